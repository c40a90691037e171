"""``gpugov fleet``: the allocators' rules, a tiny fleet in lockstep, and the CLI's lines."""

from __future__ import annotations

import io
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.controllers.budget import SLOTarget
from gpugov.plant.types import Request
from gpugov.study.fleet import report as fleet_report
from gpugov.study.fleet.allocators import (
    ALLOCATOR_FUNCTIONS,
    NEED_SIGMAS,
    NodeReport,
    dps,
    slo_aware,
    uniform,
)
from gpugov.study.fleet.node import FleetNode
from gpugov.study.fleet.router import make_router
from gpugov.study.fleet.run import (
    Cell,
    FleetConfig,
    _plants,
    budget_at,
    floor_warning,
    load_warning,
    run_cell,
    run_fleet,
    summarize,
)
from gpugov.study.fleet.workload import UTILIZATION_TOLERANCE, fleet_workload
from gpugov.study.runners import RunnerSpec
from gpugov.study.scoreboard.scenarios import work_seconds_at_maximum

TRACE = "arrival_time_s,prompt_tokens,output_tokens\n" + "".join(
    f"{0.25 * i:.2f},{200 + 37 * (i % 7)},{20 + 5 * (i % 5)}\n" for i in range(160)
)


def _reports(seed: int, count: int = 5, needs: bool = True) -> list[NodeReport]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        tdp = rng.choice([350.0, 400.0, 700.0, 1000.0])
        floor = 0.3 * tdp
        cap = rng.uniform(floor, tdp)
        out.append(
            NodeReport(
                floor_w=floor,
                tdp_w=tdp,
                cap_w=cap,
                power_w=rng.uniform(0.2 * tdp, cap),
                need_w=rng.uniform(0.25 * tdp, 1.1 * tdp) if needs else None,
                need_sigma_w=rng.uniform(0.0, 30.0) if needs else None,
            )
        )
    return out


# ------------------------------------------------------------------ allocator rules
@pytest.mark.parametrize("name", sorted(ALLOCATOR_FUNCTIONS))
def test_every_allocator_conserves_the_budget_within_each_range(name: str) -> None:
    allocate = ALLOCATOR_FUNCTIONS[name]
    for seed in range(30):
        nodes = _reports(seed, needs=seed % 3 != 0)
        low = sum(n.floor_w for n in nodes)
        high = sum(n.tdp_w for n in nodes)
        budget = low + (high - low) * random.Random(seed).uniform(0.05, 0.95)
        caps = allocate(nodes, budget)
        assert sum(caps) == pytest.approx(budget, abs=1e-3), (seed, caps)
        for node, cap in zip(nodes, caps, strict=True):
            assert node.floor_w - 1e-9 <= cap <= node.tdp_w + 1e-9
    nodes = _reports(1)
    assert allocate(nodes, 1.0) == [n.floor_w for n in nodes]  # below every floor
    assert allocate(nodes, 1e9) == [n.tdp_w for n in nodes]  # above every TDP


def test_uniform_gives_one_cap_to_every_node_its_range_allows() -> None:
    nodes = [NodeReport(105.0, 350.0, 350.0, 100.0), *[NodeReport(210.0, 700.0, 700.0, 1.0)] * 2]
    caps = uniform(nodes, 1050.0)
    assert caps == pytest.approx([350.0, 350.0, 350.0])
    caps = uniform(nodes, 1450.0)  # the small board's TDP clips it; the others share the rest
    assert caps == pytest.approx([350.0, 550.0, 550.0])


def test_slo_aware_gives_each_node_its_need_then_evens_out_the_rest() -> None:
    nodes = [
        NodeReport(210.0, 700.0, 400.0, 300.0, need_w=500.0, need_sigma_w=20.0),
        NodeReport(120.0, 400.0, 400.0, 300.0, need_w=150.0, need_sigma_w=0.0),
        NodeReport(210.0, 700.0, 400.0, 300.0, need_w=200.0, need_sigma_w=0.0),
    ]
    first = 500.0 + NEED_SIGMAS * 20.0
    caps = slo_aware(nodes, 1000.0)
    # The needy node keeps its need; the others share the rest at one level.
    assert caps == pytest.approx([first, 240.0, 240.0])
    caps = slo_aware(nodes, 1600.0)
    assert caps == pytest.approx([600.0, 400.0, 600.0])  # the 400 W board at its TDP


def test_slo_aware_under_a_budget_below_the_needs_shares_the_shortfall_by_need() -> None:
    nodes = [
        NodeReport(210.0, 700.0, 400.0, 300.0, need_w=610.0),
        NodeReport(120.0, 400.0, 400.0, 300.0, need_w=320.0),
    ]
    caps = slo_aware(nodes, 630.0)
    assert sum(caps) == pytest.approx(630.0, abs=1e-3)
    # The same fraction of each node's need above its floor.
    fractions = [(caps[0] - 210.0) / 400.0, (caps[1] - 120.0) / 200.0]
    assert fractions[0] == pytest.approx(fractions[1], rel=1e-6)
    assert 0.0 < fractions[0] < 1.0


def test_slo_aware_counts_a_node_without_a_need_at_its_measured_power() -> None:
    nodes = [NodeReport(210.0, 700.0, 400.0, 300.0), NodeReport(210.0, 700.0, 400.0, 300.0)]
    assert slo_aware(nodes, 700.0) == pytest.approx([350.0, 350.0])


def test_dps_moves_watts_from_a_node_under_its_cap_to_one_pressing_its_cap() -> None:
    nodes = [NodeReport(210.0, 700.0, 450.0, 440.0), NodeReport(210.0, 700.0, 450.0, 250.0)]
    caps = dps(nodes, 900.0)
    assert caps[0] > 450.0 > caps[1]
    assert sum(caps) == pytest.approx(900.0, abs=1e-3)
    cut = dps(nodes, 700.0)  # a cut comes first from the node with slack
    assert 450.0 - cut[1] > 450.0 - cut[0]


def test_node_report_refuses_an_empty_range() -> None:
    with pytest.raises(ValueError, match="cap range"):
        NodeReport(500.0, 400.0, 400.0, 100.0)


# ------------------------------------------------------------------------ routers
class _Routed:
    def __init__(self, tokens: float, rate: float) -> None:
        self.tokens = tokens
        self.tokens_per_s = rate

    def outstanding_tokens(self) -> float:
        return self.tokens


class _Dispatched(_Routed):
    def __init__(self, tokens: float, rate: float) -> None:
        super().__init__(tokens, rate)
        self.sent: list[int] = []
        self.read = 0

    def outstanding_tokens(self) -> float:
        self.read += 1
        return self.tokens

    def dispatch(self, request: Request) -> None:
        self.tokens += request.prompt_tokens
        self.sent.append(request.request_id)


