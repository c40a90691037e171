"""A disaggregated layout: a prefill pool, a decode pool and the KV-cache link between them,
with the link's stated defaults (what :mod:`gpugov.plant.disaggregated` simulates).

``kv_bytes_per_token`` comes from the profile's model shape where the manifest records it
(``2 * n_layers * n_kv_heads * head_dim * bytes_per_value``: 131,072 B for Llama-3.1-8B,
327,680 B for Llama-3.1-70B, BF16), otherwise :data:`DEFAULT_KV_BYTES_PER_TOKEN`.

Interconnect defaults (:data:`INTERCONNECTS`), per GPU and per direction:

* ``nvlink`` (P and D in one node): 450 GB/s, half of the 900 GB/s total bidirectional
  NVLink 4 bandwidth of an H100/H200 SXM (NVIDIA H100 and H200 datasheets);
* ``infiniband`` (between nodes): 50 GB/s, one 400 Gb/s NDR ConnectX-7 NIC per GPU as in
  a DGX H100 (NVIDIA DGX H100 user guide, network ports);
* ``roce`` (between nodes, Ethernet): 25 GB/s, one 200 Gb/s RoCE NIC per GPU (the
  200 Gb/s class of NIC the Mooncake transfer engine is benchmarked on; an assumption).

Line rates, not measured transfer throughputs: a real connector reaches a fraction of
them. The fixed costs (0.1 ms on NVLink, 1 ms over RDMA: the connector's control
round trip and completion notification) are assumptions, not measurements; every value
can be overridden.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpugov.plant.plant import ServingPlant, run_horizon_s
from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.types import Request, Scheduler

ROLES = ("prefill", "decode")
"""The pools of a disaggregated layout, in the order the loop serves them."""

DEFAULT_KV_BYTES_PER_TOKEN = 131_072.0
"""KV bytes per token when a profile records no model shape: Llama-3.1-8B's (32 layers,
8 KV heads of 128, BF16, K and V), the size class of the bundled small profiles."""


@dataclass(frozen=True, slots=True)
class Interconnect:
    """A link between the pools: per-GPU bandwidth one way, and a fixed cost per transfer."""

    name: str
    bandwidth_bytes_per_s: float
    fixed_s: float
    source: str


INTERCONNECTS: dict[str, Interconnect] = {
    "nvlink": Interconnect(
        "nvlink",
        450e9,
        1e-4,
        "NVLink 4, 900 GB/s total bidirectional per H100/H200 SXM GPU (NVIDIA datasheets)",
    ),
    "infiniband": Interconnect(
        "infiniband",
        50e9,
        1e-3,
        "NDR InfiniBand, one 400 Gb/s ConnectX-7 per GPU (NVIDIA DGX H100 user guide)",
    ),
    "roce": Interconnect("roce", 25e9, 1e-3, "RoCE, one 200 Gb/s NIC per GPU (assumed NIC class)"),
}
"""Stated defaults per interconnect (module docstring)."""


def kv_bytes_per_token(profile: PerformanceProfile) -> float | None:
    """KV-cache bytes per token of the profile's model (whole model, K and V), from the
    model shape its manifest records; None when it records none."""
    derivation = profile.manifest.get("derivation")
    parameters = derivation.get("parameters") if isinstance(derivation, Mapping) else None
    model = parameters.get("model") if isinstance(parameters, Mapping) else None
    if not isinstance(model, Mapping):
        return None
    try:
        value = (
            2.0
            * float(model["n_layers"])
            * float(model["n_kv_heads"])
            * float(model["head_dim"])
            * float(model.get("bytes_per_value", 2))
        )
    except (KeyError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0.0 else None


@dataclass(frozen=True)
class PoolSpec:
    """One pool: ``replicas`` engines of ``plant`` under one clock, with ``scheduler``."""

    plant: ServingPlant
    replicas: int = 1
    scheduler: Scheduler = chunked_prefill_scheduler

    def __post_init__(self) -> None:
        replicas = self.replicas
        if isinstance(replicas, bool) or not isinstance(replicas, numbers.Integral) or replicas < 1:
            raise ValueError(f"PoolSpec.replicas must be an integer >= 1, got {replicas!r}")

    @property
    def gpus(self) -> int:
        """GPUs in the pool: replicas times the plant's tensor-parallel size."""
        return self.replicas * self.plant.tensor_parallel


