"""Every flag of every subcommand against a fixed catalogue of bad values.

The flags are read from the real parser (``gpugov.cli.build_parser``), so a new flag is
fuzzed without editing this file; each flag gets the catalogue of its kind (a number, an
input file, an output file or directory, a choice, free text). Each case runs through the
real entry point (``gpugov.cli.main``) in this process, on an otherwise valid and cheap
command line, under a time bound (an interval timer) and a memory bound (the growth of the
process's peak RSS). It must exit 2 with exactly one ``gpugov: error:`` line that names the
flag or the value, and no traceback, unless the pair is in :data:`ACCEPTED` (accepted on
purpose, with the reason). A few of the worst cases also run as real processes under an
address-space limit (:func:`test_worst_cases_in_a_bounded_process`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

from gpugov import cli
from gpugov.cli import build_parser, main

RUN_EARLY = 11  # its rough seconds on 2 cores: tests/conftest.py runs the longest files first
TIME_BOUND_S = 20.0
"""Longest a refused case may take (they take milliseconds; a hang is caught here)."""
MEMORY_BOUND_KIB = 1 << 20
"""Most a refused case may grow the process's peak RSS (1 GiB; /dev/zero would be more)."""

PROFILE = "h100-sxm-llama3-8b"
DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens, refused at once


# ------------------------------------------------------------------- the fixtures
@dataclass(frozen=True)
class Files:
    """The files the catalogue and the valid command lines point at."""

    root: Path
    trace: Path
    burst_trace: Path
    config: Path
    grid: Path
    recording: Path
    state_dir: Path
    empty: Path
    binary: Path
    long_line: Path
    deep_json: Path
    deep_toml: Path
    fifo: Path
    directory: Path
    link_loop: Path
    missing: Path
    missing_parent: Path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("fuzz")
    trace = root / "trace.csv"
    trace.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n"
        + "".join(f"{i * 0.5},{100 + i},{10 + i}\n" for i in range(10))
    )
    # A minute of arrivals: the open-loop experiment needs work 20 s in to move earlier.
    burst_trace = root / "burst.csv"
    burst_trace.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n"
        + "".join(f"{i},{100 + i},{10 + i % 7}\n" for i in range(60))
    )
    config = root / "node.toml"
    config.write_text(
        "[daemon]\n"
        f'backend = "emulated"\nemulator = "{DEAD_URL}"\nmetrics_address = "127.0.0.1:19999"\n'
        "[[domains]]\n"
        'name = "d"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{DEAD_URL}/metrics"\n'
        '[domains.controller]\nkind = "max"\n'
    )
    grid = root / "grid.toml"
    grid.write_text(
        f'traces = ["{trace}"]\nprofiles = ["{PROFILE}"]\ncontrollers = ["max"]\nduration_s = 3.0\n'
    )
    recording = root / "run.jsonl"
    state_dir = root / "state"
    state_dir.mkdir()
    argv = [
        "run",
        "--simulate",
        "--virtual",
        "--duration",
        "10",
        "--controller",
        "mpc-online",
        "--metrics-address",
        "none",
        "--record",
        str(recording),
        "--quiet",
    ]
    before = os.environ.get("STATE_DIRECTORY")
    os.environ["STATE_DIRECTORY"] = str(state_dir)  # the learned model for `model`
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(argv) == 0
    finally:
        if before is None:
            del os.environ["STATE_DIRECTORY"]
        else:
            os.environ["STATE_DIRECTORY"] = before
    empty = root / "empty"
    empty.write_text("")
    binary = root / "binary"
    binary.write_bytes(bytes(range(256)) * 4)
    long_line = root / "long-line"
    long_line.write_text("x" * (17 << 20))
    deep_json = root / "deep.json"
    deep_json.write_text("[" * 30_000 + "]" * 30_000)
    deep_toml = root / "deep.toml"
    deep_toml.write_text("a = " + "[" * 30_000 + "]" * 30_000)
    fifo = root / "fifo"
    os.mkfifo(fifo)
    directory = root / "a-directory"
    directory.mkdir()
    link_loop = root / "link-loop"  # two links that lead to each other
    link_loop.symlink_to(root / "link-loop-back")
    (root / "link-loop-back").symlink_to(link_loop)
    return Files(
        root=root,
        trace=trace,
        burst_trace=burst_trace,
        config=config,
        grid=grid,
        recording=recording,
        state_dir=state_dir,
        empty=empty,
        binary=binary,
        long_line=long_line,
        deep_json=deep_json,
        deep_toml=deep_toml,
        fifo=fifo,
        directory=directory,
        link_loop=link_loop,
        missing=root / "no-such-file",
        missing_parent=root / "no-such-dir" / "out",
    )


