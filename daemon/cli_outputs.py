"""Where a command's output goes, checked before any work is done: every output file and
``--out DIR`` (writable, not one of the command's inputs, no two flags on one file), the
files a run reads that no output may overwrite, and a directory made for a run that failed
removed again."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable, Iterator

from gpugov.daemon.cli_support import UsageError
from gpugov.daemon.controller_config import (
    MPCControllerConfig,
    OnlineMPCControllerConfig,
    OpenLoopControllerConfig,
    PowerProfileControllerConfig,
)
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.plant.profile_files import profile_files
from gpugov.plant.workload import DEFAULT_TRACE, TraceError, resolve_trace


def _check_writable_dir(flag: str, target: str, directory: str) -> None:
    """Refuse ``directory`` (where ``target`` goes) unless it exists, is a directory and
    takes a new file (a probe file is created and removed)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{flag} {target}: {directory} is not a directory")
    if not os.path.isdir(directory):
        raise UsageError(f"{flag} {target}: directory {directory} does not exist (create it first)")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".gpugov-write-test-"):
            pass
    except OSError as error:
        raise UsageError(
            f"{flag} {target}: cannot write in {directory}: {error.strerror or error}"
        ) from error


def check_output_file(
    flag: str,
    path: str | os.PathLike[str] | None,
    inputs: Iterable[tuple[str, str | os.PathLike[str] | None]] = (),
) -> None:
    """Refuse an output file that cannot be written, before any work is done: the one
    check of every ``--out FILE``, ``--json FILE``, ``--record`` and ``--plot``.

    The parent directory must already exist (nothing is created behind the user's back)
    and accept a new file; an existing target must be a writable regular file (not a
    directory, a device or a FIFO), and none of the command's ``inputs`` (``(what,
    path)``: the config, the trace, the profile it reads). Nothing is written to the
    target itself, so a refused or failed run loses no earlier output.
    """
    if path is None:
        return
    target = os.fspath(path)
    if not target.strip():
        raise UsageError(f"{flag}: empty file name")
    check_not_an_input(flag, target, inputs)
    if os.path.isdir(target) or target.endswith(os.sep):
        # "out.json/" (no such folder yet) was written as the file out.json.
        raise UsageError(f"{flag} {target}: is a directory; give a file name")
    if os.path.exists(target) and not os.path.isfile(target):
        raise UsageError(f"{flag} {target}: not a regular file (a device or a FIFO?)")
    directory = os.path.dirname(os.path.abspath(target))
    if os.path.islink(target) and not os.path.exists(target):
        # A link to nothing yet: the write creates its target, so that target's directory
        # is the one to check (a loop cannot be opened at all).
        _refuse_a_link_loop(flag, target)
        directory = os.path.dirname(os.path.realpath(target))
    _check_writable_dir(flag, target, directory)
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise UsageError(f"{flag} {target}: file is not writable")


def check_not_an_input(
    flag: str,
    path: str | os.PathLike[str] | None,
    inputs: Iterable[tuple[str, str | os.PathLike[str] | None]],
) -> None:
    """Refuse an output file that is one of the command's ``inputs`` (``(what, path)``),
    the first check of :func:`check_output_file`, also made alone where the rest would
    look at this machine (``check-config --offline``). A path is compared as written too:
    an input not made yet (the daemon's lock record) is still one to keep."""
    if path is None:
        return
    target = os.fspath(path)
    for what, source in inputs:
        if source is not None and (
            _same_file(target, os.fspath(source))
            or os.path.realpath(target) == os.path.realpath(source)
        ):
            raise UsageError(f"{flag} {target}: is {what}, which it would overwrite")


def check_distinct_outputs(*outputs: tuple[str, str | os.PathLike[str] | None]) -> None:
    """Refuse two output flags (``(flag, path)``) that name one file, where the later write
    would replace the earlier; compared by resolved path, since neither need exist yet."""
    given = [(flag, os.fspath(path)) for flag, path in outputs if path is not None]
    for index, (flag, target) in enumerate(given):
        for earlier, other in given[:index]:
            if _same_file(target, other) or os.path.realpath(target) == os.path.realpath(other):
                raise UsageError(
                    f"{flag} {target}: is the {earlier} file, which it would overwrite"
                )


def controller_files(config: object) -> list[tuple[str, str | os.PathLike[str]]]:
    """The files a controller config reads, as ``(field, path)``: an ``open-loop`` plan
    (``plan``), the manifest an ``mpc``'s or ``power-profile``'s ``profile`` or an
    ``mpc-online``'s ``prior_profile`` names, and that manifest's CSV (``profile's CSV``,
    ``prior_profile's CSV``): what no output of the run may overwrite."""
    if isinstance(config, OpenLoopControllerConfig):
        return [("plan", config.plan)]
    if isinstance(config, OnlineMPCControllerConfig):
        field, profile = "prior_profile", config.prior_profile
    elif isinstance(config, MPCControllerConfig | PowerProfileControllerConfig):
        field, profile = "profile", config.profile
    else:
        return []
    if profile is None:
        return []
    manifest, *csvs = profile_files(profile)
    return [(field, manifest), *((f"{field}'s CSV", path) for path in csvs)]


