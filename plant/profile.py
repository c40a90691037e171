"""GPU performance profiles: per-clock prefill/decode rates and phase powers, with provenance.

A profile is a CSV over the supported SM clocks plus a JSON manifest beside it (see
``profiles/README.md`` for the schema). This module is the profile itself: its tables, the
engine models its manifest states and what the plant reads of it;
:func:`gpugov.plant.profile_files.load_profile` reads and checks both files and records
their sha256s, so every result can say exactly which profile produced it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.input_files import finite_number
from gpugov.plant.types import ttft_slo_at

Phase = Literal["prefill", "decode", "idle"]

CSV_COLUMNS = (
    "clock_mhz",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "prefill_power_w",
    "decode_power_w",
    "idle_power_w",
)


DEFAULT_PROFILE = "h100-sxm-llama3-8b"
"""The bundled profile a command uses when none is named (the seed's case-study GPU)."""


class ProfileError(ValueError):
    """A profile CSV or manifest is malformed; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class DecodeLatencyModel:
    """Split of the reference decode iteration time into weight, batch and KV parts.

    Decode iteration time at clock f for batch B with total context C tokens is
    ``t_ref(f) * (weight_fraction + batch_fraction * B/B_ref + kv_fraction * C/C_ref)``,
    with ``t_ref(f) = B_ref / decode_tokens_per_s(f)`` and ``C_ref = B_ref * L_ref``.
    The fractions sum to one, so the profile's aggregate decode rate is reproduced
    exactly at the reference batch and context.
    """

    weight_fraction: float
    batch_fraction: float
    kv_fraction: float
    reference_batch_size: int
    reference_context_tokens: int

    def __post_init__(self) -> None:
        parts = (self.weight_fraction, self.batch_fraction, self.kv_fraction)
        if not all(0.0 <= p <= 1.0 for p in parts) or not abs(sum(parts) - 1.0) <= 1e-6:
            raise ValueError(f"decode latency fractions must be >= 0 and sum to 1, got {parts}")
        references = (self.reference_batch_size, self.reference_context_tokens)
        if not all(1 <= value <= MAX_ENGINE_COUNT for value in references):
            raise ValueError(
                f"reference batch size and context tokens must lie in [1, {MAX_ENGINE_COUNT:g}]"
            )


@dataclass(frozen=True, slots=True)
class DecodePowerBatchModel:
    """Logistic dependence of decode power on batch size (ML.ENERGY's model form).

    ``P(f, B) = idle(f) + (decode_power(f) - idle(f)) * s(B) / s(B_ref)`` with
    ``s(B) = sigmoid(k * (log2 B - x0))``; ``s(B_ref)`` normalises so the profile's
    decode power is reproduced at the reference batch.
    """

    k: float
    x0: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k) and math.isfinite(self.x0) and 0.0 <= self.k <= 100.0):
            # A negative k makes decode power fall as the batch grows: at a batch of one it
            # was thousands of times the reference power (a run's energy in the MJ).
            raise ValueError(f"k must be in [0, 100] and x0 finite, got {self.k!r}, {self.x0!r}")

    def factor(self, batch: float, reference_batch: float) -> float:
        """Decode dynamic-power multiplier for ``batch`` relative to the reference batch."""
        if batch <= 0:
            return 0.0
        s = 1.0 / (1.0 + np.exp(-self.k * (np.log2(batch) - self.x0)))
        s_ref = 1.0 / (1.0 + np.exp(-self.k * (np.log2(reference_batch) - self.x0)))
        return float(s / s_ref)


@dataclass(frozen=True, eq=False)
class PerformanceProfile:
    """Per-GPU table over ascending supported clocks (the seed's ``PerformanceProfile``)."""

    clock_mhz: NDArray[np.float64]
    prefill_tokens_per_s: NDArray[np.float64]
    decode_tokens_per_s: NDArray[np.float64]
    prefill_power_w: NDArray[np.float64]
    decode_power_w: NDArray[np.float64]
    idle_power_w: NDArray[np.float64]
    ttft_slo_s: float
    tpot_slo_s: float
    manifest: Mapping[str, Any] = field(default_factory=dict)
    name: str = "unnamed"
    profile_csv_sha256: str = ""
    manifest_sha256: str = ""

    def __post_init__(self) -> None:
        arrays = {
            "clock_mhz": self.clock_mhz,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "prefill_power_w": self.prefill_power_w,
            "decode_power_w": self.decode_power_w,
            "idle_power_w": self.idle_power_w,
        }
        size = None
        for key, value in arrays.items():
            array = np.asarray(value, dtype=float)
            object.__setattr__(self, key, array)
            if array.ndim != 1 or array.size < 2:
                raise ValueError(f"profile {self.name}: {key} must be 1-D with >= 2 clocks")
            if size is None:
                size = array.size
            elif array.size != size:
                raise ValueError(
                    f"profile {self.name}: {key} has {array.size} values, clock_mhz has {size}"
                )
            # Idle power may be zero (a table of the power above an idle floor, or a
            # board whose idle draw is not metered); every other value is positive.
            floor_ok = array >= 0.0 if key == "idle_power_w" else array > 0.0
            if not np.all(np.isfinite(array) & floor_ok):
                bad = int(np.flatnonzero(~(np.isfinite(array) & floor_ok))[0])
                which = "at least 0" if key == "idle_power_w" else "positive"
                raise ValueError(
                    f"profile {self.name}: {key}[{bad}] must be finite and {which}, "
                    f"got {array[bad]!r}"
                )
        if np.any(np.diff(self.clock_mhz) <= 0.0):
            bad = int(np.flatnonzero(np.diff(self.clock_mhz) <= 0.0)[0]) + 1
            raise ValueError(
                f"profile {self.name}: clock_mhz must be strictly ascending; "
                f"row {bad} ({self.clock_mhz[bad]!r}) is not above the previous"
            )
        for key in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, key)
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"profile {self.name}: {key} must be positive, got {value!r}")
        realized = self._realized_map()
        object.__setattr__(self, "_realized_by_requested", realized)

    # ----------------------------------------------------------------- provenance
    @property
    def profile_status(self) -> str:
        """The manifest's ``status`` (``measured``, ``emulated``, ``literature-derived`` or
        ``synthetic``)."""
        return str(self.manifest.get("status", "synthetic"))

    @property
    def is_measured(self) -> bool:
        """True only for profiles measured on real hardware."""
        return self.profile_status == "measured"

    @property
    def measurement_validated(self) -> bool:
        """True when a measured profile's manifest says its validation passed."""
        return self.is_measured and bool(self.manifest.get("measurement_validated", False))

    @property
    def source_label(self) -> str:
        """One line naming the GPU, model and provenance, for tables and figures."""
        gpu = self.manifest.get("gpu", "unknown GPU")
        model = self.manifest.get("model", "unknown model")
        return f"{gpu}, {model} ({self.profile_status})"

    # ------------------------------------------------------------------- clocks
    @property
    def minimum_clock_mhz(self) -> float:
        """Lowest supported clock."""
        return float(self.clock_mhz[0])

    @property
    def maximum_clock_mhz(self) -> float:
        """Highest supported clock."""
        return float(self.clock_mhz[-1])

    def quantize_clock(self, value: float, downward: bool = True) -> float:
        """Map a clock onto the supported set: the highest clock <= value (downward) or
        the lowest clock >= value (upward), clamped to the supported range."""
        if not np.isfinite(value):
            raise ValueError(f"clock must be finite, got {value!r}")
        clocks = self.clock_mhz
        if downward:
            index = int(np.searchsorted(clocks, value + 1e-9, side="right")) - 1
        else:
            index = int(np.searchsorted(clocks, value - 1e-9, side="left"))
        return float(clocks[min(max(index, 0), clocks.size - 1)])

    def clock_index(self, value: float, downward: bool = True) -> int:
        """Index of :meth:`quantize_clock`'s result in ``clock_mhz``."""
        quantized = self.quantize_clock(value, downward=downward)
        return int(np.searchsorted(self.clock_mhz, quantized - 1e-9))

    def _realized_map(self) -> dict[float, float]:
        """The manifest's requested-to-realised clock medians, checked: a requested clock
        within the profile's clocks, and a realised one positive and at most the top clock. A
        locked GPU runs at or below its lock (power, heat), above it only within boost, which
        the supported range bounds; below the lowest profiled clock is possible (the GPU's
        range goes lower), and the plant reads rates and powers at the table's ends there.

        Raises:
            ValueError: naming the field and the requested key.
        """
        selection = self.manifest.get("clock_profile_selection")
        if selection is None:
            return {}
        if not isinstance(selection, Mapping):
            raise ValueError(
                f"profile {self.name}: clock_profile_selection must be an object, "
                f"got {selection!r:.40}"
            )
        raw = selection.get("realized_clock_median_mhz_by_requested")
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            raise ValueError(
                f"profile {self.name}: clock_profile_selection."
                "realized_clock_median_mhz_by_requested must be an object of requested "
                f"clock -> realised clock (MHz), got {raw!r:.40}"
            )
        lowest, highest = self.minimum_clock_mhz, self.maximum_clock_mhz
        result: dict[float, float] = {}
        for requested, realized in raw.items():
            where = (
                f"profile {self.name}: clock_profile_selection."
                f"realized_clock_median_mhz_by_requested[{requested!r:.40}]"
            )
            if isinstance(realized, bool) or not isinstance(realized, int | float):
                raise ValueError(f"{where} is not numeric: {realized!r:.40}")
            try:
                req, rea = float(requested), float(realized)
            except (TypeError, ValueError, OverflowError) as error:
                raise ValueError(f"{where} is not numeric") from error
            if not (math.isfinite(req) and lowest <= req <= highest):
                raise ValueError(
                    f"{where}: the requested clock must be within the profile's clocks "
                    f"({lowest:g}-{highest:g} MHz), got {req!r}"
                )
            if not (math.isfinite(rea) and 0.0 < rea <= highest):
                raise ValueError(
                    f"{where}: its realised clock must be positive and at most the profile's "
                    f"top clock ({highest:g} MHz), got {rea!r}"
                )
            result[req] = rea
        return result

    def realized_clock(self, requested_mhz: float) -> float:
        """Clock the GPU actually runs at when ``requested_mhz`` (supported) is locked.

        A measured manifest's requested-to-realised medians are honoured; otherwise the
        request is realised exactly.
        """
        mapping: dict[float, float] = self._realized_by_requested  # type: ignore[attr-defined]
        return float(mapping.get(float(requested_mhz), requested_mhz))

    # -------------------------------------------------------------- rates, powers
    def rate(self, phase: Phase, clock_mhz: float) -> float:
        """Aggregate tokens/s of ``phase`` at ``clock_mhz`` (interpolated; idle is 0)."""
        if phase == "prefill":
            return float(np.interp(clock_mhz, self.clock_mhz, self.prefill_tokens_per_s))
        if phase == "decode":
            return float(np.interp(clock_mhz, self.clock_mhz, self.decode_tokens_per_s))
        if phase == "idle":
            return 0.0
        raise ValueError(f"unknown phase {phase!r}; expected prefill, decode or idle")

    def power(self, phase: Phase, clock_mhz: float) -> float:
        """Board power in watts of ``phase`` at ``clock_mhz`` (interpolated)."""
        if phase == "prefill":
            table = self.prefill_power_w
        elif phase == "decode":
            table = self.decode_power_w
        elif phase == "idle":
            table = self.idle_power_w
        else:
            raise ValueError(f"unknown phase {phase!r}; expected prefill, decode or idle")
        return float(np.interp(clock_mhz, self.clock_mhz, table))

    # -------------------------------------------------------------- SLO, domain
    @property
    def ttft_slo_per_prompt_token_s(self) -> float:
        """TTFT allowance per prompt token on top of ``ttft_slo_s`` (0: a flat SLO)."""
        return float(self.manifest.get("ttft_slo_per_prompt_token_s", 0.0))

    def ttft_slo_for(self, prompt_tokens: float) -> float:
        """TTFT SLO of a request with ``prompt_tokens`` prompt tokens, in seconds:
        ``ttft_slo_s + ttft_slo_per_prompt_token_s * prompt_tokens``."""
        return ttft_slo_at(self.ttft_slo_s, self.ttft_slo_per_prompt_token_s, prompt_tokens)

    @property
    def tensor_parallel(self) -> int:
        """GPUs in the simulated domain (rates are the domain's, powers its sum)."""
        raw = self.manifest.get("tensor_parallel", 1)
        if isinstance(raw, Mapping):
            raw = raw.get("size", 1)
        return int(raw)

    @property
    def worst_calibration_error(self) -> float | None:
        """Largest ``|relative_error|`` of the manifest's calibration rows, or None."""
        return worst_calibration_error(self.manifest)

    # -------------------------------------------------------- engine model params
    @property
    def decode_latency_model(self) -> DecodeLatencyModel:
        """Decode iteration model from the manifest (defaults: a pure aggregate rate)."""
        raw = self.manifest.get("decode_latency_model")
        engine = self.manifest.get("engine", {})
        reference_batch = int(engine.get("reference_batch_size", DEFAULT_REFERENCE_BATCH_SIZE))
        reference_context = int(engine.get("reference_context_tokens", 1024))
        if not raw:
            return DecodeLatencyModel(1.0, 0.0, 0.0, reference_batch, reference_context)
        parts = [float(raw[key]) for key in ("weight_fraction", "batch_fraction", "kv_fraction")]
        total = math.fsum(parts)
        if all(part >= 0.0 for part in parts) and abs(total - 1.0) <= FRACTION_SUM_TOLERANCE:
            # Fractions written to a few decimals (0.6247, 0.0468, 0.3284: 0.9999) were
            # refused as not summing to 1; they are read as the shares they state.
            parts = [part / total for part in parts]
        weight, batch, kv = parts
        return DecodeLatencyModel(
            weight_fraction=weight,
            batch_fraction=batch,
            kv_fraction=kv,
            reference_batch_size=reference_batch,
            reference_context_tokens=reference_context,
        )

    @property
    def decode_power_batch_model(self) -> DecodePowerBatchModel | None:
        """Batch dependence of decode power, or None (power independent of batch)."""
        raw = self.manifest.get("decode_power_batch_model")
        if not raw:
            return None
        return DecodePowerBatchModel(k=float(raw["k"]), x0=float(raw["x0"]))

    def describe(self) -> dict[str, Any]:
        """JSON-able summary used in result metadata."""
        return {
            "name": self.name,
            "status": self.profile_status,
            "source": self.source_label,
            "profile_csv_sha256": self.profile_csv_sha256,
            "manifest_sha256": self.manifest_sha256,
            "minimum_clock_mhz": self.minimum_clock_mhz,
            "maximum_clock_mhz": self.maximum_clock_mhz,
            "supported_clock_count": int(self.clock_mhz.size),
            "ttft_slo_s": self.ttft_slo_s,
            "ttft_slo_per_prompt_token_s": self.ttft_slo_per_prompt_token_s,
            "tpot_slo_s": self.tpot_slo_s,
            "tensor_parallel": self.tensor_parallel,
        }


FRACTION_SUM_TOLERANCE = 1e-3
"""How far from 1 the manifest's ``decode_latency_model`` fractions may sum: within it they
are rescaled to sum to 1 (fractions rounded to three or four decimals); past it, refused."""
MAX_ENGINE_COUNT = 1e12
"""The largest engine count (a batch, a context, KV tokens) a profile may state."""
DEFAULT_MAX_BATCH_SIZE = 256
"""The engine's batch bound where a manifest states no ``engine.max_batch_size``."""
DEFAULT_REFERENCE_BATCH_SIZE = 64
"""The batch a profile's decode rates are read at where a manifest states no
``engine.reference_batch_size``."""


def worst_calibration_error(manifest: Mapping[str, Any]) -> float | None:
    """Largest ``|relative_error|`` over a manifest's ``calibration`` rows (None: no rows)."""
    rows = manifest.get("calibration") or []
    errors = [
        abs(float(row["relative_error"]))
        for row in rows
        if isinstance(row, Mapping) and finite_number(row.get("relative_error")) is not None
    ]
    return max(errors) if errors else None
