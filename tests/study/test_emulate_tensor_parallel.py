"""A tensor-parallel profile on ``gpugov emulate``: each engine replica is ``tensor_parallel``
emulated GPUs, as on a real node, each with its share of the group's power, its own clock
lock and fault, and the group running at its slowest GPU's clock; the daemon governs the
group as one domain of its GPUs. Over real loopback HTTP, through the daemon's own
``EmulatedBackend``."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.daemon.config import parse_config
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.emulated import EmulatedBackend, emulated_device_count
from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.errors import GpuLost, PermissionDenied
from gpugov.daemon.service import domains_from_config, gpu_uuid
from gpugov.plant import ServingPlant, load_profile
from gpugov.study.emulate.cli import _replicas
from gpugov.study.emulate.node import EmulatedNode, emulated_gpu_name, emulated_gpu_uuid
from gpugov.study.emulate.server import EmulatorServer

TP4 = "h100-sxm-llama3-70b-tp4"
APPLICATIONS_CLOCKS_SETTING = 0x2
TOP_MHZ = 1980


def _tp4_plant() -> ServingPlant:
    return ServingPlant.from_profile(load_profile(TP4))


class FrozenClock:
    """The node's wall clock, moved by hand: every read between two moves sees one plant
    instant, so the GPUs' shares can be compared exactly."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def frozen() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def tp4(frozen: FrozenClock) -> Iterator[EmulatorServer]:
    """One TP4 replica (the default GPU count: the profile's tensor_parallel)."""
    server = EmulatorServer(EmulatedNode(_tp4_plant(), clock=frozen), "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.close()


def _backends(url: str, count: int) -> list[EmulatedBackend]:
    return [EmulatedBackend(gpu, emulator=url, timeout_s=2.0) for gpu in range(count)]


def _busy(node: EmulatedNode, frozen: FrozenClock, requests: int = 32) -> None:
    """Put the node under load and let it run a few plant seconds."""
    for _ in range(requests):
        node.submit(512, 2000, "length")
    for _ in range(20):
        frozen.now_s += 0.25
        node.advance()


def test_one_replica_is_four_gpus_each_with_a_quarter_of_the_power(
    tp4: EmulatorServer, frozen: FrozenClock
) -> None:
    node = tp4.node
    assert emulated_device_count(tp4.url) == 4
    assert (node.replicas, node.tensor_parallel, node.gpu_count) == (1, 4, 4)
    backends = _backends(tp4.url, 4)
    try:
        profile = node.plant.profile
        uuids = [backend.uuid for backend in backends]
        assert uuids == [emulated_gpu_uuid(profile, gpu) for gpu in range(4)]
        assert len(set(uuids)) == 4
        assert {backend.name for backend in backends} == {emulated_gpu_name(profile)}
        _busy(node, frozen)
        samples = [backend.sample() for backend in backends]  # one plant instant
        plant = node.simulations[0].observe()
        assert plant.power_w is not None and plant.energy_j is not None
        assert plant.power_w > 4 * 200.0  # a 70B model's four GPUs under load
        for sample in samples:
            assert sample.power_w == pytest.approx(plant.power_w / 4, abs=0.001)
            assert sample.energy_j == pytest.approx(plant.energy_j / 4, abs=0.001)
            assert sample.power_limit_w == pytest.approx(node.plant.power_limit_w / 4)
            assert sample.power_limit_w == 700.0  # the manifest's per-GPU limit
            assert sample.temperature_c == round(plant.temperature_c)  # the group's
            assert sample.sm_clock_mhz == TOP_MHZ
            assert sample.utilization == samples[0].utilization  # the group's busy share
        assert samples[0].utilization is not None and samples[0].utilization > 0.5
        assert sum(s.power_w or 0.0 for s in samples) == pytest.approx(plant.power_w, abs=0.004)
        assert sum(s.energy_j or 0.0 for s in samples) == pytest.approx(plant.energy_j, abs=0.004)
    finally:
        for backend in backends:
            backend.close()


def test_the_group_runs_at_its_slowest_gpus_clock(tp4: EmulatorServer, frozen: FrozenClock) -> None:
    node = tp4.node
    simulation = node.simulations[0]
    backends = _backends(tp4.url, 4)

    def settle() -> list[float | None]:
        frozen.now_s += 0.5  # past the actuation delay
        return [backend.sample().sm_clock_mhz for backend in backends]

    try:
        _busy(node, frozen)
        backends[3].lock_clocks(TOP_MHZ, TOP_MHZ)
        for backend in backends[:3]:
            backend.lock_clocks(900, 900)
        assert simulation.requested_clock_mhz == 900
        assert node.group_clock_mhz(0) == 900
        assert settle() == [900.0] * 4  # every GPU shows the group's clock
        reasons = [backend.sample().clock_event_reasons for backend in backends]
        # GPUs 0-2 are held below the top by their lock; GPU 3's own lock is the top.
        assert [bool(int(r or 0) & APPLICATIONS_CLOCKS_SETTING) for r in reasons] == [
            True,
            True,
            True,
            False,
        ]
        # One slow GPU holds the whole group down, whatever the order of the writes.
        backends[0].lock_clocks(1200, 1200)
        backends[1].lock_clocks(1200, 1200)
        assert settle() == [900.0] * 4  # GPU 2 still at 900
        backends[2].reset_clocks()
        assert simulation.requested_clock_mhz == 1200
        assert settle() == [1200.0] * 4
        for backend in backends[:2]:
            backend.reset_clocks()
        assert simulation.requested_clock_mhz == TOP_MHZ
        assert settle() == [float(TOP_MHZ)] * 4
        # A lock between the profile's clocks holds the group at the clock below it.
        backends[1].lock_clocks(300, 1000)
        assert simulation.requested_clock_mhz == 990
    finally:
        for backend in backends:
            backend.close()


def test_faults_stay_with_their_gpu(tp4: EmulatorServer) -> None:
    node = tp4.node
    backends = _backends(tp4.url, 4)
    try:
        node.gpu_state[2].fault = "lost"
        node.gpu_state[1].fault = "no-permission"
        with pytest.raises(GpuLost):
            backends[2].sample()
        with pytest.raises(PermissionDenied):
            backends[1].lock_clocks(900, 900)
        assert node.group_clock_mhz(0) == TOP_MHZ  # the refused lock changed nothing
        assert backends[0].sample().power_w is not None
        backends[3].lock_clocks(900, 900)
        assert node.simulations[0].requested_clock_mhz == 900
        assert node.gpu_state[3].locked == (900, 900)
        assert [state.locked for state in node.gpu_state[:3]] == [None] * 3
    finally:
        for backend in backends:
            backend.close()


def test_two_replicas_of_four_gpus_are_eight_gpus_locked_by_group() -> None:
    node = EmulatedNode(_tp4_plant(), gpus=8, speed=10.0)
    assert (node.replicas, node.gpu_count) == (2, 8)
    assert [list(node.group_gpus(r)) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(set(node.gpu_uuids)) == 8
    assert _replicas(node) == "2 engine replicas of 4 tensor-parallel GPUs each: GPUs 0-3, 4-7"
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    backends = _backends(server.url, 8)
    try:
        for backend in backends[4:]:
            backend.lock_clocks(900, 900)
        assert node.simulations[0].requested_clock_mhz == TOP_MHZ
        assert node.simulations[1].requested_clock_mhz == 900
        for _ in range(2):  # one request per replica (the fewest in flight, in turn)
            node.submit(64, 4, "length")
        assert [len(simulation.requests) for simulation in node.simulations] == [1, 1]
        text = urllib.request.urlopen(f"{server.url}/metrics", timeout=5).read().decode()
        for engine in ("0", "1"):
            assert f'vllm:num_requests_running{{engine="{engine}",' in text
        assert 'engine="2"' not in text  # one engine per replica on the page, not per GPU
        source = ScrapedSource(f"{server.url}/metrics", "vllm", timeout_s=2.0)
        deadline = time.monotonic() + 10.0
        while source.scrape().prompt_tokens_total != 128 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert source.scrape().prompt_tokens_total == 128  # both engines, summed
        source.close()
    finally:
        for backend in backends:
            backend.close()
        server.close()


def test_a_gpu_count_that_is_not_whole_replicas_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--gpus 6: profile h100-sxm-llama3-70b-tp4 is"):
        EmulatedNode(_tp4_plant(), gpus=6)


def test_the_cli_refuses_a_partial_replica_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["emulate", "--profile", TP4, "--address", "127.0.0.1:0", "--gpus", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert err == (
        "gpugov: error: --gpus 2: profile h100-sxm-llama3-70b-tp4 is tensor parallel 4 "
        "(each engine replica runs on 4 GPUs); give a multiple of 4, such as 4 for one replica"
    )


def test_a_profile_wider_than_an_emulated_node_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--gpus takes at most 64, but its default (one replica of the profile's
    tensor_parallel) started 128 emulated GPUs for a TP 128 profile, which loads."""
    source = Path(__file__).resolve().parents[2] / "profiles"
    manifest = json.loads((source / f"{TP4}.json").read_text())
    manifest["tensor_parallel"]["size"] = 128
    (tmp_path / manifest["csv"]).write_text((source / manifest["csv"]).read_text())
    path = tmp_path / "tp128.json"
    path.write_text(json.dumps(manifest))
    code = main(["emulate", "--profile", str(path), "--address", "127.0.0.1:0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (
        f"gpugov: error: --profile {path}: tensor parallel 128, one engine replica of 128 "
        "GPUs, more than the 64 GPUs an emulated node has at most"
    )


def _startup_line(*argv: str) -> str:
    """``gpugov emulate``'s first line (then SIGTERM)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gpugov", "emulate", "--address", "127.0.0.1:0", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    return line


def test_the_startup_line_says_how_many_gpus_and_replicas() -> None:
    line = _startup_line("--profile", TP4)
    assert line.startswith(
        "gpugov emulate: 4 emulated GPU(s) 'NVIDIA H100 SXM5 80GB HBM3' of profile "
        "h100-sxm-llama3-70b-tp4 (1 engine replica of 4 tensor-parallel GPUs each: GPUs 0-3), "
    ), line
    line = _startup_line("--profile", "h100-sxm-llama3-8b", "--gpus", "2")
    assert line.startswith(
        "gpugov emulate: 2 emulated GPU(s) 'NVIDIA H100 SXM5 80GB HBM3' of profile "
        "h100-sxm-llama3-8b (2 data-parallel engine replicas, one GPU each), "
    ), line
    assert line.rstrip().endswith(
        "(OpenAI API under /v1, /metrics, each replica's page /replica/0/metrics to "
        "/replica/1/metrics, GPUs under /gpu)"
    ), line
    line = _startup_line("--profile", TP4, "--layout", "1P1D")
    assert line.startswith(
        "gpugov emulate: layout 1P1D, 8 emulated GPU(s) 'NVIDIA H100 SXM5 80GB HBM3' of "
        "profile h100-sxm-llama3-70b-tp4 (prefill GPUs 0-3, decode GPUs 4-7, 4 "
        "tensor-parallel GPUs per engine replica, nvlink), "
    ), line


def _tp4_config(url: str, gpus: list[int]) -> dict[str, object]:
    manifest = json.loads(json.dumps(load_profile(TP4).manifest))
    return {
        "daemon": {
            "backend": "emulated",
            "emulator": url,
            "metrics_address": "",
            "period_s": 0.5,
        },
        "domains": [
            {
                "name": "llama70b",
                "gpus": gpus,
                "ttft_slo_s": manifest["ttft_slo_s"],
                "tpot_slo_s": manifest["tpot_slo_s"],
                "engine": {"kind": "vllm", "url": f"{url}/metrics"},
                "controller": {"kind": "mpc", "profile": TP4},
            }
        ],
    }


def _tp_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if "(tensor_parallel)" in record.getMessage()
    ]


def test_the_daemon_governs_the_group_as_one_domain_of_its_four_gpus(
    tp4: EmulatorServer,
    frozen: FrozenClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gpus = [0, 1, 2, 3]`` with the TP4 profile's ``mpc``: no tensor_parallel warning,
    the four GPUs locked together, the domain's power the plant's."""
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    node = tp4.node
    caplog.set_level(logging.INFO)
    assembled = domains_from_config(parse_config(_tp4_config(tp4.url, [0, 1, 2, 3])))
    try:
        assert _tp_warnings(caplog) == []
        (domain,) = assembled.domains
        assert [gpu_uuid(b) for b in assembled.backends] == list(node.gpu_uuids)
        _busy(node, frozen)
        records = []
        for step in range(6):
            frozen.now_s += 0.5
            records.append(domain.tick(time.monotonic(), step))
        locks = {state.locked for state in node.gpu_state}
        assert len(locks) == 1 and None not in locks, locks  # locked together
        (lock,) = locks
        assert lock is not None and node.group_clock_mhz(0) == lock[1]
        last = records[-1]
        assert last.decision_mhz is not None and not last.failsafe
        frozen.now_s += 0.5
        record = domain.tick(time.monotonic(), 6)
        plant = node.simulations[0].observe()
        assert plant.power_w is not None
        assert record.observation.power_w == pytest.approx(plant.power_w, abs=0.004)
        assert record.observation.realized_clock_mhz == plant.realized_clock_mhz
    finally:
        assembled.close()
    # The same profile on one GPU of the group is another domain: the warning says so.
    caplog.clear()
    for gpu in range(4):
        node.reset_clocks(gpu)
    assembled = domains_from_config(parse_config(_tp4_config(tp4.url, [0])))
    assembled.close()
    assert _tp_warnings(caplog) == [
        "domain 'llama70b': controller: mpc profile 'h100-sxm-llama3-70b-tp4' describes a "
        "domain of 4 GPU(s) (tensor_parallel), this domain has 1: its rates and powers are "
        "another domain's"
    ]


# ------------------------------------------------------- one page per replica
def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        answer: dict[str, object] = json.loads(response.read())
    return answer


def test_each_replica_serves_its_own_page(frozen: FrozenClock) -> None:
    """``--gpus 8``: two TP4 replicas, each with its own page at ``/replica/<r>/metrics``
    (its engine labelled ``engine="0"``, as its own engine process would); ``/metrics``
    has both; ``GET /gpu`` lists each replica's GPUs and page."""
    node = EmulatedNode(_tp4_plant(), gpus=8, clock=frozen)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        node.submit(64, 4, "length")  # replica 0 (the fewest in flight, in turn)
        node.submit(100, 4, "length")  # replica 1
        frozen.now_s += 5.0
        node.advance()
        assert _get_json(f"{server.url}/gpu") == {
            "count": 8,
            "speed": 1.0,
            "tensor_parallel": 4,
            "replicas": [
                {
                    "replica": 0,
                    "gpus": [0, 1, 2, 3],
                    "role": "colocated",
                    "metrics": "/replica/0/metrics",
                },
                {
                    "replica": 1,
                    "gpus": [4, 5, 6, 7],
                    "role": "colocated",
                    "metrics": "/replica/1/metrics",
                },
            ],
        }
        scraped = {}
        for page in ("/metrics", "/replica/0/metrics", "/replica/1/metrics"):
            source = ScrapedSource(f"{server.url}{page}", "vllm", timeout_s=2.0)
            scraped[page] = source.scrape()
            source.close()
        assert scraped["/metrics"].prompt_tokens_total == 164  # both engines, summed
        assert scraped["/replica/0/metrics"].prompt_tokens_total == 64
        assert scraped["/replica/1/metrics"].prompt_tokens_total == 100
        assert scraped["/replica/1/metrics"].generation_tokens_total == 4
        text = urllib.request.urlopen(f"{server.url}/replica/1/metrics", timeout=5).read()
        assert b'engine="0"' in text and b'engine="1"' not in text
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{server.url}/replica/2/metrics", timeout=5)
        assert caught.value.code == 404
        assert "2 engine replica(s), their pages /replica/0/metrics to /replica/1/metrics" in (
            caught.value.read().decode()
        )
    finally:
        server.close()


EXAMPLE_TWO_REPLICAS = Path(__file__).resolve().parents[2] / "deploy" / "emulated-tp4x2.toml"


def test_the_daemon_governs_two_replicas_as_two_domains_each_on_its_own_page(
    frozen: FrozenClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped two-replica example (``deploy/emulated-tp4x2.toml``): each domain lists
    its replica's four GPUs and scrapes its replica's own page, so it sees its replica's
    queue and power alone and locks its own group; a busy replica beside an idle one is
    governed apart from it."""
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    node = EmulatedNode(_tp4_plant(), gpus=8, clock=frozen)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    caplog.set_level(logging.INFO)
    data = tomllib.loads(
        EXAMPLE_TWO_REPLICAS.read_text().replace("http://127.0.0.1:8000", server.url)
    )
    data["daemon"]["metrics_address"] = ""
    assembled = domains_from_config(parse_config(data, str(EXAMPLE_TWO_REPLICAS)))
    try:
        assert _tp_warnings(caplog) == []
        busy, idle = assembled.domains
        # Submitted together, the requests alternate between the replicas: replica 0
        # gets the long ones, replica 1 the one-token ones, done within a second.
        for _ in range(16):
            node.submit(2000, 2000, "length")
            node.submit(16, 1, "length")
        records: list[tuple[TickRecord, TickRecord]] = []
        for step in range(8):
            frozen.now_s += 1.0
            records.append((busy.tick(time.monotonic(), step), idle.tick(time.monotonic(), step)))
        busy_record, idle_record = records[-1]
        assert busy_record.observation.decode_active == 16
        assert idle_record.observation.decode_active == 0
        assert idle_record.observation.waiting_requests == 0
        for record, replica in ((busy_record, 0), (idle_record, 1)):
            plant = node.simulations[replica].observe()
            assert plant.power_w is not None
            assert record.observation.power_w == pytest.approx(plant.power_w, abs=0.004)
            assert not record.failsafe and record.decision_mhz is not None
        locks = [{node.gpu_state[gpu].locked for gpu in node.group_gpus(r)} for r in (0, 1)]
        for replica, group_locks in enumerate(locks):
            assert len(group_locks) == 1 and None not in group_locks, locks  # one clock a group
            (lock,) = group_locks
            assert lock is not None and node.group_clock_mhz(replica) == lock[1]
        (busy_lock,), (idle_lock,) = locks
        assert busy_lock is not None and idle_lock is not None
        assert idle_lock[1] < busy_lock[1]  # the idle replica runs lower than the busy one
    finally:
        assembled.close()
        server.close()
