"""A study closes every controller it builds once its run ends, as a node closes its
controllers at exit (``controllers.contract.Closable``): an outside controller that
releases or flushes what it holds in ``close()`` was closed by ``gpugov run`` and never by
``simulate``, ``replay``, a sweep (its cells and its check of the grid) or a fleet (its
nodes and its check of the controller), whose every run left it open."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import close_controller
from gpugov.daemon.replay import replay

CLOSABLE = """
import os
import uuid

LOG = {log!r}


def _note(what, name):
    with open(os.path.join(LOG, what), "a") as file:
        file.write(name + "\\n")


class Governor:
    def __init__(self, clocks):
        self.clocks = clocks
        self.id = uuid.uuid4().hex
        _note("made", self.id)

    def __call__(self, observation):
        return self.clocks[-1]

    def close(self):
        _note("closed", self.id)


def make(context):
    return Governor(context.supported_clocks_mhz)
"""

FAILING = """
def make(context):
    top = context.supported_clocks_mhz[-1]

    class Governor:
        def __call__(self, observation):
            return top

        def close(self):
            raise SystemExit(3)

    return Governor()
"""


class Log:
    """What the outside controllers noted, in whatever process they ran (a study may build
    one in a child process): each one made, each one closed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _read(self, what: str) -> list[str]:
        path = self.folder / what
        return path.read_text().split() if path.exists() else []

    @property
    def made(self) -> list[str]:
        return self._read("made")

    @property
    def closed(self) -> list[str]:
        return self._read("closed")


@pytest.fixture
def closable(module_on_path: Callable[[str, str], str], tmp_path: Path) -> Log:
    """An outside controller ``closable_gov:make`` that notes each instance made and
    closed in files (a child process's too)."""
    folder = tmp_path / "log"
    folder.mkdir()
    module_on_path("closable_gov", CLOSABLE.format(log=str(folder)))
    return Log(folder)


def _all_closed(log: Log) -> None:
    assert log.made, "no controller was built"
    assert sorted(log.closed) == sorted(log.made)


def test_simulate_and_replay_close_their_controllers(closable: Log, tmp_path: Path) -> None:
    spec = "closable_gov:make"
    run = ["--duration", "20", "--quiet", "--controller", spec]
    record = tmp_path / "run.jsonl"
    assert main(["simulate", *run]) == 0
    _all_closed(closable)
    assert (
        main(
            [
                "run",
                "--simulate",
                "--virtual",
                "--metrics-address",
                "none",
                "--record",
                str(record),
                *run,
            ]
        )
        == 0
    )
    _all_closed(closable)
    report = replay(record, parse_controller_spec(spec))
    assert report.compared > 0
    _all_closed(closable)


def test_a_sweep_closes_its_cells_and_its_checks(closable: Log, tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["closable_gov:make"]\nseeds = [0, 1]\nduration_s = 10.0\n'
    )
    out = tmp_path / "out"
    assert main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]) == 0
    assert len(closable.made) == 3  # the grid's check, then its two cells
    _all_closed(closable)


def test_a_fleet_closes_its_nodes_and_its_check(closable: Log, tmp_path: Path) -> None:
    flags = ["--nodes", "2", "--no-step", "--duration", "10", "--drain", "5"]
    flags += ["--trace", "azure-conv-10min", "--trace-start", "0", "--budgets", "1.0"]
    flags += ["--allocators", "uniform", "--jobs", "1", "--quiet"]
    assert main(["fleet", *flags, "--controller", "closable_gov:make", "--out", str(tmp_path)]) == 0
    _all_closed(closable)


def test_a_fleet_whose_controller_fails_at_its_first_decision_closes_every_node(
    module_on_path: Callable[[str, str], str], tmp_path: Path
) -> None:
    """The nodes' first decision, at 0 s, ran before the run's ``try``: a controller
    failing there left every node's controller open."""
    folder = tmp_path / "log"
    folder.mkdir()
    source = CLOSABLE.format(log=str(folder)).replace(
        "        return self.clocks[-1]", '        raise RuntimeError("no decision")'
    )
    module_on_path("failing_first_gov", source)
    flags = ["--nodes", "2", "--no-step", "--duration", "10", "--drain", "5"]
    flags += ["--trace", "azure-conv-10min", "--trace-start", "0", "--budgets", "1.0"]
    flags += ["--allocators", "uniform", "--jobs", "1", "--quiet"]
    out = tmp_path / "out"
    assert main(["fleet", *flags, "--controller", "failing_first_gov:make", "--out", str(out)]) != 0
    _all_closed(Log(folder))


def test_a_close_that_fails_is_one_line_not_the_run(
    module_on_path: Callable[[str, str], str], caplog: pytest.LogCaptureFixture
) -> None:
    from gpugov.daemon.decide import ControllerContext, build_controller

    name = module_on_path("failing_close_gov", FAILING)
    chain = build_controller(
        parse_controller_spec(f"{name}:make"),
        ControllerContext(period_s=1.0, supported_clocks_mhz=(900.0, 1200.0), time_mode="virtual"),
    )
    with caplog.at_level("WARNING"):
        assert close_controller(chain, "controller 'x'") is False
    assert [r.getMessage() for r in caplog.records] == [
        "controller 'x': closing the controller failed: SystemExit(3)"
    ]
