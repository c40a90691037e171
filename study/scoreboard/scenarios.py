"""The scoreboard's configuration and scenarios: traces x profiles x loads, each window
scaled to the load it names, the SLO capacity search, and the controllers' one names."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.oracles import (
    SLO_TOLERANCE,
)
from gpugov.daemon.cli_support import MAX_SIMULATED_DAYS, trace_progress
from gpugov.daemon.safety import DEFAULT_DWELL_S, SafetySettings
from gpugov.plant import PerformanceProfile, ServingPlant, simulate
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.types import Request
from gpugov.plant.workload import (
    TraceLoadReport,
    TraceWarning,
    format_seconds,
    load_trace,
    scale_load,
    select_window,
    workload_checksum,
)

ROOT = Path(__file__).resolve().parents[2]
# In a source checkout the results live beside the benchmark; installed from a wheel,
# there is no checkout, and they go to a folder under the working directory.
DEFAULT_OUT = (
    ROOT / "bench" / "results" / "controllers"
    if (ROOT / "pyproject.toml").is_file()
    else Path("gpugov-scoreboard")
)

TRACES = ("azure-conv-10min", "azure-conv", "azure-code", "mooncake", "burstgpt1")
PROFILES = ("h100-sxm-llama3-8b", "h200-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b")
LOADS = ("recorded", "cap70")
TRACE_STARTS_S = {
    "azure-conv-10min": 0.0,
    "azure-conv": 1800.0,
    "azure-code": 600.0,
    "mooncake": 1800.0,
    "burstgpt1": 0.0,
}
"""Source window start per trace (seconds after its first arrival)."""
WHOLE_TRACE = frozenset({"burstgpt1"})
"""Traces used whole (too few rows for a window), time-compressed to the target load."""
TARGET_UTILIZATION = 0.7
BUSY_UTILIZATION = 0.9
LIGHT_LOAD_FRACTION = 0.2
"""Light load for the capacity search, as a fraction of the fluid estimate's capacity."""
CAPACITY_SEARCH_LIMIT = 16.0

CONTROLLER_ORDER = (
    "max",
    "best-fixed",
    "reactive",
    "open-loop",
    "mpc-slsqp",
    "mpc",
    "mpc-online",
    "window-oracle",
    # Peer governors (controllers/peers, docs/benchmark.md).
    "power-cap",
    "best-cap",
    "dps",
    "power-profile",
    "default-dvfs",
    "agft",
    "pid",
    "throttllem",
    "greenllm",
)


