"""A domain's power budget: its sources, the lowest of which wins, and what the node
reports about it (``docs/power-budget.md``).

Sources, each in watts for the whole domain:

* ``config``: the domain's ``power_budget_w``;
* ``file``: the number in ``power_budget_file`` (such as a Kubernetes Downward API
  projection of the pod annotation ``dynamo.nvidia.com/gpu-power-limit``), times the
  domain's GPU count when ``power_budget_file_scope = "gpu"`` (the default: the
  annotation is a per-GPU cap); read every tick through the bounded reader, on a worker
  thread within :data:`~gpugov.daemon.deadline.READ_DEADLINE_S` (a hung mount), and taken
  again when its contents change;
* ``nvml``: the GPUs' enforced power limits (``nvmlDeviceGetEnforcedPowerLimit``), summed,
  as the observation carries them every tick; where gpugov set a GPU's limit itself (a
  controller's power cap, :mod:`daemon.power_limit`), the limit that GPU enforced before
  gpugov's first write, or one someone else set since (:class:`OutsideLimits`): gpugov's
  own cap is no outside budget.

Bad file contents (not one plain decimal number of watts, zero, negative, above
:data:`~gpugov.daemon.limits.MAX_POWER_W` for the domain, or below the domain's lowest
settable power limit), a file that cannot be read or disappears: one log line per new
problem, counted, and the last good value is kept. So does a read that has not finished
within its deadline (a stuck NFS or hostPath mount): one log line when such a hang starts
(at most one a minute, :class:`~gpugov.daemon.episode_log.EpisodeLog`) and one when the
file answers again, counted once per hang; no other read starts while it runs, and its
answer, when it comes, is the next tick's. Where the backend does not report the
lowest settable limit (nvidia-smi, the emulated GPUs), the line that puts a file's
budget in force says it was not checked against it. A failed NVML read keeps
the last NVML value. Every tick the lowest known value is the budget; the node puts it
in the observation's ``power_limit_w``, where the controller and its
:class:`~gpugov.controllers.power_need.BudgetGuard` read it.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from gpugov.controllers.contract import (
    ClockController,
    chain_layer,
    fits_budget,
    power_needed,
)
from gpugov.controllers.power_need import BudgetGuard
from gpugov.daemon.backend import GpuBackend, GpuSample, unwrapped
from gpugov.daemon.deadline import READ_DEADLINE_S, LatestReader, ReadTimeout
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import ConfigError
from gpugov.daemon.gpu_sampling import power_limit_range_w
from gpugov.daemon.limits import MAX_POWER_W
from gpugov.daemon.observer import Observed
from gpugov.plant.input_files import InputFileError, read_input_text

log = logging.getLogger(__name__)

BudgetSource = Literal["config", "file", "nvml"]
SOURCES: tuple[BudgetSource, ...] = ("config", "file", "nvml")
"""Every budget source, in the order a tie is won."""
FileScope = Literal["gpu", "domain"]
BUDGET_CHANGE_LOG_W = 1.0
"""A budget change smaller than this (watts) with the same source is not logged."""
EVENT_LOG_EVERY_S = 60.0
"""At most one over-budget log line per this many seconds (every event is counted)."""


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
"""A plain ASCII decimal number: digits with an optional fraction. Not Python's float()
grammar, which also takes ``1_000``, exponents, ``inf``/``nan`` and any Unicode digits."""


def parse_budget_watts(text: str) -> float:
    """One number of watts, as a budget file holds it (``350``, ``350.5``, ``350W``;
    surrounding whitespace and quotes allowed): ASCII digits with an optional decimal
    fraction, nothing else (no ``1_000``, ``3.5e2``, ``inf`` or non-ASCII digits).

    Raises:
        ValueError: the reason, in words (empty, not a number, not positive, above
            :data:`~gpugov.daemon.limits.MAX_POWER_W`).
    """
    value = text.strip().strip("\"'").strip()
    if not value:
        raise ValueError("is empty (no budget set)")
    number = value[:-1].rstrip() if value[-1] in "wW" else value
    if _DECIMAL.fullmatch(number) is None:
        raise ValueError(
            f"holds {value[:40]!r}, not a number of watts (ASCII digits with an optional "
            "decimal point, e.g. 350 or 350.5)"
        )
    watts = float(number)
    if watts <= 0.0:
        raise ValueError(f"holds {watts:g} W; a budget must be positive")
    if watts > MAX_POWER_W:
        raise ValueError(f"holds {number[:40]} W, above the {MAX_POWER_W:,.0f} W ceiling")
    return watts


@runtime_checkable
class PowerLimitRange(Protocol):
    """A GPU backend that reports the power limits it accepts (NVML's constraints)."""

    def power_limit_constraints_w(self) -> tuple[float, float] | None: ...


@runtime_checkable
class OutsideLimits(Protocol):
    """What the ``nvml`` source reads when gpugov sets power limits itself
    (:class:`daemon.power_limit.PowerLimitActuator`): the domain's enforced limit without
    gpugov's own, from this tick's samples (None: unknown this tick)."""

    def outside_limit_w(self, samples: Sequence[GpuSample]) -> float | None: ...


class BudgetFile:
    """A budget read from a file, re-read when the file changes.

    Args:
        path: the file (one number of watts).
        scale: what the number is multiplied by for the domain (its GPU count for a
            per-GPU value, 1 for a domain value).
        minimum_w: the domain's lowest settable power limit, when known: a smaller
            value is refused.
        domain: the domain's name, for log lines.
        read_deadline_s: how long a read may hold the caller (:class:`LatestReader`).
        clock: monotonic seconds, for a hang's log lines.
    """

    def __init__(
        self,
        path: Path,
        *,
        scale: float = 1.0,
        minimum_w: float | None = None,
        domain: str = "",
        read_deadline_s: float = READ_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.scale = float(scale)
        self.minimum_w = minimum_w
        self.domain = domain
        self.value_w: float | None = None
        """The last good budget (domain watts), None until the file gave one."""
        self.errors = 0
        """Problems met (each new bad content, each time the file became unreadable, each
        read that hung past its deadline)."""
        self.problem: str | None = None
        """What is wrong with the file's contents now, None when its value is in use."""
        self._text: str | None = None
        self._reader: LatestReader[str] = LatestReader(
            self._read_file, read_deadline_s, name=f"budget-{domain}", clock=clock
        )
        self._clock = clock
        self._hung_since_s: float | None = None
        """When the read that hangs now started (None: the last read answered)."""
        self._hangs = EpisodeLog()

    @property
    def hanging(self) -> bool:
        """Whether a read of the file has run past its deadline and is still running (a
        hung disk or mount): the last good value stays in force meanwhile."""
        return self._reader.hanging

    def _read_file(self) -> str:
        """The worker's read: the file, through the bounded reader."""
        return read_input_text(self.path, "budget")

    def read(self) -> float | None:
        """The budget the file gives now: its value when its contents changed and are
        good, else the last good one (None before any). Never raises.

        The file is read every call (one bounded read of a few bytes): a Downward API
        volume swaps in a new file, an editor may rewrite it in place within one
        timestamp tick, and only the contents tell for sure. The read runs on a worker
        thread and is waited for at most the read deadline: one that has not answered by
        then (a hung mount) keeps the last good value, and while it runs no other read
        starts; its answer, once it comes, is the next call's (:class:`LatestReader`)."""
        try:
            text = self._reader.read()
        except ReadTimeout:
            self._hung()
            return self.value_w
        except InputFileError as error:
            self._answered()
            self._text = None
            self._fail(_with_verb(error.reason))
            return self.value_w
        self._answered()
        if text == self._text:
            return self.value_w
        self._text = text
        try:
            watts = parse_budget_watts(text) * self.scale
        except ValueError as error:
            self._fail(str(error))
            return self.value_w
        if watts > MAX_POWER_W:
            self._fail(
                f"gives {watts:,.0f} W for the domain, above the {MAX_POWER_W:,.0f} W ceiling "
                "of any domain (72 GPUs of 1.4 kW draw about 100 kW)"
            )
            return self.value_w
        if self.minimum_w is not None and watts < self.minimum_w - 1e-9:
            self._fail(
                f"gives {watts:g} W for the domain, below the lowest power limit its GPUs "
                f"accept ({self.minimum_w:g} W)"
            )
            return self.value_w
        if self.problem is not None:
            log.warning("domain %s: power budget file %s is good again", self.domain, self.path)
        self.problem = None
        self.value_w = watts
        return watts

    def _hung(self) -> None:
        """A read has not answered within its deadline: at the start of a hang, count it
        and log it (at most one start a minute logged, :class:`EpisodeLog`); the ticks
        it goes on for are neither."""
        if self._hung_since_s is not None:
            return
        now = self._clock()
        self._hung_since_s = now - self._reader.deadline_s  # when the read started
        self.errors += 1
        note = self._hangs.start(now)
        kept = "no budget from it" if self.value_w is None else f"keeping {self.value_w:g} W"
        log.log(
            logging.DEBUG if note is None else logging.WARNING,
            "domain %s: power budget file %s cannot be read: the read has not finished "
            "within %g s (a hung disk or mount); %s, and no other read starts until it "
            "answers%s",
            self.domain,
            self.path,
            self._reader.deadline_s,
            kept,
            note or "",
        )

    def _answered(self) -> None:
        """A read answered: the end of a hang, logged where its start was."""
        since, self._hung_since_s = self._hung_since_s, None
        if since is None:
            return
        log.log(
            logging.WARNING if self._hangs.end() else logging.DEBUG,
            "domain %s: power budget file %s answers again after %.1f s",
            self.domain,
            self.path,
            self._clock() - since,
        )

    def _fail(self, reason: str) -> None:
        """Count and log a new problem once (the same problem again is neither)."""
        if reason == self.problem:
            return
        self.problem = reason
        self.errors += 1
        kept = "no budget from it" if self.value_w is None else f"keeping {self.value_w:g} W"
        log.warning("domain %s: power budget file %s %s; %s", self.domain, self.path, reason, kept)


def _with_verb(reason: str) -> str:
    """The bounded reader's reason as the end of "power budget file PATH ...": "cannot
    be read: ...", "is 5,000 bytes, over the 4 KiB limit ...", "is a directory ..."."""
    prefix = "cannot read budget file: "
    if reason.startswith(prefix):
        return f"cannot be read: {reason[len(prefix) :]}"
    if reason.startswith(("is ", "cannot ")):
        return reason
    if reason.startswith("line "):
        return f"has a {reason}"
    if reason.startswith("binary "):
        return f"holds {reason}"
    return f"is {reason}"  # "5,000 bytes, over ...", "not UTF-8 text ...", "gzip-compressed"


@dataclass(frozen=True)
class BudgetStatus:
    """What the exporter shows about a domain's budget and need after a tick."""

    budget_w: float | None = None
    source: BudgetSource | None = None
    sources_w: Mapping[str, float] = field(default_factory=dict)
    """Every source's current value (domain watts)."""
    need_w: float | None = None
    need_uncertainty_w: float | None = None
    need_clock_mhz: float | None = None
    over_budget: bool = False
    slipping: str = "none"
    over_budget_events_total: int = 0
    over_budget_seconds_total: float = 0.0
    file_errors_total: int = 0
    capped_decisions_total: int = 0

    @property
    def headroom_w(self) -> float | None:
        """Budget less need (negative over budget); None when either is unknown. A need
        over the budget by rounding only fits it (:func:`fits_budget`): 0 W, not -7e-12."""
        if self.budget_w is None or self.need_w is None:
            return None
        headroom = self.budget_w - self.need_w
        return max(headroom, 0.0) if fits_budget(self.need_w, self.budget_w) else headroom


class PowerBudget:
    """One domain's budget sources, the budget in force and its over-budget events.

    Args:
        domain: the domain's name.
        config_w: ``power_budget_w`` (domain watts), or None.
        file: the ``power_budget_file`` reader, or None.
    """

    def __init__(
        self, domain: str, *, config_w: float | None = None, file: BudgetFile | None = None
    ) -> None:
        self.domain = domain
        self.config_w = config_w
        self.file = file
        self.nvml_w: float | None = None
        self.budget_w: float | None = None
        self.source: BudgetSource | None = None
        self.sources_w: dict[str, float] = {}
        self.over_budget = False
        self.slipping = "none"
        self.need_w: float | None = None
        self.need_uncertainty_w: float | None = None
        self.need_clock_mhz: float | None = None
        self.over_budget_events = 0
        self.over_budget_s = 0.0
        self.capped_decisions = 0
        self._last_decision_s: float | None = None
        self._over_since_s: float | None = None
        self._event_logged_s = -math.inf
        self._over_logged = False  # whether this over-budget episode's line was logged

    def resolve(self, nvml_w: float | None) -> float | None:
        """Read the sources and set the budget in force (the lowest); log a change."""
        if nvml_w is not None and math.isfinite(nvml_w) and nvml_w > 0.0:
            self.nvml_w = float(nvml_w)
        values: dict[str, float] = {}
        if self.config_w is not None:
            values["config"] = float(self.config_w)
        if self.file is not None:
            from_file = self.file.read()
            if from_file is not None:
                values["file"] = from_file
        if self.nvml_w is not None:
            values["nvml"] = self.nvml_w
        self.sources_w = values
        if not values:
            self.budget_w, self.source = None, None
            return None
        source = min(SOURCES, key=lambda name: values.get(name, math.inf))
        watts = values[source]
        before, before_source = self.budget_w, self.source
        if before is None or source != before_source or abs(watts - before) >= BUDGET_CHANGE_LOG_W:
            unchecked = source == "file" and self.file is not None and self.file.minimum_w is None
            log.info(
                "domain %s: power budget %.0f W (from %s%s)%s",
                self.domain,
                watts,
                source,
                "; not checked against the GPUs' lowest settable power limit, which their "
                "backend does not report"
                if unchecked
                else "",
                "" if before is None else f", was {before:.0f} W (from {before_source})",
            )
        self.budget_w, self.source = watts, source
        return watts

    @property
    def configured(self) -> bool:
        """Whether a budget is configured beyond the GPUs' own limits (``config`` or
        ``file``): only then does the guard hold it by the clock."""
        return self.config_w is not None or self.file is not None

    def apply(self, observed: Observed, outside: OutsideLimits | None = None) -> Observed:
        """``observed`` with the budget in force as the observation's ``power_limit_w``
        (the NVML limits it carried are one of the sources; with ``outside``, the limits
        gpugov did not set itself)."""
        nvml_w = (
            observed.observation.power_limit_w
            if outside is None
            else outside.outside_limit_w(observed.gpu_samples)
        )
        budget = self.resolve(nvml_w)
        if budget is None:
            return observed
        return replace(observed, observation=replace(observed.observation, power_limit_w=budget))

    def after_decision(self, controller: ClockController, now_s: float) -> None:
        """Take the controller's need after a decision and follow the over-budget state:
        an event (counted, and one log line at most every :data:`EVENT_LOG_EVERY_S`) when
        the budget falls below the need, a line when it no longer is."""
        guard = chain_layer(controller, BudgetGuard)
        if guard is not None:
            need = guard.last_need
        else:
            try:
                need = power_needed(controller)
            except Exception as error:  # a controller's own estimate: never stops the loop
                log.debug("domain %s: power_needed raised %r", self.domain, error)
                need = None
        self.need_w = None if need is None else need.watts
        self.need_uncertainty_w = None if need is None else need.uncertainty_w
        self.need_clock_mhz = None if need is None else need.clock_mhz
        if guard is not None:
            self.capped_decisions = guard.capped_decisions
        budget = self.budget_w
        if guard is not None:
            over, self.slipping = guard.over_budget, guard.slipping
            budget = guard.last_budget_w
        else:
            over = need is not None and budget is not None and not need.fits(budget)
            self.slipping = "ttft" if over else "none"
        if self.over_budget and self._last_decision_s is not None:
            self.over_budget_s += max(0.0, now_s - self._last_decision_s)
        self._last_decision_s = now_s
        if over and not self.over_budget:
            self.over_budget_events += 1
            self._over_since_s = now_s
            self._over_logged = False
        if over and not self._over_logged:
            # An episode the rate limit kept quiet is logged once the minute has passed.
            if (
                need is not None
                and budget is not None
                and (now_s - self._event_logged_s >= EVENT_LOG_EVERY_S)
            ):
                self._event_logged_s = now_s
                self._over_logged = True
                shown_budget, shown_need = distinct_watts(budget, need.watts)
                log.warning(
                    "domain %s: over budget: the power budget %s W (from %s) is below the "
                    "%s W (+/- %.0f W) the SLO needs at this load (%.0f MHz); %s",
                    self.domain,
                    shown_budget,
                    self.source,
                    shown_need,
                    need.uncertainty_w,
                    need.clock_mhz,
                    "TTFT of queued requests slips, TPOT of running requests is held"
                    if self.slipping == "ttft"
                    else "TTFT and TPOT slip (the budget is below what decoding needs)",
                )
        elif not over and self.over_budget and self._over_since_s is not None and self._over_logged:
            # Only the end of an episode whose over-budget line was logged: a flap the
            # rate limit kept quiet said "within ... again after 0 s" with no line before.
            log.info(
                "domain %s: within the power budget again after %.0f s over it",
                self.domain,
                now_s - self._over_since_s,
            )
        self.over_budget = over

    def status(self) -> BudgetStatus:
        """The exporter's view."""
        return BudgetStatus(
            budget_w=self.budget_w,
            source=self.source,
            sources_w=dict(self.sources_w),
            need_w=self.need_w,
            need_uncertainty_w=self.need_uncertainty_w,
            need_clock_mhz=self.need_clock_mhz,
            over_budget=self.over_budget,
            slipping=self.slipping,
            over_budget_events_total=self.over_budget_events,
            over_budget_seconds_total=self.over_budget_s,
            file_errors_total=0 if self.file is None else self.file.errors,
            capped_decisions_total=self.capped_decisions,
        )


def distinct_watts(lower: float, higher: float) -> tuple[str, str]:
    """Two different wattages printed with the fewest decimals that tell them apart (none
    to two, more for a gap under 0.005 W), so a need over the budget never reads "700 W
    is below the 700 W"."""
    for decimals in range(16):
        shown = (f"{lower:.{decimals}f}", f"{higher:.{decimals}f}")
        if shown[0] != shown[1]:
            return shown
    return repr(lower), repr(higher)


def domain_power_limit_range(
    backends: Sequence[GpuBackend], read_deadline_s: float | None = None
) -> tuple[float, float] | None:
    """The domain's summed (lowest, highest) settable power limits, when every GPU
    reports them (:class:`PowerLimitRange`: NVML, each read within ``read_deadline_s``)."""
    low = high = 0.0
    for backend in backends:
        inner = unwrapped(backend)
        if not isinstance(inner, PowerLimitRange):
            return None
        limits = power_limit_range_w(inner, read_deadline_s)
        if limits is None:
            return None
        low += limits[0]
        high += limits[1]
    return low, high


def domain_budget(
    name: str,
    backends: Sequence[GpuBackend],
    *,
    config_w: float | None = None,
    file: Path | None = None,
    file_scope: FileScope = "gpu",
    read_deadline_s: float | None = None,
) -> PowerBudget:
    """A domain's :class:`PowerBudget` from its config: ``power_budget_w``,
    ``power_budget_file`` (a per-GPU number times the GPU count, or the domain's) and the
    NVML limits the observations carry. The GPUs' settable limits are read only for a
    budget of the config or a file (its lowest value), each within ``read_deadline_s``.

    Raises:
        ConfigError: ``power_budget_w`` is below the lowest power limit the domain's GPUs
            accept (NVML's constraints, where the backend reports them).
    """
    limits = (
        None
        if config_w is None and file is None
        else domain_power_limit_range(backends, read_deadline_s)
    )
    minimum = None if limits is None else limits[0]
    if config_w is not None and minimum is not None and config_w < minimum - 1e-9:
        raise ConfigError(
            f"domain {name!r}: power_budget_w ({config_w:g} W) is below the lowest power "
            f"limit its {len(backends)} GPU(s) accept ({minimum:g} W together)"
        )
    reader = None
    if file is not None:
        scale = float(len(backends)) if file_scope == "gpu" else 1.0
        reader = BudgetFile(file, scale=scale, minimum_w=minimum, domain=name)
    return PowerBudget(name, config_w=config_w, file=reader)


def check_configured_cap(
    name: str,
    cap_w: float | None,
    backends: Sequence[GpuBackend],
    *,
    read_deadline_s: float | None = None,
) -> None:
    """Refuse a controller's configured power cap (``controller.cap_w`` of ``power-cap``
    and ``power-profile``) below the lowest power limit the domain's GPUs accept together
    (NVML's constraints, where the backend reports them, each read within
    ``read_deadline_s``): NVML refuses such a limit, and clamping it to the lowest one
    would hold a cap the config does not state.

    Raises:
        ConfigError: naming the domain, the field and both wattages.
    """
    if cap_w is None:
        return
    limits = domain_power_limit_range(backends, read_deadline_s)
    if limits is None:
        return
    minimum = limits[0]
    if cap_w < minimum - 1e-9:
        raise ConfigError(
            f"domain {name!r}: controller.cap_w ({cap_w:g} W) is below the lowest power "
            f"limit its {len(backends)} GPU(s) accept ({minimum:g} W together; NVML refuses "
            "a lower one)"
        )


__all__ = [
    "EVENT_LOG_EVERY_S",
    "SOURCES",
    "BudgetFile",
    "BudgetSource",
    "BudgetStatus",
    "FileScope",
    "OutsideLimits",
    "PowerBudget",
    "PowerLimitRange",
    "check_configured_cap",
    "distinct_watts",
    "domain_budget",
    "domain_power_limit_range",
    "parse_budget_watts",
]
