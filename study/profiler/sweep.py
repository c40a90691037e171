"""The clock sweep behind ``gpugov profile``: lock each clock, measure, record, always reset.

Clocks are locked through the daemon's :class:`~gpugov.daemon.actuator.ClockActuator`
(the ``with`` block resets every GPU it touched on a normal end, on an error and on
SIGTERM/SIGINT), and each lock is kept in the daemon's lock record (``locks.json`` in
the state directory) while it holds, so a sweep killed outright leaves its GPUs named
there for the next ``gpugov run`` or ``gpugov reset-clocks``. After each clock one JSON
line is appended to ``DIR/sweep-state.jsonl``, so ``--resume`` measures only the clocks
still missing. The profile (CSV + manifest) is written from the state file at the end:
:mod:`gpugov.study.profiler.write`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.backend import GpuBackend, clock_tolerance_mhz
from gpugov.daemon.cli_support import UsageError
from gpugov.daemon.files import (
    InputFileError,
    append_line,
    loads_json,
    read_input_text,
    write_bytes_atomic,
    write_text_atomic,
)
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.progress import Progress
from gpugov.daemon.readback import DRIVER_OFFSET_STEPS
from gpugov.plant.input_files import finite_number
from gpugov.study.profiler.fit import fit_decode
from gpugov.study.profiler.measure import (
    DECODE_ATTEMPTS,
    GpuReading,
    GpuSampler,
    Interrupted,
    Measurer,
    ProfileRunError,
    point_dict,
)

log = logging.getLogger(__name__)

STATE_FILE = "sweep-state.jsonl"
MAX_REMEASURES = 2
LOCK_ATTEMPTS = 3
"""Writes of a clock's lock before a sweep gives up on it (a write may fail transiently)."""
DECODE_FIT_MIN_R2 = 0.995
PREFILL_FIT_MIN_R2 = 0.99
"""A prefill whose completion times fit its rate's line worse than this is measured
again (at most ``MAX_REMEASURES`` times); an undisturbed one fits it to 0.999 or better."""
THERMAL_SAMPLE_S = 0.25


@dataclass(frozen=True)
class SweepSettings:
    """What the sweep measures at each clock (recorded in the state file and manifest)."""

    clocks_mhz: tuple[int, ...]
    dwell_s: float = 2.0
    settle_s: float = 0.5
    prefill_prompt_tokens: int = 4096
    prefill_requests: int = 6
    decode_points: tuple[tuple[int, int], ...] = ((8, 128), (64, 128), (16, 768), (32, 384))
    decode_output_tokens: int = 64
    reference_batch: int = 64
    reference_context_tokens: int = 1024

    def header(self) -> dict[str, Any]:
        """JSON-able settings, compared on ``--resume``."""
        out = asdict(self)
        out["clocks_mhz"] = list(self.clocks_mhz)
        out["decode_points"] = [list(p) for p in self.decode_points]
        return out


