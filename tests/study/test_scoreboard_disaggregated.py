"""The scoreboard's disaggregated scenarios: the layout's load, per-pool rows, the SLO
condition, and ``gpugov bench controllers --layout disaggregated`` end to end."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.plant import ServingPlant, load_profile
from gpugov.study.scoreboard.disaggregated import run_disaggregated_scenario
from gpugov.study.scoreboard.scenarios import TINY, build_disaggregated_scenario


@pytest.fixture(scope="module")
def plant() -> ServingPlant:
    return ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))


def test_layout_load_and_rows(plant: ServingPlant) -> None:
    """2P2D gets twice the colocated scenario's arrival rate; each row judges the
    request-level SLO against the maximum clock and splits the saving by pool."""
    one = build_disaggregated_scenario("azure-conv-10min", plant, "1P1D", "recorded", 10.0)
    two = build_disaggregated_scenario("azure-conv-10min", plant, "2P2D", "recorded", 10.0)
    assert one.requests == one.base.requests
    assert [r.arrival_time_s for r in two.requests] == pytest.approx(
        [r.arrival_time_s / 2.0 for r in one.requests]
    )
    assert two.key.endswith("|recorded|2P2D") and two.describe()["decode_engines"] == 2
    with pytest.raises(ValueError, match="layout must be one of"):
        build_disaggregated_scenario("azure-conv-10min", plant, "3P1D", "recorded", 10.0)

    config = replace(TINY, duration_s=10.0)
    rows = run_disaggregated_scenario(two, plant, config, ("max", "reactive"))
    reference, reactive = rows
    assert reference["controller"] == "max" and reference["energy_saved_fraction"] == 0.0
    assert reference["holds_slo"] is True
    assert reference["pools"]["prefill"]["energy_saved_fraction"] == 0.0
    e_max = reference["energy_j"]
    assert sum(reference["pools"][r]["energy_j"] for r in ("prefill", "decode")) == (
        pytest.approx(e_max)
    )
    # The reactive governor lowers the decode pool's clock: it saves energy there.
    assert reactive["pools"]["decode"]["energy_saved_fraction"] > 0.0
    assert (
        reactive["pools"]["decode"]["mean_realized_clock_mhz"]
        < (reference["pools"]["decode"]["mean_realized_clock_mhz"])
    )
    assert reactive["oracle_capture"] is None
    # The same controllers on the colocated layout of the same four GPUs and load.
    assert reference["colocated"]["gpus"] == 4
    assert reference["colocated"]["energy_saved_fraction"] == 0.0
    e_colocated = reference["colocated"]["energy_j"]
    assert reference["energy_vs_colocated_fraction"] == pytest.approx(
        (e_colocated - e_max) / e_colocated
    )
    assert reactive["colocated"]["energy_j"] < e_colocated
    assert reactive["transfer_p50_s"] > 0.0
    with pytest.raises(ValueError, match="start with 'max'"):
        run_disaggregated_scenario(two, plant, config, ("reactive",))


def test_bench_controllers_layout_disaggregated(tmp_path: Path) -> None:
    out = tmp_path / "board"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = main(
            [
                "bench",
                "controllers",
                "--tiny",
                "--layout",
                "disaggregated",
                "--traces",
                "azure-conv-10min",
                "--profiles",
                "h200-sxm-llama3-8b",
                "--duration",
                "8",
                "--out",
                str(out),
            ]
        )
    assert code == 0
    payload = json.loads((out / "disaggregated.json").read_text())
    layouts = {(row["layout"], row["controller"]) for row in payload["rows"]}
    assert layouts == {
        (layout, key)
        for layout in ("1P1D", "2P2D")
        for key in ("max", "reactive", "default-dvfs", "mpc-online")
    }
    assert all(row["profile"] == "h200-sxm-llama3-8b" for row in payload["rows"])
    assert "| mpc-online |" in (out / "disaggregated.md").read_text()
    assert "wrote" in stdout.getvalue()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_each_pool_is_judged_on_its_phase_as_a_node_with_that_role(
    plant: ServingPlant, role: str
) -> None:
    from gpugov.controllers.contract import layers
    from gpugov.daemon.config import ReactiveControllerConfig
    from gpugov.daemon.roles import RoleView
    from gpugov.study.scoreboard.controllers import study_controller

    scenario = build_disaggregated_scenario("azure-conv-10min", plant, "1P1D", "recorded", 10.0)
    chain = study_controller(
        ReactiveControllerConfig(kind="reactive"),
        plant,
        scenario.requests,
        control_period_s=1.0,
        role=role,
    )
    views = [layer for layer in layers(chain) if isinstance(layer, RoleView)]
    assert [view.role for view in views] == [role]
