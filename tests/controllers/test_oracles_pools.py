"""The hindsight oracles per pool on a small disaggregated layout: the window oracle's
schedule, its SLO condition and cost, and the fluid LP bound of each pool."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from synthetic import make_plant

from gpugov.controllers.baseline import FixedClockController
from gpugov.controllers.oracles import (
    PoolWindowOracle,
    ScheduleController,
    fluid_energy_lower_bound,
    holds_slo,
    phase_token_costs,
    pool_energy_lower_bound,
    pool_window_oracle,
)
from gpugov.plant import ServingPlant
from gpugov.plant.disaggregated import DisaggregatedResult, simulate_disaggregated
from gpugov.plant.disaggregated_layout import ROLES, DisaggregatedPlant, PoolSpec
from gpugov.plant.types import Request

COARSE_LEVELS = 4
NEIGHBOUR_STEPS = (3,)


def _workload() -> tuple[Request, ...]:
    """25 s of arrivals with a burst in the middle."""
    requests = []
    time_s = 0.0
    for index in range(70):
        time_s += 0.2 if 25 <= index < 45 else 0.45
        requests.append(
            Request(index, round(time_s, 3), 400 + 173 * (index % 7), 20 + 23 * (index % 5))
        )
    return tuple(requests)


def _fixed(layout: DisaggregatedPlant, pair: tuple[float, float]) -> DisaggregatedResult:
    controllers = {role: FixedClockController(c) for role, c in zip(ROLES, pair, strict=True)}
    return simulate_disaggregated(_workload(), layout, controllers)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    layout: DisaggregatedPlant
    reference: DisaggregatedResult
    fixed: dict[str, DisaggregatedResult]
    oracle: PoolWindowOracle


@pytest.fixture(scope="module")
def case() -> Case:
    plant: ServingPlant = make_plant()
    layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant, 2))
    clocks = [float(c) for c in plant.profile.clock_mhz]
    reference = _fixed(layout, (clocks[-1], clocks[-1]))
    middle = (clocks[len(clocks) // 2], clocks[len(clocks) // 2])
    fixed = {"max": reference, "middle": _fixed(layout, middle)}
    oracle = pool_window_oracle(
        _workload(),
        layout,
        reference=reference,
        continuation_clocks_mhz=dict(zip(ROLES, middle, strict=True)),
        window_s=5.0,
        lookahead_s=5.0,
        coarse_levels=COARSE_LEVELS,
        neighbour_steps=NEIGHBOUR_STEPS,
    )
    return Case(layout, reference, fixed, oracle)


def test_pool_window_oracle_holds_the_slo_and_saves_energy(case: Case) -> None:
    oracle = case.oracle
    reference = case.reference.metrics
    assert oracle.holds_slo
    assert holds_slo(oracle.result.metrics.slo_attainment, reference.slo_attainment)
    assert oracle.result.metrics.energy_j < reference.energy_j
    # The constant continuation pair is itself a candidate schedule.
    constant = [a for a in oracle.attempts if a["source"] == "constant continuation pair"]
    assert constant and oracle.result.metrics.energy_j <= constant[0]["energy_j"]
    assert case.fixed["middle"].metrics.energy_j == pytest.approx(constant[0]["energy_j"])
    # Each pool gets a clock per window, from its own profile's supported clocks.
    windows = len(oracle.schedule_mhz["prefill"])
    assert windows == len(oracle.schedule_mhz["decode"]) >= 5
    for role in ROLES:
        assert set(oracle.schedule_mhz[role]) <= set(case.layout.pool(role).plant.profile.clock_mhz)
    assert oracle.as_dict()["pool_energy_j"] == {
        role: pool.energy_j for role, pool in oracle.result.pools.items()
    }


def test_pool_window_oracle_replays_to_its_result(case: Case) -> None:
    oracle = case.oracle
    controllers = {
        role: ScheduleController(oracle.schedule_mhz[role], oracle.window_s) for role in ROLES
    }
    replay = simulate_disaggregated(_workload(), case.layout, controllers)  # type: ignore[arg-type]
    assert replay.metrics.energy_j == oracle.result.metrics.energy_j
    assert replay.request_records == oracle.result.request_records


def test_pool_window_oracle_searches_the_pools_one_after_the_other(case: Case) -> None:
    """Coordinate-wise: per window at most the prefill candidates plus the decode ones
    (one pair shared), not their product."""
    oracle = case.oracle
    searches = sum(1 for a in oracle.attempts if a["source"].startswith("greedy("))
    levels = len(case.layout.prefill.plant.profile.clock_mhz)
    per_pool = min(levels, COARSE_LEVELS + 2 + 2 * len(NEIGHBOUR_STEPS))
    windows = len(oracle.schedule_mhz["prefill"])
    assert 0 < oracle.candidate_runs <= searches * windows * (2 * per_pool - 1)
    assert oracle.candidate_runs < searches * windows * per_pool**2


def test_pool_window_oracle_needs_work_and_both_pools() -> None:
    plant = make_plant()
    layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant))
    with pytest.raises(ValueError, match="at least one request"):
        pool_window_oracle([], layout)
    with pytest.raises(ValueError, match="decode"):
        pool_window_oracle(_workload()[:3], layout, continuation_clocks_mhz={"prefill": 900.0})
    with pytest.raises(ValueError, match="whole number of control periods"):
        pool_window_oracle(_workload()[:3], layout, window_s=2.5)


# ------------------------------------------------------------------ fluid LP bound
def test_pool_bound_is_below_every_run_per_pool_and_in_total(case: Case) -> None:
    bound = pool_energy_lower_bound(_workload(), case.layout)
    assert bound.success and bound.replicas == {"prefill": 1, "decode": 2}
    assert bound.energy_j == pytest.approx(sum(b.energy_j for b in bound.pools.values()))
    assert bound.pools["prefill"].decode_tokens == 0.0
    assert bound.pools["decode"].prefill_tokens == 0.0
    runs = {**case.fixed, "window oracle": case.oracle.result}
    for name, run in runs.items():
        assert bound.energy_j <= run.metrics.energy_j, name
        for role in ROLES:
            assert bound.pools[role].energy_j <= run.pools[role].energy_j, (name, role)
    summary = bound.as_dict()
    assert summary["pools"]["decode"]["replicas"] == 2
    assert summary["pools"]["prefill"]["phases"] == ["prefill"]


def test_one_request_pool_bounds_are_its_cheapest_tokens() -> None:
    """No window before the last arrival: each pool's bound is its phase's tokens at the
    lowest joules per token, and the two sum to the colocated bound."""
    plant = make_plant()
    layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant))
    request = Request(0, 0.0, 1000, 11)
    bound = pool_energy_lower_bound([request], layout)
    costs = phase_token_costs(plant, 1000.0)
    assert bound.pools["prefill"].energy_j == pytest.approx(1000 * costs["prefill_j"].min())
    assert bound.pools["decode"].energy_j == pytest.approx(10 * costs["decode_j"].min())
    colocated = fluid_energy_lower_bound([request], plant)
    assert bound.energy_j == pytest.approx(colocated.energy_j)


def test_replicas_multiply_the_idle_floor_of_a_light_pool() -> None:
    """Two small requests 10 s apart (capacity never binds): each token at its lowest
    marginal joules plus the lowest idle power over the 10 s, once per replica."""
    plant = make_plant()
    requests = [Request(0, 0.0, 200, 6), Request(1, 10.0, 300, 4)]
    costs = phase_token_costs(plant, 200.0)
    idle_w = float(costs["idle_w"].min())
    marginal = {
        "prefill": float((costs["prefill_j"] - idle_w * costs["prefill_s"]).min()),
        "decode": float(costs["decode_marginal_j"].min()),
    }
    tokens = {"prefill": 500.0, "decode": 8.0}
    for replicas in (1, 2):
        for role in ROLES:
            bound = fluid_energy_lower_bound(requests, plant, replicas=replicas, phases=(role,))
            expected = replicas * idle_w * 10.0 + tokens[role] * marginal[role]
            assert bound.energy_j == pytest.approx(expected, rel=1e-7), (role, replicas)
    with pytest.raises(ValueError, match="replicas"):
        fluid_energy_lower_bound(requests, plant, replicas=0)
    with pytest.raises(ValueError, match="phases"):
        fluid_energy_lower_bound(requests, plant, phases=("transfer",))