# ------------------------------------------------------------------ the catalogue
NUMBERS = ["", "x", "nan", "inf", "-inf", "-1", "-1e308", "1e308", "1" + "0" * 30]
"""Every numeric flag (int or float) gets these."""


def input_files(f: Files) -> list[str]:
    """Every flag that names a file to read gets these."""
    return [
        "",
        str(f.empty),
        str(f.binary),
        str(f.long_line),
        str(f.deep_json),
        str(f.deep_toml),
        "/dev/zero",
        str(f.fifo),
        str(f.directory),
        str(f.link_loop),
        str(f.missing),
    ]


def input_dirs(f: Files) -> list[str]:
    """Every flag that names a directory to read gets these."""
    return ["", "/dev/zero", str(f.fifo), str(f.binary), str(f.link_loop), str(f.missing)]


def output_files(f: Files) -> list[str]:
    """Every flag that names a file to write gets these."""
    return [
        "",
        "/proc/version",
        "/dev/zero",
        str(f.fifo),
        str(f.directory),
        str(f.link_loop),
        str(f.missing_parent),
        "/proc/gpugov-out",
    ]


def output_dirs(f: Files) -> list[str]:
    """Every flag that names a directory to write gets these."""
    return [
        "",
        "/proc/version",
        "/dev/zero",
        str(f.fifo),
        str(f.binary),
        str(f.link_loop),
        str(f.missing_parent),
        "/proc/gpugov-out",
    ]


TEXT = [
    "",
    "\x01\x7f",
    "x" * 10_000,
    "-1",
    "nan",
    "9" * 20,
    "http://[::1",
    "http://127.0.0.1:99999",
]
"""Every free-text flag (a spec, a list, a URL, an address) gets these."""

CHOICES = ["", "no-such-choice"]

INPUT_FILE_FLAGS = {"--config", "--grid", "--trace", "--profile", "file"}
INPUT_DIR_FLAGS = {"--state-dir"}
OUTPUT_FILE_FLAGS = {"--record", "--plot", "--json"}
OUTPUT_DIR_FLAGS = {"--out", "--report"}
FILE_OUTPUT_COMMANDS = {"simulate", "plot"}
"""Commands whose ``--out`` is a file (elsewhere ``--out`` is a directory)."""


