"""The scoreboard on a user's trace too small to load the GPU: a window that meets its SLO
at every rate the capacity search tries has no capacity, and a load scaled to one is
skipped with its reason rather than reported as a utilisation it is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.plant.workload import load_trace
from gpugov.study.fleet.run import _plants
from gpugov.study.scoreboard.scenarios import NoCapacityError, build_scenario

HEADER = "arrival_time_s,prompt_tokens,output_tokens\n"
PROFILE = "h100-sxm-llama3-8b"


def _scenario(trace: Path, load: str) -> object:
    """``build_scenario`` of ``trace`` on the H100 with a 30 s window."""
    requests, report = load_trace(trace)
    plant = _plants((PROFILE,))[PROFILE]
    return build_scenario(str(trace), plant, load, 30.0, (requests, report.sha256))


@pytest.mark.parametrize("load", ["recorded", "cap70"])
def test_requests_at_one_instant_have_no_capacity_to_scale_to(tmp_path: Path, load: str) -> None:
    """One request (or several at one instant) was 'recorded/716' and 'cap70' at a
    utilisation of 70 % of a capacity that was only the search's limit."""
    trace = tmp_path / "one.csv"
    trace.write_text(HEADER + "0,100,50\n")
    with pytest.raises(NoCapacityError, match="1 request\\(s\\) at one instant meet the SLO"):
        _scenario(trace, load)


def test_a_few_requests_replay_as_recorded_but_have_no_cap70(tmp_path: Path) -> None:
    trace = tmp_path / "few.csv"
    trace.write_text(HEADER + "0,100,50\n1,200,20\n2,300,30\n")
    recorded = _scenario(trace, "recorded")
    assert recorded.load_label == "recorded"
    assert recorded.load_scale == 1.0
    with pytest.raises(NoCapacityError, match="3 request\\(s\\) over 2 s meet the SLO"):
        _scenario(trace, "cap70")


def test_the_board_lists_the_scenario_skipped_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "few.csv"
    trace.write_text(HEADER + "0,100,50\n1,200,20\n2,300,30\n")
    out = tmp_path / "out"
    argv = ["bench", "controllers", "--traces", str(trace), "--profiles", PROFILE]
    argv += ["--duration", "30", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    board = json.loads((out / "scoreboard.json").read_text())
    assert [scenario["load_label"] for scenario in board["scenarios"]] == ["recorded"]
    [skipped] = board["skipped"]
    assert skipped["scenario"].endswith("|cap70")
    assert "too few to load the GPU" in skipped["reason"]
    assert "Traceback" not in capsys.readouterr().err


def test_only_tiny_windows_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "one.csv"
    trace.write_text(HEADER + "0,100,50\n")
    out = tmp_path / "out"
    argv = ["bench", "controllers", "--traces", str(trace), "--profiles", PROFILE]
    argv += ["--duration", "30", "--jobs", "1", "--out", str(out), "--loads", "cap70"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("gpugov: error: no scenario could run: ")
    assert "too few to load the GPU" in err[-1]
    assert not (out / "scoreboard.json").exists()


def _plant_with(tmp_path: Path, name: str, **changes: float) -> object:
    """A plant on a copy of the bundled profile, named ``name``, with manifest ``changes``."""
    from gpugov.plant import ServingPlant
    from gpugov.plant.profile_files import load_profile, resolve_profile_path

    bundled = resolve_profile_path(PROFILE)
    manifest = json.loads(bundled.read_text())
    manifest.update(changes)
    (tmp_path / f"{name}.csv").write_bytes((bundled.parent / manifest["csv"]).read_bytes())
    manifest["csv"] = f"{name}.csv"
    (tmp_path / f"{name}.json").write_text(json.dumps(manifest))
    return ServingPlant.from_profile(load_profile(str(tmp_path / f"{name}.json")))


def _cap70_refusal(tmp_path: Path, plant: object) -> str:
    """The NoCapacityError of a steady trace's cap70 scenario (40 requests over 39 s)."""
    trace = tmp_path / "steady.csv"
    trace.write_text(HEADER + "".join(f"{i},500,100\n" for i in range(40)))
    requests, report = load_trace(trace)
    with pytest.raises(NoCapacityError) as caught:
        build_scenario(str(trace), plant, "cap70", 30.0, (requests, report.sha256))  # type: ignore[arg-type]
    return str(caught.value)


def test_a_profile_whose_slo_its_maximum_clock_never_meets_is_told_so(tmp_path: Path) -> None:
    """A TPOT SLO under the profile's fastest decode iteration: every rate misses it as the
    light load does (0 %), so the search reached its limit and the skip said the window's
    requests 'meet the SLO at every rate tried ... too few to load the GPU'."""
    message = _cap70_refusal(tmp_path, _plant_with(tmp_path, "tight", tpot_slo_s=1e-9))
    assert "miss the SLO at tight's maximum clock even at a light load (0.0% within it)" in message
    assert "TPOT 1e-09 s" in message
    assert "too few to load the GPU" not in message


def test_an_slo_longer_than_the_windows_whole_work_is_named(tmp_path: Path) -> None:
    """Enormous SLOs: 40 requests queued at 16x the capacity still meet them, and the skip
    said only 'too few to load the GPU', with no word of the SLO that no queue can miss."""
    plant = _plant_with(tmp_path, "loose", ttft_slo_s=1e8, tpot_slo_s=1e8)
    message = _cap70_refusal(tmp_path, plant)
    assert "40 request(s) over 39 s meet the SLO at loose's maximum clock" in message
    assert "fits within its TTFT SLO of 100,000,000 s)" in message