@pytest.mark.parametrize("name", ["round-robin", "least-tokens", "least-work"])
def test_a_periods_arrivals_are_routed_as_one_at_a_time(name: str) -> None:
    # Each request scanned every node (a period quadratic in the fleet: minutes at 2,000
    # nodes); routed as a batch, every request goes where choose sends it, ties in turn.
    rng = random.Random(7)
    loads = [(float(rng.randrange(0, 400, 50)), rng.choice((1000.0, 2000.0))) for _ in range(40)]
    requests = [Request(i, 0.01 * i, rng.randrange(1, 120) * 25, 10) for i in range(600)]
    one = [_Dispatched(tokens, rate) for tokens, rate in loads]
    router = make_router(name)
    for request in requests:
        one[router.choose(request, one)].dispatch(request)
    batch = [_Dispatched(tokens, rate) for tokens, rate in loads]
    routed = make_router(name)
    routed.route(requests[:250], batch)
    routed.route(requests[250:], batch)  # the next period: the state carries on
    assert [node.sent for node in batch] == [node.sent for node in one]
    assert [node.tokens for node in batch] == [node.tokens for node in one]
    # Each node read once a period and once a request sent to it, not once a request.
    assert sum(node.read for node in batch) <= 2 * len(batch) + len(requests)


def test_least_work_weighs_outstanding_tokens_by_each_node_speed() -> None:
    from gpugov.plant.types import Request

    request = Request(0, 0.0, 100, 10)
    # 150 tokens on a node twice as fast is less work than 100 on the slow one.
    nodes = [_Routed(150.0, 2000.0), _Routed(100.0, 1000.0)]
    assert make_router("least-tokens").choose(request, nodes) == 1
    assert make_router("least-work").choose(request, nodes) == 0
    # Ties go round robin, as with least-tokens.
    even = [_Routed(0.0, 1000.0), _Routed(0.0, 1000.0)]
    router = make_router("least-work")
    assert [router.choose(request, even) for _ in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="least-work"):
        make_router("fastest")


# ------------------------------------------------------------------------ the fleet
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    trace = tmp_path_factory.mktemp("fleet") / "trace.csv"
    trace.write_text(TRACE)
    config = FleetConfig(
        nodes=2,
        profiles=("h100-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b"),
        trace=str(trace),
        trace_start_s=0.0,
        duration_s=30.0,
        drain_s=5.0,
        utilization=0.8,
        allocator_period_s=5.0,
        step_at_s=10.0,
        step_ramp_s=5.0,
        step_hold_s=15.0,
    )
    plants = _plants(config.profiles)
    workload, info = fleet_workload(config, plants)
    return {"config": config, "workload": workload, "plants": plants, "info": info}


def test_the_trace_is_scaled_to_the_fleet(tiny: dict[str, object]) -> None:
    info = tiny["info"]
    workload = tiny["workload"]
    assert isinstance(info, dict) and isinstance(workload, tuple)
    assert info["load_scale"] == pytest.approx(0.8 * info["fluid_capacity_scale"])
    assert info["requests"] == len(workload) > 0
    assert all(0.0 <= r.arrival_time_s < 30.0 for r in workload)
    assert [r.request_id for r in workload] == list(range(len(workload)))


def test_a_two_node_fleet_holds_its_caps_and_publishes_needs(tiny: dict[str, object]) -> None:
    config = tiny["config"]
    assert isinstance(config, FleetConfig)
    row = run_cell(Cell("slo", 0.7, step=True), tiny)
    series = row["series"]
    tdp = row["tdp_w"]
    assert tdp == 700.0 + 400.0
    assert 0.0 <= row["slo_attainment"] <= 1.0
    assert row["requests"] == len(tiny["workload"])  # type: ignore[arg-type]
    assert row["energy_j"] > 0.0
    # Caps stay in each range, and their sum within the guarded budget at every tick.
    for time_s, caps in zip(series["cap_times_s"], series["caps_w"], strict=True):
        for node, cap in zip(row["nodes"], caps, strict=True):
            assert node["floor_w"] - 1e-9 <= cap <= node["tdp_w"] + 1e-9
        assert sum(caps) <= budget_at(config, Cell("slo", 0.7, True), tdp, time_s) + 1e-6
    # mpc publishes its need; the allocator saw it after the first period.
    assert all(node["publishes_need"] for node in row["nodes"])
    assert all(need is not None for need in series["needs_w"][1])
    # The step cut the budget by 30 % and the fleet got under it.
    assert row["step_held_budget_w"] == pytest.approx(0.7 * 0.7 * tdp)
    assert row["step_time_to_under_s"] is not None


def test_least_work_sends_the_faster_board_a_larger_share_than_least_tokens(
    tiny: dict[str, object],
) -> None:
    config = tiny["config"]
    assert isinstance(config, FleetConfig)
    shares = {}
    for router in ("least-tokens", "least-work"):
        shared = {**tiny, "config": replace(config, router=router)}
        row = run_cell(Cell("uncapped", None), shared)
        h100, a100 = (node["requests"] for node in row["nodes"])
        assert h100 + a100 == len(tiny["workload"])  # type: ignore[arg-type]
        shares[router] = h100 / (h100 + a100)
    assert shares["least-work"] > shares["least-tokens"]


def test_the_seed_moves_a_fleet_only_with_latency_noise(tiny: dict[str, object]) -> None:
    config = tiny["config"]
    assert isinstance(config, FleetConfig)
    config = replace(config, duration_s=10.0)  # four runs: a third of the tiny fleet's
    workload, _ = fleet_workload(config, _plants(config.profiles))

    def energy(seed: int, noise: float) -> float:
        changed = replace(config, seed=seed, latency_noise=noise)
        plants = _plants(changed.profiles, noise)
        shared = {**tiny, "config": changed, "plants": plants, "workload": workload}
        row = run_cell(Cell("uncapped", None), shared)
        return float(row["energy_j"])

    assert energy(0, 0.0) == energy(1, 0.0)
    assert energy(0, 0.2) != energy(1, 0.2)


def test_each_node_controller_observes_its_engine_page_and_the_router_the_plant(
    tiny: dict[str, object],
) -> None:
    """As every study command, a fleet node's controller observes what its daemon derives
    from its engine's vLLM page (``engine_view``, default ``vllm``); the router and the
    fleet's accounting keep the plant's state. ``exact`` gives the controller that too."""
    from gpugov.daemon.simulated import node_view
    from gpugov.plant.types import ServingObservation
    from gpugov.study.fleet.node import FleetNode

    plants = tiny["plants"]
    workload = tiny["workload"]
    assert isinstance(plants, dict) and isinstance(workload, tuple)
    plant = plants["h100-sxm-llama3-8b"]
    made = []
    produced: list[ServingObservation] = []

    def view(simulation):  # type: ignore[no-untyped-def]
        made.append(simulation)
        observe = node_view(simulation)

        def recorded() -> ServingObservation:
            produced.append(observe())
            return produced[-1]

        return recorded

    node = FleetNode("n0", plant, "max", workload, period_s=1.0, floor_w=200.0, view=view)
    seen: list[ServingObservation] = []
    decide = node.controller
    node.controller = lambda o: seen.append(o) or decide(o)  # type: ignore[assignment,func-returns-value]
    for request in workload[:40]:
        node.dispatch(request)
    for tick in range(1, 12):
        node.step(float(tick))
    assert made == [node.simulation]
    assert len(seen) == 11 and all(a is b for a, b in zip(seen, produced, strict=True))
    # The router's own reading is the plant's; where the page states it, they agree.
    exact = node.observation
    assert exact is not None and exact is not seen[-1] and exact.arrived_requests > 0
    assert seen[-1].output_tokens_total == exact.output_tokens_total
    assert FleetConfig().engine_view == "vllm"
    with pytest.raises(ValueError, match="--engine-view"):
        FleetConfig(engine_view="sglang").validate()


