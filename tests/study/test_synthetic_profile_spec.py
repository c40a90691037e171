"""``gpugov simulate --profile`` and ``gpugov sweep``'s grid take a generated profile as
``synthetic:SHAPE``, the spelling the scoreboard's ``--profiles`` takes, and refuse an
unknown shape with the scoreboard's line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.plant.synthetic_profiles import SHAPES
from gpugov.study.sweep import plan_sweep

UNKNOWN_SHAPE = (
    "unknown synthetic profile shape 'synthetic:nope'; shapes: "
    f"{', '.join(SHAPES)} (as synthetic:SHAPE, or synthetic for all)"
)


@pytest.mark.parametrize("spec", ["synthetic:tp4", "synthetic-tp4"])
def test_simulate_runs_a_generated_profile(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    argv = ["simulate", "--profile", spec, "--duration", "20", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    assert "max on synthetic-tp4 (synthetic)" in capsys.readouterr().out
    assert out.exists()


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ("synthetic:nope", f"--profile: {UNKNOWN_SHAPE}"),
        ("synthetic", "--profile synthetic: names every generated shape"),
        ("synthetic-nope", "--profile: unknown profile 'synthetic-nope'; bundled profiles: "),
    ],
)
def test_simulate_refuses_an_unknown_shape_in_one_line(
    spec: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    assert main(["simulate", "--profile", spec, "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"gpugov: error: {line}")
    if spec == "synthetic-nope":  # a name that is neither lists the generated shapes too
        assert err.endswith(f"; or a generated one: synthetic:SHAPE ({', '.join(SHAPES)})")
    assert not out.exists()


def _grid(folder: Path, profiles: str) -> Path:
    path = folder / "grid.toml"
    path.write_text(
        'traces = ["azure-conv-10min"]\n'
        f"profiles = {profiles}\n"
        "loads = [1.0]\n"
        'controllers = ["max"]\n'
        "seeds = [0]\n"
        "duration_s = 20.0\n"
    )
    return path


def test_a_sweep_grid_names_generated_profiles(tmp_path: Path) -> None:
    plan = plan_sweep(_grid(tmp_path, '["synthetic:tp4", "h100-sxm-llama3-8b"]'))
    assert [cell.profile for cell in plan.cells] == ["synthetic:tp4", "h100-sxm-llama3-8b"]
    generated = plan.shared["profile:synthetic:tp4"]
    assert generated.name == "synthetic-tp4" and generated.profile_status == "synthetic"
    # Its key holds the generated tables' sha256s, as a file's holds the file's.
    assert len(generated.manifest_sha256) == len(generated.profile_csv_sha256) == 64
    again = plan_sweep(_grid(tmp_path, '["synthetic:tp4", "h100-sxm-llama3-8b"]'))
    assert [c.key for c in again.cells] == [c.key for c in plan.cells]


def test_synthetic_in_a_grid_is_every_shape_once(tmp_path: Path) -> None:
    plan = plan_sweep(_grid(tmp_path, '["synthetic:tp2", "synthetic"]'))
    assert [cell.profile for cell in plan.cells] == [
        "synthetic:tp2",
        *(f"synthetic:{shape}" for shape in SHAPES if shape != "tp2"),
    ]


def test_a_sweep_runs_a_generated_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["sweep", "--grid", str(_grid(tmp_path, '["synthetic:narrow-clocks"]'))]
    assert main([*argv, "--out", str(out), "--jobs", "1"]) == 0
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["profile"] == "synthetic:narrow-clocks" and "error" not in row


def test_a_sweep_refuses_an_unknown_shape_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = _grid(tmp_path, '["synthetic:nope"]')
    out = tmp_path / "out"
    assert main(["sweep", "--grid", str(grid), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpugov: error: {grid}: key 'profiles': {UNKNOWN_SHAPE}"
    assert not out.exists()
