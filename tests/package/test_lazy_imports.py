"""Node commands stay lean: their import path loads no scikit-learn, matplotlib or study code.

Each check runs in a fresh interpreter and imports exactly what ``gpugov.cli.main`` imports
for the command (its parser, hence its handler's module), then reads ``sys.modules``.
Timing is not tested here (``bench/cli_speed.py`` measures it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpugov.cli import COMMANDS

NODE_COMMANDS = [
    name for name in ("run", "status", "reset-clocks", "check-config", "model") if name in COMMANDS
]
FORBIDDEN_ON_NODE = (
    "sklearn",
    "matplotlib",
    "gpugov.controllers.scheduling",
    "gpugov.study",
)

PROBE = """
import json, sys
import gpugov.cli as cli
parser = cli.build_parser({command!r})
if {command!r}:
    action = next(a for a in parser._actions if getattr(a, "choices", None))
    handler = action.choices[{command!r}].get_default("handler")
    assert handler is not None, "no handler registered for {command}"
    assert handler.__module__ in sys.modules
print(json.dumps(sorted(sys.modules)))
"""


def loaded_modules(command: str) -> list[str]:
    """``sys.modules`` after a fresh interpreter built ``command``'s parser."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(command=command)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def offending(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    """Modules equal to, or inside, one of ``forbidden`` (``gpugov.controllers.scheduling``
    also catches ``scheduling_policy``)."""
    return [
        m for m in modules if any(m == f or m.startswith((f + ".", f + "_")) for f in forbidden)
    ]


@pytest.mark.parametrize("command", NODE_COMMANDS)
def test_node_command_imports_no_study_code(command: str) -> None:
    modules = loaded_modules(command)
    assert "gpugov.daemon.node_cli" in modules or any(
        m.startswith("gpugov.daemon") for m in modules
    ), "the probe did not load the command's module"
    assert offending(modules, FORBIDDEN_ON_NODE) == []


def test_simulate_imports_no_solver_or_plotting_until_needed() -> None:
    """``gpugov simulate`` with the default controller needs neither SciPy's optimisers
    nor matplotlib nor scikit-learn; they load only for mpc-slsqp, --plot, experiments."""
    modules = loaded_modules("simulate")
    assert offending(modules, ("sklearn", "matplotlib", "scipy", "numba")) == []


def test_help_imports_no_command_module() -> None:
    modules = loaded_modules("")
    assert [m for m in modules if m.startswith(("gpugov.daemon", "gpugov.study"))] == []


def test_offending_matches_prefixes_only() -> None:
    mods = ["gpugov.studyx", "gpugov.study", "sklearn.tree", "gpugov.controllers.scheduling_policy"]
    assert offending(mods, FORBIDDEN_ON_NODE) == [
        "gpugov.study",
        "sklearn.tree",
        "gpugov.controllers.scheduling_policy",
    ]
