"""``gpugov status``: the backend's GPUs, lock permission and the engines' reachability, read
only. One command's own responsibility, so its own module; :mod:`daemon.node_cli` registers it."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.cli_support import UsageError, check_engine_url, fail
from gpugov.daemon.config import load_config
from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.errors import (
    EngineHttpError,
    EngineParseError,
    EngineUnavailable,
    ExitCode,
    GpuCallHung,
    GpuUnavailable,
    NotSupported,
    printable,
)
from gpugov.daemon.gpu_hold import holder_of
from gpugov.daemon.node_support import (
    GPU_CALL_DEADLINE_S,
    backend_choice,
    bounded_gpu_call,
    gpu_calls,
    gpu_indices,
    gpu_lister,
    guarded,
    write_path_status,
)
from gpugov.daemon.nvml import NvmlBackend, load_pynvml
from gpugov.daemon.scrape import MAX_PAGE_BYTES
from gpugov.plant.input_files import finite_number

T = TypeVar("T")

CAP_SYS_ADMIN = 21
SPLIT_BACKENDS = ("actuator", "zeusd")
"""Backends whose clock writes go through another process (docs/actuator.md)."""


def may_lock_clocks(status_path: str | Path = "/proc/self/status") -> bool:
    """Whether this process holds CAP_SYS_ADMIN (what NVML checks), else whether it is root."""
    try:
        for line in Path(status_path).read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return hasattr(os, "geteuid") and os.geteuid() == 0


class UnreadableLockRecord(Exception):
    """The state directory's lock record is there but cannot be read; the message names
    it and why."""


def held_by_gpugov(state_dir: Path | None, uuids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per GPU key of ``uuids`` (a UUID, or the GPU as a backend without UUIDs names
    it), what a gpugov run recorded it holds there (:func:`recorded_holds`)."""
    wanted = set(uuids)
    return {key: held for key, held in recorded_holds(state_dir).items() if key in wanted}