def test_a_fleet_node_controller_sees_the_measured_tpot_through_its_page(
    tiny: dict[str, object],
) -> None:
    """The page's inter-token latencies come from the plant's latency window, which each
    ``observe()`` starts anew: the router's own reading must not empty it before the
    controller's view reads it (the controller then saw no measured TPOT at all)."""
    from gpugov.daemon.simulated import node_view
    from gpugov.study.fleet.node import FleetNode

    plants = tiny["plants"]
    workload = tiny["workload"]
    assert isinstance(plants, dict) and isinstance(workload, tuple)
    node = FleetNode(
        "n0",
        plants["h100-sxm-llama3-8b"],
        "max",
        workload,
        period_s=1.0,
        floor_w=200.0,
        view=node_view,
    )
    measured: list[float | None] = []
    decide = node.controller
    node.controller = lambda o: measured.append(o.tpot_recent_s) or decide(o)  # type: ignore[assignment,func-returns-value]
    for index, request in enumerate(workload[:40]):  # spread over the ticks: decode in each
        node.dispatch(replace(request, arrival_time_s=0.25 * index))
    for tick in range(1, 12):
        node.step(float(tick))
    decoding = [value for value in measured if value is not None]
    assert len(decoding) >= 5, measured
    assert all(value > 0.0 for value in decoding)


def test_the_budget_step_schedule() -> None:
    config = FleetConfig(step_at_s=100.0, step_ramp_s=30.0, step_hold_s=600.0)
    cell = Cell("uniform", 0.8, step=True)
    assert budget_at(config, cell, 1000.0, 99.0) == pytest.approx(800.0)
    assert budget_at(config, cell, 1000.0, 115.0) == pytest.approx(680.0)
    assert budget_at(config, cell, 1000.0, 400.0) == pytest.approx(560.0)
    assert budget_at(config, cell, 1000.0, 745.0) == pytest.approx(680.0)
    assert budget_at(config, cell, 1000.0, 800.0) == pytest.approx(800.0)
    assert budget_at(config, Cell("uniform", 0.8), 1000.0, 400.0) == pytest.approx(800.0)
    assert math.isinf(budget_at(config, Cell("uncapped", None), 1000.0, 400.0))


