"""``gpugov load --governor-metrics``: the daemon's energy estimate against the emulator's
truth, with a fake emulator and a fake daemon on loopback serving exactly their shapes
(``usage`` with ``energy_j``, ``GET /gpugov/energy``, ``gpugov_energy_*`` series)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpugov.cli import main
from gpugov.study import load_cli

J_PROMPT, J_OUTPUT, IDLE_J = 0.01, 0.5, 10.0
# The fake daemon's estimate: prefill 10% high, decode 5% low, idle exact.
PREFILL_BIAS, DECODE_BIAS = 1.10, 0.95


class FakeNode:
    """The truth both fakes read: finished requests and the idle energy so far."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.requests: list[dict[str, Any]] = []

    def totals(self) -> dict[str, float]:
        with self.lock:
            prefill = sum(r["prefill_j"] for r in self.requests)
            decode = sum(r["decode_j"] for r in self.requests)
            prompt = sum(r["prompt_tokens"] for r in self.requests)
            output = sum(r["output_tokens"] for r in self.requests)
            count = len(self.requests)
        idle = IDLE_J * (1 + count)  # idle energy between requests, step by step
        return {
            "prefill_j": prefill,
            "decode_j": decode,
            "idle_j": idle,
            "total_j": prefill + decode + idle,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "requests": count,
        }


def handler_for(node: FakeNode, *, with_truth: bool = True) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, body: bytes, kind: str = "application/json", status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())
            elif self.path.startswith("/gpugov/energy") and with_truth:
                totals = node.totals()
                with node.lock:
                    rows = list(node.requests)
                body = {
                    "plant_time_s": time.monotonic() - node.started,
                    "requests": rows,
                    "totals": {k: v for k, v in totals.items() if k != "requests"},
                }
                self._send(json.dumps(body).encode())
            elif self.path == "/governor/metrics":
                t = node.totals()
                lines = [
                    "# TYPE gpugov_energy_joules counter",
                    f'gpugov_energy_joules_total{{domain="d",model="m",phase="prefill"}} '
                    f"{t['prefill_j'] * PREFILL_BIAS}",
                    f'gpugov_energy_joules_total{{domain="d",model="m",phase="decode"}} '
                    f"{t['decode_j'] * DECODE_BIAS}",
                    f'gpugov_energy_joules_total{{domain="d",model="m",phase="idle"}} '
                    f"{t['idle_j']}",
                    "# TYPE gpugov_energy_tokens counter",
                    f'gpugov_energy_tokens_total{{domain="d",model="m",kind="prompt"}} '
                    f"{t['prompt_tokens']}",
                    f'gpugov_energy_tokens_total{{domain="d",model="m",kind="output"}} '
                    f"{t['output_tokens']}",
                    "# TYPE gpugov_energy_requests counter",
                    f'gpugov_energy_requests_total{{domain="d",model="m"}} {t["requests"]}',
                ]
                self._send(("\n".join(lines) + "\n").encode(), "text/plain")
            else:
                self._send(b"{}", status=404)

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            body = json.loads(self.rfile.read(length))
            prompt, output = len(body["prompt"]), int(body["max_tokens"])
            assert body["stream_options"] == {"include_usage": True}
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(output):
                event = {"choices": [{"index": 0, "text": " t", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            row = {
                "id": f"r{id(body)}",
                "prompt_tokens": prompt,
                "output_tokens": output,
                "prefill_j": J_PROMPT * prompt,
                "decode_j": J_OUTPUT * output,
                "total_j": J_PROMPT * prompt + J_OUTPUT * output,
                "finished_at_s": time.monotonic() - node.started,
            }
            with node.lock:
                node.requests.append(row)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": output,
                "total_tokens": prompt + output,
                "energy_j": row["total_j"],
                "prefill_energy_j": row["prefill_j"],
                "decode_energy_j": row["decode_j"],
            }
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    return Handler


@pytest.fixture
def fake() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(FakeNode()))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0000000,100,5\n2023-11-16 18:15:46.2000000,300,10\n"
        "2023-11-16 18:15:46.4000000,50,20\n"
    )
    return path


def test_load_compares_the_daemons_estimate_with_the_truth(
    fake: str,
    trace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(load_cli._EnergyRun, "LAG_S", 0.05)
    out = tmp_path / "load.json"
    code = main(
        [
            "load",
            "--trace",
            str(trace),
            "--url",
            fake,
            "--json",
            str(out),
            "--quiet",
            "--governor-metrics",
            f"{fake}/governor/metrics",
        ]
    )
    assert code == 0
    energy = json.loads(out.read_text())["energy"]
    phases = energy["phases"]
    assert phases["prefill"]["error"] == pytest.approx(PREFILL_BIAS - 1, abs=1e-6)
    assert phases["decode"]["error"] == pytest.approx(DECODE_BIAS - 1, abs=1e-6)
    assert phases["idle"]["error"] == pytest.approx(0.0, abs=1e-9)
    prefill, decode = J_PROMPT * 450, J_OUTPUT * 35
    expected = (PREFILL_BIAS * prefill + DECODE_BIAS * decode) / (prefill + decode) - 1
    assert energy["joules_per_output_token"]["error"] == pytest.approx(expected, abs=1e-6)
    assert energy["kilojoules_per_1000_requests"]["truth"] == pytest.approx((prefill + decode) / 3)
    per = energy["per_request"]
    assert per["compared"] == 3
    # Each request is priced at the run's rates: its error lies between the two biases.
    assert 0.0 < per["median_error"] < 0.10
    printed = capsys.readouterr().out
    assert "J per output token (ML.ENERGY)" in printed and "per 1,000 requests" in printed


def test_governor_metrics_is_refused_before_any_work(
    fake: str, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "load",
            "--trace",
            str(trace),
            "--url",
            fake,
            "--quiet",
            "--governor-metrics",
            f"{fake}/not-metrics",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("gpugov: error: --governor-metrics ") and "HTTP 404" in err
    # A target without the truth endpoint is not an emulator: refused too.
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(FakeNode(), with_truth=False))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        code = main(
            [
                "load",
                "--trace",
                str(trace),
                "--url",
                url,
                "--quiet",
                "--governor-metrics",
                f"{url}/governor/metrics",
            ]
        )
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "needs a gpugov emulator" in err and "/gpugov/energy" in err
