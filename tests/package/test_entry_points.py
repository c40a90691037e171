"""Entry points: ``python -m gpugov`` is the console script, and the version has one source
(``gpugov/__init__.py``, read by pyproject's dynamic version and by ``--version``)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from gpugov import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_python_dash_m_prints_the_version(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpugov", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"gpugov {__version__}"


def test_version_is_single_sourced() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpugov.__version__"}
    assert pyproject["project"]["scripts"] == {"gpugov": "gpugov.cli:main"}
    assert (
        sum(
            "__version__ =" in line
            for line in (ROOT / "gpugov" / "__init__.py").read_text().splitlines()
        )
        == 1
    )