# --------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class BenchConfig:
    """What one scoreboard run covers and how hard the oracles search."""

    traces: tuple[str, ...] = TRACES
    profiles: tuple[str, ...] = PROFILES
    loads: tuple[str, ...] = LOADS
    duration_s: float = 600.0
    control_period_s: float = 1.0
    mpc_horizon_s: float = 10.0
    mpc_solve_time_limit_s: float = 0.8
    fast_mpc_period_s: float = 0.5
    online_period_s: float = 0.25
    """``mpc-online``'s period: the node setting ``docs/online.md`` recommends (its whole
    decision takes about a millisecond)."""
    dwell_s: float = DEFAULT_DWELL_S
    """The safety chain's dwell every controller runs in (a node's ``safety.dwell_s``)."""
    floor_mhz: float | None = None
    """The safety chain's floor (a node's ``safety.floor_mhz``; None: none)."""
    oracle_window_s: float = 5.0
    oracle_lookahead_s: float = 15.0
    oracle_coarse_levels: int = 8
    oracle_neighbour_steps: tuple[int, ...] = (2, 6)
    best_fixed_coarse_points: int = 5
    lp_window_s: float = 1.0
    tolerance: float = SLO_TOLERANCE
    comparison_scenario: str | None = "azure-conv-10min|h100-sxm-llama3-8b|recorded"
    jobs: int = 0
    seed: int = 0
    mode: str = "full"
    windows: int = 1
    """Windows per trace (``--windows``): 1 runs the trace's one scoreboard window; more
    add held-out windows at other starts (``study/scoreboard/windows.py``)."""
    outside_controllers: tuple[str, ...] = ()
    """Outside controllers scored beside the rows (``--controller``): their specs,
    ``MODULE:FACTORY`` or an installed ``gpugov.controllers`` entry point's name; each
    is a row named by :func:`daemon.controller_spec.spec_name`."""
    engine_view: str = "vllm"
    """What each controller observes (``--engine-view``): ``vllm``, what a vLLM node's
    daemon derives from the engine's page (``daemon.simulated.node_view``), so the board
    scores what a node runs; ``exact``, the plant's exact state."""

    @property
    def slo_target(self) -> SLOTarget | None:
        """The SLO target every scored controller is given, from the SLO condition's own
        ``tolerance`` (one number for both): ``1 - tolerance`` of the requests over the
        scenario's ``duration_s``, the whole window the condition judges. Where the
        maximum clock attains 100 % this is the condition itself; where it attains less
        the target is stricter than the condition. The window spans at least
        ``SLO_WINDOW_PERIODS`` of the board's longest control period, as a config's
        ``slo_target.window_s`` must: a shorter scenario's window outlasts it, so the
        budget still counts every request. None with no tolerance."""
        from gpugov.daemon.config import SLO_WINDOW_PERIODS

        if not self.tolerance > 0.0:
            return None
        longest = max(self.control_period_s, self.fast_mpc_period_s, self.online_period_s)
        window = max(self.duration_s, SLO_WINDOW_PERIODS * longest)
        return SLOTarget(attainment=1.0 - self.tolerance, window_s=window)

    @property
    def oracle_search(self) -> dict[str, Any]:
        """The window oracle's search settings every board uses, colocated or per pool
        (keyword arguments of ``window_oracle`` and ``pool_window_oracle``)."""
        return {
            "window_s": self.oracle_window_s,
            "lookahead_s": self.oracle_lookahead_s,
            "coarse_levels": self.oracle_coarse_levels,
            "neighbour_steps": self.oracle_neighbour_steps,
            "tolerance": self.tolerance,
            "seed": self.seed,
            "control_period_s": self.control_period_s,
        }

    @property
    def safety(self) -> SafetySettings:
        """The node's safety chain every scored controller runs in."""
        return SafetySettings(floor_mhz=self.floor_mhz, dwell_s=self.dwell_s)

    def scenario_specs(self) -> list[tuple[str, str, str]]:
        """(trace, profile, load) for every scenario, in table order."""
        return [(t, p, ld) for t in self.traces for p in self.profiles for ld in self.loads]

    def scenario_count(self) -> int:
        """Scenarios the run covers: every (trace, profile, load) in each of its windows."""
        return len(self.scenario_specs()) * self.windows


FULL = BenchConfig()
QUICK = BenchConfig(
    traces=("azure-conv-10min", "azure-code"),
    profiles=("h100-sxm-llama3-8b",),
    duration_s=120.0,
    mode="quick",
)
TINY = BenchConfig(
    traces=("azure-conv-10min",),
    profiles=("h100-sxm-llama3-8b",),
    loads=("recorded",),
    duration_s=15.0,
    oracle_window_s=5.0,
    oracle_lookahead_s=5.0,
    oracle_coarse_levels=4,
    oracle_neighbour_steps=(3,),
    best_fixed_coarse_points=3,
    jobs=1,
    mode="tiny",
)


# ------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class Scenario:
    """One trace window at one load on one profile."""

    key: str
    trace: str
    profile: str
    load: str
    load_label: str
    requests: tuple[Request, ...]
    source_start_s: float
    source_duration_s: float
    load_scale: float
    capacity_load_scale: float
    capacity_probes: int
    light_load_slo_attainment: float
    utilization: float
    fluid_utilization_estimate: float
    trace_sha256: str
    rejected_requests: int = 0

    @property
    def scenario_duration_s(self) -> float:
        """Simulated seconds of arrivals the scenario covers: its source window stretched
        (or compressed) by its load."""
        return self.source_duration_s / self.load_scale

    def describe(self) -> dict[str, Any]:
        """JSON-able description (without the requests)."""
        arrivals = [r.arrival_time_s for r in self.requests]
        return {
            "key": self.key,
            "trace": self.trace,
            "profile": self.profile,
            "load": self.load,
            "load_label": self.load_label,
            "source_start_s": self.source_start_s,
            "source_duration_s": self.source_duration_s,
            "load_scale": self.load_scale,
            "capacity_load_scale": self.capacity_load_scale,
            "capacity_probes": self.capacity_probes,
            "light_load_slo_attainment": self.light_load_slo_attainment,
            "utilization": self.utilization,
            "fluid_utilization_estimate": self.fluid_utilization_estimate,
            "requests": len(self.requests),
            "arrival_span_s": (max(arrivals) - min(arrivals)) if arrivals else 0.0,
            "scenario_duration_s": self.scenario_duration_s,
            "trace_sha256": self.trace_sha256,
            "workload_checksum": workload_checksum(self.requests),
            "rejected_requests": self.rejected_requests,
        }


