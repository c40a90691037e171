"""A100 Llama-3-8B decode iteration: Vidur's measured kernel-time sum vs the plant's model.

Run: ``python bench/decode_check.py``. Prints, per batch at 1536 tokens of context, the sum
of Vidur's measured per-layer kernels (its execution time with CPU overheads skipped), the
plant's iteration time from the bundled profile's decode latency model and their ratio.
"""

from __future__ import annotations

import argparse
import sys

from gpugov.plant.decode_check import decode_check


def main(argv: list[str]) -> int:
    """Print the comparison table."""
    argparse.ArgumentParser(prog="bench/decode_check.py", description=__doc__).parse_args(argv)
    print("batch  vidur_kernels_ms  plant_iteration_ms  ratio")
    for batch, vidur, plant in decode_check():
        print(f"{batch:5d}  {vidur * 1e3:16.2f}  {plant * 1e3:18.2f}  {plant / vidur:5.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
