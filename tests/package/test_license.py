"""The licence files: pyproject's ``license-files`` exist, LICENSE is Apache-2.0's text,
NOTICE names every bundled data file, and the installed metadata lists both files."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_files_exist_and_match_the_declared_licence() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE", "NOTICE"]
    for name in project["license-files"]:
        assert (ROOT / name).is_file(), name
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_notice_names_each_bundled_data_file_and_its_licence() -> None:
    notice = (ROOT / "NOTICE").read_text()
    bundled = [ROOT / "plant" / "data" / "azure_conv_10min.csv"]
    bundled += sorted((ROOT / "profiles" / "calibration").glob("vidur_*.csv"))
    assert "plant/data/azure_conv_10min.csv" in notice
    assert "profiles/calibration/vidur_*.csv" in notice
    assert all(path.is_file() for path in bundled)
    for licence in ("CC BY 4.0", "MIT", "Apache License"):
        assert licence in notice


def test_installed_metadata_lists_the_license_files() -> None:
    # The editable install's metadata (rebuilt by `make` whenever pyproject.toml changes).
    files = importlib.metadata.metadata("gpugov").get_all("License-File") or []
    assert {"LICENSE", "NOTICE"} <= {Path(name).name for name in files}
