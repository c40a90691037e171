"""A100 Llama-3-8B decode iteration: Vidur's measured kernel-time sum vs the plant's model.

Run: ``python bench/decode_check.py``. Prints, per batch at 1536 tokens of context, the sum
of Vidur's measured per-layer kernels (its execution time with CPU overheads skipped), the
plant's iteration time from the bundled profile's decode latency model and their ratio.
"""

from __future__ import annotations

import argparse
import sys

from gpugov.plant import calibration
from gpugov.plant.profile import load_profile
from gpugov.plant.zoo import LLAMA_31_8B

PROFILE = "a100-sxm-80gb-llama3-8b"
CONTEXT = 1536


def main(argv: list[str]) -> int:
    """Print the comparison table."""
    argparse.ArgumentParser(prog="bench/decode_check.py", description=__doc__).parse_args(argv)
    prof = load_profile(PROFILE)
    lat, eng = prof.manifest["decode_latency_model"], prof.manifest["engine"]
    b_ref, l_ref = eng["reference_batch_size"], eng["reference_context_tokens"]
    t_ref = b_ref / prof.decode_tokens_per_s[-1]
    linear = {
        p.num_tokens: p.layer_s
        for p in calibration.linear_points()
        if (p.gpu, p.model, p.shape.tensor_parallel) == ("a100", "Llama-3-8B", 1)
    }
    attention = {
        (p.batch, p.context_tokens): p.layer_s
        for p in calibration.attention_points()
        if (p.model, p.tensor_parallel) == ("Llama-3-8B", 1)
    }
    print("batch  vidur_kernels_ms  plant_iteration_ms  ratio")
    for batch in (1, 8, 32, 64, 128):
        vidur = LLAMA_31_8B.n_layers * (linear[batch] + attention[(batch, CONTEXT)])
        plant = t_ref * (
            lat["weight_fraction"]
            + lat["batch_fraction"] * batch / b_ref
            + lat["kv_fraction"] * batch * CONTEXT / (b_ref * l_ref)
        )
        print(f"{batch:5d}  {vidur * 1e3:16.2f}  {plant * 1e3:18.2f}  {plant / vidur:5.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