def work_seconds_at_maximum(requests: Iterable[Request], profile: PerformanceProfile) -> float:
    """Seconds of work at the maximum clock by the profile's aggregate rates (the fluid
    estimate's numerator)."""
    top = profile.realized_clock(profile.maximum_clock_mhz)
    prefill = profile.rate("prefill", top)
    decode = profile.rate("decode", top)
    return sum(r.prompt_tokens / prefill + (r.output_tokens - 1) / decode for r in requests)


def probe_span_s(requests: Sequence[Request], load_scale: float, work_s: float) -> float:
    """The simulated seconds a probe at ``load_scale`` may take: the arrivals' span
    stretched by the load (``scale_load``), plus the window's ``work_s`` at the maximum
    clock (:func:`work_seconds_at_maximum`)."""
    arrivals = [r.arrival_time_s for r in requests]
    return (max(arrivals) - min(arrivals)) / load_scale + work_s


def slo_attainment_at_maximum(
    requests: Sequence[Request], plant: ServingPlant, load_scale: float
) -> float:
    """SLO attainment of the maximum clock on ``requests`` at ``load_scale``."""
    result = simulate(
        scale_load(requests, load_scale),
        plant,
        chunked_prefill_scheduler,
        maximum_clock_controller,
        controller_name="capacity probe",
    )
    return result.metrics.slo_attainment or 0.0


def slo_capacity(
    requests: Sequence[Request],
    plant: ServingPlant,
    duration_s: float,
    *,
    tolerance: float = SLO_TOLERANCE,
    light_fraction: float = LIGHT_LOAD_FRACTION,
    bisections: int = 4,
) -> tuple[float, float, int]:
    """The window's SLO capacity multiplier at the maximum clock (module notes). No probe
    runs whose simulated span passes :data:`MAX_SIMULATED_DAYS` (:func:`probe_span_s`): a
    lighter load past it is not tried, the light load before it stays the reference.

    Returns:
        ``(capacity multiplier, light-load SLO attainment, simulations run)``.

    Raises:
        ProbeTooLongError: even the first light-load probe would pass that limit.
        ValueError: no requests or a non-positive duration.
    """
    if not requests or duration_s <= 0.0:
        raise ValueError("slo_capacity needs requests and a positive duration")
    work_s = work_seconds_at_maximum(requests, plant.profile)
    guess = duration_s / max(work_s, 1e-9)
    runs = 0
    limit_s = MAX_SIMULATED_DAYS * 86_400.0

    def attainment(scale: float) -> float:
        nonlocal runs
        runs += 1
        return slo_attainment_at_maximum(requests, plant, scale)

    # Light load: 20% of the fluid guess, lowered 4x at a time (at most twice) while
    # that still gains half a point (bursty traces stay congested at 20% on average).
    light = light_fraction * guess
    span_s = probe_span_s(requests, light, work_s)
    if not span_s <= limit_s:
        raise ProbeTooLongError(
            f"its light-load capacity probe would simulate {format_seconds(span_s)} s "
            f"({span_s / 86_400.0:.3g} days), over the limit of {MAX_SIMULATED_DAYS:g} "
            f"simulated days: {plant.profile.name} takes "
            f"{format_seconds(work_s)} s at its maximum clock for this "
            f"{format_seconds(duration_s)} s window's requests (a very slow profile?)"
        )
    reference = attainment(light)
    for _ in range(2):
        if not probe_span_s(requests, light / 4.0, work_s) <= limit_s:
            break  # too long to simulate: the load before stays the reference
        lighter = attainment(light / 4.0)
        if lighter < reference + tolerance / 2.0:
            break
        light, reference = light / 4.0, lighter
    threshold = reference - tolerance - 1e-12
    low, high = light, guess
    if attainment(high) >= threshold:
        low = high
        while high < CAPACITY_SEARCH_LIMIT * guess:
            high *= 2.0
            if attainment(high) < threshold:
                break
            low = high
        else:
            return high, reference, runs
    for _ in range(bisections):
        middle = math.sqrt(low * high)
        if attainment(middle) >= threshold:
            low = middle
        else:
            high = middle
    return low, reference, runs