def test_the_run_writes_its_report_and_degrades_without_matplotlib(
    tiny: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tiny["config"]
    assert isinstance(base, FleetConfig)
    config = replace(base, allocators=("slo",), budgets=(0.7,))
    payload = run_fleet(config, spec=RunnerSpec(jobs=1))
    keys = [row["key"] for row in payload["rows"]]
    assert keys == ["uncapped", "slo@0.70", "slo@0.80+step"]
    assert payload["rows"][0]["slo_vs_uncapped_pp"] == 0.0
    step = payload["rows"][-1]
    assert step["step_slo_loss_pp"] is None  # no slo@0.80 cell to compare with
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    (tmp_path / "fleet.png").write_bytes(b"an earlier run's plot")
    paths, note = fleet_report.write_outputs(payload, tmp_path)
    assert note is not None and note.startswith(fleet_report.PLOTS_HINT) and "png" not in paths
    assert "fleet.png was removed" in note
    assert not (tmp_path / "fleet.png").exists()  # not left beside another run's report
    paths, note = fleet_report.write_outputs(payload, tmp_path)
    assert note == fleet_report.PLOTS_HINT
    assert json.loads(paths["json"].read_text())["rows"][1]["key"] == "slo@0.70"
    text = paths["md"].read_text()
    assert "| SLO-aware (published need) | 70 % TDP |" in text
    assert "## Budget step" in text
    # Per board type: the nodes' requests and attainment add up to the cell's, and the
    # caps and needs are the allocator's and the controllers' over the allocations.
    assert "## Per board type" in text
    for row in payload["rows"]:
        boards = fleet_report.board_breakdown(row)
        assert sum(board["nodes"] for board in boards) == len(row["nodes"])
        assert sum(board["requests"] for board in boards) == row["requests"]
        met = sum(board["slo_attainment"] * board["requests"] for board in boards)
        assert met / row["requests"] == pytest.approx(row["slo_attainment"])
        energy = sum(board["energy_per_node_j"] * board["nodes"] for board in boards)
        assert energy == pytest.approx(sum(node["energy_j"] for node in row["nodes"]))
        for board in boards:
            tdp = max(n["tdp_w"] for n in row["nodes"] if n["profile"] == board["profile"])
            assert board["mean_cap_w"] is not None and 0.0 < board["mean_cap_w"] <= tdp
            if not row["step"]:  # the step cells have their own table
                assert f"| {board['profile']} | {board['nodes']} | {board['requests']} |" in text


def test_a_board_named_with_a_pipe_or_a_newline_keeps_the_table_s_columns(
    tiny: dict[str, object],
) -> None:
    """fleet.md's per-board table writes a profile (a user's manifest may name it with a |
    or a newline) on one line with its | escaped: written as it was, its | ended the cell
    and pushed every figure of the row under the next header."""
    base = tiny["config"]
    assert isinstance(base, FleetConfig)
    config = replace(base, allocators=("uniform",), budgets=(0.7,), step=False)
    text = json.dumps(run_fleet(config, spec=RunnerSpec(jobs=1)))
    payload = json.loads(text.replace("a100-sxm-80gb-llama3-8b", "my|a100\\nboard"))
    rows = [line for line in fleet_report.markdown(payload).splitlines() if "my" in line]
    assert rows and all("my\\|a100\\nboard" in line for line in rows)
    table = [line for line in rows if line.startswith("|")]
    assert table and all(line.count("|") - line.count("\\|") == 11 for line in table)


def test_a_report_cut_short_mid_write_leaves_the_earlier_one_whole(tmp_path: Path) -> None:
    """fleet.json, fleet.md and fleet.png were written in place: a write that failed
    midway (here past a file-size limit: the disk full) left a truncated report and a
    traceback. Each is now replaced whole or not at all, the failure one line."""
    from study_support import run_past_file_size

    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    out = tmp_path / "out"
    argv = ["fleet", "--trace", str(trace), "--duration", "30", "--drain", "5", "--nodes", "2"]
    argv += ["--no-step", "--budgets", "0.7", "--allocators", "uniform", "--controller", "max"]
    argv += ["--quiet", "--jobs", "1", "--trace-start", "0", "--out", str(out)]
    assert main(argv) == 0
    report = out / "fleet.json"
    before = {path: (path.read_bytes(), path.stat().st_ino) for path in out.iterdir()}
    assert sorted(path.name for path in before) == ["fleet.json", "fleet.md", "fleet.png"]
    cut = run_past_file_size(argv, limit_bytes=len(before[report][0]) // 2)
    assert cut.returncode == 1, cut.stderr
    assert cut.stderr.splitlines() == [f"gpugov: error: {report}: File too large"]
    assert {path: (path.read_bytes(), path.stat().st_ino) for path in out.iterdir()} == before
    assert main(argv) == 0
    assert report.stat().st_ino != before[report][1]
    rows = json.loads(report.read_text())["rows"]
    assert [row["key"] for row in rows] == ["uncapped", "uniform@0.70"]


def test_a_failure_on_the_second_output_leaves_the_earlier_set_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet.json, fleet.md and fleet.png were each replaced on its own: a write that
    failed on fleet.md left the new fleet.json beside the earlier run's fleet.md and
    fleet.png. Now the three are written to temporary files first and renamed into place
    only once all are: a failure on the second leaves the earlier three byte for byte,
    with no temporary file, and says one line naming the file."""
    pytest.importorskip("matplotlib")
    import errno
    import os

    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    out = tmp_path / "out"
    argv = ["fleet", "--trace", str(trace), "--duration", "10", "--drain", "2", "--nodes", "2"]
    argv += ["--no-step", "--allocators", "uniform", "--controller", "max", "--quiet"]
    argv += ["--jobs", "1", "--trace-start", "0", "--out", str(out)]
    assert main([*argv, "--budgets", "0.7"]) == 0
    names = ["fleet.json", "fleet.md", "fleet.png"]
    assert sorted(path.name for path in out.iterdir()) == names
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    capsys.readouterr()

    from study_support import fail_when_synced

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    failed = fail_when_synced(monkeypatch, "fleet.md", full)  # fills while it is written
    assert main([*argv, "--budgets", "0.6"]) == 1  # another run: other files
    assert failed
    assert _one_error_line(capsys) == (
        f"gpugov: error: {out / 'fleet.md'}: {os.strerror(errno.ENOSPC)}"
    )
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    monkeypatch.undo()
    assert main([*argv, "--budgets", "0.6"]) == 0
    assert sorted(path.name for path in out.iterdir()) == names
    after = {path.name: path.read_bytes() for path in out.iterdir()}
    assert all(after[name] != before[name] for name in names)
    rows = json.loads(after["fleet.json"])["rows"]
    assert [row["key"] for row in rows] == ["uncapped", "uniform@0.60"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_progress_counts_node_seconds_while_the_cells_run(
    tiny: dict[str, object], jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The progress line moved only when a whole cell finished, so its ETA read "?" until
    the first one had (minutes into the default fleet, whose cells run side by side). The
    cells now report their node-seconds every control period, in this process and from a
    local pool's workers, and the line has a rate, hence an ETA, from the first update."""
    from gpugov.daemon.progress import Progress
    from gpugov.study import runners

    monkeypatch.setattr(runners, "WAIT_S", 0.01)  # the pool's driver looks every 10 ms
    base = tiny["config"]
    assert isinstance(base, FleetConfig)
    config = replace(base, allocators=("slo",), budgets=(0.7,))
    events: list[tuple[str, float]] = []
    run_fleet(
        config,
        spec=RunnerSpec(jobs=jobs),
        on_progress=lambda node_s: events.append(("progress", node_s)),
        on_cell=lambda row, finished, count: events.append(("cell", finished)),
    )
    total = 3 * config.nodes * config.ticks * config.control_period_s
    first_cell = events.index(("cell", 1))
    before = [value for kind, value in events[:first_cell] if kind == "progress"]
    assert before and 0.0 < before[-1] < total  # counted before any cell finished
    counted = [value for kind, value in events if kind == "progress"]
    assert counted == sorted(counted) and counted[-1] == pytest.approx(total)
    clock = [0.0]
    bar = Progress(total, "fleet", unit="node-s", stream=io.StringIO(), clock=lambda: clock[0])
    clock[0] = 10.0
    assert "ETA ?" not in bar.line(before[-1])


def test_cell_progress_keeps_one_count_per_cell() -> None:
    """A cell run again (its worker lost) overwrites its count, never adds to it; a copy
    sent by value to another process (a Ray worker) counts nothing here."""
    import pickle

    from gpugov.study.runners import CellProgress

    reports: list[float] = []
    progress = CellProgress(["a", "b"], on_report=lambda: reports.append(progress.total()))
    progress.report("a", 5.0)
    progress.report("b", 2.0)
    progress.report("a", 3.0)  # the cell started again
    assert progress.total() == 5.0 and reports == [5.0, 7.0, 5.0]
    copy = pickle.loads(pickle.dumps(progress))
    copy.report("b", 100.0)
    assert copy.total() == 0.0 and progress.total() == 5.0


# ---------------------------------------------------------------------------- CLI
def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("gpugov: error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--nodes", "0"], "--nodes"),
        (["--budgets", "0.6,1.5"], "--budgets"),
        (["--allocators", "uniform,fair"], "'fair'"),
        (["--router", "random"], "--router"),
        (["--duration", "100"], "--duration"),
        (["--allocator-period", "2.5"], "--allocator-period"),
        (["--profiles", "no-such-gpu"], "--profiles"),
        (["--controller", "no-such-controller"], "--controller"),
        (["--out", "/proc/gpugov-fleet"], "--out"),
        (["--engine-view", "sglang"], "--engine-view"),
        (["--latency-noise", "1.0"], "--latency-noise"),
        (["--latency-noise", "-0.1"], "--latency-noise"),
        (["--budgets", "0.7,0.7"], "budget '0.7' given more than once"),
        # Two budgets a run names alike (slo@0.70) ended in a traceback after the checks.
        (["--budgets", "0.7,0.701"], "budgets '0.7' and '0.701' are one budget (0.70)"),
        (["--budgets", "0.7,"], "an empty budget in '0.7,'"),
        (["--allocators", "uniform,uniform"], "allocator 'uniform' given more than once"),
        (["--profiles", "h100-sxm-llama3-8b,,"], "an empty profile"),
        (["--controller", "fixed:99999"], "outside the supported range 345-1980 MHz of h100"),
        (["--controller", "fixed:1500"], "outside the supported range 510-1410 MHz of a100"),
        # A cap below the lowest power limit the simulated GPUs accept (a tenth of the
        # profile's 700 W): simulate refused it, fleet ran it.
        (["--controller", "power-cap:69"], "cap_w (69 W) is below the lowest power limit"),
        # A step no period's budget sample falls in: its held budget was min() of none
        # (inf), and the run ended writing fleet.json in a traceback.
        # Every cell simulates --duration + --drain: 3e8 s ran with an ETA of 1,800 hours.
        (["--no-step", "--drain", "3e8"], "over the limit of 7 simulated days"),
        (["--no-step", "--duration", "604800"], "shorten --duration or --drain"),
        # The step's flags beside --no-step were ignored: no step ran, and none was said.
        (
            ["--no-step", "--step-at", "5", "--step-hold", "30"],
            "--step-at, --step-hold: not with --no-step (it runs no budget-step cells)",
        ),
        (
            ["--duration", "40", "--step-at", "0", "--step-ramp", "0", "--step-hold", "0.5"],
            "holds the middle of no control period (--control-period 1 s)",
        ),
        (
            ["--duration", "40", "--step-at", "1e-300", "--step-ramp", "0", "--step-hold", "1e-9"],
            "lengthen --step-hold or pass --no-step",
        ),
    ],
)
def test_bad_flags_are_one_line_before_any_work(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = ["--out", str(tmp_path / "out")] if "--out" not in argv else []
    assert main(["fleet", *argv, *out, "--quiet"]) == 2
    assert named in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("at", "hold", "ticks"),
    [(60.0, 600.0, (60, 660)), (1.5, 1.0, (1, 2)), (0.0, 0.51, (0, 1)), (0.0, 0.5, (0, 0))],
)
def test_the_step_covers_the_periods_whose_budget_sample_lies_in_it(
    at: float, hold: float, ticks: tuple[int, int]
) -> None:
    # round() took the step from 1.5 s to 2.5 s for no period (both ends half to even),
    # though the budget sampled in the middle of period 1 (at 1.5 s) is the cut one.
    config = FleetConfig(step_at_s=at, step_ramp_s=0.0, step_hold_s=hold, duration_s=700.0)
    assert config.step_ticks == ticks


