"""``gpugov load`` against the emulator on loopback: every request sent, streamed and timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import make_plant

from gpugov.cli import main
from gpugov.plant.types import Request
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.load import run_load, summarize
from gpugov.study.openai_client import served_model


@pytest.fixture
def emulator():
    server = EmulatorServer(EmulatedNode(make_plant()), "127.0.0.1", 0)
    server.start()
    yield server
    server.close()


def test_replay_times_every_request(emulator: EmulatorServer) -> None:
    workload = [Request(i, 0.1 * i, 64 + 16 * i, 8 + i) for i in range(6)]
    model = served_model(emulator.url)
    run = run_load(workload, emulator.url, model, max_concurrency=4, drain_s=20.0)
    summary = summarize(run)
    assert summary["requests_completed"] == 6 and summary["requests_failed"] == 0
    assert summary["output_tokens"] == sum(r.output_tokens for r in workload)
    assert all(len(t.token_s) == t.max_tokens for t in run.timings)
    assert 0 < summary["ttft_s"]["p50"] < 1.0
    assert 0 < summary["tpot_s"]["p50"] < 0.5


def test_text_prompts_work_too(emulator: EmulatorServer) -> None:
    run = run_load([Request(0, 0.0, 40, 3)], emulator.url, "gpugov-emulated", prompt_mode="text")
    assert summarize(run)["requests_completed"] == 1


def test_cli_writes_json_and_fails_cleanly_when_unreachable(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,100,5\n2023-11-16 18:15:47.0805900,50,4\n"
    )
    out = tmp_path / "load.json"
    code = main(
        ["load", "--trace", str(trace), "--url", emulator.url, "--json", str(out), "--quiet"]
    )
    assert code == 0
    summary = json.loads(out.read_text())
    assert summary["requests_completed"] == 2
    assert summary["output_tokens"] == 9
    code = main(["load", "--trace", str(trace), "--url", "http://127.0.0.1:9", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpugov: error: engine at http://127.0.0.1:9 does not answer")
    # A bad trace is named before the engine is contacted (here unreachable too).
    code = main(["load", "--trace", str(tmp_path / "none.csv"), "--url", "http://127.0.0.1:9"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpugov: error:") and "none.csv" in err[-1]


@pytest.mark.parametrize(
    "rows",
    [
        "0,100,5\n1e300,100,5\n",  # a plain CSV whose second arrival is 1e300 s later
        "0,100,5\n31553789760,100,5\n",  # 1000 years, as 0001-01-01 to 9999-12-31
    ],
)
def test_a_window_longer_than_ten_years_is_refused_before_the_engine_is_contacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str
) -> None:
    """Sent in real time, such a window never ends (the run sent the first request, then
    waited, and its first line printed the span as hundreds of digits): one line naming
    the trace, before the engine (unreachable here) is asked anything, and no --json."""
    trace = tmp_path / "far.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + rows)
    out = tmp_path / "load.json"
    argv = ["load", "--trace", str(trace), "--url", "http://127.0.0.1:9", "--json", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"gpugov: error: --trace {trace}: the window spans ")
    assert "--duration" in err[0] and "does not answer" not in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("signum", "code", "word"), [(2, 130, "interrupted"), (15, 143, "terminated")]
)
def test_a_stopped_load_says_how_in_its_exit_line_and_summary(
    emulator: EmulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signum: int,
    code: int,
    word: str,
) -> None:
    """SIGINT ends ``load`` with 130, SIGTERM with 143 (it was 130 with no line), each
    with one line; the --json summary says the run was stopped."""
    import os
    import threading

    rows = "".join(f"2023-11-16 18:15:{10 + i:02d}.0000000,100,5\n" for i in range(40))
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    out = tmp_path / "load.json"
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signum))
    timer.start()
    try:
        result = main(
            ["load", "--trace", str(trace), "--url", emulator.url, "--json", str(out), "--quiet"]
        )
    finally:
        timer.cancel()
    assert result == code
    assert f"gpugov: {word} after" in capsys.readouterr().err
    assert json.loads(out.read_text())["stopped"] == word


def test_json_cut_short_mid_write_leaves_the_old_summary_whole(
    emulator: EmulatorServer, tmp_path: Path
) -> None:
    """``--json`` was written in place: a write that failed midway (past a file-size limit
    of 256 bytes) left a summary cut short, with a traceback; it is now replaced whole or
    not at all, and the failure is one line."""
    from study_support import run_past_file_size

    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,100,5\n2023-11-16 18:15:47.0805900,50,4\n"
    )
    out = tmp_path / "load.json"
    out.write_text('{"an": "earlier run"}\n')
    argv = ["load", "--trace", str(trace), "--url", emulator.url, "--json", str(out), "--quiet"]
    cut = run_past_file_size(argv, limit_bytes=256)
    assert cut.returncode == 1, cut.stderr
    line = f"gpugov: error: --json {out}: cannot write: File too large"
    assert cut.stderr.splitlines()[-1] == line
    assert out.read_text() == '{"an": "earlier run"}\n'
    assert sorted(path.name for path in tmp_path.iterdir()) == ["load.json", "t.csv"]