def recorded_holds(state_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Per GPU key of ``state_dir``'s lock state file (:mod:`daemon.lockstate`: its UUID,
    or the GPU as a backend without UUIDs names it), what a gpugov run recorded it holds
    there: its clock lock, the power limit it set and the one before, its pid and
    whether it still runs (and, as ``gpu``, the GPU as the run named it); empty without
    a state directory this user may read, or a record. Read only: a record whose run is
    gone is what its next start (or ``gpugov reset-clocks``) undoes."""
    from gpugov.daemon.files import loads_json, read_input_text
    from gpugov.daemon.lockstate import STATE_FILE, LockState, live_writer, recorded_pid

    if state_dir is None:
        return {}
    path = state_dir / STATE_FILE
    try:
        if not path.exists():
            return {}
        # Readable and JSON at all: the record's own reader says why not.
        loads_json(read_input_text(path, "state"), unique_keys=False)
    except (OSError, ValueError) as error:  # InputFileError and a JSON error too
        # A state directory or record only the daemon's user may read (0700, 0600), or
        # a damaged one: nothing shown read as nothing held.
        if isinstance(error, json.JSONDecodeError):
            why = f"not a lock record: {error.msg} at line {error.lineno}"
        elif isinstance(error, OSError):
            why = error.strerror or str(error)
        else:
            why = str(error).removeprefix(f"{path}: ")
        raise UnreadableLockRecord(
            f"{path}: cannot read it ({why}): what a gpugov run recorded it holds is not "
            "shown; run status as the daemon's user or root"
        ) from None
    state = LockState(state_dir)
    held: dict[str, dict[str, Any]] = {}
    for uuid in sorted({*state.read(), *state.power_limits()}):
        lock, limit = state.get(uuid), state.get_power_limit(uuid)
        if lock is None and limit is None:
            continue
        entries = [entry for entry in (lock, limit) if entry is not None]
        writer = next((e for e in entries if recorded_pid(e) is not None), None)
        pid = None if writer is None else recorded_pid(writer)
        held[uuid] = {
            "clock_lock_mhz": None if lock is None else [lock.get("min_mhz"), lock.get("max_mhz")],
            "power_limit_w": _watts(None if limit is None else limit.get("set_mw")),
            "power_limit_before_w": None if limit is None else limit["original_mw"] / 1000.0,
            "pid": pid,
            "running": writer is not None and live_writer(writer),
            "gpu": str(entries[0].get("gpu", uuid)),
        }
    return held


def gpu_key_of(row: dict[str, Any]) -> str:
    """The key a run's lock record names a listed GPU by: its UUID, else (a backend
    that gives none, such as nvidia-smi, whose runs key it as configured) its index."""
    uuid = row.get("uuid")
    return str(uuid) if uuid else str(row.get("index"))


def gpu_status(
    nvml: Any = None,
    *,
    backend_kind: str = "nvml",
    emulator: str | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Per GPU of the backend (``nvml``, ``nvidia-smi`` or ``emulated`` at ``emulator``):
    name, UUID, supported clock range, current clock, power, temperature; each row is
    appended to ``rows`` (when given) as it is read.

    Every GPU call runs on a worker thread, waited for as ``run``'s start waits: listing
    the GPUs and opening one (they initialise NVML) at most
    :data:`~daemon.gpu_open.GPU_OPEN_DEADLINE_S`, the others (the clocks' list, a sample,
    the close) :data:`~daemon.node_support.GPU_CALL_DEADLINE_S`. A call that hangs ends
    the listing (the GPUs after it would queue behind it in the driver); its GPU is not
    closed (NVML is not shut down under the hung call).

    Raises:
        GpuUnavailable: no driver or library, no nvidia-smi, or no emulator answering;
            GpuCallHung: a call past its deadline, naming its GPU.
    """
    from gpugov.daemon.gpu_open import GPU_OPEN_DEADLINE_S

    rows = [] if rows is None else rows
    listed = bounded_gpu_call(
        lambda: gpu_indices(backend_kind, emulator, nvml, GPU_OPEN_DEADLINE_S),
        "list the GPUs",
        GPU_OPEN_DEADLINE_S,
    )
    for index in listed:
        calls = gpu_calls(index)

        def call(target: Callable[[], T], what: str, deadline_s: float = GPU_CALL_DEADLINE_S) -> T:
            return bounded_gpu_call(target, what, deadline_s, gpu=index, calls=calls)  # noqa: B023

        backend = call(
            lambda: _open_for_status(index, backend_kind, nvml, emulator),  # noqa: B023
            "open",
            GPU_OPEN_DEADLINE_S,
        )
        hung = False
        try:
            try:
                clocks = call(backend.supported_clocks_mhz, "list supported clocks")
                clock_range: list[int] | None = [clocks[0], clocks[-1]]
                count: int | None = len(clocks)
            except GpuCallHung:
                raise
            except (NotSupported, GpuUnavailable):
                clock_range, count = None, None
            sample = call(backend.sample, "read")
            rows.append(
                {
                    "index": index,
                    "name": getattr(backend, "name", None),
                    "uuid": getattr(backend, "uuid", None),
                    "supported_clock_range_mhz": clock_range,
                    "supported_clock_count": count,
                    "sm_clock_mhz": sample.sm_clock_mhz,
                    "power_w": sample.power_w,
                    "temperature_c": sample.temperature_c,
                    "utilization": sample.utilization,
                    "power_limit_w": sample.power_limit_w,
                    "clock_event_reasons": sample.clock_event_reasons,
                }
            )
        except GpuCallHung:
            hung = True
            raise
        finally:
            if not hung:
                call(backend.close, "close")
    return rows


def _open_for_status(index: int, kind: str, nvml: Any, emulator: str | None) -> GpuBackend:
    """One GPU of the backend, opened as ``run`` opens it (its clocks are listed later,
    so a GPU that lists none is still shown)."""
    if kind == "emulated":
        from gpugov.daemon.emulated import EmulatedBackend

        return EmulatedBackend(index, emulator=str(emulator))
    if kind == "nvidia-smi":
        from gpugov.daemon.nvidia_smi import NvidiaSmiBackend

        return NvidiaSmiBackend(index)
    return NvmlBackend(index, nvml=nvml)


def engine_status(
    url: str, kind: str = "auto", timeout_s: float = 1.0, max_page_bytes: int = MAX_PAGE_BYTES
) -> dict[str, Any]:
    """Whether the engine's metrics page answers, and its queue if it does. An engine that
    answers with an HTTP error or a page that is not its metrics is reachable: ``answer``
    says which (``"http_error"``, ``"not_a_metrics_page"``), ``error`` what came. A
    configured domain's engine is read with its ``timeout_s`` and ``max_page_bytes``, as
    ``run`` reads it."""
    source = ScrapedSource(
        url,
        kind,  # type: ignore[arg-type]
        timeout_s=timeout_s,
        max_page_bytes=max_page_bytes,
    )
    try:
        sample = source.scrape()
    except EngineHttpError as error:
        return {"url": url, "reachable": True, "answer": "http_error", "error": str(error)}
    except EngineParseError as error:
        return {
            "url": url,
            "reachable": True,
            "answer": "not_a_metrics_page",
            "error": str(error),
        }
    except EngineUnavailable as error:
        return {"url": url, "reachable": False, "error": str(error)}
    return {
        "url": url,
        "reachable": True,
        "engine": sample.engine,
        "waiting": sample.waiting_requests,
        "running": sample.running_requests,
        "role": sample.role,  # the pool role its labels state (docs/disaggregated.md)
    }