_FULL_TRACES: dict[str, tuple[tuple[Request, ...], str]] = {}
_TRACE_WARNINGS: dict[str, tuple[str, ...]] = {}


def _full_trace(name: str, *, quiet: bool = False) -> tuple[tuple[Request, ...], str]:
    """The whole trace ``name`` (its warnings, zero-token rows skipped or stamps that look
    like another unit, kept unsaid: :func:`trace_warnings`) and its file's sha256, read
    once per process; a progress line on stderr while a large file loads, unless
    ``quiet``."""
    if name not in _FULL_TRACES:
        with (
            warnings.catch_warnings(record=True) as caught,
            trace_progress(name, enabled=not quiet) as on_progress,
        ):
            warnings.simplefilter("always", TraceWarning)
            requests, report = load_trace(name, on_progress=on_progress)
        said = [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]
        keep_full_trace(name, requests, report, said)
        for warning in caught:  # anything else, as it would have been shown
            if not issubclass(warning.category, TraceWarning):
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
    return _FULL_TRACES[name]


def keep_full_trace(
    name: str,
    requests: tuple[Request, ...],
    report: TraceLoadReport,
    trace_warnings: Sequence[str] = (),
) -> None:
    """Keep ``requests``, the whole trace ``name`` as loaded by the caller (``load_trace``
    without a window), as :func:`_full_trace`'s, so the file is not read a second time (a
    day-long trace takes seconds to read); ``trace_warnings``: its load's warnings not yet
    said."""
    _FULL_TRACES[name] = (requests, report.sha256)
    _TRACE_WARNINGS[name] = tuple(trace_warnings)


def trace_warnings(name: str) -> tuple[str, ...]:
    """The warnings :func:`_full_trace` kept unsaid when it read trace ``name`` (zero-token
    rows skipped, a first stamp that looks like a time since 1970 in another unit), for a
    command that says them (``gpugov fleet``); none before it read the trace."""
    return _TRACE_WARNINGS.get(name, ())


def _window(
    full: Sequence[Request], start_s: float, length_s: float
) -> tuple[tuple[Request, ...], float, float]:
    """Arrivals in ``[start, start + length)``, the window moved back to fit the trace."""
    span = full[-1].arrival_time_s if full else 0.0
    length = min(length_s, span + 1e-6)
    start = max(0.0, min(start_s, span + 1e-6 - length))
    return select_window(full, start, length), start, length


class ScenarioSkip(ValueError):
    """A scenario that cannot run: the board skips it, with this error's message as the
    reason."""


class EmptyWindowError(ScenarioSkip):
    """A scenario holds no requests: none fits the profile's KV cache, or its window (as
    given, or shrunk to a small profile's capacity) falls in an idle stretch."""


class ProbeTooLongError(ScenarioSkip):
    """A scenario's capacity search would simulate more than :data:`MAX_SIMULATED_DAYS`
    (a profile so slow that a light load of its window lasts weeks): it would not end."""


def _require_requests(window: Sequence[Request], trace: str, length_s: float) -> None:
    """Raise :class:`EmptyWindowError` when ``window`` is empty (the scenario is skipped)."""
    if not window:
        raise EmptyWindowError(
            f"{trace}: the {format_seconds(length_s)} s window this profile's capacity allows "
            "holds no requests"
        )


class NoCapacityError(ScenarioSkip):
    """A scenario's window never misses its SLO at the maximum clock, at any rate the
    capacity search tries (too few requests, or all at one instant, to load the GPU): it
    has no SLO capacity to scale a load to."""


