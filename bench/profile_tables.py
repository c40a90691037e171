"""Print profiles/README.md's fit-quality and key-number table rows from the manifests.

Run: ``python bench/profile_tables.py profiles`` after regenerating the profiles.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Print both tables' rows for the manifests in the folder named (exit 2 if none)."""
    parser = argparse.ArgumentParser(prog="bench/profile_tables.py", description=__doc__)
    parser.add_argument("folder", nargs="?", type=Path, default=Path("profiles"))
    root = parser.parse_args(argv).folder
    manifests = [json.loads(p.read_text()) for p in sorted(root.glob("*.json"))]
    if not manifests:
        print(f"profile_tables: error: {root}: no manifests", file=sys.stderr)
        return 2
    for m in manifests:
        worst = m["calibration_summary"]["worst_relative_error"]
        shown = "none" if worst is None else f"{worst:.3f}"
        print(f"| `{m['name']}` | {len(m['calibration'])} | {shown} |")
    print()
    for m in manifests:
        with (root / m["csv"]).open() as handle:
            rows = list(csv.DictReader(handle))
        s = m["summary"]

        def col(name: str, i: int, rows: list[dict[str, str]] = rows) -> float:
            return float(rows[i][name])

        print(
            f"| `{m['name']}` | {col('decode_tokens_per_s', -1):.0f} / "
            f"{col('decode_tokens_per_s', 0):.0f} | {col('prefill_tokens_per_s', -1):.0f} | "
            f"{col('prefill_power_w', -1):.0f} | {col('decode_power_w', -1):.0f} / "
            f"{col('decode_power_w', 0):.0f} | {col('idle_power_w', -1):.0f} | "
            f"{s['decode_energy_per_token_j_at_max_clock']:.3f} | "
            f"{s['min_decode_energy_clock_mhz']} "
            f"({s['decode_energy_saving_at_best_clock_vs_max']:.0%}, "
            f"{s['decode_rate_loss_at_best_clock_vs_max']:.1%}) | "
            f"{m['engine']['kv_capacity_tokens']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
