"""The node's install is lean: plotting and scikit-learn are extras, and every command that
needs one says in one line how to install it (the import failure is simulated here)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from gpugov.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("[")[0].strip().lower() for r in requirements}


def test_node_install_has_no_plotting_or_sklearn() -> None:
    project = _project()
    core = _names(project["dependencies"])
    assert "matplotlib" not in core and "scikit-learn" not in core
    assert {"numpy", "pydantic", "prometheus-client", "nvidia-ml-py", "numba"} <= core
    extras = project["optional-dependencies"]
    assert _names(extras["plots"]) == {"matplotlib"}
    assert _names(extras["study"]) == {"scikit-learn"}
    # `make test` and `pip install -e '.[test]'` get everything the tests use.
    assert "gpugov[plots,study]" in extras["test"]


def test_every_third_party_import_is_a_declared_dependency() -> None:
    """A module imported by the source must come from a dependency of the node's install or
    of an extra, not only through another package's requirements: threadpoolctl came with
    scikit-learn, and every study command's worker pool failed on the node's install."""
    project = _project()
    declared = _names(project["dependencies"]).union(
        *(_names(group) for group in project["optional-dependencies"].values())
    )
    distributions = packages_distributions()
    undeclared: dict[str, str] = {}
    for layer in ("gpugov", "plant", "controllers", "daemon", "profiles", "study"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top == "gpugov":
                        continue
                    names = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
                    if not names & declared:
                        undeclared.setdefault(top, str(path.relative_to(ROOT)))
    assert undeclared == {}


def _one_line_error(capsys: pytest.CaptureFixture[str], extra: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("gpugov: error: ")
    assert f"pip install 'gpugov[{extra}]'" in lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


def test_simulate_plot_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    plot, out = tmp_path / "p.png", tmp_path / "r.json"
    code = main(["simulate", "--duration", "30", "--plot", str(plot), "--out", str(out)])
    assert code == 2
    assert "simulate --plot" in _one_line_error(capsys, "plots")
    assert not plot.exists() and not out.exists()  # it failed before doing any work


def test_simulate_without_plot_needs_no_matplotlib(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["simulate", "--duration", "30"]) == 0
    assert "energy" in capsys.readouterr().out


def test_experiments_without_sklearn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    assert main(["experiments", "--quick", "--out", str(tmp_path / "x")]) == 2
    assert "experiments" in _one_line_error(capsys, "study")
    assert not (tmp_path / "x").exists()


def test_experiments_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["experiments", "--quick", "--out", str(tmp_path / "x")]) == 2
    _one_line_error(capsys, "plots")


def test_experiments_without_either_names_both_extras_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["experiments", "--quick", "--out", str(tmp_path / "x")]) == 2
    line = _one_line_error(capsys, "study,plots")
    assert "sklearn and matplotlib, which are not installed" in line


def test_scoreboard_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["bench", "controllers", "--tiny", "--out", str(tmp_path / "b")]) == 2
    assert "bench controllers" in _one_line_error(capsys, "plots")


def test_readme_and_packaging_doc_name_every_node_dependency() -> None:
    """README.md and docs/packaging.md list what the node's install carries: each of
    pyproject's dependencies is named there, so a reader auditing a node sees them all."""
    spelled = {"scipy": "SciPy"}
    for page in ("README.md", "docs/packaging.md"):
        text = " ".join((ROOT / page).read_text().split())
        missing = [
            name
            for name in sorted(_names(_project()["dependencies"]))
            if spelled.get(name, name) not in text
        ]
        assert missing == [], f"{page} does not name {missing}"