def _require_capacity(
    window: Sequence[Request],
    plant: ServingPlant,
    length_s: float,
    capacity: float,
    trace: str,
    light: float,
) -> None:
    """Raise :class:`NoCapacityError` when :func:`slo_capacity` returned its search limit
    (``CAPACITY_SEARCH_LIMIT`` times the fluid guess, powers of two apart, so exact): the
    window held its SLO at every rate tried, and the capacity is only that bound. A load
    scaled to it (``cap70``, a recorded load split over ``1 / capacity`` nodes) would be
    reported as a utilisation it is not: a trace of one request showed ``recorded/716``.

    ``light`` is the light-load attainment the search measured against: at most the
    tolerance, every rate is within the tolerance of it (a profile whose SLOs its maximum
    clock never meets: a TPOT SLO under its fastest decode iteration), and the error says
    so, not that the requests were too few to load the GPU."""
    guess = length_s / max(work_seconds_at_maximum(window, plant.profile), 1e-9)
    if capacity < CAPACITY_SEARCH_LIMIT * guess:
        return
    instant = window[0].arrival_time_s == window[-1].arrival_time_s
    over = "at one instant" if instant else f"over {format_seconds(length_s)} s"
    if light <= SLO_TOLERANCE:
        profile = plant.profile
        per_token = profile.ttft_slo_per_prompt_token_s
        ttft = f"{profile.ttft_slo_s:g} s" + (
            f" + {per_token:g} s per prompt token" if per_token else ""
        )
        raise NoCapacityError(
            f"{trace}: the window's {len(window)} request(s) {over} miss the SLO at "
            f"{profile.name}'s maximum clock even at a light load ({light:.1%} within it): "
            f"its SLOs (TTFT {ttft}, TPOT {profile.tpot_slo_s:g} s) are tighter than the "
            "profile serves, so no rate holds them and the window has no SLO capacity to "
            "scale a load to"
        )
    work_s = work_seconds_at_maximum(window, plant.profile)
    ttft_slo_s = plant.profile.ttft_slo_s
    # Every arrival at once still finishes its first token within the TTFT SLO: the
    # requests are too few for it, however many they are (an enormous SLO).
    within = (
        f" (the whole window's work at the maximum clock, {format_seconds(work_s)} s, fits "
        f"within its TTFT SLO of {format_seconds(ttft_slo_s)} s)"
        if work_s <= ttft_slo_s
        else ""
    )
    raise NoCapacityError(
        f"{trace}: the window's {len(window)} request(s) {over} "
        f"meet the SLO at {plant.profile.name}'s maximum clock at every rate tried (up to "
        f"{CAPACITY_SEARCH_LIMIT:g}x the fluid capacity): too few to load the GPU past its "
        f"SLOs{within}, so the window has no SLO capacity to scale a load to"
    )


