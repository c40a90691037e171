"""``bench/online_zoo.py`` (one controller priced against cached oracle energies): its
capture and summary arithmetic, its cache key, one scenario end to end, and its refusal of
an unknown profile."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from study_support import bench_script


def _run(holds: bool, saved: float, capture: float | None, after: float | None) -> dict[str, Any]:
    return {
        "holds_slo": holds,
        "slo_attainment_vs_max_pp": 0.0,
        "energy_saved_fraction": saved,
        "oracle_capture": capture,
        "oracle_capture_after_warmup": after,
    }


def test_capture_is_the_scoreboards_and_none_where_it_does_not_hold() -> None:
    module = bench_script("online_zoo")
    assert module._capture(100.0, 70.0, 40.0, True) == pytest.approx(0.5)
    assert module._capture(100.0, 70.0, 40.0, False) is None
    assert module._capture(100.0, 70.0, 100.0, True) is None  # the oracle saves nothing


def test_no_capture_after_the_warm_up_where_the_run_ends_in_a_brief_drain() -> None:
    """Past the warm-up a run whose arrivals ended early drains for seconds: a capture over
    them is no measure, so none is reported under the share the benchmark requires."""
    module = bench_script("online_zoo")
    share = module.MIN_AFTER_WARMUP_SHARE
    after = module._capture_after_warmup(100.0, 100.0 * share, 100.0 * share - 1.0, 0.0, True)
    assert after == pytest.approx(1.0 / (100.0 * share))
    assert module._capture_after_warmup(100.0, 100.0 * share - 0.1, 1.0, 0.0, True) is None
    assert module._capture_after_warmup(100.0, 50.0, 40.0, 30.0, False) is None


def test_summary_counts_holds_and_takes_medians_over_what_is_defined() -> None:
    module = bench_script("online_zoo")
    rows = [
        {"controllers": {"mpc-online": _run(True, 0.30, 0.9, 0.95)}},
        {"controllers": {"mpc-online": _run(True, 0.20, 0.7, None)}},
        {"controllers": {"mpc-online": _run(False, 0.40, None, None)}},
        {"scenario": "x", "error": "the trace did not load"},
    ]
    (online,) = module.summarise(rows, ("mpc-online",))
    assert online["scenarios"] == 3  # the skipped scenario is not counted
    assert online["holds_slo"] == 2
    assert online["median_capture"] == pytest.approx(0.8)
    assert online["mean_capture"] == pytest.approx(0.8)
    assert online["median_capture_after_warmup"] == pytest.approx(0.95)
    assert online["scenarios_after_warmup"] == 1
    assert online["median_saved"] == pytest.approx(0.30)


def test_the_cache_key_follows_the_settings_the_oracles_depend_on() -> None:
    module = bench_script("online_zoo")
    from gpugov.study.scoreboard.scenarios import FULL

    key = module.settings_key(FULL)
    assert key == module.settings_key(replace(FULL, jobs=1, profiles=("l4-llama3.2-3b",)))
    assert key != module.settings_key(replace(FULL, duration_s=300.0))
    assert key != module.settings_key(replace(FULL, tolerance=0.02))


def test_one_scenario_priced_against_cached_oracle_energies() -> None:
    """With a cached oracle of zero joules the capture is the saving itself: the energies
    are the scenario's own and no oracle is run."""
    module = bench_script("online_zoo")
    from gpugov.study.scoreboard.scenarios import FULL

    config = replace(FULL, duration_s=120.0)
    cell = (
        "azure-conv-10min",
        "h100-sxm-llama3-8b",
        "recorded",
        config,
        ("mpc-online",),
        [0.0, 0.0],
    )
    row = module.run_cell(cell)
    assert row["oracle_energies_j"] == [0.0, 0.0]
    run = row["controllers"]["mpc-online"]
    assert run["holds_slo"]
    assert 0.0 < run["energy_saved_fraction"] < 1.0
    assert run["oracle_capture"] == pytest.approx(run["energy_saved_fraction"])
    assert run["oracle_capture_after_warmup"] is not None


def test_an_unknown_profile_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    module = bench_script("online_zoo")
    assert module.main(["--profiles", "no-such-gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --profiles:")


def test_an_unknown_controller_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A comma-joined list is one unknown key, named before any scenario runs."""
    module = bench_script("online_zoo")
    assert module.main(["--controllers", "mpc-online,throttllem"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --controllers:")
    assert "'mpc-online,throttllem'" in err[0]
