"""profiles/README.md states what the bundled manifests hold: each profile's clocks and
SLOs in the first table, and the fit-quality and key-number rows exactly as
``bench/profile_tables.py`` prints them from the manifests (a manifest changed without its
README row is caught here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gpugov.plant.profile_files import list_bundled_profiles, load_profile

REPO = Path(__file__).resolve().parents[2]
README = REPO / "profiles" / "README.md"


def _table_rows() -> dict[str, list[str]]:
    """README table rows by their first cell (a profile name), every table's rows in turn
    under ``name#N`` for the N-th table that names it."""
    rows: dict[str, list[str]] = {}
    for line in README.read_text().splitlines():
        match = re.match(r"\| `([^`]+)` \|(.*)\|$", line)
        if match:
            name, cells = match.group(1), [c.strip() for c in match.group(2).split("|")]
            index = sum(1 for key in rows if key.split("#")[0] == name)
            rows[f"{name}#{index}"] = cells
    return rows


def test_first_table_states_each_profiles_clocks_and_slos() -> None:
    rows = _table_rows()
    wrong = []
    for entry in list_bundled_profiles():
        name = entry["name"]
        profile = load_profile(name)
        cells = rows.get(f"{name}#0")
        assert cells is not None, f"profiles/README.md has no row for {name}"
        clocks, slos = cells[2], cells[3]
        low, high = profile.minimum_clock_mhz, profile.maximum_clock_mhz
        if clocks != f"{low:.0f}-{high:.0f}":
            wrong.append(f"{name}: clocks {clocks!r}, the profile {low:.0f}-{high:.0f}")
        per_token_us = profile.ttft_slo_per_prompt_token_s * 1e6
        stated = (
            f"{profile.ttft_slo_s:g} s + {per_token_us:.0f} us/token / "
            f"{profile.tpot_slo_s * 1000:.0f} ms"
        )
        if slos != stated:
            wrong.append(f"{name}: SLO {slos!r}, the manifest {stated!r}")
    assert not wrong, wrong


def test_fit_quality_and_key_number_rows_are_the_manifests() -> None:
    printed = subprocess.run(
        [sys.executable, str(REPO / "bench" / "profile_tables.py"), str(REPO / "profiles")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    lines = README.read_text().replace("**", "").splitlines()  # a bold figure is the figure
    stale = [
        line
        for line in printed.splitlines()
        if line.startswith("| `") and not any(row.startswith(line) for row in lines)
    ]
    assert not stale, f"profiles/README.md rows that differ from the manifests: {stale}"
