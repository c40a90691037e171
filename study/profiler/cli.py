"""``gpugov profile``: sweep locked clocks under controlled load and write a GPU profile."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpugov.daemon import cli_types
from gpugov.daemon.cli_support import UsageError, fail, parse_gpu_list
from gpugov.daemon.errors import ExitCode, printable
from gpugov.daemon.files import write_text_atomic
from gpugov.daemon.limits import MAX_CLOCK_MHZ
from gpugov.plant.input_files import plain_number_text

if TYPE_CHECKING:
    from gpugov.daemon.lockstate import LockState

EXIT_RUNTIME, EXIT_PERMISSION, EXIT_NO_GPU, EXIT_GPU_LOST, EXIT_NOT_RESET, EXIT_INTERRUPTED = (
    ExitCode.FAILURE,
    ExitCode.PERMISSION,
    ExitCode.NO_GPU,
    ExitCode.GPU_LOST,
    ExitCode.NOT_RESET,
    ExitCode.INTERRUPTED,
)


def _check_emulator_speed(
    emulator: str, flag: str = "--emulator", api_key: str | None = None
) -> None:
    """Refuse an emulator that runs faster than real time (``gpugov emulate --speed X``):
    a profile measures wall-clock rates, so every rate would be X times the plant's. One
    that does not answer is left to the backend's own error (exit 4).

    Raises:
        UsageError: the emulator's speed is not 1.
    """
    from gpugov.daemon.emulated import emulated_speed
    from gpugov.daemon.errors import GpuUnavailable

    try:
        speed = emulated_speed(emulator, api_key=api_key)
    except GpuUnavailable:
        return
    if speed is not None and speed != 1.0:
        raise UsageError(
            f"{flag} {emulator}: gpugov emulate runs at --speed {speed:g} (plant seconds "
            f"per wall second); a profile measures wall-clock rates, so its rates would be "
            f"{speed:g} times the plant's: run the emulator at --speed 1; nothing was changed"
        )


def profile_status(backend: str, engine_url: str, api_key: str | None = None) -> str:
    """The written profile's ``status``: ``emulated`` when the GPUs are emulated or the
    engine is ``gpugov emulate`` (its rates and powers are then the simulated plant's,
    whatever GPU backend read them), else ``measured``: an emulated run is never
    presented as a measurement of hardware."""
    from gpugov.daemon.emulated import emulated_device_count
    from gpugov.daemon.errors import GpuUnavailable

    if backend == "emulated":
        return "emulated"
    try:
        # gpugov emulate answers GET /gpu with its GPU count; an engine does not.
        emulated_device_count(engine_url.rstrip("/").removesuffix("/v1"), api_key=api_key)
    except GpuUnavailable:
        return "measured"
    return "emulated"


def _check_one_emulated_engine(
    engine_base: str, gpus: list[int | str], api_key: str | None = None
) -> None:
    """Refuse a sweep whose engine is ``gpugov emulate`` serving several engine replicas
    (it spreads the requests over them, and the locked GPUs run only some), or whose
    ``--gpus`` are not its one replica's GPUs (a tensor-parallel group runs at its
    slowest GPU's clock, and the powers would be some GPUs' of the group's rates). Not
    an emulator: left alone.

    Raises:
        UsageError: naming the flag and the GPUs to list.
    """
    from gpugov.daemon.emulated import emulated_gpu_roles, emulated_replicas
    from gpugov.daemon.errors import GpuUnavailable

    try:
        groups = emulated_replicas(engine_base, api_key=api_key)
        roles = emulated_gpu_roles(engine_base, api_key=api_key)
    except GpuUnavailable:
        return
    if not groups:
        return
    known = {gpu for group in groups for gpu in group}
    if not all(gpu in known for gpu in gpus):
        return  # a GPU the emulator does not have: the backend says so (exit 4)
    if roles:
        # Pools, not replicas: each request's prefill runs on one and its decode on the
        # other, so no lock on some of the GPUs measures one engine.
        pools = ", ".join(
            f"{role} GPUs {','.join(str(gpu) for gpu in sorted(roles) if roles[gpu] == role)}"
            for role in dict.fromkeys(roles[gpu] for gpu in sorted(roles))
        )
        raise UsageError(
            f"--engine-url {engine_base}: gpugov emulate serves a disaggregated layout "
            f"({pools}): each request's prefill and decode run in different pools, and a "
            "profile measures one colocated engine: run the emulator without --layout; "
            "nothing was changed"
        )
    if len(groups) > 1:
        listed = "; ".join(",".join(str(gpu) for gpu in group) for group in groups)
        raise UsageError(
            f"--engine-url {engine_base}: gpugov emulate serves {len(groups)} engine "
            f"replicas (GPUs {listed}) and spreads the requests over them; a profile "
            "measures one engine: run the emulator with one replica; nothing was changed"
        )
    group = groups[0]
    if all(isinstance(gpu, int) for gpu in gpus) and sorted(gpus) != sorted(group):  # type: ignore[type-var]
        wanted = ",".join(str(gpu) for gpu in group)
        raise UsageError(
            f"--gpus {','.join(str(gpu) for gpu in gpus)}: the emulated engine runs on GPUs "
            f"{wanted}: give exactly those (--gpus {wanted}); nothing was changed"
        )


def _gpus(text: str) -> list[int | str]:
    """``--gpus``: at least one index or UUID."""
    gpus = parse_gpu_list(text) or []
    if not gpus:
        raise UsageError("--gpus needs at least one GPU")
    return gpus


def _clock_list(text: str) -> tuple[int, ...]:
    """``--clock-list``: clocks in MHz, positive integers separated by commas."""
    try:
        parts = text.split(",")
        if not all(plain_number_text(part) for part in parts):
            raise ValueError(text)  # int() read '1_000' and other scripts' digits
        clocks = tuple(int(part) for part in parts)
    except ValueError:
        clocks = ()
    if not clocks or any(not 0 < clock <= MAX_CLOCK_MHZ for clock in clocks):
        raise UsageError(
            f"--clock-list {text[:80]!r}: expected MHz,MHz,... (integers from 1 to "
            f"{MAX_CLOCK_MHZ:g})"
        )
    return clocks


def _kv_capacity(url: str) -> int | None:
    from gpugov.daemon.engine_sources import ScrapedSource
    from gpugov.daemon.errors import EngineUnavailable

    base = url.rstrip("/").removesuffix("/v1")
    source = ScrapedSource(f"{base}/metrics", "auto", timeout_s=2.0)
    try:
        capacity = source.scrape().kv_capacity_tokens
        return int(capacity) if capacity else None
    except EngineUnavailable:
        return None
    finally:
        source.close()


def _check_decode_points_fit(
    points: tuple[tuple[int, int], ...], kv_capacity_tokens: int | None
) -> None:
    """Refuse decode points whose batch cannot sit in the engine's KV cache at once (their
    requests would never decode together, found only after minutes of retries), when the
    engine's page states its KV capacity.

    Raises:
        UsageError: naming the flags and the point, before any clock is set.
    """
    from gpugov.study.profiler.sweep import SweepSettings

    if kv_capacity_tokens is None:
        return
    output = SweepSettings.decode_output_tokens
    for batch, prompt in points:
        needed = batch * (prompt + output)
        if needed > kv_capacity_tokens:
            raise UsageError(
                f"--reference-batch and --reference-context: the decode point of {batch} "
                f"sequences of {prompt:,} prompt and {output} output tokens needs {needed:,} "
                f"KV tokens at once, more than the engine's KV cache holds "
                f"({kv_capacity_tokens:,}); lower either; nothing was changed"
            )


def _check_load(record: dict[str, Any]) -> None:
    """Refuse a GPU the engine cannot load: prefill barely above idle power, or prefill
    time swamped by fixed per-request latency (a model far too small for the GPU)."""
    from gpugov.study.profiler.measure import ProfileRunError

    idle = record["idle_power_w"] or 0.0
    prefill = record["prefill"]
    work_s = prefill["prompt_tokens"] / prefill["tokens_per_s"]
    if not prefill["power_w"] or prefill["power_w"] < idle * 1.05:
        raise ProfileRunError(
            "the model is too small to load the GPU: prefill draws "
            f"{prefill['power_w'] or 0:.0f} W against {idle:.0f} W idle; profile a larger model"
        )
    if work_s < 0.25 * max(prefill["fixed_latency_s"], 0.0):
        raise ProfileRunError(
            f"the model is too small to load the GPU: a {prefill['prompt_tokens']}-token prefill "
            f"takes {work_s * 1000:.1f} ms against {prefill['fixed_latency_s'] * 1000:.1f} ms of "
            "fixed latency per request"
        )


def cmd_profile(args: argparse.Namespace) -> int:
    """Run the sweep (or the dry run) and write the profile; one line per failure."""
    from gpugov.daemon.addresses import emulator_url
    from gpugov.daemon.cli_outputs import check_output_dir, prepare_output_dir
    from gpugov.daemon.cli_support import UsageError, check_engine_url, require_positive
    from gpugov.daemon.errors import (
        GpuError,
        GpugovError,
        GpuLost,
        GpuUnavailable,
        PermissionDenied,
    )
    from gpugov.daemon.gpu_hold import GpuHeld, GpuHold, hold_gpu, release
    from gpugov.daemon.gpu_open import open_backend
    from gpugov.daemon.loop import stop_on_signals
    from gpugov.daemon.stop_signals import StopEvent
    from gpugov.study.openai_client import (
        EngineUnreachable,
        resolve_api_key,
        served_max_model_len,
        served_model,
    )
    from gpugov.study.profiler.measure import ProfileRunError
    from gpugov.study.profiler.sweep import (
        Interrupted,
        Sweep,
        SweepSettings,
        default_decode_points,
        pick_clocks,
    )
    from gpugov.study.profiler.write import write_profile

    api_key = resolve_api_key(args.api_key)
    require_positive("--dwell", args.dwell)
    require_positive("--ttft-slo", args.ttft_slo)
    require_positive("--tpot-slo", args.tpot_slo)
    if args.clocks is not None and args.clocks < 2:
        raise UsageError(f"--clocks must be >= 2, got {args.clocks}")
    for flag, value in (
        ("--reference-batch", args.reference_batch),
        ("--reference-context", args.reference_context),
    ):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    gpus = _gpus(args.gpus)
    _check_state_dir_flag(args.state_dir, args.dry_run)
    wanted_clocks = _clock_list(args.clock_list) if args.clock_list else None
    if wanted_clocks is not None and len(set(wanted_clocks)) < 2 and not args.dry_run:
        # Known from the flag alone: refused before the engine or a GPU is asked.
        raise UsageError(
            f"--clock-list {args.clock_list[:80]!r}: needs at least two different clocks"
        )
    if args.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", args.name):
        raise UsageError(
            f"--name {args.name[:80]!r}: a profile name is a file stem: letters, digits, "
            "'.', '_' and '-', at most 100 characters"
        )
    if args.name is not None and args.name.lower() == "dry-run":
        # --dry-run writes DIR/dry-run.json: it would replace this profile's manifest.
        raise UsageError(
            f"--name {args.name}: that name is --dry-run's record (dry-run.json); give another"
        )
    if args.engine_url is not None:
        check_engine_url(args.engine_url)
    try:
        emulator_url(args.emulator)
    except ValueError as error:
        raise UsageError(f"--emulator {error}") from None
    # Checked now, made once the engine and the GPUs have answered: a run refused for
    # either leaves no empty directory behind.
    check_output_dir("--out", args.out)
    try:
        model = served_model(args.engine_url, api_key=api_key)
    except EngineUnreachable as error:
        raise UsageError(f"--engine-url: {error}; nothing was changed") from error
    served_len = served_max_model_len(args.engine_url, model, api_key=api_key)
    if served_len is not None and args.reference_context > served_len:
        # Its decode points were cut to the model's length and the reference's rate was
        # the latency fit extrapolated to sequences the engine cannot serve.
        raise UsageError(
            f"--reference-context {args.reference_context}: longer than the engine's "
            f"max_model_len ({served_len} tokens), a sequence it cannot serve; give at most "
            f"{served_len}; nothing was changed"
        )
    max_len = served_len or 8192
    emulator = args.emulator or args.engine_url.rstrip("/").removesuffix("/v1")
    out_dir = Path(args.out)
    if args.backend == "emulated":
        _check_emulator_speed(emulator)
    engine_base = args.engine_url.rstrip("/").removesuffix("/v1")
    if engine_base != emulator or args.backend != "emulated":
        # An engine that is gpugov emulate streams its tokens X times fast whatever
        # backend reads the GPUs (one that is not answers no GET /gpu: left alone).
        _check_emulator_speed(engine_base, "--engine-url", api_key)
    _check_one_emulated_engine(engine_base, gpus, api_key)
    backends = []
    holds: list[GpuHold] = []  # the GPUs' holds against a governor (daemon.gpu_hold)
    named: dict[str, str] = {}  # UUID -> how --gpus named it first
    try:
        for gpu in gpus:
            backends.append(
                open_backend(gpu, args.backend, dry_run=args.dry_run, emulator=emulator)
            )
            # One GPU as an index and as its UUID was swept as a group of two (the
            # manifest's tensor_parallel and power limit doubled).
            uuid = str(getattr(backends[-1], "uuid", None) or "")
            if uuid and uuid in named:
                for backend in backends:
                    backend.close()
                raise UsageError(
                    f"--gpus: GPU {gpu} is GPU {named[uuid]}, named twice; nothing was changed"
                )
            if uuid:
                named[uuid] = str(gpu)
            if not args.dry_run:  # a running governor on this GPU would fight the sweep
                try:
                    held = hold_gpu(uuid, args.backend, named=str(gpu), emulator=emulator)
                except GpuHeld as error:
                    for backend in backends:
                        backend.close()
                    release(holds)
                    raise UsageError(
                        f"--gpus: {error}; stop it before profiling; nothing was changed"
                    ) from None
                if held is not None:
                    holds.append(held)
    except GpuError as error:
        # A GPU lost, refusing permission or failing as it is opened: one line (a lost
        # one was a traceback), and the GPUs opened before it are closed again.
        for backend in backends:
            backend.close()
        release(holds)
        if isinstance(error, GpuUnavailable):
            return fail(f"{error}", EXIT_NO_GPU)
        if isinstance(error, GpuLost):
            return fail(f"{error}; nothing was changed", EXIT_GPU_LOST)
        if isinstance(error, PermissionDenied):
            return fail(f"{error}", EXIT_PERMISSION)
        return fail(f"{error}; nothing was changed", EXIT_RUNTIME)
    try:
        # A dry run locks nothing: it neither needs the lock record nor touches it.
        lock_state = None if args.dry_run else _held_lock_record(args.state_dir)
    except BaseException:
        for backend in backends:
            backend.close()
        release(holds)
        raise
    received: list[str] = []  # the signal that stopped the sweep, by name
    sweep: Sweep | None = None
    try:
        supported = backends[0].supported_clocks_mhz()
        if not args.dry_run:  # a dry run locks no clock: one listed clock is enough
            _check_supported_clocks(backends[0], supported)
        if wanted_clocks is not None:
            clocks = wanted_clocks
            bad = [c for c in clocks if c not in supported]
            if bad and not supported:
                raise UsageError(f"--clock-list: GPU {backends[0].label} lists no supported clock")
            if bad:
                raise UsageError(
                    f"--clock-list: {bad[0]} MHz is not a supported clock "
                    f"({min(supported)}-{max(supported)} MHz; see gpugov status)"
                )
        else:
            clocks = pick_clocks(supported, args.clocks or 8)
        name = args.name or _default_name(getattr(backends[0], "name", "gpu"), model)
        if not args.resume and not args.dry_run:
            _check_no_profile_named(out_dir, name)
        decode_points = default_decode_points(args.reference_batch, args.reference_context, max_len)
        _check_decode_points_fit(decode_points, _kv_capacity(args.engine_url))
        prepare_output_dir("--out", args.out)
        prompt_tokens = max(16, min(4096, max_len - 2))
        settings = SweepSettings(
            clocks_mhz=tuple(dict.fromkeys(clocks)),
            dwell_s=args.dwell,
            prefill_prompt_tokens=prompt_tokens,
            decode_points=decode_points,
            reference_batch=args.reference_batch,
            reference_context_tokens=args.reference_context,
        )
        stop = StopEvent()
        sweep = Sweep(
            backends,
            args.engine_url,
            model,
            settings,
            out_dir,
            stop=stop,
            progress_enabled=not args.quiet,
            api_key=api_key,
            lock_state=lock_state,
            on_first_lock=_warn_no_lock_record if lock_state is None else None,
        )
        with stop_on_signals(stop, received):
            if args.dry_run:
                record = sweep.dry_run()
                # Its provenance, as a profile's: an emulated engine's numbers are the
                # simulated plant's, not a measurement of hardware.
                record["status"] = profile_status(args.backend, args.engine_url, api_key)
                out_dir.mkdir(parents=True, exist_ok=True)
                path = out_dir / "dry-run.json"
                write_text_atomic(path, json.dumps(record, indent=2) + "\n")
                _print_dry_run(record, path)
                return 0
            records = sweep.run(resume=args.resume, check_load=_check_load)
        sample = backends[0].sample()
        manifest = write_profile(
            records,
            out_dir,
            name=name,
            status=profile_status(args.backend, args.engine_url, api_key),
            gpu_name=str(getattr(backends[0], "name", "unknown GPU")),
            model=model,
            supported_clocks=supported,
            power_limit_w=(sample.power_limit_w or 700.0) * len(backends),
            # An assumed limit is said to be one in the manifest, not passed off as read.
            power_limit_read=bool(sample.power_limit_w),
            settings=settings.header(),
            command=_command_line(args),
            ttft_slo_s=args.ttft_slo,
            tpot_slo_s=args.tpot_slo,
            kv_capacity_tokens=_kv_capacity(args.engine_url),
            backend=args.backend,
            tensor_parallel=len(backends),
        )
    except Interrupted:
        word, code = _stopped_by(received)
        # A dry run locks no clock and keeps no sweep state: nothing to reset or resume.
        line = (
            f"gpugov: {word}; the dry run changed nothing and wrote nothing ({out_dir})"
            if args.dry_run
            else f"gpugov: {word}; {_reset_words(sweep, args)}; rerun with --resume to continue "
            f"({out_dir})"
        )
        print(printable(line), file=sys.stderr)
        return code
    except ProfileRunError as error:
        return fail(f"{error}; {_reset_words(sweep, args)}", EXIT_RUNTIME)
    except PermissionDenied as error:
        return fail(f"{error}", EXIT_PERMISSION)
    except GpuLost as error:
        return fail(f"{error}; clocks reset where possible", EXIT_GPU_LOST)
    except GpugovError as error:
        return fail(f"{error}; {_reset_words(sweep, args)}", EXIT_RUNTIME)
    finally:
        for backend in backends:
            backend.close()
        if lock_state is not None:
            lock_state.release()
        release(holds)
    _print_written(manifest)
    if getattr(sweep, "unreset", ()):
        # Measured and written, but a GPU may be left locked: said last, as run's exit 6.
        return fail(_reset_words(sweep, args), EXIT_NOT_RESET)
    return 0


def _check_state_dir_flag(state_dir: str | None, dry_run: bool) -> None:
    """Refuse an empty ``--state-dir`` (it would read as the working directory), as the
    config's ``state_dir`` is refused, and, unless this is a dry run (which reads and
    writes nothing there), one that is not an existing directory: a mistyped one would
    keep the record where no ``gpugov run`` looks, and see no governor running. (The
    daemon's own, ``$STATE_DIRECTORY``, is made when missing, as ``gpugov run`` makes it.)

    Raises:
        UsageError: naming the flag.
    """
    from gpugov.daemon.config_types import named_directory

    try:
        named_directory(state_dir)
    except ValueError as error:
        raise UsageError(f"--state-dir: {error}") from None
    if state_dir is None or dry_run:
        return
    try:
        found = Path(state_dir).is_dir()
    except PermissionError:
        found = True  # there, past a directory this user may not search: the record warns
    except (OSError, ValueError):  # a NUL byte, a name too long
        found = False
    if not found:
        what = "not a directory" if os.path.lexists(state_dir) else "no such directory"
        raise UsageError(
            f"--state-dir {state_dir}: {what}; give the state directory gpugov run keeps its "
            "lock record in (systemd's StateDirectory=gpugov: /var/lib/gpugov); nothing was "
            "changed"
        )


def _warn_no_lock_record() -> None:
    """Run from a shell (the usual way) with no state directory: say, once the first
    lock took, what a kill would leave and how to have the governor undo it."""
    from gpugov.daemon.log_lines import command_line

    print(
        command_line(
            "warning",
            "no --state-dir (nor $STATE_DIRECTORY): the clock locks are recorded nowhere, so a "
            "profile killed mid-sweep leaves its GPUs locked until gpugov reset-clocks; pass "
            "--state-dir /var/lib/gpugov (the governor's StateDirectory=) to have the next "
            "gpugov run reset them",
        ),
        file=sys.stderr,
    )


def _held_lock_record(state_dir: str | None) -> LockState | None:
    """The lock record the sweep keeps its locks in: ``locks.json`` in ``--state-dir``,
    else ``$STATE_DIRECTORY`` (the daemon's choice, :func:`~gpugov.daemon.files.resolve_state_dir`),
    with the state directory held for the sweep as ``gpugov run`` holds it
    (:meth:`~gpugov.daemon.lockstate.LockState.hold`); None where neither names one. A
    directory that cannot be held or written is warned about once and the sweep goes on,
    as the daemon does.

    Raises:
        UsageError: a running gpugov holds the directory (named, with its pid: a profile
            would fight it over the clocks), or a newer gpugov wrote the record; before
            any clock is locked.
    """
    from gpugov.daemon.deadline import EXIT_WRITE_WAIT_S
    from gpugov.daemon.errors import ConfigError
    from gpugov.daemon.files import resolve_state_dir
    from gpugov.daemon.lockstate import LockState, StateDirectoryHeld

    directory = resolve_state_dir(state_dir)
    if directory is None:
        return None
    where = f"--state-dir {directory}" if state_dir is not None else f"$STATE_DIRECTORY={directory}"
    try:
        # A lock is written once a clock, and no loop waits on it: each write may take a
        # slow disk's time, so the last one (the exit's reset) is not lost at the exit.
        state = LockState(directory, write_deadline_s=EXIT_WRITE_WAIT_S)
        state.hold()
    except StateDirectoryHeld as held:
        raise UsageError(
            f"{where}: gpugov ({held.holder}) holds this state directory: a running "
            "governor (or another profile) sets these clocks, and the two would fight over "
            "them; stop it before profiling (systemctl stop gpugov); nothing was changed"
        ) from None
    except ConfigError as error:  # a lock record a newer gpugov wrote
        raise UsageError(f"{where}: {error}; nothing was changed") from None
    return state


def _print_written(manifest: Path) -> None:
    """Say where the profile is and how to use it: a command quoted for a shell and a
    TOML line escaped, so both still work pasted when the path holds a space or quote."""
    path = str(manifest)
    command = shlex.join(["gpugov", "simulate", "--profile", path, "--controller", f"mpc:{path}"])
    # A JSON string (ASCII, escaped as JSON escapes) is a TOML basic string.
    toml_path = json.dumps(path)
    print(printable(f"gpugov profile: wrote {manifest} and {manifest.with_suffix('.csv').name}"))
    # Not through printable(): it shortens a long line, and these are to be pasted whole.
    print(f"  use it: {command}")
    print(f'  or in a config: [domains.controller] kind = "mpc", profile = {toml_path}')


def _check_supported_clocks(backend: Any, supported: Sequence[int]) -> None:
    """Refuse a GPU whose clock list cannot make a profile (fewer than two different
    clocks) before any clock is set: the sweep measured it, then could not write it.

    Raises:
        UsageError: naming the GPU and what it lists.
    """
    different = sorted(set(supported))
    if len(different) >= 2:
        return
    label = getattr(backend, "label", "?")
    listed = f"one supported clock ({different[0]} MHz)" if different else "no supported clock"
    raise UsageError(
        f"GPU {label} lists {listed}: a profile needs two; nothing was changed (see gpugov status)"
    )


def _reset_words(sweep: Any, args: argparse.Namespace) -> str:
    """What the exit line says of the clocks: reset, or which GPUs may still be locked
    (their reset failed: the emulator or GPU stopped answering) and how to unlock them."""
    unreset = getattr(sweep, "unreset", ())
    if not unreset:
        return "clocks reset"
    gpus = ",".join(unreset)
    command = ["gpugov", "reset-clocks", "--gpus", gpus]
    if args.backend != "nvml":
        command += ["--backend", args.backend]
    if args.backend == "emulated":
        command += ["--emulator", args.emulator or args.engine_url.rstrip("/").removesuffix("/v1")]
    return (
        f"GPU(s) {gpus} could not be reset and may still be locked: run "
        f"{shlex.join(command)} once it answers"
    )


def _check_no_profile_named(out_dir: Path, name: str) -> None:
    """Refuse a new sweep whose profile would replace one already in ``--out`` (an earlier
    sweep's, a copied one), before any clock is set: it was overwritten at the sweep's
    end. A resumed sweep rewrites its own profile.

    Raises:
        UsageError: naming the file and the flags that avoid it.
    """
    for suffix in (".json", ".csv"):
        path = out_dir / f"{name}{suffix}"
        if os.path.lexists(path):
            raise UsageError(
                f"--out {out_dir}: already holds {path.name}, which this sweep's profile "
                "would replace; give another --name or --out, or --resume to rewrite the "
                "sweep's own profile (nothing was changed)"
            )


def _command_line(args: argparse.Namespace) -> str:
    """The run's command for the manifest, from the parsed flags: ``sys.argv`` dropped
    the word ``profile``, was another program's when called in process, and carried
    ``--api-key KEY`` into the profile (the key is never written: the line says only
    that one was given)."""
    words = ["gpugov", "profile", "--engine-url", args.engine_url, "--gpus", args.gpus]
    words += ["--backend", args.backend]
    if args.emulator is not None:
        words += ["--emulator", args.emulator]
    words += ["--out", str(args.out)]
    if args.clocks is not None:
        words += ["--clocks", str(args.clocks)]
    if args.clock_list is not None:
        words += ["--clock-list", args.clock_list]
    words += ["--dwell", f"{args.dwell:g}"]
    if args.name is not None:
        words += ["--name", args.name]
    words += ["--reference-batch", str(args.reference_batch)]
    words += ["--reference-context", str(args.reference_context)]
    words += ["--ttft-slo", f"{args.ttft_slo:g}", "--tpot-slo", f"{args.tpot_slo:g}"]
    line = shlex.join(words)
    return f"{line} (with an API key)" if args.api_key else line


def _stopped_by(received: list[str]) -> tuple[str, int]:
    """The word and exit code of a sweep stopped by the signal named first in
    ``received``: Ctrl-C 130, SIGTERM 143 (as ``load`` and the other study commands),
    another 128 + its number, as a shell reports it."""
    from gpugov.daemon.stop_signals import signal_number

    name = received[0] if received else "SIGINT"
    if name == "SIGINT":
        return "interrupted", EXIT_INTERRUPTED
    if name == "SIGTERM":
        return "terminated", ExitCode.TERMINATED
    return f"stopped by {name}", 128 + signal_number(name)


def _default_name(gpu: str, model: str) -> str:
    text = f"{gpu}-{model}".lower()
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-")[:80] or "profile"


def _print_dry_run(record: dict[str, Any], path: Path) -> None:
    prefill = record["prefill"]
    where = (
        " through gpugov emulate (the simulated plant's numbers, not hardware's)"
        if record.get("status") == "emulated"
        else ""
    )
    print(
        f"gpugov profile --dry-run: measured{where} at the current clock "
        f"({record['realized_clock_mhz']} MHz), changed nothing; wrote {path}"
    )
    print(f"  idle power     {record['idle_power_w']:.1f} W")
    print(
        f"  prefill        {prefill['tokens_per_s']:.0f} tok/s at {prefill['power_w']:.1f} W "
        f"(R^2 {prefill['r_squared']:.4f})"
    )
    for point in record["decode"]:
        print(
            f"  decode B={point['batch']:<4d} context {point['context_tokens']:.0f}: "
            f"{point['iteration_s'] * 1000:.2f} ms/iteration at {point['power_w'] or 0:.1f} W"
        )


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``profile`` to the ``gpugov`` parser."""
    from gpugov.study.openai_client import add_api_key_argument

    parser = subparsers.add_parser(
        "profile",
        help="measure a GPU profile by sweeping locked clocks under controlled load",
        description="Lock each clock in turn (reset at the end and on every way out), drive "
        "the engine's OpenAI endpoint with controlled load, and measure prefill rate, decode "
        "iteration time at several batches and contexts, idle/prefill/decode power and the "
        "realised clock; write a profile (CSV + manifest) usable as mpc:PATH. Exit codes: "
        "0 ok, 1 run-time failure, 2 usage error, 3 permission denied, 4 no GPU, 5 GPU lost, "
        "6 a GPU's clocks not reset at the end (named), 130 interrupted, 143 terminated "
        "(--resume continues).",
    )
    parser.add_argument(
        "--engine-url",
        required=True,
        metavar="URL",
        help="the engine's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000",
    )
    add_api_key_argument(parser)
    parser.add_argument(
        "--gpus",
        required=True,
        metavar="LIST",
        help="the engine's GPUs (NVML indices or UUIDs, comma separated)",
    )
    parser.add_argument(
        "--backend",
        choices=["nvml", "nvidia-smi", "emulated"],
        default="nvml",
        help="how to read and lock the GPUs (default nvml)",
    )
    parser.add_argument(
        "--emulator",
        default=None,
        metavar="URL",
        help="gpugov emulate's URL for --backend emulated (default: --engine-url)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory for the profile, the sweep state and dry-run.json",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--clocks",
        type=cli_types.count(2, 1000),
        default=None,
        metavar="N",
        help="measure N supported clocks spread from max to min (default 8)",
    )
    which.add_argument(
        "--clock-list",
        default=None,
        metavar="MHZ,...",
        help="measure exactly these supported clocks",
    )
    parser.add_argument(
        "--dwell",
        type=cli_types.duration,
        default=2.0,
        metavar="S",
        help="idle power window per clock in seconds (default 2)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue an interrupted sweep in --out (same flags)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="measure only at the current clock; change nothing"
    )
    parser.add_argument(
        "--name",
        default=None,
        help="profile name (file stem; default from the GPU and model names)",
    )
    parser.add_argument(
        "--reference-batch",
        type=cli_types.count(1, 1_000_000),
        default=64,
        metavar="B",
        help="decode reference batch of the profile's decode columns (default 64)",
    )
    parser.add_argument(
        "--reference-context",
        type=cli_types.count(1, 100_000_000),
        default=1024,
        metavar="TOKENS",
        help="decode reference context per sequence (default 1024)",
    )
    parser.add_argument(
        "--ttft-slo",
        type=cli_types.duration,
        default=1.0,
        metavar="S",
        help="TTFT SLO written into the manifest (default 1.0)",
    )
    parser.add_argument(
        "--tpot-slo",
        type=cli_types.duration,
        default=0.05,
        metavar="S",
        help="TPOT SLO written into the manifest (default 0.05)",
    )
    parser.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="the daemon's state directory, where each lock is recorded in locks.json "
        "until it is reset, so that a profile killed outright is found and reset by the "
        "next gpugov run or gpugov reset-clocks and shown by gpugov status; a running "
        "gpugov holding it refuses the profile (default: $STATE_DIRECTORY; neither: no "
        "record; --dry-run uses none)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.set_defaults(handler=cmd_profile)
