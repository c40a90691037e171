"""``gpugov replay``: feed a recording's observations to another controller, compare.

The replay is open loop: the recorded observations came from the recorded controller's
clocks, so a stateful controller (MPC, reactive) sees a world its own decisions did not
shape. The comparison is still the useful one: where, given the same information, the
two controllers would have asked for different clocks. Both decisions go through the
recording's safety settings (clamp, thermal guard, floor, dwell); fail-safe ticks are
skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from gpugov.controllers.budget import SLOTarget
from gpugov.daemon.config import SLOTargetConfig
from gpugov.daemon.controller_config import ControllerConfig
from gpugov.daemon.controller_spec import canonical_controller_name, spec_name
from gpugov.daemon.decide import (
    ControllerContext,
    Forecasts,
    build_controller,
    close_controller,
    profile_fit_warnings,
)
from gpugov.daemon.progress import Progress
from gpugov.daemon.record import RecordingError
from gpugov.daemon.record_reader import (
    check_header,
    check_ticks,
    observation_from_dict,
    read_recording,
    tick_domain,
)
from gpugov.daemon.roles import ROLES
from gpugov.daemon.safety import (
    DEFAULT_DWELL_S,
    DEFAULT_MIN_RELOCK_INTERVAL_S,
    SafetySettings,
    failsafe_clock,
    held_by_node,
)
from gpugov.daemon.service import CONTROLLER_HISTORY_STEPS
from gpugov.plant.input_files import finite_number
from gpugov.plant.types import ClockController, PowerCapping

PROGRESS_AFTER_S = 2.0
"""A replay shows its progress line (ticks checked, then replayed, with an ETA) once it has
taken this long: a day's recording takes a minute or more, a short one well under a
second."""


@dataclass(frozen=True)
class Difference:
    """One tick where the decisions differ."""

    domain: str
    step: int
    time_s: float
    recorded_mhz: float
    replayed_mhz: float


@dataclass
class ReplayReport:
    """Where the replayed controller's requests differ from the recorded ones."""

    recorded_controller: str
    replayed_controller: str
    compared: int = 0
    skipped_failsafe: int = 0
    differences: list[Difference] = field(default_factory=list)
    abs_diff_sum_mhz: float = 0.0
    recorded_sum_mhz: float = 0.0
    replayed_sum_mhz: float = 0.0
    capped: int = 0
    """Compared ticks where either side held a power cap (the recorded ``power_cap_w``, the
    replayed controller's ``requested_power_cap_w``)."""
    cap_differing: int = 0
    """Of those, ticks where one side held none or the two differ by at least 1 W."""
    recorded_cap_sum_w: float = 0.0
    replayed_cap_sum_w: float = 0.0
    """Summed caps over the ticks where that side held one (for the means)."""
    recorded_cap_ticks: int = 0
    replayed_cap_ticks: int = 0
    settings: list[str] = field(default_factory=list)
    """Each domain's period, safety chain and SLO target, the recording's, in words."""

    @property
    def differing(self) -> int:
        """Ticks whose requests differ by at least 1 MHz."""
        return len(self.differences)

    def ranges(self) -> list[tuple[str, float, float, int]]:
        """Runs of consecutive differing steps of one domain as ``(domain, first time,
        last time, ticks)``, in the order they start: a node's recording interleaves its
        domains' ticks, so a run is a domain's own."""
        runs: list[tuple[str, float, float, int]] = []
        last: dict[str, tuple[int, int]] = {}  # domain -> (its run's index, its last step)
        for diff in self.differences:
            found = last.get(diff.domain)
            if found is not None and diff.step == found[1] + 1:
                domain, start, _, count = runs[found[0]]
                runs[found[0]] = (domain, start, diff.time_s, count + 1)
                last[diff.domain] = (found[0], diff.step)
            else:
                runs.append((diff.domain, diff.time_s, diff.time_s, 1))
                last[diff.domain] = (len(runs) - 1, diff.step)
        return runs

    def format(self, show: int = 10) -> str:
        """A short human report."""
        n = self.compared
        lines = [
            f"replayed {self.compared} decisions of {self.recorded_controller!r} through "
            f"{self.replayed_controller!r} ({self.skipped_failsafe} fail-safe ticks skipped)"
        ]
        lines += [f"  settings            {line}" for line in self.settings]
        if not n:  # means of no decision are no figures
            lines.append("  no decision to compare: every recorded tick held the fail-safe")
            return "\n".join(lines)
        lines += [
            f"  differing ticks     {self.differing} ({100.0 * self.differing / n:.1f} %)",
            f"  mean |difference|   {self.abs_diff_sum_mhz / n:.1f} MHz",
            f"  mean request        recorded {self.recorded_sum_mhz / n:.1f} MHz, "
            f"replayed {self.replayed_sum_mhz / n:.1f} MHz",
        ]
        if self.capped:
            lines.append(
                f"  power cap           held on {self.capped} ticks, differing on "
                f"{self.cap_differing}; mean recorded (as applied) "
                f"{_mean_w(self.recorded_cap_sum_w, self.recorded_cap_ticks)}, "
                f"replayed (as asked) {_mean_w(self.replayed_cap_sum_w, self.replayed_cap_ticks)}"
            )
        runs = self.ranges()
        if runs and show <= 0:  # --show 0: the counts, no list headings over empty lists
            lines.append(f"  differing stretches ({len(runs)})")
        elif runs:
            lines.append(f"  differing stretches ({len(runs)}; first {min(show, len(runs))}):")
            for domain, start, end, count in runs[:show]:
                lines.append(f"    {domain} t = {start:9.1f} .. {end:9.1f} s  ({count} ticks)")
        if self.differences and show > 0:
            lines.append(
                f"  first {min(show, self.differing)} differences (t, recorded -> replayed):"
            )
            for diff in self.differences[:show]:
                lines.append(
                    f"    {diff.domain} t = {diff.time_s:9.1f} s  "
                    f"{diff.recorded_mhz:7.0f} -> {diff.replayed_mhz:7.0f} MHz"
                )
        return "\n".join(lines)


