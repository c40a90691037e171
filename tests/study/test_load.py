"""``gpugov load`` against the emulator on loopback: every request sent, streamed and timed."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


def test_a_model_the_server_does_not_list_is_warned_before_any_request(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--model` of a name the server's /v1/models does not list: every request of the
    window was sent and refused (HTTP 404), and the load said why only at its end. One
    warning line now comes first (TGI and SGLang serve any name, so it is no refusal)."""
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,5\n")
    out = tmp_path / "load.json"
    argv = ["load", "--trace", str(trace), "--url", emulator.url, "--json", str(out)]
    main([*argv, "--model", "no-such-model", "--quiet"])
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"gpugov: warning: --model no-such-model: {emulator.url}/v1/models lists no such "
        "model (it serves gpugov-emulated); a server that checks the name (vLLM) refuses "
        "every request: name one of them, or leave --model out for the first"
    ), err
    assert main([*argv, "--model", "gpugov-emulated", "--quiet"]) == 0
    assert json.loads(out.read_text())["requests_completed"] == 1


def test_the_summary_says_how_many_requests_max_model_len_clipped(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The clipped count was in the JSON only: the printed latencies read as the trace's
    lengths' while every request was cut to --max-model-len."""
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,400,8\n0.1,20,4\n")
    argv = ["load", "--trace", str(trace), "--url", emulator.url, "--quiet"]
    assert main([*argv, "--max-model-len", "64"]) == 0
    assert "  clipped to --max-model-len          1 of 2 requests\n" in capsys.readouterr().out
    assert main(argv) == 0
    assert "clipped" not in capsys.readouterr().out


def test_a_load_of_one_instant_ends_its_progress_at_100_percent(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every request at one timestamp is a window of 0 s: the last progress line of a run
    that sent and finished them all read "0.0% (0/0 s)"."""
    trace = tmp_path / "burst.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "0,64,4\n" * 3)
    assert main(["load", "--trace", str(trace), "--url", emulator.url]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("load:")]
    assert lines and lines[-1].startswith("load: 100.0% (0/0 s)"), lines


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


# A body this size outgrows loopback's socket buffers (a few MiB) many times over, so the
# emulator, which answers 413 after the headers and closes, cuts the send off midway.
OVERSIZED_PROMPT = 3_000_000  # token ids: an 18 MB body
BODY_LIMIT = 1 << 20  # the emulator's limit lowered from 32 MiB, as the test's


def test_a_body_over_the_emulator_limit_is_reported_as_its_413(
    emulator: EmulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulator reads the headers of a request over its body limit, answers 413 and
    closes the connection while the client is still sending the body: the client
    reported the send's broken pipe (``BrokenPipeError: [Errno 32] Broken pipe``); it
    now reads the answer waiting for it and reports that."""
    import http

    from gpugov.study import openai_client
    from gpugov.study.emulate import server as emulator_server
    from gpugov.study.openai_client import request_body, stream_completion

    monkeypatch.setattr(emulator_server, "MAX_BODY_BYTES", BODY_LIMIT)
    cut: list[int] = []
    answer = openai_client._answer_to_a_cut_request

    def spy(connection: object, size: int, timeout_s: float) -> str:
        cut.append(size)
        return answer(connection, size, timeout_s)  # type: ignore[arg-type]

    monkeypatch.setattr(openai_client, "_answer_to_a_cut_request", spy)
    body = request_body("gpugov-emulated", OVERSIZED_PROMPT, 4)
    size = len(json.dumps(body).encode())
    timing = stream_completion(emulator.url, body, timeout_s=30)
    assert cut == [size]  # the send was cut short: the path this test is about
    phrase = http.HTTPStatus(413).phrase  # "Content Too Large" from Python 3.13
    assert timing.error == f"HTTP 413 {phrase}: request body of {size} bytes is too large"
    assert timing.end_s is None and not timing.token_s
    # The emulator goes on serving.
    small = stream_completion(emulator.url, request_body("gpugov-emulated", 16, 3), timeout_s=30)
    assert small.error is None and len(small.token_s) == 3


def test_load_counts_an_oversized_request_as_failed_with_the_servers_answer(
    emulator: EmulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gpugov load`` counts the oversized request as one failed request with the
    server's 413 as its reason (the rest of the run goes on); a run where none completes
    ends in one line naming it."""
    from gpugov.study.emulate import server as emulator_server

    monkeypatch.setattr(emulator_server, "MAX_BODY_BYTES", BODY_LIMIT)
    trace = tmp_path / "t.csv"
    trace.write_text(
        f"arrival_time_s,prompt_tokens,output_tokens\n0,{OVERSIZED_PROMPT},4\n0.2,64,3\n"
    )
    out = tmp_path / "load.json"
    argv = ["load", "--trace", str(trace), "--url", emulator.url, "--quiet"]
    assert main([*argv, "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["requests_completed"] == 1 and summary["requests_failed"] == 1
    [(kind, count)] = summary["errors"].items()
    error = summary["error_examples"][kind]
    assert count == 1 and kind == "HTTP 413 RequestEntityTooLarge"
    assert error.startswith("HTTP 413 ") and "too large" in error
    stdout = capsys.readouterr().out
    assert f"error x1 [{kind}]: {error}" in stdout and "Broken pipe" not in stdout
    trace.write_text(f"arrival_time_s,prompt_tokens,output_tokens\n0,{OVERSIZED_PROMPT},4\n")
    assert main(argv) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert err == [f"gpugov: error: no request completed against {emulator.url}: {error}"]


class _Answers(BaseHTTPRequestHandler):
    """A server that answers every completion with the class's error status and body."""

    protocol_version = "HTTP/1.1"
    status = 502
    content_type = "text/html"
    body = b""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(self.body)
        self.close_connection = True


class _ProxyPage(_Answers):
    """A proxy's HTML error page, over several lines."""

    body = (
        b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
        b"<center><h1>502 Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n"
    )


class _ValidationError(_Answers):
    """vLLM's 400 for a request its schema refuses: pydantic's message spans lines."""

    status = 400
    content_type = "application/json"
    body = json.dumps(
        {
            "error": {
                "message": "1 validation error for CompletionRequest\nmax_tokens\n  Input "
                "should be greater than 0 [type=greater_than, input_value=0]",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        }
    ).encode()


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (
            _ProxyPage,
            "HTTP 502 Bad Gateway: <html> <head><title>502 Bad Gateway</title></head> <body> "
            "<center><h1>502 Bad Gateway</h1></center> </body> </html>",
        ),
        (
            _ValidationError,
            "HTTP 400 Bad Request: 1 validation error for CompletionRequest max_tokens Input "
            "should be greater than 0 [type=greater_than, input_value=0]",
        ),
    ],
    ids=["proxy-html-page", "multi-line-message"],
)
def test_an_error_answer_is_reported_on_one_line(
    handler: type[_Answers],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An error answer whose body or message spans lines (a proxy's HTML page, pydantic's
    validation message) is reported as one line, in the summary's errors and in the exit
    line: its line breaks were kept, and the one error line spanned several."""
    from gpugov.study.openai_client import request_body, stream_completion

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        timing = stream_completion(url, request_body("m", 16, 4), timeout_s=10)
        assert timing.error == expected
        trace = tmp_path / "t.csv"
        trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,16,4\n")
        argv = ["load", "--trace", str(trace), "--url", url, "--model", "m", "--quiet"]
        capsys.readouterr()
        assert main(argv) == 1
        err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert err == [f"gpugov: error: no request completed against {url}: {expected}"]
    finally:
        server.shutdown()
        server.server_close()


class _NeverAnswers(BaseHTTPRequestHandler):
    """A server that lists a model and takes every completion without answering it."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.release.wait(10)  # type: ignore[attr-defined]
        self.close_connection = True


@pytest.mark.parametrize(
    ("signum", "code", "word"), [(2, 130, "interrupted"), (15, 143, "terminated")]
)
def test_a_load_stopped_before_any_request_finished_says_it_was_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], signum: int, code: int, word: str
) -> None:
    """Stopped while every request was still waiting for its answer, ``load`` exited 1
    with 'no request completed ... no request finished'; it now ends as any stopped run."""
    import os

    server = ThreadingHTTPServer(("127.0.0.1", 0), _NeverAnswers)
    server.release = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:10.0000000,100,5\n2023-11-16 18:15:10.1000000,100,5\n"
    )
    out = tmp_path / "load.json"
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signum))
    timer.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = main(["load", "--trace", str(trace), "--url", url, "--json", str(out), "--quiet"])
    finally:
        timer.cancel()
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
    assert result == code
    assert capsys.readouterr().err.splitlines()[-1] == f"gpugov: {word} after 2 of 2 requests"
    assert json.loads(out.read_text())["stopped"] == word


