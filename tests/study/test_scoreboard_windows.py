"""``gpugov bench controllers --windows N`` (held-out windows) and ``--profiles synthetic``:
the tiny run through the real entry point, the refusals, the window starts and the
summary's arithmetic on hand-made rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from study_support import run_main

from gpugov.plant import ServingPlant, load_profile
from gpugov.plant.types import Request
from gpugov.plant.workload import TraceError
from gpugov.study.scoreboard import command
from gpugov.study.scoreboard import run as scoreboard
from gpugov.study.scoreboard.scenarios import (
    CONTROLLER_ORDER,
    TRACE_STARTS_S,
    TRACES,
    WHOLE_TRACE,
    _full_trace,
    build_scenario,
)
from gpugov.study.scoreboard.windows import (
    summarize_windows,
    window_markdown,
    window_overlaps,
    window_starts,
)


@pytest.fixture(scope="module")
def windows_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, str]:
    out = tmp_path_factory.mktemp("windows")
    argv = ["bench", "controllers", "--tiny", "--windows", "3", "--duration", "10"]
    # 10 s windows, not the tiny run's 15: three of them, and the window table.
    code, stdout, stderr = run_main([*argv, "--out", str(out), "--report", str(_report(out))])
    return out, code, stdout, stderr


def _report(out: Path) -> Path:
    """The --report folder of the windows run whose --out is ``out``."""
    return out.parent / f"{out.name}-report"


def test_tiny_windows_run_scores_every_window(windows_run: tuple[Path, int, str, str]) -> None:
    out, code, stdout, stderr = windows_run
    assert code == 0, stderr
    payload = json.loads((out / "scoreboard.json").read_text())
    assert payload["config"]["windows"] == 3
    starts = payload["window_starts_s"]["azure-conv-10min"]
    assert len(starts) == len(set(starts)) == 3
    assert starts[0] == TRACE_STARTS_S["azure-conv-10min"]
    keys = [info["key"] for info in payload["scenarios"]]
    assert keys == [f"azure-conv-10min|h100-sxm-llama3-8b|recorded@{s:g}" for s in starts]
    # Each window is a different stretch of the trace.
    assert len({info["source_start_s"] for info in payload["scenarios"]}) == 3
    rows = payload["rows"]
    assert len(rows) == 3 * len(CONTROLLER_ORDER)
    for row in rows:
        assert row["window_start_s"] in starts
        assert row["missed_requests"] >= 0
        if row["controller"] == "max":
            assert row["extra_missed_requests"] == 0
            assert row["energy_saved_after_warmup_fraction"] == pytest.approx(0.0)
    # The window summary agrees with the rows it summarises.
    summary = {entry["controller"]: entry for entry in payload["window_summary"]}
    assert list(summary) == list(CONTROLLER_ORDER)
    for key, entry in summary.items():
        mine = [row for row in rows if row["controller"] == key]
        assert entry["windows"] == 3
        assert entry["holds_slo"] == sum(row["holds_slo"] for row in mine)
        assert entry["extra_missed_requests"] == sum(row["extra_missed_requests"] for row in mine)
    assert summary["window-oracle"]["median_oracle_capture"] == pytest.approx(1.0)
    # The usual outputs, the window table on stdout and in the markdown, progress with ETA.
    assert "controller (windows)" in stdout
    markdown = (out / "scoreboard.md").read_text()
    assert "## Held-out windows" in markdown
    assert f"azure-conv-10min @{starts[1]:g} s" in markdown
    assert f"recorded@{starts[2]:g}" in stderr
    assert "ETA" in stderr
    # At the recorded load a window's source is its --duration: none overlap.
    assert payload["window_overlaps"] == []
    assert "not held out" not in stderr and "Not held out" not in markdown


def test_the_report_of_a_windows_run_holds_its_window_summary(
    windows_run: tuple[Path, int, str, str],
) -> None:
    """The citable report of a --windows run carries what the board says of its windows:
    the starts, the summary over them and the overlaps, in report.json and report.md."""
    out, code, _, stderr = windows_run
    assert code == 0, stderr
    payload = json.loads((out / "scoreboard.json").read_text())
    report = json.loads((_report(out) / "report.json").read_text())
    for key in ("window_starts_s", "window_summary", "window_overlaps"):
        assert report[key] == payload[key]
    markdown = (_report(out) / "report.md").read_text()
    assert "\n".join(window_markdown(payload)) in markdown
    starts = payload["window_starts_s"]["azure-conv-10min"]
    assert f"azure-conv-10min {', '.join(f'{s:g}' for s in starts)} s" in markdown


def test_default_config_runs_one_window_per_trace() -> None:
    """Without ``--windows`` each trace runs its one scoreboard window (start None: the
    scenario keys and rows stay the scoreboard's own)."""
    config = command.config_for(tiny=True)
    assert config.windows == 1 and config.scenario_count() == 1
    assert scoreboard._window_starts(config, {}, {}) == {"azure-conv-10min": (None,)}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--windows", "0"], "argument --windows: must be an integer in [1, 1000]"),
        (["--windows", "50"], "too short for 50 windows of 15 s"),
        (["--windows", "2", "--traces", "burstgpt1"], "burstgpt1 is used whole"),
        (["--profiles", "synthetic:nope"], "unknown synthetic profile shape 'synthetic:nope'"),
    ],
)
def test_bad_windows_and_profiles_are_refused_before_any_work(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "board"
    code, _, stderr = run_main(["bench", "controllers", "--tiny", *argv, "--out", str(out)])
    assert code == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def test_windows_leave_out_default_traces_used_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> Any:
        raise TraceError(f"{name}: not here")

    monkeypatch.setattr(command, "_full_trace", absent)
    config = command.config_for(windows=2)
    assert config.traces == tuple(t for t in TRACES if t not in WHOLE_TRACE)
    assert config.scenario_count() == 2 * len(config.scenario_specs())


def _trace(span_s: float) -> tuple[Request, ...]:
    return tuple(Request(i, span_s * i / 100, 100, 10) for i in range(101))


def test_window_starts_spread_over_the_trace_and_wrap() -> None:
    # The trace's own start first, then every span / N, wrapped around the span.
    assert window_starts("azure-conv", _trace(3600.0), 600.0, 3) == (1800.0, 3000.0, 600.0)
    assert window_starts("made-up", _trace(1000.0), 100.0, 4) == (0.0, 250.0, 500.0, 750.0)
    with pytest.raises(ValueError, match="too short for 4 windows of 300 s"):
        window_starts("made-up", _trace(1000.0), 300.0, 4)
    with pytest.raises(ValueError, match="used whole"):
        window_starts(next(iter(WHOLE_TRACE)), _trace(1000.0), 10.0, 2)
    # Whole-second starts under a second apart were one start, one scenario key, twice.
    assert len(set(window_starts("made-up", _trace(100.0), 0.5, 100))) == 100
    with pytest.raises(ValueError, match="150 windows would start less than a second apart"):
        window_starts("made-up", _trace(100.0), 0.5, 150)


def _row(
    key: str, holds: bool, extra: int, saved: float, after: float | None, capture: float | None
) -> dict[str, Any]:
    return {
        "controller": key,
        "holds_slo": holds,
        "extra_missed_requests": extra,
        "energy_saved_fraction": saved,
        "energy_saved_after_warmup_fraction": after,
        "oracle_capture": capture,
        "oracle_capture_after_warmup": None if capture is None else capture + 0.1,
    }


def test_window_summary_arithmetic_on_hand_made_rows() -> None:
    rows = [
        _row("max", True, 0, 0.0, 0.0, 0.0),
        _row("max", True, 0, 0.0, 0.0, 0.0),
        _row("max", True, 0, 0.0, 0.0, 0.0),
        _row("mpc-online", True, 1, 0.10, 0.20, 0.5),
        _row("mpc-online", False, 4, 0.30, None, None),
        _row("mpc-online", True, -1, 0.20, 0.30, 0.7),
    ]
    summary = {entry["controller"]: entry for entry in summarize_windows(rows)}
    assert list(summary) == ["max", "mpc-online"]  # controllers without rows are left out
    online = summary["mpc-online"]
    assert (online["windows"], online["holds_slo"]) == (3, 2)
    assert online["extra_missed_requests"] == 4
    assert online["mean_energy_saved_fraction"] == pytest.approx(0.20)
    assert online["mean_energy_saved_after_warmup_fraction"] == pytest.approx(0.25)
    assert online["median_oracle_capture"] == pytest.approx(0.6)
    assert online["median_oracle_capture_after_warmup"] == pytest.approx(0.7)
    assert summary["max"]["holds_slo"] == 3 and summary["max"]["extra_missed_requests"] == 0


def test_synthetic_profiles_run_on_the_scoreboard(tmp_path: Path) -> None:
    config = command.config_for(tiny=True, profiles=["synthetic", "h100-sxm-llama3-8b"])
    assert config.profiles[0] == "synthetic:compute-bound"
    assert len(config.profiles) == 10
    code, _, stderr = run_main(
        [
            "bench",
            "controllers",
            "--tiny",
            "--duration",
            "10",
            "--profiles",
            "synthetic:memory-bound",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, stderr
    payload = json.loads((tmp_path / "scoreboard.json").read_text())
    (scenario,) = payload["scenarios"]
    assert scenario["profile"] == "synthetic-memory-bound"
    assert {row["controller"] for row in payload["rows"]} == set(CONTROLLER_ORDER)
    assert next(r for r in payload["rows"] if r["controller"] == "max")["holds_slo"]


def test_windows_whose_source_stretches_overlap_are_named() -> None:
    # At cap70 a window's source is --duration x 0.7 x the capacity scale: on the bundled
    # slice and an H100 the 120 s windows from 0 s and 200 s read 279 s and 181 s of the
    # trace, so they shared requests, and the board called each held out from the other.
    trace = "azure-conv-10min"
    full = _full_trace(trace)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    starts = window_starts(trace, full[0], 120.0, 3)
    infos = []
    for start in starts:
        info = build_scenario(trace, plant, "cap70", 120.0, full, start_s=start).describe()
        infos.append({**info, "window_start_s": start})
    spans = {
        info["window_start_s"]: (
            info["source_start_s"],
            info["source_start_s"] + info["source_duration_s"],
        )
        for info in infos
    }
    overlaps = window_overlaps(infos)
    assert overlaps, spans  # the light slice's sources are longer than 120 s
    named = set()
    for entry in overlaps:
        first, second = entry["window_starts_s"]
        (a_start, a_end), (b_start, b_end) = spans[first], spans[second]
        assert entry["overlap_s"] == pytest.approx(min(a_end, b_end) - max(a_start, b_start))
        assert entry["overlap_s"] >= 1.0
        assert (entry["trace"], entry["profile"], entry["load"]) == (
            trace,
            "h100-sxm-llama3-8b",
            "cap70",
        )
        named.add((first, second))
    for index, first in enumerate(starts):
        for second in starts[index + 1 :]:
            (a_start, a_end), (b_start, b_end) = spans[first], spans[second]
            shared = min(a_end, b_end) - max(a_start, b_start)
            assert ((first, second) in named) == (shared >= 1.0)
    payload = {
        "config": {"windows": 3},
        "window_starts_s": {trace: list(starts)},
        "window_summary": [_summary_entry()],
        "window_overlaps": overlaps,
    }
    markdown = "\n".join(window_markdown(payload))
    first, second = overlaps[0]["window_starts_s"]
    assert f"the windows @{first:g} and @{second:g} share" in markdown
    assert markdown.index("Not held out") < markdown.index("| controller |")


def _summary_entry() -> dict[str, Any]:
    """One controller's window summary, as summarize_windows writes it."""
    return {
        "controller": "max",
        "label": "max",
        "windows": 3,
        "holds_slo": 3,
        "extra_missed_requests": 0,
        "mean_energy_saved_fraction": 0.0,
        "mean_energy_saved_after_warmup_fraction": 0.0,
        "median_oracle_capture": None,
        "median_oracle_capture_after_warmup": None,
    }