@guarded
def cmd_status(args: argparse.Namespace) -> int:
    """``gpugov status``: the GPUs of the backend the flags or the config name (NVML by
    default), lock permission, and the engines' reachability."""
    for url in args.engine_url or []:
        check_engine_url(url)
    if args.governor_metrics is not None:
        from gpugov.daemon.energy_report import check_metrics_url

        try:
            check_metrics_url(args.governor_metrics)
        except ValueError as error:
            raise UsageError(f"--governor-metrics {error}") from error
    config = load_config(args.config) if args.config else None
    kind, emulator = backend_choice(args.backend, args.emulator, config)
    emulated = kind == "emulated"
    split = kind in SPLIT_BACKENDS and config is not None
    if split:
        # The actuator (or zeusd) writes the clocks: whether it answers this user is the
        # governor's permission, not this process's capabilities.
        allowed, write_path = write_path_status(config.daemon)  # type: ignore[union-attr]
    else:
        # Emulated GPUs take locks from anyone (NVML's permission check is not emulated).
        allowed, write_path = (True if emulated else may_lock_clocks()), None
    report: dict[str, Any] = {
        "backend": kind,
        **({"emulator": emulator} if emulated else {}),
        "may_lock_clocks": allowed,
        **({"write_path": write_path} if split else {}),
        "gpus": [],
        "engines": [],
    }
    code = ExitCode.OK
    try:
        gpu_status(
            None if kind != "nvml" else load_pynvml(),
            backend_kind=kind,
            emulator=emulator,
            rows=report["gpus"],  # the GPUs read before one that hangs are shown
        )
    except GpuUnavailable as error:
        report["gpu_error"] = str(error)
    if not report["gpus"] and "gpu_error" not in report:
        # A driver (or emulator) that answers with no GPU: read as a node ready to govern.
        report["gpu_error"] = f"{gpu_lister(kind)} lists no GPU on this node"
    if "gpu_error" in report:
        code = ExitCode.NO_GPU
        if emulated:
            # The emulator takes locks from anyone, but only while it answers: one that
            # is down or hangs takes none (its "yes" read as a node ready to govern).
            report["may_lock_clocks"] = allowed = False
    from gpugov.daemon.files import resolve_state_dir
    from gpugov.daemon.lockstate import NewerLockRecord

    state_dir = resolve_state_dir(config.daemon.state_dir if config else None)
    try:
        held = recorded_holds(state_dir)
    except (NewerLockRecord, UnreadableLockRecord) as refused:  # the GPUs still shown
        held, report["lock_record_error"] = {}, str(refused)
    for gpu in report["gpus"]:
        mine = held.pop(gpu_key_of(gpu), None)
        gpu["held_by_gpugov"] = None if mine is None else _without_gpu(mine)
        # The gpugov governing it now, by the GPU's hold (one governor per GPU).
        gpu["governed_by"] = holder_of(str(gpu.get("uuid") or ""), kind, emulator=emulator)
    # What no listed GPU matches (a GPU gone or not listed, one keyed by its UUID while
    # this backend gives none) is shown all the same: status is where to check them.
    if held:
        report["held_elsewhere"] = [{"key": key, **entry} for key, entry in held.items()]
    engines: list[tuple[str, str, float, int]] = [
        (url, "auto", 1.0, MAX_PAGE_BYTES) for url in args.engine_url or []
    ]
    if config is not None:
        engines += [
            (d.engine.url, d.engine.kind, d.engine.timeout_s, d.engine.max_page_bytes)
            for d in config.domains
        ]
    report["engines"] = [engine_status(*engine) for engine in engines]
    if args.governor_metrics is not None:
        from gpugov.daemon.energy_report import governor_energy

        report["energy"] = governor_energy(args.governor_metrics)
    if args.json:
        print(json.dumps(report, indent=1))
        return _said_on_stderr(report, code)
    if emulated and not allowed:
        line = f"no (the emulated GPUs cannot be read: {report['gpu_error']})"
    elif emulated:
        line = f"yes (emulated GPUs at {emulator})"
    elif split:
        line = f"{'yes' if allowed else 'no'} (through the {kind}: {write_path})"
    else:
        line = "yes" if allowed else "no (needs root or CAP_SYS_ADMIN)"
    _say(f"may lock clocks: {line}")
    if "gpu_error" in report:
        _say(f"GPUs: unavailable: {report['gpu_error']}")
    if "lock_record_error" in report:
        _say(f"lock record: not read: {report['lock_record_error']}")
    for gpu in report["gpus"]:
        clock_range = gpu["supported_clock_range_mhz"]
        span = f"{clock_range[0]}-{clock_range[1]} MHz" if clock_range else "not reported"
        who = " ".join(str(part) for part in (gpu["name"], gpu["uuid"]) if part) or "?"
        _say(
            f"GPU {gpu['index']}: {who}; supported {span}; "
            f"now {_num(gpu['sm_clock_mhz'], 'MHz')}, {_num(gpu['power_w'], 'W')}, "
            f"{_num(gpu['temperature_c'], 'C')}"
        )
        if gpu["governed_by"] is not None:
            _say(f"  governed now by gpugov ({gpu['governed_by']})")
        if gpu["held_by_gpugov"] is not None:
            _say(f"  {_held_line(gpu['held_by_gpugov'])}")
    for entry in report.get("held_elsewhere", []):
        _say(
            f"GPU {entry['gpu']} ({entry['key']}), matched to no GPU listed (gone, or "
            f"recorded by a key this backend does not show): {_held_line(entry)}"
        )
    for engine in report["engines"]:
        if engine.get("answer") == "http_error":
            _say(
                f"engine {engine['url']}: reachable, but answered with an error: {engine['error']}"
            )
        elif engine.get("answer") == "not_a_metrics_page":
            _say(
                f"engine {engine['url']}: reachable, but its answer is not a metrics page "
                f"gpugov can read: {engine['error']}"
            )
        elif engine["reachable"]:
            role = f", labels say role {engine['role']}" if engine.get("role") else ""
            _say(
                f"engine {engine['url']}: reachable ({engine['engine']}, "
                f"{engine['waiting']} waiting, {engine['running']} running{role})"
            )
        else:
            _say(f"engine {engine['url']}: unreachable: {engine['error']}")
    if "energy" in report:
        from gpugov.daemon.energy_report import energy_lines

        for energy_line in energy_lines(report["energy"]):
            _say(energy_line)
    return _said_on_stderr(report, code)