@pytest.mark.parametrize(
    ("start", "window"),
    [("100", "from 100 s to 130 s"), ("1000", "from 58 s to 88 s (--trace-start 1,000 s wrapped")],
)
def test_an_empty_window_names_the_traces_span_as_the_others_do(
    start: str, window: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # It said only "no arrivals in the window from --trace-start 100 s".
    trace = tmp_path / "gap.csv"
    trace.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n1,100,10\n500,100,10\n501,100,10\n"
    )
    argv = ["fleet", "--trace", str(trace), "--duration", "30", "--nodes", "2", "--no-step"]
    out = tmp_path / "out"
    assert main([*argv, "--trace-start", start, "--out", str(out), "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert f"the window {window}" in line
    assert "holds no requests (kept arrivals span 0 to 501 s)" in line
    assert not out.exists()


def test_a_load_too_light_for_any_request_in_the_window_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # --utilization 1e-9 stretched the window past --duration: every cell ran a fleet of
    # no requests, and the tables printed its idle energy as results.
    trace = tmp_path / "steady.csv"
    rows = "".join(f"{second},100,10\n" for second in range(60))
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + rows)
    argv = ["fleet", "--trace", str(trace), "--utilization", "1e-9", "--duration", "30"]
    argv += ["--nodes", "2", "--no-step"]
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out), "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert "--utilization 1e-09: the fleet's 30 s window holds no request at that load" in line
    assert not out.exists()


@pytest.mark.parametrize("input_is", ["trace", "profile", "controller"])
def test_an_out_whose_report_would_overwrite_an_input_is_refused(
    input_is: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The report replaced the trace (fleet.md) or the profile's manifest (fleet.json).
    from gpugov.plant.profile_files import profile_files

    out = tmp_path / "out"
    out.mkdir()
    manifest, csv = profile_files("h100-sxm-llama3-8b")
    (out / "fleet.json").write_bytes(manifest.read_bytes())
    (out / csv.name).write_bytes(csv.read_bytes())
    (out / "fleet.md").write_text(TRACE)
    argv = ["fleet", "--nodes", "1", "--duration", "30", "--trace-start", "0", "--no-step"]
    argv += [
        "--profiles",
        str(out / "fleet.json") if input_is == "profile" else "h100-sxm-llama3-8b",
    ]
    argv += ["--trace", str(out / "fleet.md") if input_is == "trace" else "azure-conv-10min"]
    if input_is == "controller":
        argv += ["--controller", f"mpc:{out / 'fleet.json'}"]
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert main([*argv, "--out", str(out), "--quiet"]) == 2
    line = _one_error_line(capsys)
    name = "fleet.md" if input_is == "trace" else "fleet.json"
    assert f"--out {out / name}: is the {'trace' if input_is == 'trace' else 'profile'}" in line
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def test_a_trace_at_one_instant_runs_as_simulate_runs_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Arrivals sharing one timestamp (a trace spanning 0 s) are the load, at time 0,
    whatever --trace-start (the trace is shorter than the window, so it is used whole)."""
    trace = tmp_path / "instant.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:53:05.7324930,390,144\n"
        "2023-11-16 18:53:05.7324930,200,40\n"
    )
    config = replace(
        FleetConfig(nodes=2, profiles=("h100-sxm-llama3-8b",), trace=str(trace)),
        trace_start_s=0.0,
        duration_s=30.0,
    )
    workload, info = fleet_workload(config, _plants(config.profiles))
    assert [(r.arrival_time_s, r.prompt_tokens) for r in workload] == [(0.0, 390), (0.0, 200)]
    assert info["requests"] == 2
    argv = ["fleet", "--trace", str(trace), "--duration", "30", "--drain", "10", "--nodes", "2"]
    argv += ["--no-step", "--budgets", "0.7", "--allocators", "uniform", "--controller", "max"]
    argv += ["--quiet", "--jobs", "1"]
    assert main([*argv, "--trace-start", "0", "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "fleet.json").read_text())["rows"]
    assert [row["requests"] for row in rows] == [2, 2]
    later, _ = fleet_workload(replace(config, trace_start_s=5.0), _plants(config.profiles))
    assert later == workload


@pytest.mark.parametrize(
    ("flags", "period_s", "target"),
    [
        (["--controller", "mpc-online"], 0.25, 0.99),
        (["--controller", "max", "--slo-target", "none"], 1.0, None),
        (
            ["--controller", "mpc-online", "--control-period", "0.5", "--slo-target", "0.95"],
            0.5,
            0.95,
        ),
    ],
)
def test_every_node_decides_as_a_node_runs_its_controller(
    flags: list[str], period_s: float, target: float | None, tmp_path: Path
) -> None:
    """Unset, the control period is the controller's own (a node's unset daemon.period_s:
    0.25 s for mpc-online) and the SLO target 0.99, as ``simulate`` runs a controller."""
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    argv = ["fleet", "--trace", str(trace), "--trace-start", "0", "--duration", "6"]
    argv += ["--drain", "1", "--nodes", "2", "--no-step", "--budgets", "0.7"]
    argv += ["--allocators", "slo", "--allocator-period", "5", "--quiet", "--jobs", "1"]
    out = tmp_path / "out"
    assert main([*argv, *flags, "--out", str(out)]) == 0
    config = json.loads((out / "fleet.json").read_text())["config"]
    assert (config["control_period_s"], config["slo_target"]) == (period_s, target)
    said = f"every {period_s:g} s" + (f" to an SLO target of {100 * target:g} %" if target else "")
    # The chain and the view it ran in, as simulate's title says them.
    said += " in the node's safety chain (dwell 0.5 s, no clock floor) on the vllm engine view,"
    assert said in (out / "fleet.md").read_text()


def test_a_fleet_node_spends_the_slo_target_it_is_given(tiny: dict[str, object]) -> None:
    plants = tiny["plants"]
    assert isinstance(plants, dict)
    plant = plants["h100-sxm-llama3-8b"]
    workload = tiny["workload"]
    assert isinstance(workload, tuple)
    target = SLOTarget(attainment=0.95, window_s=600.0)
    given = FleetNode("n", plant, "mpc-online", workload, period_s=0.25, floor_w=100.0,
                      slo_target=target)  # fmt: skip
    assert given.controller.unwrapped.budget.target == target
    none = FleetNode("n", plant, "mpc-online", workload, period_s=0.25, floor_w=100.0)
    assert none.controller.unwrapped.budget is None


def test_a_node_the_router_sends_nothing_is_reported_without_attainment(
    tmp_path: Path,
) -> None:
    """A trace of one request on a two-node fleet leaves one node idle: its board row has
    no SLO attainment and the report is written whole (it raised a TypeError once the
    fleet.json was written)."""
    trace = tmp_path / "one.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,300,30\n")
    out = tmp_path / "out"
    argv = ["fleet", "--trace", str(trace), "--duration", "20", "--drain", "5", "--nodes", "2"]
    argv += ["--no-step", "--budgets", "0.8", "--allocators", "uniform", "--controller", "max"]
    argv += ["--trace-start", "0", "--quiet", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    assert {path.name for path in out.iterdir()} >= {"fleet.json", "fleet.md"}
    rows = json.loads((out / "fleet.json").read_text())["rows"]
    for row in rows:
        assert [node["requests"] for node in row["nodes"]] in ([1, 0], [0, 1])
        boards = fleet_report.board_breakdown(row)
        assert sorted((b["requests"], b["slo_attainment"]) for b in boards) == [
            (0, None),
            (1, 1.0),
        ]


def test_zero_token_rows_the_fleet_leaves_out_are_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fleet left a trace's zero-token rows (failed requests) out without a word,
    where a replay (`simulate`, `load`) says so in one line."""
    trace = tmp_path / "failed.csv"
    rows = [f"{i},{300 + i},{0 if i % 3 == 0 else 30}" for i in range(9)]
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    argv = ["fleet", "--trace", str(trace), "--duration", "20", "--drain", "5", "--nodes", "2"]
    argv += ["--no-step", "--budgets", "0.8", "--allocators", "uniform", "--controller", "max"]
    argv += ["--trace-start", "0", "--quiet", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "zero-token" in line]
    assert warnings == [
        f"gpugov: warning: {trace}: skipped 3 zero-token row(s) of 9 (failed requests)"
    ]


