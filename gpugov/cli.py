"""The ``gpugov`` console script: one parser; each subcommand's module loads only when named.

``COMMANDS`` maps every subcommand to the module that registers it (``register(subparsers)``)
and a one-line help. ``gpugov --help`` lists the table without importing any command module;
``gpugov NAME ...`` imports only NAME's module, so a node command never loads the study code.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gpugov import __version__

NODE = "gpugov.daemon.node_cli"
SIMULATE = "gpugov.study.simulate_cli"
EXPERIMENTS = "gpugov.study.experiments_cli"
SCOREBOARD = "gpugov.study.scoreboard.cli"
PLOT = "gpugov.study.plot_cli"
EMULATE = "gpugov.study.emulate.cli"
LOAD = "gpugov.study.load_cli"
PROFILE = "gpugov.study.profiler.cli"
SWEEP = "gpugov.study.sweep_cli"
FLEET = "gpugov.study.fleet.cli"
MODEL = "gpugov.daemon.model_cli"
ACTUATOR = "gpugov.daemon.actuator_command"

#: Subcommand -> (module that registers it, one-line help for ``gpugov --help``).
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (NODE, "run the governor (a node from --config, or the simulated plant)"),
    "check-config": (NODE, "validate a config file; apply nothing"),
    "status": (NODE, "show GPUs, clocks, power, permissions and engine reachability"),
    "reset-clocks": (NODE, "unlock the GPUs' SM clocks (the unit's ExecStopPost=)"),
    "actuator": (ACTUATOR, "serve clock locks to an unprivileged governor (split mode)"),
    "replay": (NODE, "run a recording through another controller and compare decisions"),
    "model": (MODEL, "show or export the model the mpc-online controller learned"),
    "simulate": (SIMULATE, "run a controller on the simulated plant and print its metrics"),
    "profiles": (SIMULATE, "list the bundled GPU profiles"),
    "experiments": (EXPERIMENTS, "run the textbook study (open-loop vs MPC, DP vs FQI)"),
    "bench": (SCOREBOARD, "benchmarks: the controller scoreboard"),
    "traces": (SIMULATE, "list the trace names, where each resolves and whether it is present"),
    "plot": (PLOT, "plot a replay or run --record recording (FILE.jsonl) to a PNG"),
    "emulate": (EMULATE, "serve an emulated node (OpenAI API, vLLM /metrics, GPUs) on loopback"),
    "load": (LOAD, "replay a trace against an OpenAI-compatible endpoint; client TTFT/TPOT"),
    "profile": (PROFILE, "measure a GPU profile by sweeping locked clocks under controlled load"),
    "sweep": (SWEEP, "run a grid of traces x profiles x loads x controllers x seeds"),
    "fleet": (FLEET, "simulate a fleet of nodes under a power budget (allocators, a grid step)"),
}

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""

STOPPED_BY_SIGTERM = frozenset(
    {"simulate", "replay", "plot", "experiments", "bench", "sweep", "fleet", "load", "profile"}
)
"""The long offline commands, which SIGTERM (a batch scheduler's stop, ``timeout``, a
pod's) ends as Ctrl-C does, with exit 143 and one line (``load`` and ``profile`` handle it
themselves while they run). The node's own commands (``run``, ``actuator``, ``emulate``)
take it as their normal stop."""

EXIT_USAGE = 2
"""Exit code of a usage error (argparse's, and every command's)."""

EXIT_FAILURE = 1
"""Exit code of a runtime failure (``daemon.errors.ExitCode.FAILURE``)."""

PATH_ERRNOS = frozenset(
    {
        errno.ENAMETOOLONG,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EACCES,
        errno.EPERM,
        errno.ELOOP,
        errno.EROFS,
    }
)
"""OSError numbers that mean a path the user gave cannot be used (a usage error)."""


_GIVEN = "_gpugov_given_options"
"""Namespace attribute where :class:`_StoreOnce` notes each flag given so far (removed by
:meth:`GpugovArgumentParser.parse_known_args`)."""


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store``, refusing a flag given twice with different values: argparse
    keeps the last one silently, so ``reset-clocks --gpus 0 --gpus 1`` left GPU 0 locked
    and ``run --config a.toml --config b.toml`` ran one of two files. A deprecated alias
    counts as its flag; a value repeated as it was is harmless and accepted."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: dict[str, tuple[str, Any]] = namespace.__dict__.setdefault(_GIVEN, {})
        if option_string is not None:
            earlier = given.get(self.dest)
            if earlier is not None and earlier[1] != values:
                first, value = earlier
                if option_string == first:
                    parser.error(f"{first} given twice ({value!r}, then {values!r}); give it once")
                parser.error(
                    f"{first} {value!r} and {option_string} {values!r} set the same thing; give one"
                )
            given[self.dest] = (option_string, values)
        super().__call__(parser, namespace, values, option_string)


class GpugovArgumentParser(argparse.ArgumentParser):
    """argparse with gpugov's one error line: ``gpugov: error: COMMAND: MESSAGE`` and exit
    2, the same shape as every other refusal (argparse's own prints the usage first), and
    a flag that takes a value refused when given twice with different values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Argument groups share these registries, so their flags are covered too.
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, without the note of the flags given in the namespace it returns."""
        parsed, rest = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_GIVEN, None)
        return parsed, rest

    def error(self, message: str) -> NoReturn:
        """Print one error line naming the command and where its help is; exit 2. A
        value in it is escaped as every error line escapes it (a newline stays ``\\n``)."""
        from gpugov.daemon.log_lines import command_line

        command = self.prog.removeprefix("gpugov").strip()
        where = f"{command}: " if command else ""
        hint = f"gpugov {command} --help" if command else "gpugov --help"
        self.exit(EXIT_USAGE, f"{command_line('error', f'{where}{message}')} (see {hint})\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``gpugov`` parser; with ``command``, only that command's module is imported.

    Without ``command`` every command module registers itself (the full parser, for tests
    and documentation); the commands not loaded appear in ``--help`` from ``COMMANDS``.
    """
    parser = GpugovArgumentParser(
        prog="gpugov",
        description="Serving-aware GPU clock governor and its simulated serving plant.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"gpugov {__version__}",
        help="print the version and exit",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    if command == "":
        modules: list[str] = []
    elif command in COMMANDS:
        modules = [COMMANDS[command][0]]
    else:
        modules = list(dict.fromkeys(module for module, _ in COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).register(subparsers)
    for name, (_, help_text) in COMMANDS.items():
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def _command_in(argv: Sequence[str]) -> str:
    """The subcommand named in ``argv`` (its first non-option word), or ``""`` for none."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else "?"
    return ""


def _empty_value(argv: Sequence[str]) -> str | None:
    """The flag (or ``argument N``) given an empty or blank value, if any: no gpugov
    flag takes one, and each would otherwise mean something else (the default, the
    current directory)."""
    for index, word in enumerate(argv):
        if word.startswith("--") and "=" in word and not word.split("=", 1)[1].strip():
            return f"argument {word.split('=', 1)[0]}"
        if not word.strip():
            before = argv[index - 1] if index else ""
            return f"argument {before}" if before.startswith("-") else f"argument {index + 1}"
    return None


class _StoppedBeforeTheStart(KeyboardInterrupt):
    """A stop signal (``signal_name``) reached ``gpugov run`` before its daemon handled
    signals itself."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def _stop_before_the_start(signum: int, frame: object) -> NoReturn:
    from gpugov.daemon.stop_signals import signal_name

    raise _StoppedBeforeTheStart(signal_name(signum))


class _GuardedStdout:
    """``sys.stdout`` while a command runs: the stream itself, with the first error a
    write or a flush met (a full disk, a closed pipe) noted, so that :func:`main` reports
    it once, however the command (or argparse, which swallows it) handled it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.error: OSError | None = None

    def _noted(self, error: OSError) -> OSError:
        if self.error is None:
            self.error = error
        return error

    def write(self, text: str) -> int:
        try:
            return int(self.stream.write(text))
        except OSError as error:
            raise self._noted(error) from None

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as error:
            raise self._noted(error) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _failed_on_stdout(error: BaseException) -> bool:
    """Whether ``error`` is the one a write to (or a flush of) stdout met."""
    stdout = sys.stdout
    return isinstance(stdout, _GuardedStdout) and stdout.error is error


def _stdout_failed(stream: Any, error: OSError) -> int:
    """A stdout that could not be written: one line (none for a reader that is gone, as
    the Python docs' SIGPIPE note does it), stdout pointed at devnull so that Python's
    own flush at exit cannot raise, and exit 1."""
    if not isinstance(error, BrokenPipeError):
        with contextlib.suppress(OSError, ValueError):
            print(
                f"gpugov: cannot write to standard output: {error.strerror or error}",
                file=sys.stderr,
            )
    with contextlib.suppress(OSError, ValueError):  # a stream with no descriptor (a test's)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    return EXIT_FAILURE


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
"""What starts a BLAS (OpenBLAS, MKL, an OpenMP build) with a number of threads."""


NODE_COMMANDS = ("run", "actuator")
"""The commands a node runs: their BLAS is left as the operator started it (an outside
controller on a node may want its threads)."""


def sets_one_blas_thread(args: Sequence[str]) -> bool:
    """Whether the command line ``args`` (without the program) starts its BLAS with one
    thread: every command but the node's."""
    return bool(args) and args[0] not in NODE_COMMANDS


def one_blas_thread() -> None:
    """Start this process's BLAS, and its children's, with one thread: called before
    numpy loads. An OpenBLAS started with more and limited to one later (the runners'
    ``threadpoolctl`` limit) sums in another order than one started with one (a Ray
    worker, a one-core machine), and the SLSQP MPC's decisions followed it, so a study's
    numbers depended on the machine's cores and the runner."""
    for name in BLAS_THREAD_VARIABLES:
        os.environ[name] = "1"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return the exit code.

    As the process's own command line (``argv`` None), its BLAS starts with one thread
    (:func:`one_blas_thread`), but for the node's commands (:data:`NODE_COMMANDS`).

    Ctrl-C ends any command with one line and exit code 130, SIGTERM a long offline
    command (:data:`STOPPED_BY_SIGTERM`) with one line and 143, after the same cleanup
    (its worker processes ended). A stdout that cannot be written (``> /dev/full``) ends
    any command with one line and exit 1, a closed one (``gpugov profiles --json | head``)
    quietly with exit 1 (the Python docs' SIGPIPE recipe).
    """
    if argv is None and sets_one_blas_thread(sys.argv[1:]):
        one_blas_thread()
    stream = sys.stdout
    if stream is None:  # started with stdout closed: nothing to guard
        return _main_guarded(argv)
    guard = _GuardedStdout(stream)
    sys.stdout = guard
    try:
        code = _main_guarded(argv)
        with contextlib.suppress(OSError):  # noted by the guard
            sys.stdout.flush()  # what is still buffered fails here, not at exit
    finally:
        if sys.stdout is guard:
            sys.stdout = stream
    if guard.error is None:
        return code
    failed = _stdout_failed(stream, guard.error)
    return code or failed  # an interrupt's or an error's own code stands


def _main_guarded(argv: Sequence[str] | None) -> int:
    """:func:`main` once stdout is guarded."""
    # The process's own command line: what _main sets for an interrupt stays set for the
    # exit that follows (Python's finalizers), not only for the command.
    process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    empty = _empty_value(argv)
    if empty is not None:
        from gpugov.daemon.log_lines import command_line

        print(command_line("error", f"{empty}: empty value"), file=sys.stderr)
        return EXIT_USAGE
    from gpugov.daemon.log_lines import escape_unconfigured_logs

    escape_unconfigured_logs()  # outside text in a warning stays one line
    command = _command_in(argv)
    if command != "run":
        return _main(argv, command, process=process)
    # Until the daemon installs its own handling (before it opens a GPU), a signal it
    # stops on (SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, ...) ends the start at once, as the
    # stop it asks for, not as a kill (no line); SIGINT is Ctrl-C's, as for any command.
    import signal

    from gpugov.daemon.stop_signals import STOP_SIGNALS

    previous: dict[int, Any] = {}
    for signum in STOP_SIGNALS:
        if signum == signal.SIGINT:
            continue
        try:
            previous[signum] = signal.signal(signum, _stop_before_the_start)
        except ValueError:  # not the main thread: signals are not ours to handle
            return _main(argv, command, process=process)
        except OSError:  # pragma: no cover - a platform without it
            continue
    try:
        return _main(argv, command, process=process)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _on_ctrl_c(signum: int, frame: object) -> NoReturn:
    """SIGINT: KeyboardInterrupt, as Python's own handler, and noted for the next
    progress update, where a compiled kernel swallowed the first (``daemon.progress``)."""
    from gpugov.daemon.progress import note_interrupt

    note_interrupt()
    raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: object) -> NoReturn:
    """SIGTERM during a long offline command: raised as Ctrl-C is (every cleanup runs),
    as :class:`~gpugov.daemon.errors.Terminated` (exit 143), and noted likewise."""
    from gpugov.daemon.errors import Terminated
    from gpugov.daemon.progress import note_interrupt

    note_interrupt(terminated=True)
    raise Terminated.now()


class _QuietInterrupts:
    """``sys.unraisablehook`` while a command runs: a Ctrl-C or SIGTERM raised by the
    handlers above inside a finalizer or a weakref callback (``WeakSet._remove`` while
    figures are written), where Python can only print it with a traceback and go on, is
    dropped without a word. It was noted: the next progress update raises it again
    (:func:`~gpugov.daemon.progress.note_interrupt`), else the command's end does.
    Anything else goes to ``hook``."""

    def __init__(self, hook: Callable[[Any], object]) -> None:
        self.hook = hook
        self.dropped = False

    def __call__(self, unraisable: Any) -> object:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            self.dropped = True
            return None
        return self.hook(unraisable)


def _raise_a_dropped_interrupt() -> None:
    """At a command's end: raise the interrupt :class:`_QuietInterrupts` dropped, where
    no progress update raised it since."""
    from gpugov.daemon.progress import raise_if_interrupted

    hook = sys.unraisablehook
    if isinstance(hook, _QuietInterrupts) and hook.dropped:
        raise_if_interrupted()


def _ignore_further_interrupts() -> None:
    """Once an interrupt's one line is decided: a second Ctrl-C (or SIGTERM) in what is
    left (the way out, Python's finalizers) neither raises nor prints anything."""
    import signal

    with contextlib.suppress(ValueError):  # not the main thread: signals are not ours
        for signum, ours in ((signal.SIGINT, _on_ctrl_c), (signal.SIGTERM, _on_sigterm)):
            if signal.getsignal(signum) is ours:
                signal.signal(signum, signal.SIG_IGN)


def _forget_the_interpreters_unhandled_interrupt() -> None:
    """Clear CPython's own note of an unhandled Ctrl-C, once ours is handled.

    CPython notes a KeyboardInterrupt that leaves code run from a string (``exec`` of
    source, as ``dataclasses`` and ``namedtuple`` build their methods). ``python -m
    gpugov`` then ends by killing itself with SIGINT in place of the exit code, even
    though the interrupt was caught. A Ctrl-C during an import that defines a dataclass
    did that: exit -2 after ``gpugov: interrupted``. Running any source string resets
    the note, and nothing else can reach it."""
    exec("pass", {})  # a fixed string, run for the side effect above


def _main(argv: list[str], command: str, *, process: bool = False) -> int:
    """:func:`main` past its signal set-up; ``process``: the command is this process's
    own, and what is set for an interrupt is left set for its exit."""
    import signal

    from gpugov.daemon.errors import Terminated
    from gpugov.daemon.progress import clear_interrupt

    clear_interrupt()
    Terminated.forget()
    ctrl_c = False
    with contextlib.suppress(ValueError):  # not the main thread: signals are not ours
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_ctrl_c)
            ctrl_c = True
    previous_sigterm = None
    if command in STOPPED_BY_SIGTERM:
        with contextlib.suppress(ValueError):
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _QuietInterrupts(previous_hook)
    try:
        return _run_command(argv, command)
    finally:
        if previous_sigterm is not None:  # a test's process gets its own handling back
            signal.signal(signal.SIGTERM, previous_sigterm)
        if not process:
            sys.unraisablehook = previous_hook
            if ctrl_c and signal.getsignal(signal.SIGINT) in (_on_ctrl_c, signal.SIG_IGN):
                signal.signal(signal.SIGINT, signal.default_int_handler)


def _run_command(argv: list[str], command: str) -> int:
    """:func:`_main` once its signals are set: parse, run, and turn an interrupt or an
    input error into one line and its exit code."""
    try:
        # Inside: a command's module can take a second to import (numpy, numba), and a
        # Ctrl-C then is the same one line.
        parser = build_parser(None if command == "?" else command)
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help, --version, or the one usage-error line
            return done.code if isinstance(done.code, int) else EXIT_USAGE
        code = int(args.handler(args))
        _raise_a_dropped_interrupt()
        if sys.stdout is not None:  # None: started with descriptor 1 closed
            sys.stdout.flush()  # a closed pipe raises here, inside the handler below
        return code
    except KeyboardInterrupt as stop:
        if isinstance(stop, _StoppedBeforeTheStart):
            print(
                f"gpugov: stopped ({stop.signal_name}) before the start; no GPU was touched",
                file=sys.stderr,
            )
            return 0
        _ignore_further_interrupts()
        _forget_the_interpreters_unhandled_interrupt()
        # On a terminal, end a progress bar's line first; elsewhere the line stands alone.
        start = "\n" if sys.stderr.isatty() else ""
        from gpugov.daemon.errors import ExitCode, Terminated

        if Terminated.caused(stop):
            print(f"{start}{Terminated.line()}", file=sys.stderr)
            return ExitCode.TERMINATED
        print(f"{start}gpugov: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # the outermost edge: input errors become one clear line
        if _failed_on_stdout(error) or isinstance(error, BrokenPipeError):
            return EXIT_FAILURE  # main() says it once (nothing for a reader that is gone)
        from gpugov.daemon import cli_support

        if isinstance(error, cli_support.INPUT_ERRORS):
            return cli_support.fail(error)
        if isinstance(error, cli_support.CONTROLLER_ERRORS):
            # A controller (another package's, most often) raised while a run decided:
            # its message names it and the simulated time; a runtime failure, not input.
            return cli_support.fail(error, EXIT_FAILURE)
        if isinstance(error, OSError) and error.filename is not None:
            # A path the command could not use (too long, not a directory, ...): one
            # line naming it; exit 2 when the path was the user's to fix.
            name = str(error.filename)
            shown = name if len(name) <= 200 else f"{name[:200]}..."
            code = EXIT_USAGE if error.errno in PATH_ERRNOS else 1
            return cli_support.fail(f"{shown}: {error.strerror or error}", code)
        raise


if __name__ == "__main__":
    sys.exit(main())