def simulated_run_inputs(
    trace: str | None, profile: str, controller: str
) -> list[tuple[str, str | os.PathLike[str] | None]]:
    """The files a simulated run reads, as :func:`check_output_file`'s ``inputs``: the
    trace, the profile's manifest and CSV, an ``open-loop`` controller's plan and the
    profile a ``--controller`` spec names (``mpc:P.json``, ``mpc-online:P.json``,
    ``power-profile:P.json``), its manifest and CSV."""
    inputs: list[tuple[str, str | os.PathLike[str] | None]] = [("the trace", trace_file(trace))]
    files = profile_files(profile)
    inputs.append(("the profile", files[0]))
    inputs += [("the profile's CSV", path) for path in files[1:]]
    try:
        spec = parse_controller_spec(controller)
    except ValueError:  # refused in its own line when the controller is built
        return inputs
    for field, path in controller_files(spec):
        if field == "plan":
            inputs.append(("the open-loop plan", path))
        else:
            what = "the profile's CSV" if field.endswith("CSV") else "the profile"
            inputs.append((what, path))
    return inputs


def trace_file(trace: str | None) -> str | os.PathLike[str] | None:
    """The file a ``--trace`` value reads, for refusing an output that would overwrite it:
    a trace name resolved to its file (``azure-conv-10min`` to the bundled CSV, a shared
    name to its file in the traces directory), no value to the default trace's file. Only
    a path was compared, so ``--out`` on the file behind a name (or behind no ``--trace``
    at all) replaced that trace. A value that does not resolve is returned as given:
    loading it refuses it in its own line."""
    try:
        return resolve_trace(trace or DEFAULT_TRACE)
    except TraceError:
        return trace


def _same_file(first: str, second: str) -> bool:
    """Whether two existing paths name one file (the same path, a link to it, or a hard
    link); a path that does not exist names no file to overwrite."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def _refuse_a_link_loop(flag: str, target: str) -> None:
    """Refuse ``target``, a link that leads nowhere, where it is a loop (one line)."""
    try:
        os.stat(target)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UsageError(f"{flag} {target}: a symbolic link loop") from error


def check_output_dir(flag: str, path: str | os.PathLike[str], *, parents: bool = False) -> None:
    """What :func:`prepare_output_dir` refuses, checked without creating anything: for a
    command that reads its inputs before it makes its output directory."""
    target = os.fspath(path)
    if not target.strip():
        raise UsageError(f"{flag}: empty directory name")
    if os.path.islink(target) and not os.path.exists(target):
        # A link to nothing: no directory can be made at it ("File exists"), and one
        # command took it until its work had begun.
        _refuse_a_link_loop(flag, target)
        raise UsageError(
            f"{flag} {target}: a symbolic link to a missing directory "
            f"({os.path.realpath(target)}; create it first)"
        )
    if os.path.exists(target) and not os.path.isdir(target):
        raise UsageError(f"{flag} {target}: exists and is not a directory")
    if os.path.isdir(target):
        _check_writable_dir(flag, target, target)
    elif not parents:
        _check_writable_dir(flag, target, os.path.dirname(os.path.abspath(target)))


def prepare_output_dir(flag: str, path: str | os.PathLike[str], *, parents: bool = False) -> None:
    """The one check of every ``--out DIR``, before the work: ``path`` is used when it is
    a writable directory, or created when its parent directory exists and is writable;
    anything else is refused in one line. The parents are created only with ``parents``
    (a command's own default directory), never for a path the user gave.
    """
    check_output_dir(flag, path, parents=parents)
    target = os.fspath(path)
    if os.path.isdir(target):
        return
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as error:
        raise UsageError(f"{flag} {target}: cannot create it: {error.strerror or error}") from error
    _check_writable_dir(flag, target, target)


class OutputDirectoryHeld(UsageError):
    """An output directory another run is writing (``gpugov.study.outputs``'
    ``held_output_dir``): refused, and ``directory`` is that run's to keep."""

    def __init__(self, message: str, directory: str | os.PathLike[str]) -> None:
        super().__init__(message)
        self.directory = os.fspath(directory)


@contextlib.contextmanager
def output_dirs_removed_on_failure(*paths: str | os.PathLike[str] | None) -> Iterator[None]:
    """Around a command that makes its ``--out DIR`` (:func:`prepare_output_dir`): each of
    ``paths`` that does not exist on entry and is still empty when the body fails (a run
    whose every scenario was skipped, an error, Ctrl-C) is removed again, so a failed run
    leaves no empty directory behind. A directory that existed, or holds a file, stays;
    so does one another run holds (:class:`OutputDirectoryHeld`): two runs started at once
    into a new ``DIR`` each saw it missing, and the refused one removed it from under the
    other, still empty mid-run."""
    made = [os.fspath(path) for path in paths if path is not None and not os.path.lexists(path)]
    try:
        yield
    except BaseException as error:
        for path in made:
            if isinstance(error, OutputDirectoryHeld) and _same_file(path, error.directory):
                continue
            with contextlib.suppress(OSError):  # not empty, or never made: it stays as is
                os.rmdir(path)
        raise


__all__ = [
    "OutputDirectoryHeld",
    "check_distinct_outputs",
    "check_not_an_input",
    "check_output_dir",
    "check_output_file",
    "controller_files",
    "output_dirs_removed_on_failure",
    "prepare_output_dir",
    "simulated_run_inputs",
    "trace_file",
]