def build_scenario(
    trace: str,
    plant: ServingPlant,
    load: str,
    duration_s: float,
    full_trace: tuple[tuple[Request, ...], str] | None = None,
    *,
    start_s: float | None = None,
) -> Scenario:
    """The workload of one scenario (module notes: windows, capacity, loads).

    ``full_trace`` (requests, sha256) is the loaded trace when the caller has it (a Ray
    worker gets it by value); without it the trace is loaded by name here. ``start_s``
    moves the source window's start (default: the trace's ``TRACE_STARTS_S`` entry), so
    held-out windows of a trace can be run (``--windows``, ``bench/online_windows.py``);
    the scenario's key then ends in ``@START`` (seconds).

    Raises:
        TraceError: the trace cannot be loaded.
        EmptyWindowError: no request fits the profile's KV cache, or the window (as
            given, or shrunk to the profile's capacity) holds no requests.
        ProbeTooLongError: the capacity search would simulate past
            :data:`MAX_SIMULATED_DAYS` (:func:`slo_capacity`).
        ValueError: an unknown load.
    """
    if load not in LOADS:
        raise ValueError(f"load must be one of {LOADS}, got {load!r}")
    profile = plant.profile
    everything, digest = _full_trace(trace) if full_trace is None else full_trace
    # A request larger than the KV cache is one the engine refuses (vLLM's max_model_len):
    # it is left out of the scenario and counted.
    capacity_tokens = plant.kv_capacity_tokens
    full = tuple(r for r in everything if r.prompt_tokens + r.output_tokens <= capacity_tokens)
    if not full:
        raise EmptyWindowError(
            f"{trace}: no request fits {profile.name}'s KV cache of {capacity_tokens} tokens "
            f"(all {len(everything)} left out)"
        )
    if trace in WHOLE_TRACE:
        window, start, length = _window(full, 0.0, full[-1].arrival_time_s + 1e-6)
        capacity, light, probes = slo_capacity(window, plant, length)
        _require_capacity(window, plant, length, capacity, trace, light)
        target = BUSY_UTILIZATION if load == "recorded" else TARGET_UTILIZATION
        scale = target * capacity
        label = "busy" if load == "recorded" else "cap70"
    else:
        first = TRACE_STARTS_S.get(trace, 0.0) if start_s is None else start_s
        window, start, length = _window(full, first, duration_s)
        if not window:  # an idle stretch of a bursty trace (azure-code's gaps reach 217 s)
            raise EmptyWindowError(
                f"{trace}: the {format_seconds(length)} s window from {format_seconds(start)} s "
                "holds no requests "
                "(an idle stretch of the trace)"
            )
        capacity, light, probes = slo_capacity(window, plant, length)
        if load == "recorded":
            if capacity < 1.0:  # the load is split by the capacity: it must be one
                _require_capacity(window, plant, length, capacity, trace, light)
            pool = 1 if capacity >= 1.0 else math.ceil(1.0 / capacity)
            scale = 1.0 / pool
            label = "recorded" if pool == 1 else f"recorded/{pool}"
            if pool > 1:
                window, start, length = _window(full, start, duration_s * scale)
                _require_requests(window, trace, length)
        else:
            window, start, length = _window(full, start, duration_s * TARGET_UTILIZATION * capacity)
            _require_requests(window, trace, length)
            capacity, light, more = slo_capacity(window, plant, length)
            _require_capacity(window, plant, length, capacity, trace, light)
            probes += more
            scale = TARGET_UTILIZATION * capacity
            label = "cap70"
    return Scenario(
        key=f"{trace}|{profile.name}|{load}" + ("" if start_s is None else f"@{start_s:g}"),
        trace=trace,
        profile=profile.name,
        load=load,
        load_label=label,
        requests=scale_load(window, scale),
        source_start_s=start,
        source_duration_s=length,
        load_scale=scale,
        capacity_load_scale=capacity,
        capacity_probes=probes,
        light_load_slo_attainment=light,
        utilization=scale / capacity,
        fluid_utilization_estimate=work_seconds_at_maximum(window, profile) * scale / length,
        trace_sha256=digest,
        rejected_requests=len(select_window(everything, start, length)) - len(window),
    )


def expected_scenario_duration_s(
    trace: str,
    requests: Sequence[Request],
    profile: PerformanceProfile,
    load: str,
    duration_s: float,
    *,
    start_s: float | None = None,
) -> float:
    """The simulated seconds :func:`build_scenario` will cover on ``trace`` (its loaded
    ``requests``), guessed before its capacity is measured: a window's, ``duration_s``
    cut to what the trace holds from its start; a trace used whole, its work at the
    maximum clock over the load's utilisation (the fluid capacity)."""
    if not requests:
        return 0.0
    if trace in WHOLE_TRACE:
        target = BUSY_UTILIZATION if load == "recorded" else TARGET_UTILIZATION
        return work_seconds_at_maximum(requests, profile) / target
    first = TRACE_STARTS_S.get(trace, 0.0) if start_s is None else start_s
    return _window(requests, first, duration_s)[2]


LABELS = {
    "max": "max",
    "best-fixed": "best-fixed (hindsight)",
    "reactive": "reactive",
    "open-loop": "open-loop",
    "mpc-slsqp": "mpc-slsqp",
    "mpc": "mpc",
    "mpc-online": "mpc-online",
    "window-oracle": "window-oracle (hindsight)",
    "power-cap": "power-cap (70% TDP)",
    "best-cap": "best-cap (hindsight)",
    "dps": "dps",
    "power-profile": "power-profile",
    "default-dvfs": "default-dvfs",
    "agft": "agft",
    "pid": "pid",
    "throttllem": "throttllem",
    "greenllm": "greenllm",
}
"""Row labels: a controller's one name (its ``--controller`` spec, metrics label and JSON
key); the hindsight oracles, which are not controllers, say so."""