# ------------------------------------------------------- valid, cheap command lines
def bases(f: Files, out: Path) -> dict[str, list[str]]:
    """A valid, cheap command line per command (the fuzzed flag is added to it)."""
    sim = ["--trace", str(f.trace), "--quiet"]
    return {
        "run": ["run", "--simulate", "--virtual", "--controller", "max", "--metrics-address",
                "none", *sim],
        "run --config": ["run", "--dry-run"],
        "check-config": ["check-config", str(f.config), "--offline"],
        "status": ["status", "--backend", "emulated", "--emulator", DEAD_URL],
        "reset-clocks": ["reset-clocks", "--backend", "emulated", "--emulator", DEAD_URL],
        "replay": ["replay", str(f.recording), "--controller", "max"],
        "model show": ["model", "show", "--state-dir", str(f.state_dir)],
        "model export": ["model", "export", "--state-dir", str(f.state_dir), "--out",
                         str(out / "model")],
        "simulate": ["simulate", "--controller", "max", *sim],
        "experiments": ["experiments", "--quick", "--trace", str(f.burst_trace), "--duration",
                        "60", "--animation", "2", "--out", str(out / "experiments")],
        "bench controllers": ["bench", "controllers", "--tiny", "--out", str(out / "bench")],
        "plot": ["plot", str(f.recording), "--out", str(out / "plot.png")],
        "emulate": ["emulate", "--profile", PROFILE, "--address", "127.0.0.1:0"],
        # Ten times the trace's rate: its 4.5 s of arrivals are sent in real time.
        "load": ["load", "--trace", str(f.trace), "--url", DEAD_URL, "--model", "m",
                 "--quiet", "--drain", "1", "--load-scale", "10"],
        "profile": ["profile", "--engine-url", DEAD_URL, "--gpus", "0", "--backend",
                    "emulated", "--out", str(out / "profile")],
        "sweep": ["sweep", "--grid", str(f.grid), "--out", str(out / "sweep")],
        "fleet": ["fleet", "--nodes", "1", "--duration", "2", "--drain", "1", "--no-step",
                  "--allocators", "uniform", "--budgets", "0.7", "--trace", str(f.trace),
                  "--trace-start", "0", "--controller", "max", "--jobs", "1", "--quiet",
                  "--out", str(out / "fleet")],
        "actuator": ["actuator", "--gpus", "0", "--allow", "0", "--socket",
                     str(out / "actuator.sock")],
    }  # fmt: skip


NODE_RUN_FLAGS = {"--config", "--dry-run"}
"""``run`` flags fuzzed on a node run (``--config``) rather than on ``--simulate``."""

ACCEPTED: dict[tuple[str, str], tuple[frozenset[str] | None, str]] = {
    ("load", "--model"): (None, "the model id is the server's to refuse (one line, exit 1)"),
    ("emulate", "--served-model-name"): (
        frozenset({"-1", "nan", "9" * 20, "http://[::1", "http://127.0.0.1:99999"}),
        "model ids like any other (printable text up to 256 characters is served)",
    ),
    ("profile", "--name"): (frozenset({"nan", "9" * 20}), "file stems like any other"),
    **{
        (command, "--api-key"): (
            frozenset({"-1", "nan", "9" * 20, "http://[::1", "http://127.0.0.1:99999"}),
            "API keys like any other (visible ASCII; the server refuses a wrong one, its 401 "
            "in one line)",
        )
        for command in ("load", "profile")
    },
    ("actuator", "--allow"): (
        frozenset({"nan", "inf", "x"}),
        "user names like any other (looked up at each connection)",
    ),
}
"""(command, flag) -> (the values accepted on purpose, None for every value; the reason it
is not a usage error). Documented in docs/commands.md (Input rules)."""


