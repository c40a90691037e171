"""An outside package's controller: ``--controller MODULE:FACTORY``, a
``gpugov.controllers`` entry point, or ``kind = "external"`` in the config, built by the
node's factory in the safety chain and scored on the plant like any kind."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_config import ExternalControllerConfig
from gpugov.daemon.controller_spec import ENTRY_POINT_GROUP, parse_controller_spec, spec_name
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.daemon.errors import ControllerError
from gpugov.plant import Request, simulate
from gpugov.plant.types import ServingObservation
from gpugov.study.scoreboard.controllers import study_controller

CLOCKS = (900.0, 1200.0, 1500.0, 1800.0)

PACKAGE = '''
"""A minimal outside governor (the example in docs/benchmark.md)."""

from gpugov.daemon.decide import ControllerContext
from gpugov.plant.types import ServingObservation

seen = []


def make(context: ControllerContext):
    seen.append(context)
    clocks = context.supported_clocks_mhz

    def decide(observation: ServingObservation) -> float:
        busy = observation.decode_active > 0 or observation.waiting_requests > 0
        return clocks[-1] if busy else clocks[0]

    return decide


def broken(context):
    raise RuntimeError("no GPU model for this node")


def not_a_controller(context):
    return 42


def fails_later(context):
    clocks = context.supported_clocks_mhz

    def decide(observation: ServingObservation) -> float:
        if observation.time_s > 5.0:
            raise ValueError("no model for this load")
        return clocks[-1]

    return decide
'''


@pytest.fixture
def outside(module_on_path: Callable[[str, str], str]) -> str:
    """An importable module ``outside_governor`` in a temporary directory."""
    return module_on_path("outside_governor", PACKAGE)


def observation(busy: bool) -> ServingObservation:
    return ServingObservation(
        time_s=0.0,
        step_index=0,
        arrived_requests=1,
        prefill_remaining_tokens=0.0,
        decode_active=4 if busy else 0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        supported_clocks_mhz=CLOCKS,
    )


def test_module_factory_spec_builds_the_outside_controller(outside: str) -> None:
    spec = parse_controller_spec(f"{outside}:make")
    assert spec == ExternalControllerConfig(kind="external", factory=f"{outside}:make")
    assert spec_name(spec) == f"{outside}:make"
    chain = build_controller(spec, ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS))
    assert chain(observation(busy=True)) == 1800.0
    assert chain(observation(busy=False)) in CLOCKS  # the dwell may hold it a while
    assert chain.name == f"{outside}:make"


def test_outside_controller_is_scored_on_the_plant_without_the_profile(outside: str) -> None:
    from synthetic import make_plant

    plant = make_plant()
    workload = tuple(Request(i, 0.5 * i, 400, 30) for i in range(10))
    chain = study_controller(
        parse_controller_spec(f"{outside}:make"), plant, workload, control_period_s=1.0
    )
    result = simulate(workload, plant, controller=chain)
    assert result.metrics.completed_requests == len(workload)
    context = sys.modules[outside].seen[-1]
    assert context.plant is None  # a node's view: no simulated profile to peek at
    assert context.supported_clocks_mhz == tuple(float(c) for c in plant.profile.clock_mhz)


def test_entry_point_name_resolves_to_its_factory(
    outside: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = EntryPoint(name="outside", value=f"{outside}:make", group=ENTRY_POINT_GROUP)

    def entry_points(*, group: str) -> list[EntryPoint]:
        return [entry] if group == ENTRY_POINT_GROUP else []

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    spec = parse_controller_spec("outside")
    assert spec == ExternalControllerConfig(
        kind="external", factory=f"{outside}:make", name="outside"
    )
    assert spec_name(spec) == "outside"
    with pytest.raises(ValueError, match="unknown controller 'elsewhere'"):
        parse_controller_spec("elsewhere")


def test_config_file_takes_an_external_kind(outside: str) -> None:
    config = parse_config(
        {
            "domains": [
                {
                    "name": "d0",
                    "gpus": [0],
                    "controller": {"kind": "external", "factory": f"{outside}:make"},
                }
            ]
        }
    )
    assert config.domains[0].controller.kind == "external"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_here:make", "cannot import 'no_such_module_here'"),
        ("outside_governor:missing", "has no missing"),
    ],
)
def test_a_bad_factory_is_one_line(outside: str, spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        parse_controller_spec(spec)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("factory", "message"), [("broken", "raised: no GPU model"), ("not_a_controller", "int")]
)
def test_a_failing_factory_is_a_controller_error(outside: str, factory: str, message: str) -> None:
    spec = ExternalControllerConfig(kind="external", factory=f"{outside}:{factory}")
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS)
    with pytest.raises(ControllerError, match=message):
        build_controller(spec, context)


def test_an_outside_controller_is_a_row_of_bench_controllers(
    outside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpugov bench controllers --controller MODULE:FACTORY`` scores it beside the
    board's rows, in the same safety chain and scenarios: in the summary, the
    head-to-head and the per-scenario table."""
    import json

    from gpugov.cli import main

    out = tmp_path / "board"
    spec = f"{outside}:make"
    code = main(
        ["bench", "controllers", "--tiny", "--jobs", "1", "--out", str(out), "--controller", spec]
    )
    assert code == 0, capsys.readouterr().err
    payload = json.loads((out / "scoreboard.json").read_text())
    (row,) = [r for r in payload["rows"] if r["controller"] == spec]
    assert row["label"] == spec and row["decisions"] > 0
    assert row["energy_saved_fraction"] is not None and row["oracle_capture"] is not None
    assert payload["summary"][-1]["controller"] == spec  # after the board's own rows
    assert [e for e in payload["head_to_head"] if e["controller"] == spec]
    markdown = (out / "scoreboard.md").read_text()
    assert f"| {spec} |" in markdown and f" | {spec} | LP / oracle |" in markdown


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--controller", "pid"], "--controller 'pid': pid is built in"),
        (["--controller", "voltana"], "--controller 'voltana': voltana is built in"),
        (["--controller", "nowhere_module:make"], "--controller: unknown controller"),
        (["--controller", "{m}:make", "--controller", "{m}:make"], "is there already"),
        (["--controller", "{m}:broken"], "raised: no GPU model for this node"),
        (["--controller", "{m}:not_a_controller"], "returned int, not a callable"),
        (
            ["--controller", "{m}:make", "--layout", "disaggregated"],
            "--controller: outside controllers are scored on the colocated board only",
        ),
    ],
)
def test_bench_controllers_refuses_a_bad_outside_row_before_any_work(
    outside: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    from gpugov.cli import main

    out = tmp_path / "board"
    argv = ["bench", "controllers", "--tiny", "--out", str(out)]
    code = main(argv + [part.format(m=outside) for part in extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("command", ["simulate", "bench"])
def test_a_controller_raising_mid_run_is_one_line_and_exit_1(
    outside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A controller that raises while a run decides (an outside one, most often) ends the
    command with one line naming it and the simulated time, exit 1 (a runtime failure),
    not a traceback; the scoreboard writes the board of its other rows first."""
    from gpugov.cli import main

    spec = f"{outside}:fails_later"
    argv = (
        ["simulate", "--controller", spec, "--duration", "20", "--quiet"]
        if command == "simulate"
        else [
            *("bench", "controllers", "--tiny", "--jobs", "1"),
            *("--out", str(tmp_path / "b"), "--controller", spec),
        ]
    )
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1, err
    (line,) = err.strip().splitlines()[-1:]
    prefix = "gpugov: error: " if command == "simulate" else f"gpugov: error: --controller {spec}"
    assert line.startswith(prefix)
    assert f"controller '{spec}' raised at t=" in line
    assert "no model for this load" in line and "Traceback" not in err
    if command == "bench":
        assert (tmp_path / "b" / "scoreboard.json").exists()


def test_a_module_in_the_working_directory_names_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--controller mygov:make`` beside mygov.py: the console script does not import from
    the working directory, and the line said only "No module named 'mygov'", with the
    file right there. It says where the module is and what to do."""
    (tmp_path / "mygov_here.py").write_text(PACKAGE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with pytest.raises(ValueError) as error:
        parse_controller_spec("mygov_here:make")
    message = str(error.value)
    assert "\n" not in message
    assert "mygov_here.py is in the working directory" in message
    assert "PYTHONPATH" in message
    with pytest.raises(ValueError) as elsewhere:
        parse_controller_spec("no_such_module_here:make")
    assert "PYTHONPATH" in str(elsewhere.value)  # importable: on PYTHONPATH, or installed