def label_of(key: str) -> str:
    """A row's label: :data:`LABELS`'s, an outside controller's own name."""
    return LABELS.get(key, key)


def row_order(keys: Iterable[str]) -> list[str]:
    """``keys`` in table order: the board's own rows (:data:`CONTROLLER_ORDER`), then
    outside controllers in the order first seen."""
    seen = list(dict.fromkeys(keys))
    return [key for key in CONTROLLER_ORDER if key in seen] + [
        key for key in seen if key not in CONTROLLER_ORDER
    ]


# --------------------------------------------------------- disaggregated scenarios
DISAGGREGATED_TRACES = ("azure-conv", "mooncake")
"""Traces of the disaggregated scenarios (``--layout disaggregated``)."""
DISAGGREGATED_PROFILES = (
    "h100-sxm-llama3-8b",
    "h200-sxm-llama3-8b",
    "h100-sxm-llama3-70b-tp4",
    "h200-sxm-llama3-70b-tp8",
)
"""Profiles of the disaggregated scenarios: each pool's engines run this profile (the 8B
model on one GPU per engine, the 70B model on a tensor-parallel group per engine)."""


def layout_profiles(layout: str, colocated: Sequence[str], named: bool) -> tuple[str, ...]:
    """The profiles ``--layout`` runs: the colocated board's ``colocated``; the
    disaggregated board's :data:`DISAGGREGATED_PROFILES` unless ``--profiles`` named
    them (``named``: then ``colocated``, the named ones); ``both``, either board's."""
    disaggregated = tuple(colocated) if named else DISAGGREGATED_PROFILES
    if layout == "colocated":
        return tuple(colocated)
    if layout == "disaggregated":
        return disaggregated
    return tuple(dict.fromkeys((*colocated, *disaggregated)))


DISAGGREGATED_LAYOUTS = {"1P1D": (1, 1), "2P2D": (2, 2)}
"""Layouts: (prefill engines, decode engines) of the profile's plant."""
DISAGGREGATED_INTERCONNECT = "nvlink"
"""The link of every disaggregated scenario: P and D in one node."""


@dataclass(frozen=True)
class DisaggregatedScenario:
    """A colocated scenario's requests on a prefill/decode layout of the same profile.

    The load is the colocated scenario's (one GPU, :func:`build_scenario`) times the
    layout's prefill/decode pairs: each P/D pair of GPUs gets the request stream one
    colocated GPU gets in the colocated scoreboard."""

    key: str
    layout: str
    prefill_engines: int
    decode_engines: int
    interconnect: str
    base: Scenario
    requests: tuple[Request, ...]

    def describe(self) -> dict[str, Any]:
        """JSON-able description (without the requests)."""
        return {
            **self.base.describe(),
            "key": self.key,
            "layout": self.layout,
            "prefill_engines": self.prefill_engines,
            "decode_engines": self.decode_engines,
            "interconnect": self.interconnect,
            "requests": len(self.requests),
            "workload_checksum": workload_checksum(self.requests),
        }


def build_disaggregated_scenario(
    trace: str,
    plant: ServingPlant,
    layout: str,
    load: str,
    duration_s: float,
    full_trace: tuple[tuple[Request, ...], str] | None = None,
) -> DisaggregatedScenario:
    """The disaggregated scenario of ``layout`` (a key of :data:`DISAGGREGATED_LAYOUTS`)
    on ``trace`` at ``load`` (:class:`DisaggregatedScenario`).

    Raises:
        ValueError: an unknown layout or load; as :func:`build_scenario`.
    """
    if layout not in DISAGGREGATED_LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(DISAGGREGATED_LAYOUTS)}, got {layout!r}")
    prefill, decode = DISAGGREGATED_LAYOUTS[layout]
    base = build_scenario(trace, plant, load, duration_s, full_trace)
    pairs = min(prefill, decode)
    return DisaggregatedScenario(
        key=f"{base.key}|{layout}",
        layout=layout,
        prefill_engines=prefill,
        decode_engines=decode,
        interconnect=DISAGGREGATED_INTERCONNECT,
        base=base,
        requests=scale_load(base.requests, float(pairs)),
    )