def test_stamps_that_look_like_epoch_milliseconds_are_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``simulate`` says a first stamp of 1.7e12 looks like milliseconds since 1970 read as
    seconds (the trace then runs 1000 times slower); the fleet dropped that warning with
    the skipped-rows one it words itself."""
    trace = tmp_path / "epoch_ms.csv"
    rows = [f"{1_700_000_000_000 + 500 * i},{300 + i},30" for i in range(9)]
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    argv = ["fleet", "--trace", str(trace), "--duration", "20", "--drain", "5", "--nodes", "2"]
    argv += ["--no-step", "--budgets", "0.8", "--allocators", "uniform", "--controller", "max"]
    argv += ["--trace-start", "0", "--quiet", "--jobs", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "1970" in line]
    assert warnings == [
        f"gpugov: warning: {trace}: the first timestamp 1700000000000 looks like milliseconds "
        "since 1970, but the csv format reads its stamps as seconds: if so, the trace replays "
        "1000 times slower than it was recorded (convert the stamps first)"
    ]


@pytest.mark.parametrize("start_s", [0.0, 0.5, 100.0, 1800.0])
def test_a_trace_shorter_than_the_window_is_used_whole(tmp_path: Path, start_s: float) -> None:
    """Every request of a trace shorter than --duration is in each overlaid window, from any
    --trace-start: a window of exactly the span left out the last arrival, and a start
    wrapped into no room at all was rounding noise that could leave out the first."""
    trace = tmp_path / "short.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,301,30\n1,302,30\n2,303,30\n")
    config = replace(
        FleetConfig(nodes=2, profiles=("h100-sxm-llama3-8b",), trace=str(trace)),
        trace_start_s=start_s,
        duration_s=30.0,
    )
    workload, info = fleet_workload(config, _plants(config.profiles))
    copies = info["overlaid_windows"]
    assert sorted(r.prompt_tokens for r in workload) == sorted([301, 302, 303] * copies)
    assert info["source_start_s"] is None  # used whole: fleet.md says so, not a start


@pytest.mark.parametrize("start_s", [10.0, 1000.0])
def test_fleet_md_says_where_in_the_trace_the_window_starts(
    tmp_path: Path, start_s: float, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --trace-start past the room a window leaves is wrapped round the trace; fleet.md
    said 'from 1000 s' of a trace of 100 s. It names the second the first window starts
    at (fleet.json's source_start_s), and the --trace-start it was wrapped from."""
    trace = tmp_path / "hundred.csv"
    rows = [f"{t},{300 + t},{20 + t % 7}" for t in range(101)]
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    argv = ["fleet", "--trace", str(trace), "--trace-start", f"{start_s:g}", "--nodes", "2"]
    argv += ["--duration", "30", "--drain", "5", "--no-step", "--budgets", "0.8"]
    argv += ["--allocators", "uniform", "--controller", "max", "--quiet", "--jobs", "1"]
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    workload = json.loads((out / "fleet.json").read_text())["workload"]
    first = workload["source_start_s"]
    length = 30.0 * workload["load_scale"] / workload["overlaid_windows"]
    assert first >= 0.0 and first + length <= 100.0  # a stretch the trace has
    markdown = (out / "fleet.md").read_text()
    if start_s == 10.0:
        assert first == 10.0 and "` from 10 s scaled" in markdown
    else:
        assert first < start_s
        assert f"` from {first:g} s (--trace-start 1000 s wrapped round the trace)" in markdown


def test_ray_missing_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["fleet", "--ray", "local", "--out", str(tmp_path / "out")]) == 2
    assert "pip install 'gpugov[ray]'" in _one_error_line(capsys)