def default_decode_points(
    reference_batch: int,
    reference_context: int,
    max_model_len: int,
    output_tokens: int = SweepSettings.decode_output_tokens,
) -> tuple[tuple[int, int], ...]:
    """Four design points (batch, prompt tokens) spanning the reference: two batches at a
    short context, and smaller batches at the reference context and half of it (not
    collinear, so the weight, batch and KV terms separate, and the reference point is
    interpolated rather than extrapolated). Each prompt leaves room within
    ``max_model_len`` for the longest output a decode point's retries ask for."""
    limit = max(16, max_model_len - (output_tokens << (DECODE_ATTEMPTS - 1)))
    short = min(128, limit)
    full = max(short + 1, min(reference_context, limit))
    half = max(short + 1, min(reference_context // 2, limit))
    return (
        (max(1, reference_batch // 8), short),
        (reference_batch, short),
        (max(2, reference_batch // 4), full),
        (max(2, reference_batch // 2), half),
    )


def worst_decode_point(points: Sequence[dict[str, Any]]) -> int | None:
    """Index of the decode point the latency fit explains worst, when the fit's R^2 is
    under ``DECODE_FIT_MIN_R2`` or a point is off by more than 3%; else None."""
    rows = [(p["batch"], p["context_tokens"], p["iteration_s"]) for p in points]
    fit = fit_decode(rows)
    relative = [abs(fit.iteration_s(b, c) / t - 1.0) for b, c, t in rows]
    worst = int(max(range(len(rows)), key=lambda i: relative[i]))
    if fit.r_squared < DECODE_FIT_MIN_R2 or relative[worst] > 0.03:
        return worst
    return None


def pick_clocks(supported: Sequence[int], count: int) -> tuple[int, ...]:
    """``count`` supported clocks spread evenly from the highest to the lowest, descending."""
    ordered = sorted(set(int(c) for c in supported))
    if count >= len(ordered):
        return tuple(reversed(ordered))
    if count < 2:
        return (ordered[-1],)
    picks = []
    for index in range(count):
        target = ordered[-1] - (ordered[-1] - ordered[0]) * index / (count - 1)
        distances = [abs(clock - target) for clock in ordered]
        picks.append(ordered[distances.index(min(distances))])
    return tuple(dict.fromkeys(picks))


def read_state(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The header and the clock records of a state file (a last line cut short by an
    interrupted write is ignored).

    Raises:
        UsageError: unreadable, or a line that is not a header or a clock record as the
            sweep writes them (named by line and field): a damaged file is refused, not
            fitted into a profile.
    """
    if not path.exists():
        return None, []
    header = None
    records = []
    try:
        text = read_input_text(path, "state")
    except InputFileError as error:
        raise UsageError(str(error)) from error
    lines = text.split("\n")
    seen: dict[int, int] = {}  # clock -> the line that recorded it
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = loads_json(line)
        except (json.JSONDecodeError, ValueError) as error:
            if number == len(lines):  # no newline after it: a torn last write
                continue
            raise UsageError(f"{path}:{number}: not a JSON line ({error})") from None
        kind = row.get("kind") if isinstance(row, dict) else None
        if kind == "header":
            header = row
            continue
        problem = "not a header or clock record" if kind != "clock" else _record_problem(row)
        if problem is None and row["clock_mhz"] in seen:
            # Fitted twice into one profile: a clock range of one clock, or polyfit's
            # RankWarning on the user's terminal.
            problem = f"{row['clock_mhz']} MHz is recorded again (line {seen[row['clock_mhz']]})"
        if problem is not None:
            raise UsageError(
                f"{path}:{number}: {problem}; remove the line (that clock is measured "
                "again) or the file (--resume then starts over)"
            )
        seen[row["clock_mhz"]] = number
        records.append(row)
    return header, records


def _shown(value: object) -> str:
    """A GPU list or model name for one line: ``0,1`` or the name, quoted and shortened."""
    if isinstance(value, list):
        return ",".join(str(item) for item in value)[:120]
    return repr(str(value)[:120])


def _positive(value: object) -> bool:
    number = finite_number(value)
    return number is not None and number > 0


def _record_problem(row: dict[str, Any]) -> str | None:
    """What makes a clock record unusable (None when it is usable)."""
    clock = row.get("clock_mhz")
    # Only a dry run measures at no clock (None), and it keeps no state: a record without
    # a clock failed writing the profile with a TypeError.
    if not (_positive(clock) and isinstance(clock, int) and not isinstance(clock, bool)):
        return f"clock_mhz is {clock!r}, not a clock in MHz"
    for name in ("realized_clock_mhz", "idle_power_w"):
        if not _positive(row.get(name)):
            return f"{name} is {row.get(name)!r}, not a positive number"
    prefill = row.get("prefill")
    if not isinstance(prefill, dict) or not _positive(prefill.get("tokens_per_s")):
        return "prefill.tokens_per_s is missing or not a positive number"
    if not _positive(prefill.get("power_w")):  # a clock without it is never recorded
        return f"prefill.power_w is {prefill.get('power_w')!r}, not a positive number"
    if finite_number(prefill.get("r_squared")) is None:
        return f"prefill.r_squared is {prefill.get('r_squared')!r}, not a number"
    decode = row.get("decode")
    if not isinstance(decode, list) or not decode:
        return "decode is missing or not a list of design points"
    for index, point in enumerate(decode):
        if not isinstance(point, dict):
            return f"decode[{index}] is not a design point"
        for name in ("batch", "iteration_s", "context_tokens"):
            if not _positive(point.get(name)):
                return f"decode[{index}].{name} is {point.get(name)!r}, not a positive number"
        if "power_w" not in point:
            return f"decode[{index}].power_w is missing (a power in W, or null: no reading)"
        power = point["power_w"]
        if power is not None and not (finite_number(power) is not None and power >= 0):
            return f"decode[{index}].power_w is {power!r}, not a power in W or null"
    return _thermal_problem(row.get("thermal"))


def _thermal_problem(thermal: object) -> str | None:
    """What makes a clock record's ``thermal`` readings unusable for the thermal fit (None
    when each is a ``[time_s, power_w, temperature_c]`` of numbers)."""
    if not isinstance(thermal, list):
        return f"thermal is {thermal!r:.80}, not a list of [time_s, power_w, temperature_c]"
    for index, reading in enumerate(thermal):
        if not (
            isinstance(reading, list)
            and len(reading) == 3
            and all(finite_number(value) is not None for value in reading)
        ):
            return f"thermal[{index}] is {reading!r:.80}, not [time_s, power_w, temperature_c]"
    return None


def _check_readings(record: dict[str, Any]) -> None:
    """Refuse a clock measured without GPU readings (the GPUs stopped answering, and not
    as lost): it was kept, and the sweep went on for every other clock, to fail only when
    the profile was written (or, the first clock, as "the model is too small").

    Raises:
        ProfileRunError: naming the clock and the reading missing.
    """
    missing = [
        name
        for name, value in (
            ("idle power", record["idle_power_w"]),
            ("prefill power", record["prefill"].get("power_w")),
            ("decode power", any(p.get("power_w") for p in record["decode"]) or None),
        )
        if not value
    ]
    if missing:
        raise ProfileRunError(
            f"{record['clock_mhz']} MHz: no {' and no '.join(missing)} reading: the GPUs "
            "gave no readings while it was measured (did a GPU stop answering?); that clock "
            "was not recorded"
        )


def _append(path: Path, row: dict[str, Any]) -> None:
    """Append one record to the state file (a failure, a full disk, raised naming it)."""
    append_line(path, json.dumps(row) + "\n")


@dataclass
class Sweep:
    """One sweep: GPUs, engine, settings, and where the state goes."""

    backends: Sequence[GpuBackend]
    url: str
    model: str
    settings: SweepSettings
    out_dir: Path
    stop: threading.Event = field(default_factory=threading.Event)
    progress_enabled: bool = True
    clock: Callable[[], float] = time.monotonic
    api_key: str | None = field(default=None, repr=False)
    """Sent with every request (``Authorization: Bearer``); never written to the state."""
    lock_state: LockState | None = None
    """Where each lock is recorded until it is reset (``locks.json`` in the state
    directory, :mod:`gpugov.daemon.lockstate`): a sweep killed before its resets leaves its
    GPUs named there, for the next ``gpugov run`` or ``gpugov reset-clocks`` to reset and
    ``gpugov status`` to show. None: nowhere."""
    on_first_lock: Callable[[], None] | None = None
    """Called once, after the sweep's first lock took (the command's warning that no
    record keeps it, said only once there is a lock to keep)."""
    unreset: tuple[str, ...] = field(default=(), init=False)
    """The GPUs whose reset failed at the sweep's end (they may still be locked)."""

    @property
    def state_path(self) -> Path:
        """``DIR/sweep-state.jsonl``."""
        return self.out_dir / STATE_FILE

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted("interrupted")

    def _lock(self, actuator: ClockActuator, clock_mhz: int) -> None:
        """Lock every GPU at ``clock_mhz``, writing again where a write failed transiently
        (the actuator counts it and leaves it to its next call): measured unlocked, the
        GPUs ran at the clock before it, recorded under this one.

        Raises:
            ProfileRunError: a GPU still not locked after :data:`LOCK_ATTEMPTS` writes.
            Interrupted: a stop while waiting to write again.
        """
        missing: list[str] = []
        for attempt in range(LOCK_ATTEMPTS):
            if attempt:
                self._check_stop()
                if self.stop.wait(self.settings.settle_s):
                    raise Interrupted("interrupted")
            actuator.apply(clock_mhz)
            missing = [
                b.label for b in self.backends if actuator.locked_mhz.get(b.label) != clock_mhz
            ]
            if not missing:
                return
        raise ProfileRunError(
            f"{clock_mhz} MHz: the lock could not be set on GPU(s) {','.join(missing)} "
            f"(not locked after {LOCK_ATTEMPTS} tries: its writes failed or hung, the GPU busy "
            "or not answering); that clock was "
            "not measured, --resume measures it"
        )

    def _check_lock_held(
        self, requested_mhz: int | None, measurement: str, readings: Sequence[GpuReading]
    ) -> None:
        """Refuse a measurement a GPU ran above the locked clock for (the median of the
        fastest GPU's clock further above it than a driver holds a lock: another program
        reset one GPU's clocks, the GPU or its emulator restarted, or the lock's write
        failed): its rates and powers are another clock's, and were recorded under this
        one. The fastest GPU's, not the group's mean: one GPU of eight reset to the top
        moved the mean by a few steps only.

        Raises:
            ProfileRunError: naming the clock, the measurement and the clock it ran at.
        """
        clocks = [
            clock
            for r in readings
            if (clock := r.top_sm_clock_mhz or r.sm_clock_mhz) is not None and clock > 0.0
        ]
        if requested_mhz is None or not clocks or not self.backends:
            return  # a dry run locks nothing
        ran = sorted(clocks)[len(clocks) // 2]
        step = clock_tolerance_mhz(self.backends[0].supported_clocks_mhz()) / 2.0
        if ran <= requested_mhz + step * DRIVER_OFFSET_STEPS:
            return
        raise ProfileRunError(
            f"{requested_mhz} MHz: the GPUs ran at {ran:.0f} MHz while its {measurement} "
            "was measured: the lock did not hold (did another program reset the clocks, "
            "or the GPU or its emulator restart?); that clock was not recorded, --resume "
            "measures it again"
        )

    def measure_clock(
        self,
        measurer: Measurer,
        sampler: GpuSampler,
        requested_mhz: int | None,
        on_step: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Idle, prefill and every decode point at the clock now in force; ``on_step``
        is told the name of each of these measurements once it is done."""
        settings = self.settings
        step = on_step or (lambda name: None)
        started = self.clock()
        idle_w, idle_clock = measurer.idle(settings.dwell_s)
        self._check_stop()
        step("idle")
        prefill, prefill_readings = measurer.prefill(
            settings.prefill_prompt_tokens, settings.prefill_requests
        )
        busy_clocks = [r.sm_clock_mhz for r in prefill_readings if r.sm_clock_mhz]
        self._check_lock_held(requested_mhz, "prefill", prefill_readings)
        prefill_remeasured = 0
        while prefill.r_squared < PREFILL_FIT_MIN_R2 and prefill_remeasured < MAX_REMEASURES:
            # Completion times off the line against cumulative prompt tokens: most likely
            # disturbed (a stalled client or server), as a decode point below.
            self._check_stop()
            log.info(
                "%s MHz: the prefill's fit is R^2 %.4f (under %g): measured again",
                requested_mhz if requested_mhz is not None else "current clock",
                prefill.r_squared,
                PREFILL_FIT_MIN_R2,
            )
            again, readings = measurer.prefill(
                settings.prefill_prompt_tokens, settings.prefill_requests
            )
            clocks = [r.sm_clock_mhz for r in readings if r.sm_clock_mhz]
            self._check_lock_held(requested_mhz, "prefill", readings)
            prefill_remeasured += 1
            if again.r_squared > prefill.r_squared:  # the best-explained one is kept
                prefill, busy_clocks = again, clocks
        self._check_stop()
        step("prefill")
        decode = []
        for batch, prompt in settings.decode_points:
            point, readings = measurer.decode(batch, prompt, settings.decode_output_tokens)
            decode.append(point_dict(point))
            clocks = [r.sm_clock_mhz for r in readings if r.sm_clock_mhz]
            self._check_lock_held(requested_mhz, f"decode B={batch}", readings)
            busy_clocks += clocks
            self._check_stop()
            step(f"decode B={batch}")
        remeasured = 0
        while remeasured < MAX_REMEASURES:
            # A point the linear latency model cannot explain was most likely disturbed
            # (a stalled client or server): measure that one again.
            worst = worst_decode_point(decode)
            if worst is None:
                break
            batch, prompt = decode[worst]["batch"], decode[worst]["prompt_tokens"]
            point, readings = measurer.decode(batch, prompt, settings.decode_output_tokens)
            decode[worst] = point_dict(point)
            clocks = [r.sm_clock_mhz for r in readings if r.sm_clock_mhz]
            self._check_lock_held(requested_mhz, f"decode B={batch}", readings)
            busy_clocks += clocks
            remeasured += 1
            self._check_stop()
        ended = self.clock()
        thermal = []
        last = -1e9
        for reading in sampler.window(started, ended):
            if (
                reading.time_s - last >= THERMAL_SAMPLE_S
                and reading.power_w is not None
                and (reading.temperature_c is not None)
            ):
                thermal.append([reading.time_s, reading.power_w, reading.temperature_c])
                last = reading.time_s
        realized = sorted(busy_clocks)[len(busy_clocks) // 2] if busy_clocks else idle_clock
        return {
            "kind": "clock",
            "clock_mhz": requested_mhz,
            "realized_clock_mhz": realized,
            "idle_clock_mhz": idle_clock,
            "idle_power_w": idle_w,
            "prefill": point_dict(prefill),
            "decode": decode,
            "thermal": thermal,
            "duration_s": ended - started,
            "decode_points_remeasured": remeasured,
            "prefill_remeasured": prefill_remeasured,
        }

    def run(
        self, *, resume: bool = False, check_load: Callable[[dict], None] | None = None
    ) -> list[dict]:
        """Measure every clock not yet in the state file; reset the clocks on every way out.

        Returns:
            Every clock record (resumed and new), in measurement order.

        Raises:
            ProfileRunError: the engine failed or the GPU was not loaded (clocks reset).
            Interrupted: SIGTERM/SIGINT (clocks reset, state kept for --resume).
            GpuError: a GPU call failed for good (clocks reset).
        """
        self.out_dir.mkdir(parents=True, exist_ok=True)
        header, records = read_state(self.state_path)
        wanted = self.settings.header()
        if records and not resume:
            raise UsageError(
                f"{self.state_path}: holds {len(records)} measured clock(s) of an earlier "
                "sweep; pass --resume to continue it, or give another --out (nothing was "
                "changed)"
            )
        if records and header is None:
            raise UsageError(
                f"{self.state_path}: clock records without the sweep's header line; "
                "--resume cannot tell their settings (nothing was changed)"
            )
        if resume and header is not None:
            if header.get("settings") != wanted or header.get("url") != self.url:
                raise ProfileRunError(
                    f"{self.state_path}: --resume with different settings or engine than the "
                    "interrupted sweep; rerun with the same flags or without --resume"
                )
            # Another GPU or model would be fitted into one profile with the clocks
            # measured before: refused (a header without them, an older sweep's, passes).
            gpus = [b.label for b in self.backends]
            for what, before, now in (
                ("--gpus", header.get("gpus"), gpus),
                ("served model", header.get("model"), self.model),
            ):
                if before is not None and before != now:
                    raise UsageError(
                        f"{self.state_path}: --resume with {what} {_shown(now)}, the "
                        f"interrupted sweep's was {_shown(before)}; rerun with the same "
                        "GPUs and engine, or give another --out (nothing was changed)"
                    )
            points = len(self.settings.decode_points)
            for record in records:
                if len(record["decode"]) != points:
                    raise UsageError(
                        f"{self.state_path}: the record of {record.get('clock_mhz')} MHz "
                        f"holds {len(record['decode'])} decode points, the sweep's "
                        f"settings {points}"
                    )
            # Only now that it is accepted: a last line cut short by an interrupted write
            # goes, or the next record would be appended to it.
            raw = self.state_path.read_bytes()
            if not raw.endswith(b"\n"):  # atomically: the measured clocks stay whole
                write_bytes_atomic(self.state_path, raw[: raw.rfind(b"\n") + 1])
        else:
            records = []
            started = {
                "kind": "header",
                "settings": wanted,
                "url": self.url,
                "model": self.model,
                "gpus": [b.label for b in self.backends],
                "started_unix_s": time.time(),
            }
            write_text_atomic(self.state_path, json.dumps(started) + "\n")
        done = {r["clock_mhz"] for r in records}
        todo = [c for c in self.settings.clocks_mhz if c not in done]
        sampler = GpuSampler(self.backends)
        measurer = Measurer(self.url, self.model, sampler, api_key=self.api_key, stop=self.stop)
        # Measurements, not clocks, are the progress's units: one clock takes a minute or
        # more, and a line per clock left the first clock without a line or an ETA. Only
        # the clocks still to measure count: resumed ones, "done" at the start, made the
        # rate (and the ETA) as many clocks too fast.
        steps = 2 + len(self.settings.decode_points)
        total_clocks = len(self.settings.clocks_mhz)
        progress = Progress(
            len(todo) * steps, "profile", unit="measurements", enabled=self.progress_enabled
        )
        resumed = f"{len(done)} of {total_clocks} clocks resumed" if done else ""
        progress.update(0, resumed, force=True)
        measured = [0]
        sampler.start()
        actuator = ClockActuator(self.backends, domain="profile", state=self.lock_state)
        on_first_lock = self.on_first_lock
        try:
            try:
                for clock_mhz in todo:
                    self._check_stop()
                    self._lock(actuator, clock_mhz)
                    if on_first_lock is not None:
                        on_first_lock()
                        on_first_lock = None
                    time.sleep(self.settings.settle_s)
                    where = f"{clock_mhz} MHz (clock {len(records) + 1} of {total_clocks})"

                    def step(name: str, where: str = where) -> None:
                        measured[0] += 1
                        progress.update(measured[0], f"{where}: {name} measured", force=True)

                    record = self.measure_clock(measurer, sampler, clock_mhz, on_step=step)
                    sampler.check()  # a GPU lost mid-clock is lost, not one with no readings
                    _check_readings(record)
                    if check_load is not None and not records:
                        check_load(record)
                    records.append(record)
                    _append(self.state_path, record)
                    progress.update(
                        measured[0],
                        f"{clock_mhz} MHz: prefill {record['prefill']['tokens_per_s']:.0f} tok/s",
                        force=True,
                    )
                    sampler.check()
            finally:
                # Kept for the exit line: "clocks reset" is said only when they were.
                self.unreset = tuple(actuator.restore())
                if self.unreset:
                    log.error("domain profile: could not reset GPU(s) %s", ", ".join(self.unreset))
        finally:
            sampler.stop()
            progress.close()
        return records

    def dry_run(self) -> dict[str, Any]:
        """Measure at the clock in force now; lock nothing, reset nothing."""
        sampler = GpuSampler(self.backends)
        measurer = Measurer(self.url, self.model, sampler, api_key=self.api_key, stop=self.stop)
        # Its measurements as the progress's steps: one clock takes a minute at --dwell 5.
        steps = 2 + len(self.settings.decode_points)
        progress = Progress(
            steps, "profile --dry-run", unit="measurements", enabled=self.progress_enabled
        )
        done = [0]

        def step(name: str) -> None:
            done[0] = min(steps, done[0] + 1)
            progress.update(done[0], f"{name} measured")

        progress.update(0, "idle", force=True)
        sampler.start()
        try:
            time.sleep(max(0.2, 2 * sampler.interval_s))
            record = self.measure_clock(measurer, sampler, None, on_step=step)
            sampler.check()  # a GPU lost while it was measured: lost, not a record
            return record
        finally:
            sampler.stop()
            progress.close()


__all__ = [
    "Interrupted",
    "ProfileRunError",
    "Sweep",
    "SweepSettings",
    "default_decode_points",
    "pick_clocks",
    "read_state",
]