def _say(line: str) -> None:
    """Print one line of the report: a GPU's NVML name and UUID, an engine's URL and
    answer are outside text, escaped and bounded (:func:`~gpugov.daemon.errors.printable`)."""
    print(printable(line))


def _said_on_stderr(report: dict[str, Any], code: int) -> int:
    """``code``, once the GPUs' failure (the report's ``gpu_error``, which stdout carries
    in the report) is also the one error line on stderr, where a script or a unit's log
    looks for why the exit code is not 0."""
    if "gpu_error" in report:
        return fail(f"GPUs unavailable: {report['gpu_error']}", code)
    return code


def _without_gpu(held: dict[str, Any]) -> dict[str, Any]:
    """A listed GPU's ``held_by_gpugov``: :func:`recorded_holds`' entry less ``gpu``
    (the row names the GPU)."""
    return {name: value for name, value in held.items() if name != "gpu"}


def _watts(milliwatts: object) -> float | None:
    """A recorded limit in mW as watts; None where the record holds no number (a hand
    edit, a bad disk: status shows ``?``, never a traceback)."""
    value = finite_number(milliwatts)
    return None if value is None else value / 1000.0


def _held_line(held: dict[str, Any]) -> str:
    """One line on what a gpugov run recorded it holds on a GPU."""
    parts = []
    if held["clock_lock_mhz"] is not None:
        low, high = held["clock_lock_mhz"]
        # A damaged record keeps the lock but not its clocks (daemon.lockstate).
        known = low is not None and high is not None
        parts.append(f"clock lock {low}-{high} MHz" if known else "clock lock (clocks unknown)")
    if held["power_limit_before_w"] is not None:
        before, now = held["power_limit_before_w"], held["power_limit_w"]
        limit = "?" if now is None else f"{now:g}"
        parts.append(f"power limit {limit} W ({before:g} W before)")
    who = f"pid {held['pid']}" if held["pid"] is not None else "pid unknown"
    if held["running"]:
        state = f"{who}, running"
    else:
        state = f"{who}, not running: its next start or `gpugov reset-clocks` undoes it"
    return f"held by a gpugov run ({state}): {'; '.join(parts)}"


def _num(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.0f} {unit}"
