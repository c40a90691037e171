"""``gpugov emulate``'s per-request true energy over real loopback HTTP: the extra
``usage`` fields and ``GET /gpugov/energy`` (the contract in ``docs/commands.md``)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from synthetic import make_plant

from gpugov.study.emulate.node import MAX_ENERGY_RECORDS, EmulatedNode
from gpugov.study.emulate.server import EmulatorServer


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorServer]:
    # Ten plant seconds per wall second: a test's requests take a fraction of a second.
    node = EmulatedNode(make_plant(), gpus=2, speed=10.0)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.close()


def _request(url: str, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    connection.request(method, path, body=data, headers=headers)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, payload


def _complete(url: str, prompt_tokens: int, max_tokens: int, stream: bool = False) -> dict:
    body: dict = {
        "prompt_token_ids": list(range(prompt_tokens)),
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    status, payload = _request(url, "POST", "/v1/completions", body)
    assert status == 200
    if not stream:
        return json.loads(payload)
    events = [line[6:] for line in payload.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return json.loads(events[-2])  # the usage-only chunk


def _energy(url: str, query: str = "") -> dict:
    status, payload = _request(url, "GET", "/gpugov/energy" + query)
    assert status == 200
    return json.loads(payload)


def test_usage_and_truth_endpoint_carry_each_requests_energy(emulator: EmulatorServer) -> None:
    url = emulator.url
    with ThreadPoolExecutor(4) as pool:  # concurrent: they share iterations (mixed batches)
        shapes = [(300, 40, False), (900, 20, True), (50, 60, False), (600, 30, True)]
        answers = list(pool.map(lambda shape: _complete(url, *shape), shapes))
    report = _energy(url)
    assert set(report) == {"plant_time_s", "requests", "totals"}
    by_id = {row["id"]: row for row in report["requests"]}
    assert len(by_id) == 4
    for (prompt, output, _), answer in zip(shapes, answers, strict=True):
        usage = answer["usage"]
        assert usage["completion_tokens"] == output
        assert usage["prefill_energy_j"] > 0.0 and usage["decode_energy_j"] > 0.0
        assert usage["energy_j"] == pytest.approx(
            usage["prefill_energy_j"] + usage["decode_energy_j"]
        )
        row = by_id[answer["id"]]  # the same id as the completion's
        assert row["prompt_tokens"] == prompt and row["output_tokens"] == output
        assert row["total_j"] == pytest.approx(usage["energy_j"])
        assert row["prefill_j"] == pytest.approx(usage["prefill_energy_j"])
        assert 0.0 < row["finished_at_s"] <= report["plant_time_s"]
    totals = report["totals"]
    assert set(totals) == {
        "prefill_j",
        "decode_j",
        "idle_j",
        "total_j",
        "prompt_tokens",
        "output_tokens",
    }
    # Conservation over both GPUs: the requests (all finished) plus idle is the energy.
    assert totals["prefill_j"] + totals["decode_j"] + totals["idle_j"] == pytest.approx(
        totals["total_j"], rel=1e-9
    )
    assert totals["prefill_j"] == pytest.approx(sum(r["prefill_j"] for r in by_id.values()))
    assert totals["idle_j"] > 0.0
    assert totals["prompt_tokens"] == sum(s[0] for s in shapes)
    assert totals["output_tokens"] == sum(s[1] for s in shapes)

    # ?since= keeps the requests finished at or after T; the totals stay whole-run.
    last = max(r["finished_at_s"] for r in by_id.values())
    later = _energy(url, f"?since={last}")
    at_last = [r["id"] for r in by_id.values() if r["finished_at_s"] == last]
    assert [r["id"] for r in later["requests"]] == at_last
    assert later["totals"]["prefill_j"] == totals["prefill_j"]
    assert _energy(url, f"?since={report['plant_time_s'] + 1e6}")["requests"] == []


@pytest.mark.parametrize("query", ["?since=abc", "?since=-1", "?since=nan", "?since=1&since=2"])
def test_bad_since_gets_a_vllm_400(emulator: EmulatorServer, query: str) -> None:
    status, payload = _request(emulator.url, "GET", "/gpugov/energy" + query)
    assert status == 400
    error = json.loads(payload)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == 400 and "since" in error["message"]


def test_energy_path_takes_get_only(emulator: EmulatorServer) -> None:
    status, payload = _request(emulator.url, "POST", "/gpugov/energy", {})
    assert status == 405 and json.loads(payload)["error"]["code"] == 405


def test_truth_keeps_a_bounded_number_of_requests() -> None:
    node = EmulatedNode(make_plant())
    assert node._energy_records.maxlen == MAX_ENERGY_RECORDS == 100_000
    report = node.energy_report()
    assert report["requests"] == [] and report["totals"]["total_j"] >= 0.0