@dataclass(frozen=True)
class Case:
    """One fuzz case: the command, the flag, the bad value."""

    command: str
    flag: str
    value: str

    def argv(self, base: list[str]) -> list[str]:
        """The command line: the base with the flag (or the positional) replaced."""
        if self.flag == "file":  # the positional FILE: the base's first path
            return [base[0], self.value, *base[2:]]
        argv = list(base)
        if self.flag in argv:  # replace the base's own value of the flag
            index = argv.index(self.flag)
            del argv[index : index + 2]
        return (
            [*argv, self.flag, self.value]
            if not self.value.startswith("-")
            else [
                *argv,
                f"{self.flag}={self.value}",
            ]
        )


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every leaf command of the parser (``bench controllers``, ``model show``, ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
                if inner:
                    for leaf, subsub in _commands(sub):
                        yield f"{name} {leaf}", subsub
                else:
                    yield name, sub


def _catalogue(command: str, action: argparse.Action, f: Files) -> list[str]:
    """The bad values of a flag's kind."""
    flag = action.option_strings[0] if action.option_strings else action.dest
    if action.choices is not None:
        return CHOICES
    if action.type not in (None, str):
        return NUMBERS
    if flag in INPUT_FILE_FLAGS:
        return input_files(f)
    if flag in INPUT_DIR_FLAGS:
        return input_dirs(f)
    if flag in OUTPUT_FILE_FLAGS or (flag == "--out" and command in FILE_OUTPUT_COMMANDS):
        return output_files(f)
    if flag in OUTPUT_DIR_FLAGS:
        return output_dirs(f)
    return TEXT


def all_cases(f: Files) -> list[Case]:
    """Every (command, flag, value) of the catalogue; flags that take no value are left out."""
    cases = []
    for command, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue  # --help, switches, hidden aliases (their flag is fuzzed)
            flag = action.option_strings[0] if action.option_strings else action.dest
            if flag in ("command", "benchmark", "action"):
                continue
            accepted, _ = ACCEPTED.get((command, flag), (frozenset(), ""))
            if accepted is None:
                continue
            for value in _catalogue(command, action, f):
                if value not in accepted:
                    cases.append(Case(command, flag, value))
    return cases


# ---------------------------------------------------------------------- the runner
@pytest.fixture
def parsers_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` builds each command's parser once for the test, not once per case: the
    construction (argparse's gettext lookups) was most of a refused case's time, and a
    parse leaves its parser as it found it."""
    monkeypatch.setattr(cli, "build_parser", functools.cache(build_parser))


class CaseTimeout(BaseException):
    """The time bound ran out (a BaseException: no command's handler may swallow it)."""


def _run_in_process(argv: list[str]) -> tuple[int, str, float]:
    """``main(argv)`` under the time bound; (exit code, stderr, peak-RSS growth KiB)."""

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise CaseTimeout(f"{argv} ran over {TIME_BOUND_S} s")

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous = signal.signal(signal.SIGALRM, on_alarm)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    err, out = io.StringIO(), io.StringIO()
    try:
        signal.setitimer(signal.ITIMER_REAL, TIME_BOUND_S)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return code, err.getvalue(), grown


def _names_the_input(line: str, case: Case) -> bool:
    """Whether the error line names the flag (or its command's positional) or the value."""
    names = {case.flag, case.flag.lstrip("-"), case.flag.lstrip("-").replace("-", "_")}
    if case.flag == "file":
        names.add("FILE")
    value = case.value.strip()
    if not value and "empty value" in line:  # a blank value is refused before parsing
        return case.flag == "file" or case.flag in line
    return any(name in line for name in names) or (len(value) > 1 and value[:200] in line)


@pytest.mark.usefixtures("parsers_built_once")
def test_every_flag_refuses_the_catalogue(
    files: Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # a blank path must not mean "here": nothing may appear in it
    base = bases(files, tmp_path)
    failures: list[str] = []
    cases = all_cases(files)
    commands = {command for command, _ in _commands(build_parser())}
    assert {c.command for c in cases} | {"profiles", "traces"} >= commands - {"bench"}
    for case in cases:
        key = "run --config" if case.command == "run" and case.flag in NODE_RUN_FLAGS else None
        argv = case.argv(base[key or case.command])
        try:
            code, stderr, grown = _run_in_process(argv)
        except (Exception, CaseTimeout) as error:
            failures.append(
                f"{case.command} {case.flag} {case.value[:40]!r}: raised {error!r:.200}"
            )
            continue
        errors = [line for line in stderr.splitlines() if line.startswith("gpugov: error:")]
        problem = None
        if "Traceback" in stderr:
            problem = "traceback"
        elif code != 2:
            problem = f"exit {code}"
        elif len(errors) != 1:
            problem = f"{len(errors)} error lines"
        elif not _names_the_input(errors[0], case):
            problem = f"the line names neither the flag nor the value: {errors[0]!r}"
        elif grown > MEMORY_BOUND_KIB:
            problem = f"peak RSS grew {grown} KiB"
        if problem:
            failures.append(f"{case.command} {case.flag} {case.value[:40]!r}: {problem}")
    assert not failures, "\n".join(failures)
    assert list(cwd.iterdir()) == []


def test_the_catalogue_covers_every_kind(files: Files) -> None:
    cases = all_cases(files)
    flags = {(c.command, c.flag) for c in cases}
    for expected in [
        ("simulate", "--seed"),
        ("simulate", "--control-period"),
        ("simulate", "--latency-noise"),
        ("load", "--start"),
        ("emulate", "--gpus"),
        ("check-config", "file"),
        ("sweep", "--grid"),
        ("load", "--json"),
        ("run", "--record"),
        ("experiments", "--out"),
    ]:
        assert expected in flags, expected
    assert len(cases) > 300, len(cases)


@pytest.mark.parametrize(
    "command", ["sweep", "fleet", "bench controllers", "model export", "profile"]
)
def test_an_out_dir_that_is_a_link_to_nothing_is_refused_naming_it(
    command: str, files: Files, tmp_path: Path
) -> None:
    """A --out DIR that is a link loop or a link to a missing directory: profile took it
    (and asked the engine first), the others said "cannot create it: File exists"."""
    for link, said in (
        (files.link_loop, "a symbolic link loop"),
        (files.root / "dangling", "a symbolic link to a missing directory"),
    ):
        if not link.is_symlink():
            link.symlink_to(files.root / "no-such-dir" / "out")
        argv = _with_out(bases(files, tmp_path)[command], str(link))
        code, stderr, _ = _run_in_process(argv)
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1, (command, stderr)
        assert lines[0].startswith(f"gpugov: error: --out {link}: {said}"), lines


def _with_out(base: list[str], out: str) -> list[str]:
    """``base`` with its ``--out`` value replaced by ``out``."""
    argv = list(base)
    argv[argv.index("--out") + 1] = out
    return argv


WORST = [
    ["check-config", "/dev/zero"],
    ["replay", "/dev/zero", "--controller", "max"],
    ["sweep", "--grid", "/dev/zero", "--out", "{tmp}/sweep"],
    ["simulate", "--controller", "open-loop:/dev/zero"],
    ["simulate", "--trace", "{fifo}"],
    ["simulate", "--control-period", "1e-9"],
    ["emulate", "--gpus", "100000", "--profile", PROFILE],
    ["simulate", "--out", "/proc/version"],
]
"""The issue's worst cases (unbounded reads, hangs), as real processes."""


def test_worst_cases_in_a_bounded_process(files: Files, tmp_path: Path) -> None:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    for template in WORST:
        argv = [a.format(tmp=tmp_path, fifo=files.fifo) for a in template]
        done = subprocess.run(
            [sys.executable, "-m", "gpugov", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=limits,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, (argv, done.stderr)
        assert len(lines) == 1 and lines[0].startswith("gpugov: error: "), (argv, lines)


CHEAP_BASES = {
    "run": 0,
    "check-config": 0,
    "replay": 0,
    "model show": 0,
    "simulate": 0,
    "plot": 0,
    "sweep": 0,
    "load": 1,  # nothing listens at DEAD_URL: every request fails (exit 1, not a usage error)
    "status": 4,  # no emulator answers at DEAD_URL: no GPU (exit 4)
    "reset-clocks": 4,
}
"""The command lines the catalogue is added to are valid: run alone, none is a usage
error (so a case's exit 2 comes from its bad value). The costly ones (experiments, bench,
emulate, which serves until stopped) are left out; profile's needs an engine, and its
cases are held to naming the flag or the value instead."""


def test_the_command_lines_the_catalogue_extends_are_valid(files: Files, tmp_path: Path) -> None:
    base = bases(files, tmp_path)
    for command, expected in CHEAP_BASES.items():
        code, stderr, _ = _run_in_process(base[command])
        assert code == expected, (command, stderr)
