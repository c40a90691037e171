"""The A100 Llama-3-8B decode iteration against Vidur's measured kernels.

Vidur (default, no CPU overheads) times an iteration as the sum of its measured per-layer
kernels (linear operators plus decode attention); the plant's bundled profile times it with
its decode latency model. ``bench/decode_check.py`` prints the comparison and a test holds
the ratio.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpugov.plant import calibration
from gpugov.plant.profile_files import load_profile
from gpugov.plant.zoo import LLAMA_31_8B

PROFILE = "a100-sxm-80gb-llama3-8b"
CONTEXT_TOKENS = 1536
BATCHES = (1, 8, 32, 64, 128)


def decode_check(
    batches: Sequence[int] = BATCHES, context_tokens: int = CONTEXT_TOKENS
) -> list[tuple[int, float, float]]:
    """``(batch, Vidur's kernel-time sum s, plant iteration s)`` per batch."""
    prof = load_profile(PROFILE)
    lat = prof.decode_latency_model
    b_ref, l_ref = lat.reference_batch_size, lat.reference_context_tokens
    t_ref = b_ref / prof.decode_tokens_per_s[-1]
    rows = []
    for batch in batches:
        linear, attention = calibration.a100_llama3_8b_decode_points(batch, context_tokens)
        vidur = LLAMA_31_8B.n_layers * (linear.layer_s + attention.layer_s)
        plant = t_ref * (
            lat.weight_fraction
            + lat.batch_fraction * batch / b_ref
            + lat.kv_fraction * batch * context_tokens / (b_ref * l_ref)
        )
        rows.append((batch, vidur, plant))
    return rows