@dataclass(frozen=True)
class DisaggregatedPlant:
    """A prefill pool, a decode pool and the link between them.

    ``link_bandwidth_bytes_per_s``, ``transfer_fixed_s`` and ``kv_bytes_per_token`` default
    to the interconnect's values and the profile's model shape (module docstring); an
    infinite bandwidth and a zero fixed cost make the transfer free. The request-level
    SLO is the prefill profile's TTFT SLO and the decode profile's TPOT SLO.
    """

    prefill: PoolSpec
    decode: PoolSpec
    interconnect: str = "nvlink"
    link_bandwidth_bytes_per_s: float | None = None
    transfer_fixed_s: float | None = None
    kv_bytes_per_token: float | None = None

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(
                f"DisaggregatedPlant.interconnect must be one of {sorted(INTERCONNECTS)}, "
                f"got {self.interconnect!r}"
            )
        bandwidth = self.bandwidth_bytes_per_s
        if math.isnan(bandwidth) or bandwidth <= 0.0:
            raise ValueError(
                f"DisaggregatedPlant.link_bandwidth_bytes_per_s must be positive, got {bandwidth!r}"
            )
        if not math.isfinite(self.fixed_s) or self.fixed_s < 0.0:
            raise ValueError(
                f"DisaggregatedPlant.transfer_fixed_s must be >= 0, got {self.fixed_s!r}"
            )
        size = self.bytes_per_token
        if not math.isfinite(size) or size < 0.0:
            raise ValueError(f"DisaggregatedPlant.kv_bytes_per_token must be >= 0, got {size!r}")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Per-GPU link bandwidth in force."""
        if self.link_bandwidth_bytes_per_s is not None:
            return float(self.link_bandwidth_bytes_per_s)
        return INTERCONNECTS[self.interconnect].bandwidth_bytes_per_s

    @property
    def fixed_s(self) -> float:
        """Fixed cost per transfer in force."""
        if self.transfer_fixed_s is not None:
            return float(self.transfer_fixed_s)
        return INTERCONNECTS[self.interconnect].fixed_s

    @property
    def bytes_per_token(self) -> float:
        """KV bytes per prompt token in force (override, profile's shape, or default)."""
        if self.kv_bytes_per_token is not None:
            return float(self.kv_bytes_per_token)
        shaped = kv_bytes_per_token(self.prefill.plant.profile)
        return DEFAULT_KV_BYTES_PER_TOKEN if shaped is None else shaped

    @property
    def links(self) -> int:
        """Parallel links per transfer: ``min(prefill TP, decode TP)``."""
        return min(self.prefill.plant.tensor_parallel, self.decode.plant.tensor_parallel)

    def transfer_bytes(self, prompt_tokens: int) -> float:
        """Bytes of a prompt's KV cache."""
        return float(prompt_tokens) * self.bytes_per_token

    def transfer_s(self, prompt_tokens: int) -> float:
        """Seconds to move a prompt's KV cache from the prefill pool to the decode pool."""
        bandwidth = self.bandwidth_bytes_per_s * self.links
        return self.fixed_s + self.transfer_bytes(prompt_tokens) / bandwidth

    def pool(self, role: str) -> PoolSpec:
        """The pool of ``role`` ("prefill" or "decode")."""
        if role == "prefill":
            return self.prefill
        if role == "decode":
            return self.decode
        raise ValueError(f"unknown pool role {role!r}; expected one of {ROLES}")

    def run_horizon_s(self, requests: Sequence[Request]) -> float:
        """Where a run of ``requests`` ends by default: the longer pool's drain timeout
        after the last arrival, or the request-level SLO's last deadline where later
        (:func:`~gpugov.plant.plant.run_horizon_s`)."""
        drain = max(self.prefill.plant.drain_timeout_s, self.decode.plant.drain_timeout_s)
        return run_horizon_s(
            requests,
            drain,
            self.prefill.plant.profile.ttft_slo_for,
            self.decode.plant.profile.tpot_slo_s,
        )

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters for result metadata; ``layout`` counts each pool's engines
        (``MPND``, as ``--layout`` and the scoreboard name it), ``gpus`` each pool's GPUs."""
        return {
            "layout": f"{self.prefill.replicas}P{self.decode.replicas}D",
            "interconnect": self.interconnect,
            "link_bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "transfer_fixed_s": self.fixed_s,
            "kv_bytes_per_token": self.bytes_per_token,
            "links": self.links,
            **{
                role: {
                    "replicas": self.pool(role).replicas,
                    "gpus": self.pool(role).gpus,
                    "plant": self.pool(role).plant.describe(),
                }
                for role in ROLES
            },
        }