def test_ctrl_c_exits_130_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("gpugov.study.fleet.run.run_fleet", interrupted)
    monkeypatch.setattr("gpugov.study.fleet.run.check_inputs", lambda config, **options: None)
    assert main(["fleet", "--quiet", "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err.strip() == "gpugov: interrupted"


def test_a_budget_below_the_fleets_floor_is_one_line_and_every_node_sits_at_its_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget the nodes' lowest caps (and idle power) cannot get under ran without a
    word: the caps summed above it, and nothing said the split was infeasible."""
    trace = tmp_path / "trace.csv"
    rows = [f"{i},{300 + i},30" for i in range(9)]
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    argv = ["fleet", "--trace", str(trace), "--duration", "20", "--drain", "5", "--nodes", "2"]
    argv += ["--profiles", "h100-sxm-llama3-8b", "--no-step", "--budgets", "0.1,0.2,0.8"]
    argv += ["--allocators", "uniform", "--controller", "max", "--trace-start", "0"]
    argv += ["--quiet", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "floor" in line]
    assert lines == [
        "gpugov: warning: --budgets 0.1, 0.2 (140 W, 280 W) of the nodes' summed TDP of "
        "1400 W, less the 2 % guard band, is below the fleet's floor of 420 W: the nodes' "
        "lowest caps (--floor 0.3 of each TDP) sum to 420 W, their idle power at the lowest "
        "clock to 216 W; every node is held at its lowest cap there and the fleet runs over "
        "that budget"
    ]
    rows_out = json.loads((out / "fleet.json").read_text())["rows"]
    low = [row for row in rows_out if row["budget_fraction"] in (0.1, 0.2)]
    assert len(low) == 2
    for row in low:  # the split degrades to the floors, never below them
        floors = [node["floor_w"] for node in row["nodes"]]
        assert floors == [210.0, 210.0]
        assert all(caps == floors for caps in row["series"]["caps_w"])


def test_the_floor_line_names_the_budget_steps_hold_and_an_idle_floor_above_the_caps(
    tiny: dict[str, object],
) -> None:
    """Where ``--floor`` puts the lowest caps under the idle power, the idle power is the
    floor; the step's held budget is checked as the budgets are."""
    base, plants = tiny["config"], tiny["plants"]
    assert isinstance(base, FleetConfig) and isinstance(plants, dict)
    config = replace(base, budgets=(0.9,), floor_fraction=0.05, step_budget=0.2)
    line = floor_warning(config, plants)
    assert line == (
        "the budget step's hold (--step-budget 0.2 less 30 %: 154 W) of the nodes' summed "
        "TDP of 1100 W, less the 2 % guard band, is below the fleet's floor of 182 W: the "
        "nodes' lowest caps (--floor 0.05 of each TDP) sum to 55 W, their idle power at the "
        "lowest clock to 182 W; every node is held at its lowest cap there and the fleet runs "
        "over that budget"
    )
    assert floor_warning(replace(config, step=False), plants) is None


def _fleet_load(config: FleetConfig, workload: tuple[Request, ...]) -> float:
    """The load ``workload`` puts on the fleet over ``--duration``, as --utilization counts
    it (one over the sum over nodes of the duration over the work at the top clock)."""
    plants = _plants(config.profiles)
    works = [work_seconds_at_maximum(workload, plants[n].profile) for n in config.node_profiles()]
    return 1.0 / sum(config.duration_s / work for work in works)


def test_a_trace_with_hours_of_gaps_is_scaled_to_the_utilization_asked(tmp_path: Path) -> None:
    """The scale was set on the first window only; the later windows it overlays fell in
    the trace's gaps, so the fleet ran at a fraction of --utilization (BurstGPT's first
    720 s: 0.23 of 0.6) while the report said 0.6."""
    trace = tmp_path / "gaps.csv"
    busy = [f"{s},{300 + s % 50},{40 + s % 30}" for s in range(60)]
    later = [f"{3600 + s},{250 + s % 40},{60 + s % 20}" for s in range(0, 600, 2)]
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "\n".join(busy + later))
    config = replace(
        FleetConfig(nodes=2, profiles=("h100-sxm-llama3-8b",), trace=str(trace)),
        trace_start_s=0.0,
        duration_s=30.0,
    )
    workload, info = fleet_workload(config, _plants(config.profiles))
    assert _fleet_load(config, workload) == pytest.approx(0.6, rel=UTILIZATION_TOLERANCE)
    assert info["reached_utilization"] == pytest.approx(_fleet_load(config, workload))
    assert load_warning(config, info) is None


def test_a_trace_shorter_than_the_window_says_the_load_it_reaches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A 2 s trace under a 30 s --duration put every overlaid window in the first 2 s and
    left the fleet idle after: a load of 0.04, reported as --utilization 0.6 without a
    word. It runs, but says so on stderr and in fleet.md."""
    trace = tmp_path / "short.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,301,30\n1,302,30\n2,303,30\n")
    out = tmp_path / "out"
    argv = ["fleet", "--trace", str(trace), "--duration", "30", "--drain", "5", "--nodes", "2"]
    argv += ["--no-step", "--budgets", "0.8", "--allocators", "uniform", "--controller", "max"]
    argv += ["--trace-start", "0", "--quiet", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "--utilization" in line]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"gpugov: warning: --trace {trace}: it spans 2 s, shorter ")
    assert "not --utilization 0.6; choose a --duration of at most 2 s" in warned[0]
    reached = json.loads((out / "fleet.json").read_text())["workload"]["reached_utilization"]
    assert reached < 0.1
    assert (
        f"0.6 of the fleet's fluid capacity asked, {reached:.3g} reached"
        in (out / "fleet.md").read_text()
    )


def test_a_trace_that_scales_says_nothing_of_its_load(tmp_path: Path) -> None:
    config = replace(
        FleetConfig(nodes=2, profiles=("h100-sxm-llama3-8b",), trace="azure-conv-10min"),
        trace_start_s=0.0,
        duration_s=120.0,
    )
    workload, info = fleet_workload(config, _plants(config.profiles))
    assert _fleet_load(config, workload) == pytest.approx(0.6, rel=UTILIZATION_TOLERANCE)
    assert load_warning(config, info) is None


def test_a_load_lighter_than_one_request_is_said_as_such(tmp_path: Path) -> None:
    """--utilization 1e-300 keeps the window's first arrival (at 0 s, whatever the scale):
    the load reached is above the one asked, which is no gap in the trace."""
    trace = tmp_path / "steady.csv"
    rows = "".join(f"{second},100,10\n" for second in range(60))
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + rows)
    config = replace(
        FleetConfig(nodes=2, profiles=("h100-sxm-llama3-8b",), trace=str(trace)),
        trace_start_s=0.0,
        duration_s=30.0,
        utilization=1e-300,
    )
    workload, info = fleet_workload(config, _plants(config.profiles))
    assert len(workload) == 1
    line = load_warning(config, info)
    assert line is not None
    assert "a load that light is less than the 1 request(s) kept" in line
    assert line.endswith("choose a higher --utilization or a longer --duration")


def test_a_utilization_that_underflows_the_scale_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--utilization 5e-324 took the scale to 0.0, and scale_load's ValueError reached the
    user as a traceback."""
    trace = tmp_path / "heavy.csv"  # more work than the fleet can do: the scale is below 1
    rows = "".join(f"{i / 100},4000,1000\n" for i in range(6000))
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + rows)
    argv = ["fleet", "--trace", str(trace), "--utilization", "5e-324", "--duration", "30"]
    argv += ["--nodes", "2", "--no-step", "--trace-start", "0"]
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out), "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert "the fleet's 30 s window holds no request at that load" in line
    assert not out.exists()


