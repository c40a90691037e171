"""Phases of GPU load through PyTorch, for checks that watch a real GPU at its own clocks.

Each phase runs for ``--seconds`` (or its own, written ``phase:seconds``): ``idle`` sleeps
with the process's CUDA context open; ``matmul`` multiplies bf16 matrices
(compute-bound, like a prefill); ``copy`` copies a large buffer on the device
(memory-bound, like a decode step). Each prints one JSON line when it ends: its wall
span and its achieved TFLOP/s or GB/s (bytes read and written). No clock or power limit
is touched. PyTorch is not a gpugov dependency: this runs where it is installed.

    python bench/gpu_load.py --phases idle,matmul,idle,copy,idle --seconds 20
    python bench/gpu_load.py --phases idle:150,matmul:5,idle:60 --size 1024 --copy-gib 0.01
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Run the phases in order."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--phases", default="idle,matmul,idle,copy,idle")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--size", type=int, default=8192, help="matrix side (matmul)")
    parser.add_argument("--copy-gib", type=float, default=4.0, help="buffer size (copy)")
    args = parser.parse_args(argv)
    import torch

    device = torch.device("cuda")
    a = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
    count = int(args.copy_gib * 2**30 // 4)
    source = torch.empty(count, device=device, dtype=torch.float32)
    target = torch.empty_like(source)
    torch.cuda.synchronize()
    for item in args.phases.split(","):
        phase, _, length = item.partition(":")
        seconds = float(length) if length else args.seconds
        start = time.time()
        end = start + seconds
        work = 0
        if phase == "idle":
            time.sleep(seconds)
        elif phase == "matmul":
            while time.time() < end:
                for _ in range(20):
                    torch.matmul(a, b)
                torch.cuda.synchronize()
                work += 20
        elif phase == "copy":
            while time.time() < end:
                for _ in range(20):
                    target.copy_(source)
                torch.cuda.synchronize()
                work += 20
        else:
            print(f"gpu_load: unknown phase {phase!r}", file=sys.stderr)
            return 2
        span = time.time() - start
        row: dict[str, object] = {"phase": phase, "start": start, "end": start + span}
        if phase == "matmul":
            row["tflops"] = 2.0 * args.size**3 * work / span / 1e12
        elif phase == "copy":
            row["gb_per_s"] = 2.0 * count * 4 * work / span / 1e9
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