def _mean_w(total: float, ticks: int) -> str:
    return f"{total / ticks:.0f} W" if ticks else "none"


def _requested_cap(controller: ClockController) -> float | None:
    """The power cap ``controller`` asks for after its decision (None: the GPUs' own)."""
    if not isinstance(controller, PowerCapping):
        return None
    cap = controller.requested_power_cap_w
    return None if cap is None else float(cap)


def _compare_caps(report: ReplayReport, recorded: float | None, replayed: float | None) -> None:
    """Fold one tick's power caps (None: the GPUs' own limits) into ``report``."""
    if recorded is None and replayed is None:
        return
    report.capped += 1
    if recorded is not None:
        report.recorded_cap_ticks += 1
        report.recorded_cap_sum_w += recorded
    if replayed is not None:
        report.replayed_cap_ticks += 1
        report.replayed_cap_sum_w += replayed
    if recorded is None or replayed is None or abs(recorded - replayed) >= 1.0:
        report.cap_differing += 1


def _recorded_forecasts(info: dict[str, Any]) -> Forecasts:
    """The forecasts the recorded domain declared to its controller (the header's
    ``context``; a recording from before it, the recorded spec's), so replaying an MPC
    recording through the same MPC rebuilds the controller that made it."""
    known = info.get("context") or {}
    recorded = known.get("forecasts") or info.get("controller_config") or {}

    def number(key: str) -> float | None:
        value = recorded.get(key)
        return float(value) if isinstance(value, int | float) and value > 0 else None

    return Forecasts(
        mean_prompt_tokens=number("mean_prompt_tokens"),
        mean_output_tokens=number("mean_output_tokens"),
        ttft_prompt_tokens=number("ttft_prompt_tokens"),
    )


def _recorded_role(info: dict[str, Any]) -> str:
    """The recorded domain's pool role (``docs/disaggregated.md``); a recording from
    before roles, or with an unknown one, replays as colocated."""
    role = info.get("role")
    return role if isinstance(role, str) and role in ROLES else "colocated"