def test_the_fleets_load_is_priced_once_per_profile_not_once_per_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fleet_utilization`` priced the whole workload at every node's top clock, node by
    node: quadratic in ``--nodes`` (the workload grows with the fleet), so ``--nodes 200``
    sat 80 s and ``--nodes 2000`` many minutes before its first progress line. Each of
    the listed profiles is priced once now, and the load is the same number."""
    from gpugov.study.fleet import workload as fleet_workload_module

    config = replace(FleetConfig(), nodes=12, profiles=("h100-sxm-llama3-8b", "h200-sxm-llama3-8b"))
    plants = _plants(config.profiles)
    requests = [Request(i, 0.5 * i, 300 + 11 * i, 40 + i % 7) for i in range(200)]
    expected = 1.0 / sum(
        config.duration_s / work_seconds_at_maximum(requests, plants[name].profile)
        for name in config.node_profiles()
    )
    priced: list[str] = []
    real = fleet_workload_module.work_seconds_at_maximum

    def counting(work: object, profile: object) -> float:
        priced.append(profile.name)  # type: ignore[attr-defined]
        return real(work, profile)  # type: ignore[arg-type]

    monkeypatch.setattr(fleet_workload_module, "work_seconds_at_maximum", counting)
    assert fleet_workload_module.fleet_utilization(requests, config, plants) == expected
    assert sorted(priced) == sorted(config.profiles)


def _summary_row(cell: Cell, attainment: float) -> dict[str, object]:
    """A cell's row as run_cell writes the fields summarize reads."""
    return {
        "key": cell.key,
        "allocator": cell.allocator,
        "budget_fraction": cell.budget,
        "step": cell.step,
        "slo_attainment": attainment,
        "step_window_slo_attainment": attainment,
        "energy_j": 1000.0,
    }


@pytest.mark.parametrize(("budget", "loss"), [(0.8, 4.0), (0.801, None)])
def test_the_steps_slo_loss_is_against_the_same_allocator_at_its_own_budget(
    budget: float, loss: float | None
) -> None:
    # --budgets 0.801 names its cell uniform@0.80, as the step's budget 0.8 names its
    # baseline: the step's loss was taken against the run at 0.801.
    config = FleetConfig(budgets=(budget,), allocators=("uniform",), step_budget=0.8)
    rows = [
        _summary_row(Cell("uncapped", None), 0.99),
        _summary_row(Cell("uniform", budget), 0.98),
        _summary_row(Cell("uniform", 0.8, step=True), 0.94),
    ]
    step = [row for row in summarize(config, rows) if row["step"]]
    assert step[0]["step_slo_loss_pp"] == (None if loss is None else pytest.approx(loss))


def test_a_fleets_nodes_share_one_reading_of_the_workloads_forecasts(
    tiny: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every node declared its forecasts by reading the whole fleet's workload, which grows
    # with the fleet: building 2,000 nodes took minutes before the first progress line.
    from gpugov.daemon import decide
    from gpugov.study.fleet import node as fleet_node

    config = replace(tiny["config"], nodes=6)  # type: ignore[arg-type]
    shared = {"config": config, "workload": tiny["workload"], "plants": tiny["plants"]}
    read: list[int] = []
    real = decide.Forecasts.from_workload.__func__  # type: ignore[attr-defined]

    def counting(cls: type, workload: object) -> object:
        read.append(len(workload))  # type: ignore[arg-type]
        return real(cls, workload)

    monkeypatch.setattr(decide.Forecasts, "from_workload", classmethod(counting))
    once = run_cell(Cell("uncapped", None), shared)
    assert read.count(len(tiny["workload"])) == 1  # type: ignore[arg-type]
    # The same run as each node reading the workload itself.
    original = fleet_node.FleetNode.__init__

    def per_node(self: object, *args: object, forecasts: object = None, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fleet_node.FleetNode, "__init__", per_node)
    read.clear()
    each = run_cell(Cell("uncapped", None), shared)
    assert read.count(len(tiny["workload"])) == 1 + 6  # type: ignore[arg-type]
    once.pop("cpu_s"), each.pop("cpu_s")
    assert once == each


COUNTING = """
CALLS = [0]


def make(context):
    clocks = context.supported_clocks_mhz

    def decide(observation):
        CALLS[0] += 1  # module state: a node's decisions follow every call before it
        return clocks[-1] if (CALLS[0] // 20) % 2 == 0 else clocks[len(clocks) // 3]

    return decide
"""


def test_an_outside_controllers_cell_starts_from_the_same_module_state(
    tiny: dict[str, object], module_on_path: Callable[[str, str], str]
) -> None:
    """Another package's controller runs each cell in a child process, as a sweep's cell
    does: what a cell changes in its module's state is not there when the next starts, so
    a cell's figures do not follow --jobs, --ray or the cells' order (a cell run after
    another decided other clocks)."""
    name = module_on_path("fleet_counting_governor", COUNTING)
    config = tiny["config"]
    assert isinstance(config, FleetConfig)
    shared = {**tiny, "config": replace(config, controller=f"{name}:make")}
    cell = Cell("uniform", 0.7, step=False)
    alone = run_cell(cell, shared)
    run_cell(Cell("slo", 0.8, step=False), shared)
    again = run_cell(cell, shared)
    assert again["energy_j"] == alone["energy_j"]
    assert again["series"] == alone["series"]
    assert sys.modules[name].CALLS == [0]


RAISING = """
def make(context):
    top = max(context.supported_clocks_mhz)

    def decide(observation):
        if observation.time_s > 3.0:
            raise ValueError("boom")
        return top

    return decide
"""


def test_an_outside_controller_that_raises_in_a_cell_is_one_line(
    tmp_path: Path,
    module_on_path: Callable[[str, str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The child's failure comes back as the line the controller's failure is in this
    process: the controller, the node and the time, no class name before it."""
    name = module_on_path("fleet_raising_governor", RAISING)
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    argv = ["fleet", "--trace", str(trace), "--trace-start", "0", "--duration", "6"]
    argv += ["--drain", "1", "--nodes", "2", "--no-step", "--budgets", "0.7", "--quiet"]
    argv += ["--allocators", "uniform", "--allocator-period", "5", "--jobs", "1"]
    argv += ["--controller", f"{name}:make", "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"gpugov: error: controller '{name}:make' on node node0 raised at t=4.000s (step 40): boom"
    ]


TICKS = """
SEEN = []


def make(context):
    top = max(context.supported_clocks_mhz)

    def decide(observation):
        SEEN.append(observation.time_s)
        return top

    return decide
"""


def test_a_fleet_node_decides_at_the_ticks_a_simulated_node_does(
    module_on_path: Callable[[str, str], str],
) -> None:
    """A node's daemon decides from its first tick, at 0 s, before any request, as
    ``simulate`` and ``run --simulate`` call their controller; a fleet's node first decided
    one period in, so a controller counting its decisions (or its warm-up) was a period
    behind its simulated twin."""
    import importlib

    from gpugov.daemon.cli_support import simulated_controller
    from gpugov.plant import ServingPlant, load_profile, simulate
    from gpugov.plant.scheduler import chunked_prefill_scheduler

    name = module_on_path("fleet_tick_governor", TICKS)
    seen: list[float] = importlib.import_module(name).SEEN
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    workload = tuple(Request(i, 0.4 * i + 0.1, 200, 10) for i in range(10))
    controller = simulated_controller(f"{name}:make", plant, workload, 1.0)
    simulate(workload, plant, chunked_prefill_scheduler, controller, 0, control_period_s=1.0)
    simulated = list(seen)
    seen.clear()
    node = FleetNode("n", plant, f"{name}:make", workload, period_s=1.0, floor_w=100.0)
    for request in workload:
        node.dispatch(request)
    seen.clear()  # the build's warm-up decision, as the simulated build made one
    node.start()
    for tick in range(1, len(simulated) - 1):  # its first entry: the build's warm-up
        node.step(float(tick))
    assert seen == simulated[1:] and seen[0] == 0.0
