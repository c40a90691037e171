"""The CLI's bad inputs: each is refused with its exit code and ONE stderr line.

Every case goes through the real entry point (``gpugov.cli.main``); none may print a
traceback, and nothing may be written where the user did not ask.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from gpugov.cli import main

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("gpugov: error: "), err
    return err[0]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n1,200,20\n")
    return path


@pytest.fixture
def trace_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test where a trace is read: a flag is to be refused before it."""
    from gpugov.daemon import cli_support

    def unread(*args: object, **kwargs: object) -> None:
        raise AssertionError("the trace was read")

    monkeypatch.setattr(cli_support, "load_trace", unread)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "run.jsonl"
    argv = [
        "run",
        "--simulate",
        "--virtual",
        "--duration",
        "20",
        "--controller",
        "reactive",
        "--metrics-address",
        "none",
        "--record",
        str(path),
        "--quiet",
    ]
    assert main(argv) == 0
    return path


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["simulate", "--stride", "0"], "argument --stride: must be an integer in [1, "),
        (
            ["emulate", "--profile", "h100-sxm-llama3-8b", "--fault", "lost-after:-1"],
            "--fault lost-after:-1: SECONDS must lie in",
        ),
        (
            ["emulate", "--profile", "h100-sxm-llama3-8b", "--fault", "lost-after:nan"],
            "--fault lost-after:nan: SECONDS must lie in",
        ),
        (["simulate", "--latency-noise", "-1"], "argument --latency-noise: must be a coeff"),
        (["simulate", "--controller", "mpc:garbage"], "unknown profile 'garbage'"),
        (["simulate", "--controller", "mpc:"], "name a profile after the colon"),
        # Taken as the bare kind, as if no colon were there.
        (["simulate", "--controller", "mpc-online:"], "or KEY=VALUE hints after the colon"),
        (["simulate", "--controller", "reactive:foo"], "reactive takes no argument"),
        (["simulate", "--controller", "max:1"], "max takes no argument"),
        (["simulate", "--load-scale", "1e-6"], "over the limit of 7 simulated days"),
        (["run", "--simulate", "--controller", "mpc:garbage"], "unknown profile 'garbage'"),
        (["run", "--simulate", "--dry-run"], "--dry-run applies to a node run"),
        (["run", "--simulate", "--load-scale", "1e-6"], "over the limit of 7 simulated days"),
        (["run", "--simulate", "--controller", "fixed:99999"], "outside the supported range"),
        (["status", "--engine-url", "notaurl"], "--engine-url: must be an http:// or https:// URL"),
        (["status", "--engine-url", "http://127.0.0.1:99999/metrics"], "has a port outside"),
        # A host no name encodes, or one holding a control character: http.client raised
        # on it at the first request, a traceback.
        (["status", "--engine-url", "http://ü..x:8000/metrics"], "'ü..x' is no host name"),
        (
            ["load", "--url", "http://ü..x:8000", "--trace", "azure-conv-10min"],
            "--url: 'ü..x' is no host name",
        ),
        (
            ["load", "--url", "http://a\x01b:8000", "--trace", "azure-conv-10min"],
            "it holds a control character",
        ),
        (["bench", "controllers", "--traces", "nosuch"], "unknown trace 'nosuch'"),
        (
            ["bench", "controllers", "--traces", "azure-conv-10mim"],
            "nor a file; did you mean 'azure-conv-10min'?",
        ),
        (["simulate", "--trace", "azure-conv-10mim"], "did you mean 'azure-conv-10min'?"),
        (["bench", "controllers", "--jobs", "0"], "argument --jobs: must be an integer in [1, "),
        (["experiments", "--out", "/dev/null/x"], "/dev/null is not a directory"),
        # Scaled to its load, a window this short was 0 s (or its capacity's inverse
        # infinite): a traceback from inside the run.
        (
            ["bench", "controllers", "--traces", "azure-conv-10min", "--duration", "1e-300"],
            "argument --duration: must be a duration in seconds in [0.05, ",
        ),
        (
            ["fleet", "--no-step", "--trace", "azure-conv-10min", "--duration", "1e-300"],
            "argument --duration: must be a duration in seconds in [0.05, ",
        ),
    ],
)
def test_bad_input_is_one_line(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert expected in _one_error_line(capsys)


@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_an_output_file_named_as_a_folder_is_refused(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--out out.json/` (a folder's name, no such folder yet) was written as the file
    out.json."""
    target = f"{tmp_path / ('out.json' if flag == '--out' else 'out.png')}/"
    assert main(["simulate", flag, target, "--duration", "5"]) == 2
    assert _one_error_line(capsys).endswith(f"{flag} {target}: is a directory; give a file name")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_unwritable_simulate_outputs_are_refused_before_the_work(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = blocker / "x.out"  # a file's "subdirectory": never writable
    assert main(["simulate", flag, str(target), "--duration", "5"]) == 2
    line = _one_error_line(capsys)
    assert f"{flag} {target}" in line
    missing = tmp_path / "no" / "such" / "x.out"
    assert main(["simulate", flag, str(missing), "--duration", "5"]) == 2
    assert "does not exist (create it first)" in _one_error_line(capsys)
    assert not (tmp_path / "no").exists()


def test_record_under_a_missing_directory_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "nosuch" / "run.jsonl"
    argv = [
        "run",
        "--simulate",
        "--virtual",
        "--duration",
        "5",
        "--metrics-address",
        "none",
        "--record",
        str(target),
    ]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert f"--record {target}: directory {target.parent} does not exist" in line
    assert not target.parent.exists()


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--record`` on the trace, ``--out`` on the profile, a config recording into itself:
    each replaced the input it named."""
    kept = trace.read_text()
    run = ["run", "--simulate", "--virtual", "--controller", "max", "--metrics-address", "none"]
    assert main([*run, "--trace", str(trace), "--record", str(trace)]) == 2
    assert "is the trace, which it would overwrite" in _one_error_line(capsys)
    assert main(["simulate", "--trace", str(trace), "--out", str(trace)]) == 2
    assert "--out" in _one_error_line(capsys)
    assert trace.read_text() == kept
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nrecord = "{config}"\nmetrics_address = ""\n'
        '[[domains]]\nname = "d"\ngpus = [0]\n'
    )
    text = config.read_text()
    assert main(["run", "--config", str(config)]) == 2
    assert "is the config file, which it would overwrite" in _one_error_line(capsys)
    assert config.read_text() == text


@pytest.mark.parametrize("name", ["online-model-sim.json", "online-model-sim.lock"])
def test_a_record_on_the_learned_model_of_a_simulated_run_is_refused_and_the_model_kept(
    name: str,
    trace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``run --simulate --record`` on the learned model (or its hold file) mpc-online keeps
    in ``$STATE_DIRECTORY``: the recording truncated the model, which then read as corrupt
    and was set aside, and the model written at the end replaced the recording."""
    state = tmp_path / "state"
    state.mkdir()
    target = state / name
    target.write_text("kept")
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    argv = ["run", "--simulate", "--virtual", "--controller", "mpc-online", "--trace"]
    argv += [str(trace), "--metrics-address", "none", "--quiet", "--record", str(target)]
    assert main(argv) == 2
    assert f"--record {target}: is the learned model" in _one_error_line(capsys)
    assert target.read_text() == "kept"
    assert sorted(path.name for path in state.iterdir()) == [name]


def test_an_output_on_the_file_behind_a_trace_name_is_refused_and_the_trace_kept(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a ``--trace`` path was compared with the outputs: ``--out`` on the file a trace
    name reads (a shared name's file, the bundled default's when no ``--trace`` is
    given) replaced that trace with the run's JSON."""
    import socket

    from gpugov.daemon.cli_outputs import simulated_run_inputs
    from gpugov.plant.workload import DEFAULT_TRACE, resolve_trace

    shared = tmp_path / "burstgpt1_first400rows.csv"
    shutil.copy(trace, shared)
    kept = shared.read_bytes()
    monkeypatch.setenv("GPUGOV_TRACES_DIR", str(tmp_path))
    run = ["run", "--simulate", "--virtual", "--metrics-address", "none", "--quiet"]
    for argv in (
        ["simulate", "--trace", "burstgpt1", "--quiet", "--out", str(shared)],
        [*run, "--trace", "burstgpt1", "--record", str(shared)],
    ):
        assert main(argv) == 2
        assert f"{shared}: is the trace, which it would overwrite" in _one_error_line(capsys)
    with socket.create_server(("127.0.0.1", 0)) as engine:
        url = f"http://127.0.0.1:{engine.getsockname()[1]}"
        argv = ["load", "--trace", "burstgpt1", "--url", url, "--json", str(shared), "--quiet"]
        assert main(argv) == 2
        assert f"--json {shared}: is the trace, which it would overwrite" in (
            _one_error_line(capsys)
        )
    assert shared.read_bytes() == kept
    # No --trace: the default trace's file is the input (checked without writing near it).
    inputs = dict(simulated_run_inputs(None, "h100-sxm-llama3-8b", "max"))
    assert Path(inputs["the trace"]) == resolve_trace(DEFAULT_TRACE)


def test_an_output_on_the_profile_csv_the_plan_or_the_other_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` on the profile's CSV or on an open-loop plan replaced that input, and
    ``--plot`` on the ``--out`` file replaced the JSON results with the PNG."""
    for name in ("h100-sxm-llama3-8b.json", "h100-sxm-llama3-8b.csv"):
        shutil.copy(PROFILES / name, tmp_path / name)
    manifest, table = tmp_path / "h100-sxm-llama3-8b.json", tmp_path / "h100-sxm-llama3-8b.csv"
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    kept = {path: path.read_bytes() for path in (manifest, table, plan)}
    simulate = ["simulate", "--duration", "5", "--quiet"]
    assert main([*simulate, "--profile", str(manifest), "--out", str(table)]) == 2
    assert f"--out {table}: is the profile's CSV, which it would overwrite" in (
        _one_error_line(capsys)
    )
    assert main([*simulate, "--controller", f"open-loop:{plan}", "--out", str(plan)]) == 2
    assert "is the open-loop plan, which it would overwrite" in _one_error_line(capsys)
    record = ["run", "--simulate", "--virtual", "--metrics-address", "none"]
    assert main([*record, "--profile", str(manifest), "--record", str(table)]) == 2
    assert "is the profile's CSV, which it would overwrite" in _one_error_line(capsys)
    assert {path: path.read_bytes() for path in kept} == kept
    out = tmp_path / "r.json"
    assert main([*simulate, "--out", str(out), "--plot", str(tmp_path / "." / "r.json")]) == 2
    assert "is the --out file, which it would overwrite" in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["mpc", "mpc-online", "power-profile"])
def test_an_output_on_the_profile_a_controller_spec_names_is_refused(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``--profile`` and an open-loop plan were protected: ``--controller
    mpc:P.json --out P.json`` replaced the manifest, ``power-profile:P.json --record
    P.csv`` the profile's CSV."""
    for name in ("h100-sxm-llama3-8b.json", "h100-sxm-llama3-8b.csv"):
        shutil.copy(PROFILES / name, tmp_path / name)
    manifest, table = tmp_path / "h100-sxm-llama3-8b.json", tmp_path / "h100-sxm-llama3-8b.csv"
    kept = {path: path.read_bytes() for path in (manifest, table)}
    controller = ["--controller", f"{kind}:{manifest}"]
    simulate = ["simulate", "--duration", "5", "--quiet", *controller]
    record = ["run", "--simulate", "--virtual", "--metrics-address", "none", *controller]
    for argv, flag in ((simulate, "--out"), (simulate, "--plot"), (record, "--record")):
        for target, what in ((manifest, "the profile"), (table, "the profile's CSV")):
            assert main([*argv, flag, str(target)]) == 2
            assert f"{flag} {target}: is {what}, which it would overwrite" in (
                _one_error_line(capsys)
            )
    assert {path: path.read_bytes() for path in kept} == kept


def test_prompt_above_the_kv_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.csv"
    big.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n1,900000,10\n")
    for argv in (
        ["simulate", "--trace", str(big)],
        ["run", "--simulate", "--virtual", "--trace", str(big)],
    ):
        assert main(argv) == 2
        line = _one_error_line(capsys)
        assert "request 1 (data row 2) needs 900000 + 10 KV tokens" in line and str(big) in line
        assert "more of the window" not in line


def test_every_prompt_above_the_kv_capacity_is_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line named the first request too long for the KV cache only; a trace of prompts
    longer than the profile's cache (Mooncake's on a small board) has many."""
    big = tmp_path / "big.csv"
    rows = "".join(f"{i},{900000 if i % 3 else 100},10\n" for i in range(9))
    big.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + rows)
    assert main(["simulate", "--trace", str(big), "--duration", "8"]) == 2
    line = _one_error_line(capsys)
    assert "request 1 (data row 2) needs 900000 + 10 KV tokens" in line
    assert line.endswith("(and 4 more of the window's 8 requests)"), line


def test_arrival_far_in_the_future_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    far = tmp_path / "far.csv"
    far.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,10,10\n1e308,10,10\n")
    assert main(["simulate", "--trace", str(far)]) == 2
    assert "7 simulated days" in _one_error_line(capsys)


def test_experiments_refuse_a_trace_without_a_shiftable_burst_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    # Every arrival in the first two seconds: no window has work 20 s in to move earlier.
    early = tmp_path / "early.csv"
    early.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n1,200,20\n")
    out = tmp_path / "out"
    argv = ["experiments", "--quick", "--trace", str(early), "--duration", "60"]
    assert main([*argv, "--animation", "5", "--out", str(out)]) == 2
    line = _one_error_line(capsys)  # no progress line before it
    assert f"--trace {early}" in line and "shiftable" in line
    assert not out.exists()


def test_trace_from_dev_zero_is_refused_before_reading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--trace", "/dev/zero"]) == 2
    assert "/dev/zero: is a device, not a trace file" in _one_error_line(capsys)


def test_reversed_clock_range_in_a_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "h100-sxm-llama3-8b"
    shutil.copy(PROFILES / f"{name}.csv", tmp_path / f"{name}.csv")
    manifest = json.loads((PROFILES / f"{name}.json").read_text())
    manifest["clock_range_mhz"] = list(reversed(manifest["clock_range_mhz"]))
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    assert main(["simulate", "--profile", str(path), "--duration", "5"]) == 2
    line = _one_error_line(capsys)
    assert str(path) in line and "clock_range_mhz must be [lowest, highest]" in line


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["simulate", "--controller", "max"], "decode_tokens_per_s' must be at least 1 token/s"),
        (["run", "--simulate", "--virtual", "--metrics-address", "none"], "at least 1 token/s"),
    ],
    ids=["simulate", "run-simulate"],
)
def test_a_profile_rate_no_board_has_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], named: str
) -> None:
    """A decode rate of 1e-300 token/s passed the loader and ended the run in an
    OverflowError traceback; it is one line now, and the earlier output is kept."""
    name = "h100-sxm-llama3-8b"
    lines = (PROFILES / f"{name}.csv").read_text().splitlines()
    lines[1:] = [
        ",".join([*row.split(",")[:2], "1e-300", *row.split(",")[3:]]) for row in lines[1:]
    ]
    (tmp_path / f"{name}.csv").write_text("\n".join(lines) + "\n")
    shutil.copy(PROFILES / f"{name}.json", tmp_path / f"{name}.json")
    earlier = tmp_path / "earlier.out"
    earlier.write_text("the earlier run's\n")
    flag = "--out" if command[0] == "simulate" else "--record"
    argv = [*command, "--profile", str(tmp_path / f"{name}.json"), "--duration", "20", "--quiet"]
    assert main([*argv, flag, str(earlier)]) == 2
    line = _one_error_line(capsys)
    assert f"{name}.csv:2: column '" in line and named in line
    assert earlier.read_text() == "the earlier run's\n"


def test_replay_refuses_a_fixed_clock_outside_the_recording(
    recording: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(recording), "--controller", "fixed:99999"]) == 2
    assert "outside the supported range" in _one_error_line(capsys)


def test_replay_calibrates_power_profile_on_the_profile_or_names_the_flag(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``power-profile`` ignored ``--profile`` and the recording's profile, and its refusal
    named neither the flag nor how to give one."""
    assert main(["replay", str(recording), "--controller", "power-profile"]) == 0
    assert "replayed" in capsys.readouterr().out
    lines = recording.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["profile"]  # a node's recording names no profile
    bare = tmp_path / "node.jsonl"
    bare.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    assert main(["replay", str(bare), "--controller", "power-profile"]) == 2
    line = _one_error_line(capsys)
    assert "--controller power-profile:" in line and "--profile NAME" in line
    argv = ["replay", str(bare), "--controller", "power-profile", "--profile"]
    assert main([*argv, "h100-sxm-llama3-8b"]) == 0
    assert "replayed" in capsys.readouterr().out


def test_crash_cut_recording_replays_up_to_the_last_complete_line(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = recording.read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 40])  # the last tick line loses its end
    complete = len(text.splitlines()) - 2
    assert main(["replay", str(cut), "--controller", "max"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("gpugov: warning: ")
    assert "last line is incomplete" in warnings[0]
    assert f"using the {complete + 1} complete line(s)" in warnings[0]
    assert f"replayed {complete} decisions" in captured.out
    # A complete last line that is not JSON is no cut-short write: refused by its line.
    junk = tmp_path / "junk.jsonl"
    junk.write_text(text + "[[[[not json\n")
    assert main(["replay", str(junk), "--controller", "max"]) == 2
    assert f"{junk}:{complete + 3}: not JSON" in _one_error_line(capsys)


def test_all_interfaces_metrics_address_warns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gpugov.daemon.exporter as exporter

    bound: list[tuple[str, int]] = []

    class NoServer:
        """Stands in for the exporter: tests never listen beyond loopback."""

        url = "http://0.0.0.0:0/metrics"

        def __init__(self, host: str, port: int) -> None:
            bound.append((host, port))

        def publish(self, *args: object, **kwargs: object) -> None:
            """Accept whatever the loop publishes."""

        def __getattr__(self, name: str) -> object:
            return lambda *args, **kwargs: None

    monkeypatch.setattr(exporter, "Exporter", NoServer)
    # The max clock, not the default mpc-online: the warning is the address's, and the
    # simulation need not load (or, on a cold cache, compile) the MPC's numba kernels.
    argv = [
        "run",
        "--simulate",
        "--virtual",
        "--duration",
        "5",
        "--controller",
        "max",
        "--quiet",
        "--metrics-address",
        "0.0.0.0:0",
    ]
    assert main(argv) == 0
    assert bound == [("0.0.0.0", 0)]
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [
        "gpugov: warning: metrics address 0.0.0.0:0 exposes /metrics on every network "
        "interface; use 127.0.0.1 or one interface's address unless that is intended"
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["simulate", "--out", "/proc/version"], "--out /proc/version: cannot write in /proc"),
        (["simulate", "--out", "/dev/zero"], "--out /dev/zero: not a regular file"),
        (["simulate", "--plot", "{tmp}"], "is a directory; give a file name"),
        (["simulate", "--out", "{tmp}/missing/x.json"], "does not exist (create it first)"),
        (
            ["load", "--trace", "{trace}", "--url", "http://127.0.0.1:9", "--model", "m",
             "--json", "{tmp}/missing/x.json"],
            "--json {tmp}/missing/x.json: directory {tmp}/missing does not exist",
        ),
        (["experiments", "--out", "{tmp}/missing/out"], "does not exist (create it first)"),
        (["experiments", "--out", "/dev/zero"], "exists and is not a directory"),
    ],
)  # fmt: skip
def test_outputs_are_checked_before_the_work_and_no_parent_is_created(
    argv: list[str], expected: str, tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = [a.format(tmp=tmp_path, trace=trace) for a in argv]
    assert main(filled) == 2
    assert expected.format(tmp=tmp_path) in _one_error_line(capsys)
    assert not (tmp_path / "missing").exists()


def test_load_json_on_its_trace_is_refused_before_any_request(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `load --trace T --json T` replaced the trace with the run's summary.
    import socket

    kept = trace.read_bytes()
    with socket.create_server(("127.0.0.1", 0)) as engine:
        engine.setblocking(False)
        url = f"http://127.0.0.1:{engine.getsockname()[1]}"
        link = tmp_path / "link.csv"
        link.symlink_to(trace)
        for target in (trace, link):
            argv = ["load", "--trace", str(trace), "--url", url, "--json", str(target)]
            assert main([*argv, "--quiet"]) == 2
            assert f"--json {target}: is the trace, which it would overwrite" in (
                _one_error_line(capsys)
            )
        with pytest.raises(BlockingIOError):
            engine.accept()  # no request was sent
    assert trace.read_bytes() == kept


def test_load_max_model_len_of_one_token_is_refused_before_any_request(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One token leaves no room for an output: every request was clipped to max_tokens 0,
    # and the run sent them all, each refused by the server (exit 1 after the run).
    import socket

    with socket.create_server(("127.0.0.1", 0)) as engine:
        engine.setblocking(False)
        url = f"http://127.0.0.1:{engine.getsockname()[1]}"
        argv = ["load", "--trace", str(trace), "--url", url, "--max-model-len", "1", "--quiet"]
        assert main(argv) == 2
        assert "argument --max-model-len: must be an integer in [2, " in _one_error_line(capsys)
        with pytest.raises(BlockingIOError):
            engine.accept()  # no request was sent


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["simulate", "--seed", "-1"], "--seed"),
        (["simulate", "--latency-noise", "1e6"], "--latency-noise"),
        (["simulate", "--control-period", "1e-9"], "--control-period"),
        (["run", "--simulate", "--control-period", "1e-9"], "--control-period"),
        (["load", "--start", "-5", "--trace", "x", "--url", "http://127.0.0.1:9"], "--start"),
        (["emulate", "--gpus", "100000", "--profile", "h100-sxm-llama3-8b"], "--gpus"),
        (["simulate", "--trace", ""], "--trace"),
    ],
)
def test_numbers_are_refused_by_the_parser(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert f"argument {flag}: " in _one_error_line(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--control-period", "60"],
        ["run", "--simulate", "--control-period", "60"],
        ["fleet", "--nodes", "2", "--control-period", "60"],
    ],
)
def test_a_slo_target_window_of_fewer_than_twelve_periods_is_refused_as_a_config_refuses_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The simulated runs state the SLO target a config states (600 s), so they refuse a
    control period a config refuses with it (at least 12 periods in the window), in one
    line naming both flags; ``--slo-target none`` has no window to fill."""
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "--slo-target, --control-period: " in line and "at most 50 s, got 60 s" in line


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("period", "header period_s must be a positive number"),
        ("domains", "header domains must be a list"),
        ("clocks", "supported_clocks_mhz must be positive numbers"),
        ("safety", "safety must hold non-negative numbers"),
        ("row", ":3: a tick is a JSON object"),
        ("requested", "requested_mhz must be a positive number"),
    ],
)
def test_replay_names_a_malformed_recording_field(
    recording: Path, tmp_path: Path, damage: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each raised a KeyError, TypeError, ValueError or AttributeError traceback.
    lines = recording.read_text().splitlines()
    header = json.loads(lines[0])
    if damage == "period":
        header["period_s"] = "abc"
    elif damage == "domains":
        header["domains"] = "abc"
    elif damage == "clocks":
        header["domains"][0]["supported_clocks_mhz"] = ["a"]
    elif damage == "safety":
        header["domains"][0]["safety"] = {"dwell_s": -5}
    elif damage == "row":
        lines[2] = "[1, 2]"
    else:
        row = json.loads(lines[2])
        row["requested_mhz"] = "abc"
        row["failsafe"] = False
        lines[2] = json.dumps(row)
    lines[0] = json.dumps(header)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(damaged), "--controller", "max"]) == 2
    assert named in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("controller_config", "x", "domains[0].controller_config must be an object, got 'x'"),
        ("gpus", 5, "domains[0].gpus must be a list, got 5"),
        ("slo_target", {"attainment": 2}, "domains[0].slo_target.attainment: Input should be"),
        ("safety", {"dwell_s": 1e308}, "domains[0].safety.dwell_s: Input should be less than"),
        ("power_budget_held", "yes", "domains[0].power_budget_held must be true or false"),
        (
            "controller_config",
            {"kind": "mpc-online", "mean_prompt_tokens": 1e308},
            "domains[0].controller_config.mean_prompt_tokens must be a token count",
        ),
        ("context", [1], "domains[0].context must be an object, got [1]"),
        (
            "context",
            {"ttft_slo_s": -1},
            "domains[0].context.ttft_slo_s must be a positive number or null, got -1",
        ),
        ("context", {"gpu_uuids": [5]}, "domains[0].context.gpu_uuids must be a list of text"),
        (
            "context",
            {"forecasts": {"mean_output_tokens": 0}},
            "domains[0].context.forecasts.mean_output_tokens must be a token count",
        ),
    ],
)
def test_replay_checks_each_domain_field_it_hands_the_controller(
    recording: Path,
    tmp_path: Path,
    key: str,
    value: object,
    named: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Failed before: Python's own text ("'str' object has no attribute 'get'", "object of
    # type 'int' has no len()"), an slo_target line naming no file, a 'yes' read as true,
    # or a dwell or forecast of 1e308 that failed on tick 22, after the replay had begun.
    lines = recording.read_text().splitlines()
    header = json.loads(lines[0])
    header["domains"][0][key] = value
    lines[0] = json.dumps(header)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(damaged), "--controller", "mpc-online"]) == 2
    assert f"{damaged}:1: header {named}" in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("requested_clock_mhz", "fast", "field requested_clock_mhz must be a number, got 'fast'"),
        ("time_s", None, "field time_s must be a number, got null"),
        ("prefill_remaining_tokens", "x", "field prefill_remaining_tokens must be a number"),
        ("waiting_requests", 1.5, "field waiting_requests must be an integer, got 1.5"),
        ("decode_active", True, "field decode_active must be an integer, got True"),
        ("power_w", {"a": 1}, "field power_w must be a number"),
        ("model_name", 5, "field model_name must be text, got 5"),
        ("role", "banana", "field role must be one of colocated, prefill, decode"),
        ("arrival_rate", 1.0, "unknown field 'arrival_rate'"),
        ("power_w", 10**400, "field power_w must be a number a float holds"),
        ("step_index", 10**400, "field step_index must be an integer a float holds"),
    ],
)
@pytest.mark.parametrize("controller", ["reactive", "mpc-online"])
def test_replay_names_a_bad_observation_field(
    recording: Path,
    tmp_path: Path,
    field: str,
    value: object,
    named: str,
    controller: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A text clock raised a traceback; the others were refused without the field's name,
    # or replayed as if they were good.
    lines = recording.read_text().splitlines()
    row = json.loads(lines[3])
    row["observation"][field] = value
    lines[3] = json.dumps(row)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(damaged), "--controller", controller]) == 2
    line = _one_error_line(capsys)
    assert f"{damaged}:4: bad observation: {named}" in line


def test_replay_names_the_tick_an_outside_controller_fails_on(
    recording: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "failing_governor.py").write_text(
        "def make(context):\n"
        "    def decide(observation):\n"
        "        raise RuntimeError('no model for this tick')\n"
        "    return decide\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "failing_governor", raising=False)
    assert main(["replay", str(recording), "--controller", "failing_governor:make"]) == 2
    line = _one_error_line(capsys)
    assert f"{recording}:" in line and "the controller failed on this tick" in line
    assert "no model for this tick" in line


def test_bench_refuses_a_bad_trace_file_and_report_dir_before_making_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A malformed trace file was skipped scenario by scenario after --out was made and
    # the progress printed; a --report that is a file was refused after --out was made.
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,x,1\n")
    out = tmp_path / "out"
    assert main(["bench", "controllers", "--quick", "--traces", str(bad), "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"--traces: {bad}:2: field 'prompt_tokens'" in line
    assert not out.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = ["bench", "controllers", "--quick", "--report", str(a_file), "--out", str(out)]
    assert main(argv) == 2
    assert f"--report {a_file}: exists and is not a directory" in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--profiles", "nope"], "--profiles: unknown profile 'nope'"),
        (["--floor", "5000"], "--floor 5000: above the top supported clock"),
        (["--loads", "nope"], "--loads: unknown load(s) ['nope']"),
    ],
    ids=["profiles", "floor", "loads"],
)
def test_bench_refuses_a_bad_flag_before_reading_a_traces_file(
    trace_never_read: None,
    trace: Path,
    flags: list[str],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each was refused only after the --traces file was read (55 s for a 63 MB one).
    out = tmp_path / "out"
    argv = ["bench", "controllers", "--quick", "--traces", str(trace), "--out", str(out)]
    assert main([*argv, *flags]) == 2
    assert said in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("layout", ["colocated", "disaggregated"])
def test_bench_with_no_scenario_to_run_leaves_no_empty_out_or_report_dir(
    tmp_path: Path, layout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every scenario skipped (no request fits any profile's KV cache): the run failed in
    # one line but left the --out and --report directories it had made, empty.
    trace = tmp_path / "huge.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,9000000,1\n1,9000000,1\n")
    out, report = tmp_path / "out", tmp_path / "report"
    argv = ["bench", "controllers", "--quick", "--traces", str(trace), "--out", str(out)]
    argv += ["--layout", layout] + (["--report", str(report)] if layout == "colocated" else [])
    assert main(argv) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("gpugov: error: no ") and "scenario could run" in last
    assert not out.exists() and not report.exists()
    out.mkdir()  # a directory that was there stays
    assert main(argv[:-2] if layout == "colocated" else argv) == 2
    assert out.is_dir() and list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--traces", "t.csv", "./t.csv"], "--traces: t.csv and ./t.csv name the same file"),
        (
            ["--profiles", "h100-sxm-llama3-8b", str(PROFILES / "h100-sxm-llama3-8b.json")],
            "are both the profile 'h100-sxm-llama3-8b'",
        ),
        (["--profiles", "a/p.json", "b/p.json"], "a/p.json and b/p.json are both the profile 'p'"),
    ],
)
def test_bench_refuses_one_file_or_profile_name_given_twice(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    named: str,
) -> None:
    """Two spellings of one trace file passed the repeated-name check and ran its
    scenarios twice; two profiles of one name ran as scenarios of one key."""
    (tmp_path / "t.csv").write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(PROFILES / "h100-sxm-llama3-8b.csv", tmp_path / folder / "p.csv")
        manifest = json.loads((PROFILES / "h100-sxm-llama3-8b.json").read_text())
        (tmp_path / folder / "p.json").write_text(json.dumps({**manifest, "csv": "p.csv"}))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "controllers", "--quick", *flags, "--out", "out"]) == 2
    assert named in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--floor", "99999"], "--floor 99999: above the top supported clock of h100-sxm"),
        (["--loads", "cap70", "cap70"], "--loads: cap70 given more than once"),
        (["--traces", "azure-code", "azure-code"], "--traces: azure-code given more than once"),
    ],
)
def test_bench_refuses_a_floor_no_gpu_reaches_and_repeated_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    # Each ran: the whole board at a floor above every clock, a load or trace twice.
    out = tmp_path / "out"
    assert main(["bench", "controllers", "--quick", *flags, "--out", str(out)]) == 2
    assert named in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "controllers", "--quick"],
        ["experiments", "--quick"],
        ["fleet", "--nodes", "2", "--no-step"],
    ],
)
def test_a_malformed_ray_address_is_refused_before_any_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # It printed progress (and made --out, for experiments and fleet) before Ray refused it.
    out = tmp_path / "out"
    assert main([*command, "--ray", "nope", "--out", str(out)]) == 2
    assert "--ray nope: not a Ray address" in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "controllers", "--quick"],
        ["bench", "controllers", "--layout", "disaggregated"],
        ["experiments", "--quick"],
        ["fleet", "--nodes", "2", "--no-step"],
    ],
)
def test_a_ray_address_where_nothing_listens_is_refused_before_any_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # Ray retried such an address for about 14 minutes, after --out was made.
    import socket

    with socket.socket() as bound:  # a port of ours that does not listen
        bound.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{bound.getsockname()[1]}"
        out = tmp_path / "out"
        assert main([*command, "--ray", address, "--out", str(out)]) == 2
    assert f"--ray {address}: cannot join Ray" in _one_error_line(capsys)
    assert not out.exists()


def test_a_file_name_with_a_newline_or_an_escape_prints_as_one_escaped_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was printed raw: its newline split the one line, its ESC drove the terminal.
    name = tmp_path / "t\nfake: error\r\x1b[31m.csv"
    name.write_text("bad header\n")
    assert main(["simulate", "--trace", str(name)]) == 2
    line = _one_error_line(capsys)
    assert "\x1b" not in line and "\r" not in line
    assert "t\\nfake: error\\r\\x1b[31m.csv:1: unknown header" in line
    # A value argparse refuses, and an output path, are escaped the same way.
    assert main(["simulate", "--stride", "1\n2"]) == 2
    assert "not an integer: '1\\n2'" in _one_error_line(capsys)
    assert main(["simulate", "--out", "/nonexistent\x1b]0;x\x07/o.json"]) == 2
    assert "--out /nonexistent\\x1b]0;x\\x07/o.json:" in _one_error_line(capsys)


def test_a_written_file_or_traces_directory_with_a_newline_prints_as_one_escaped_line(
    tmp_path: Path,
    trace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # "wrote PATH" and the traces listing printed the name raw: its newline started a
    # line of its own, its ESC drove the terminal (the summary's title escaped it).
    out = tmp_path / "o\nfake\x1b[31m.json"
    assert main(["simulate", "--trace", str(trace), "--quiet", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"wrote {tmp_path}/o\\nfake\\x1b[31m.json" and out.is_file()
    monkeypatch.setenv("GPUGOV_TRACES_DIR", str(tmp_path / "x\ny\x1b[31m"))
    assert main(["traces"]) == 0
    listed = capsys.readouterr().out
    assert "\x1b" not in listed and "x\\ny\\x1b[31m/AzureLLMInferenceTrace_conv.csv" in listed
    from gpugov.plant.workload import BUNDLED_TRACES, SHARED_TRACES

    assert len(listed.splitlines()) == 2 + len(BUNDLED_TRACES) + len(SHARED_TRACES)


def test_a_warning_naming_such_a_file_is_one_escaped_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = tmp_path / "zero\nrows.csv"
    name.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n1,0,20\n")
    assert main(["simulate", "--trace", str(name), "--quiet"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("gpugov: warning: "), warnings
    assert "zero\\nrows.csv: skipped 1 zero-token row(s)" in warnings[0]


def test_each_problem_of_a_config_named_with_a_newline_stays_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node\n.toml"
    path.write_text("[daemon]\nperiod_s = 0\nbogus = 1\n")
    assert main(["check-config", str(path), "--offline"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("gpugov: error: ") and len(err) == 3, err
    assert all("node\\n.toml: " in line for line in err)
    assert [line.split(": ")[-2] for line in err[:2]] == ["daemon.period_s", "daemon.bogus"]


def test_a_header_of_several_formats_names_the_flag_only_where_the_command_has_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "pass format= to choose one", the Python argument, to every command.
    path = tmp_path / "both.csv"
    path.write_text(
        "arrival_time_s,prompt_tokens,output_tokens,TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "0.0,10,5,2023-11-16 18:00:00.0000000,100,50\n"
    )
    assert main(["simulate", "--trace", str(path)]) == 2
    line = _one_error_line(capsys)
    assert "matches several formats (azure, csv); rename a column" in line
    assert line.endswith("or choose one: --trace-format azure or --trace-format csv")
    assert main(["run", "--simulate", "--virtual", "--trace", str(path)]) == 2
    line = _one_error_line(capsys)
    assert "rename a column of each format but the one to read (azure: TIMESTAMP" in line
    assert "format=" not in line and "--trace-format" not in line


PROFILE_FLAGS = ["profile", "--engine-url", "http://127.0.0.1:1", "--gpus", "0", "--out", "x"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["simulate", "--duration", "1_0"], "argument --duration: not a number: '1_0'"),
        (["simulate", "--duration", "５"], "argument --duration: not a number: '５'"),
        (["simulate", "--seed", "1_0"], "argument --seed: not an integer: '1_0'"),
        (["simulate", "--controller", "fixed:1_400"], "fixed:MHZ needs a number"),
        (["simulate", "--controller", "power-cap:3_00"], "power-cap:W needs a number"),
        (
            ["simulate", "--controller", "mpc-online:gpu=H100,params_b=8_0"],
            "params_b must be a number of billions, got '8_0'",
        ),
        (
            ["simulate", "--controller", "mpc-online:gpu=H100,params_b=8,tp=٣"],
            "tp must be a whole number of GPUs",
        ),
        (
            ["profile", "--engine-url", "http://127.0.0.1:1", "--gpus", "²", "--out", "x"],
            "--gpus takes indices or GPU-/MIG- UUIDs separated by commas, got '²'",
        ),
        (
            [*PROFILE_FLAGS, "--clock-list", "١٠٠٠,1200"],
            "--clock-list '١٠٠٠,1200': expected MHz,MHz,...",
        ),
        (["emulate", "--profile", "h100-sxm-llama3-8b", "--fault", "lost-after:1_0"], "--fault"),
        # The actuator read its flags by its own rules: --gpus ٣ served GPU 3, --allow ٣
        # allowed uid 3, --max-lease-s 1_0 was 10 s and --gpus ² named a Python function.
        (
            ["actuator", "--gpus", "٣", "--allow", "root"],
            "argument --gpus: GPUs are NVML indices or GPU-/MIG- UUIDs separated by commas",
        ),
        (["actuator", "--gpus", "²", "--allow", "root"], "argument --gpus: GPUs are NVML"),
        (["actuator", "--gpus", "0", "--allow", "٣"], "argument --allow: a user name or a uid"),
        (["actuator", "--gpus", "0", "--allow", "²"], "argument --allow: a user name or a uid"),
        (
            ["actuator", "--gpus", "0", "--allow", "root", "--max-lease-s", "1_0"],
            "argument --max-lease-s: must be a number of seconds, got '1_0'",
        ),
        (
            ["actuator", "--gpus", "0", "--allow", "root", "--min-relock-s", "٣"],
            "argument --min-relock-s: must be a number of seconds, got '٣'",
        ),
    ],
    ids=[
        "duration-underscore", "duration-fullwidth", "seed", "fixed", "power-cap", "params_b",
        "tp-arabic", "gpus-superscript", "clock-list-arabic", "lost-after", "actuator-gpus",
        "actuator-gpus-superscript", "actuator-allow", "actuator-allow-superscript",
        "actuator-lease", "actuator-relock",
    ],
)  # fmt: skip
def test_a_number_that_is_no_plain_number_is_refused(
    argv: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Python's int() and float() read '1_0' as 10 and other scripts' digits as digits, so a
    typo ran: --duration 1_0 ran 10 s, fixed:1_400 locked 1400 MHz; and '²' passes
    str.isdigit() but not int(): --gpus ² ended in a traceback."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpugov: error: ") and said in err[0], err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("warp", "--controller: unknown controller 'warp'"),
        ("fixed:1000x", "--controller fixed:MHZ needs a number"),
    ],
)
def test_replay_refuses_a_bad_controller_before_reading_the_recording(
    spec: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The whole recording (1 GiB at most) was read first: this one does not exist, and
    # that was the line; 'unknown controller' also named no flag.
    missing = tmp_path / "missing.jsonl"
    assert main(["replay", str(missing), "--controller", spec]) == 2
    assert said in _one_error_line(capsys)


@pytest.mark.parametrize("command", ["simulate", "run-simulate"])
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--controller", "fixed:100"], "--controller fixed:100: outside the supported range"),
        (["--floor", "5000"], "--floor 5000: above the top supported clock"),
        (["--controller", "open-loop:plan.json"], "--controller open-loop:plan.json: plan.json"),
    ],
    ids=["fixed", "floor", "plan"],
)
def test_a_bad_controller_or_floor_is_refused_before_the_trace_is_read(
    trace_never_read: None,
    command: str,
    flags: list[str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each was refused only after the whole trace was read (a minute for a 63 MB one)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text("{not json")
    argv = ["simulate"] if command == "simulate" else ["run", "--simulate"]
    argv += ["--metrics-address", "none"] if command == "run-simulate" else []
    assert main([*argv, *flags]) == 2
    assert said in _one_error_line(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--profile", "h100-sxm-llama3-8bb"],
        ["experiments", "--quick", "--profile", "h100-sxm-llama3-8bb", "--out", "x"],
        ["emulate", "--profile", "h100-sxm-llama3-8bb", "--address", "127.0.0.1:0"],
        ["run", "--simulate", "--profile", "h100-sxm-llama3-8bb", "--metrics-address", "none"],
        # The recording is not read either (this one does not exist).
        ["replay", "missing.jsonl", "--controller", "mpc", "--profile", "h100-sxm-llama3-8bb"],
    ],
    ids=["simulate", "experiments", "emulate", "run-simulate", "replay"],
)
def test_a_bad_profile_names_its_flag_before_the_trace_is_read(
    trace_never_read: None,
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """'gpugov: error: unknown profile ...' named no flag, and simulate, experiments and
    run --simulate read their whole trace (a gigabyte at most) before the profile (run
    --simulate: 50 s for a 63 MB trace), replay its whole recording."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("gpugov: error: --profile: unknown profile 'h100-sxm-llama3-8bb'")
    assert not (tmp_path / "x").exists()