def test_requests_over_the_served_context_are_named_before_the_run(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace whose requests exceed the model's context was sent as it was: each such
    request failed at the server, its reason cut to 80 characters mid-sentence,
    and nothing said so before the run; one warning line now says how many and the fix."""
    context = emulator.node.max_model_len
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        f"2023-11-16 18:15:10.0000000,100,5\n2023-11-16 18:15:10.1000000,{context},5\n"
    )
    argv = ["load", "--trace", str(trace), "--url", emulator.url, "--quiet"]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"gpugov: warning: --trace {trace}: 1 of 2 requests exceed the served model's context "
        f"of {context} tokens (prompt + output, its max_model_len in /v1/models); the server "
        f"will refuse them; --max-model-len {context} clips them instead"
    )
    assert main([*argv, "--max-model-len", "1000"]) == 0  # clipped: no warning
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("max_concurrency", "said"),
    [(1, r"1 requests sent, waiting: 1 in flight \(--max-concurrency\)"),
     (2, r"2 requests sent, draining 2 in flight \(at most [01]s more\)")],
)  # fmt: skip
def test_the_progress_line_says_what_a_long_wait_is_on(max_concurrency: int, said: str) -> None:
    """Waiting on the concurrency bound the line was not redrawn at all, and while draining
    it read '100%, ETA 0s' for up to --drain; both now say what the run waits on."""
    import io
    import re

    from gpugov.daemon.progress import Progress

    server = ThreadingHTTPServer(("127.0.0.1", 0), _NeverAnswers)
    server.release = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    stream = io.StringIO()
    progress = Progress(0.01, "load", unit="s", stream=stream, tty=False, log_interval_s=0.0)
    workload = [Request(0, 0.0, 100, 5), Request(1, 0.01, 100, 5)]
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        run_load(workload, url, "m", max_concurrency=max_concurrency, drain_s=0.8,
                 progress=progress)  # fmt: skip
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
    assert re.search(said, stream.getvalue())


class _ModelsAnswer(BaseHTTPRequestHandler):
    """A server whose ``GET /v1/models`` answers the server's ``status`` and ``body``."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        status, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (
            401,
            b'{"error": {"message": "bad key"}}',
            "/v1/models: HTTP 401 Unauthorized: bad key "
            "(a missing or wrong API key: --api-key or OPENAI_API_KEY)",
        ),
        (500, b"oops", "/v1/models: HTTP 500 Internal Server Error: oops"),
        (200, b'{"data": []}', "/v1/models lists no model"),
        (200, b'{"data": [{"id": 5}]}', "/v1/models: its first model has no id"),
    ],
)
def test_a_model_list_that_names_no_model_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], status: int, body: bytes, said: str
) -> None:
    """An error answer read '<url>/v1/models is not an OpenAI model list: <url>/v1/models:
    HTTP 500' without its message, an empty list 'list index out of range', and a numeric
    id was sent as the model '5'; each is now one line saying what the list lacks."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsAnswer)
    server.answer = (status, body)  # type: ignore[attr-defined]
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:10.0,100,5\n")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert main(["load", "--trace", str(trace), "--url", url, "--quiet"]) == 2
    finally:
        server.shutdown()
        server.server_close()
    assert capsys.readouterr().err.splitlines() == [f"gpugov: error: {url}{said}"]


class _SeveralTokensPerEvent(BaseHTTPRequestHandler):
    """A server streaming ``per_event`` tokens in each event (vLLM's and SGLang's
    ``--stream-interval``), 20 ms apart, ending at the length limit; ``usage`` (the
    class's flag) in a last event when asked for."""

    protocol_version = "HTTP/1.1"
    per_event = 4
    send_usage = False

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        wanted = int(body["max_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        while sent < wanted:
            count = min(self.per_event, wanted - sent)
            sent += count
            reason = "length" if sent == wanted else None
            event = {"choices": [{"index": 0, "text": " a" * count, "finish_reason": reason}]}
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(0.02)
        if self.send_usage:
            usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": sent}}
            self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@pytest.mark.parametrize("send_usage", [False, True])
def test_a_server_sending_several_tokens_per_event_is_counted_in_tokens(
    send_usage: bool,
) -> None:
    """Each stream event was counted as one token: a server sending four per event
    showed a quarter of the output tokens and four times the TPOT. The tokens are the
    usage's ``completion_tokens`` where the server sends it, else the ``max_tokens`` a
    stream ended at its length limit with."""
    handler = type("Handler", (_SeveralTokensPerEvent,), {"send_usage": send_usage})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        run = run_load([Request(0, 0.0, 8, 17), Request(1, 0.0, 8, 9)], url, "m", drain_s=20.0)
    finally:
        server.shutdown()
        server.server_close()
    summary = summarize(run)
    assert summary["requests_completed"] == 2, summary
    assert summary["output_tokens"] == 17 + 9
    for timing in run.timings:
        assert len(timing.token_s) == -(-timing.max_tokens // 4)  # events, not tokens
        assert timing.output_tokens == timing.max_tokens
        span = timing.token_s[-1] - timing.token_s[0]
        assert timing.tpot_s == pytest.approx(span / (timing.max_tokens - 1))