def _replayed_controller(
    spec: ControllerConfig, info: dict[str, Any], period_s: float, clocks: list[float]
) -> ClockController:
    """The controller ``spec`` asks for, in the recording's safety chain, knowing what the
    recorded domain's controller knew: its GPU names and count (``gpu_names``, ``gpus``,
    for an ``mpc-online`` hint ``gpu = "auto"``; a recording without names: one warning,
    no prior from the name), and the SLOs, limits, GPU UUIDs and forecasts the header's
    ``context`` keeps (a recording from before it: the recorded spec's forecasts alone).
    Like a node's, the chain holds the power budget each recorded observation carries
    (its ``power_limit_w``) by the clock where the recorded domain had a budget
    configured (``power_budget_held``), and otherwise only reports it; it spends the
    recorded domain's ``slo_target`` as the node did. It runs on virtual time, as every
    study does: an outside controller is called directly (no node's decision deadline)
    and an MPC solves within the deterministic budget, so a busy machine cannot change a
    replayed decision; it keeps the history of plans a node keeps
    (:data:`~daemon.service.CONTROLLER_HISTORY_STEPS`).

    Raises:
        RecordingError: the header's ``slo_target`` is not a valid target.
    """
    names = tuple(str(n or "") for n in info.get("gpu_names") or [])
    known = info.get("context") or {}
    context = ControllerContext(
        period_s=period_s,
        supported_clocks_mhz=tuple(float(c) for c in clocks),
        gpu_names=names,
        gpu_uuids=tuple(str(uuid) for uuid in known.get("gpu_uuids") or ()),
        gpu_count=len(info.get("gpus") or []) or 1,
        power_limit_w=known.get("power_limit_w"),
        ttft_slo_s=known.get("ttft_slo_s"),
        tpot_slo_s=known.get("tpot_slo_s"),
        thermal_limit_c=known.get("thermal_limit_c"),
        forecasts=_recorded_forecasts(info),
        role=_recorded_role(info),
        safety=_recorded_safety(info),
        budget_guard=True,
        budget_enforced=bool(info.get("power_budget_held", False)),
        slo_target=_recorded_slo_target(info),
        time_mode="virtual",
        # A day's recording is a day of decisions: keep a node's history, not all of it.
        history_limit=CONTROLLER_HISTORY_STEPS,
    )
    return build_controller(spec, context)


def _recorded_safety(info: dict[str, Any]) -> SafetySettings:
    """The recorded domain's safety chain settings (the defaults where a recording from
    before them carries none)."""
    safety = info.get("safety") or {}
    return SafetySettings(
        floor_mhz=safety.get("floor_mhz"),
        dwell_s=float(safety.get("dwell_s", DEFAULT_DWELL_S)),
        min_relock_interval_s=float(
            safety.get("min_relock_interval_s", DEFAULT_MIN_RELOCK_INTERVAL_S)
        ),
    )


def _settings_line(name: str, info: dict[str, Any], period_s: float) -> str:
    """What the replayed controller of domain ``name`` runs with, in words: the period,
    the chain's dwell and floor and the SLO target, all the recording's."""
    target = _recorded_slo_target(info)
    return f"{name}: every {period_s:g} s, {_recorded_safety(info).words()}, SLO target " + (
        "none" if target is None else f"{100.0 * target.attainment:g}%"
    )


def _recorded_slo_target(info: dict[str, Any]) -> SLOTarget | None:
    """The recorded domain's SLO target (None: none, or a recording from before the
    header carried it)."""
    value = info.get("slo_target")
    if value is None:
        return None
    try:
        return SLOTargetConfig.model_validate(value).target()
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "slo_target"
        raise RecordingError(
            f"domain {info.get('name')!r}: header slo_target {value!r} is not a target "
            f"({where}: {first['msg']})"
        ) from error


def checked_header(
    path: str | Path, header: dict[str, Any]
) -> tuple[float, dict[str, dict[str, Any]]]:
    """The header's period and its domains by name, each checked for what replay reads
    (:func:`gpugov.daemon.record_reader.check_header`, which plot shares).

    Raises:
        RecordingError: a field of the wrong kind, named.
    """
    return check_header(path, header)


def replay(
    path: str | Path,
    spec: ControllerConfig,
    *,
    warn: Callable[[str], None] | None = None,
    progress_stream: TextIO | None = None,
) -> ReplayReport:
    """Replay ``path`` through the controller ``spec`` describes (progress lines with an
    ETA on ``progress_stream``, default stderr).

    Raises:
        RecordingError: the file is not a usable recording.
        ControllerError: the controller cannot be built.
    """
    header, rows = read_recording(path, warn=warn)
    # A line with an ETA on a long replay (an MPC on a day's recording), over the ticks
    # checked and then replayed (checking a day's recording took half a minute without a
    # word), and where a Ctrl-C was swallowed inside a compiled kernel, the point where it
    # is raised again.
    progress = Progress(
        2 * len(rows),
        "replay",
        unit="ticks",
        stream=progress_stream,
        quiet_start_s=PROGRESS_AFTER_S,
    )
    checked = 0

    def counted(where: str, row: dict[str, Any]) -> None:
        nonlocal checked
        checked += 1
        progress.update(checked)

    # The whole recording, before any controller is built (what plot checks too).
    period_s, domains = check_header(path, header)
    check_ticks(path, rows, domains, counted)
    controllers = {}
    try:
        for name, info in domains.items():
            clocks = info["supported_clocks_mhz"]
            try:
                controllers[name] = _replayed_controller(spec, info, period_s, clocks)
            except (TypeError, ValueError, OverflowError, AttributeError) as error:
                raise RecordingError(f"{path}: header, domain {name!r}: {error}") from error
            # As a node says it at its start: an MPC profile that is not its GPUs'.
            gpus = len(info.get("gpus") or []) or 1
            if warn is not None:
                for line in profile_fit_warnings(spec, clocks, gpus):
                    warn(f"domain {name!r}: controller: {line}")
        # Older recordings carry older names (mpc_clock, reactive_governor...): show today's.
        recorded_names = sorted(
            {
                canonical_controller_name(str(info.get("controller", "?")))
                for info in domains.values()
            }
        )
        report = ReplayReport(
            recorded_controller=", ".join(recorded_names),
            replayed_controller=spec_name(spec),
            settings=[_settings_line(name, info, period_s) for name, info in domains.items()],
        )
        for number, row in enumerate(rows, start=2):
            progress.update(len(rows) + number - 2)
            domain = tick_domain(f"{path}:{number}:", row, controllers)
            if row.get("failsafe") or row.get("requested_mhz") is None:
                report.skipped_failsafe += 1
                # The node locked (or unlocked to) the top clock outside the chain, or
                # the clock the thermal guard allowed: its dwell and relock interval
                # count from there, as on the node.
                time_s = finite_number(row.get("time_s"))
                if time_s is not None:
                    clocks = domains[domain]["supported_clocks_mhz"]
                    try:
                        seen = observation_from_dict(row["observation"], clocks)
                    except (KeyError, TypeError, ValueError):
                        seen = None  # as the node, which then held the top clock
                    top = failsafe_clock(controllers[domain], float(max(clocks)), seen)
                    held_by_node(controllers[domain], top, time_s)
                continue
            try:
                observation = observation_from_dict(
                    row["observation"], domains[domain]["supported_clocks_mhz"]
                )
            except KeyError as error:
                raise RecordingError(f"{path}:{number}: the tick has no {error}") from error
            except (TypeError, ValueError) as error:
                raise RecordingError(f"{path}:{number}: bad observation: {error}") from error
            try:
                replayed = float(controllers[domain](observation))
            except Exception as error:  # a controller's failure on one tick: named, no traceback
                raise RecordingError(
                    f"{path}:{number}: the controller failed on this tick: "
                    f"{type(error).__name__}: {error}"
                ) from error
            recorded = finite_number(row["requested_mhz"])
            step = row.get("step", 0)
            if recorded is None or not (isinstance(step, int) and not isinstance(step, bool)):
                raise RecordingError(
                    f"{path}:{number}: requested_mhz must be a number and step an integer, got "
                    f"{row['requested_mhz']!r:.40} and {step!r:.40}"
                )
            cap = row.get("power_cap_w")
            recorded_cap = None if cap is None else finite_number(cap)
            if cap is not None and recorded_cap is None:
                raise RecordingError(
                    f"{path}:{number}: power_cap_w must be a number or null, got {cap!r:.40}"
                )
            _compare_caps(report, recorded_cap, _requested_cap(controllers[domain]))
            report.compared += 1
            report.recorded_sum_mhz += recorded
            report.replayed_sum_mhz += replayed
            report.abs_diff_sum_mhz += abs(replayed - recorded)
            if abs(replayed - recorded) >= 1.0:
                report.differences.append(
                    Difference(
                        domain, int(row.get("step", 0)), observation.time_s, recorded, replayed
                    )
                )
        progress.close(done=progress.total)
        return report
    finally:  # as a node closes its controllers at exit
        for name, controller in controllers.items():
            close_controller(controller, f"domain {name!r}: controller {spec_name(spec)!r}")
