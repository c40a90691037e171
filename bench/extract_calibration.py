"""Extract the small measured-data tables the profile generator calibrates against.

Reads a local mirror of microsoft/vidur (MIT licence) with ``git show`` and writes
``profiles/calibration/vidur_linear_ops.csv`` (per-layer time of the non-attention
operators, summed medians, ms) and ``profiles/calibration/vidur_all_reduce.csv``
(intra-node all-reduce medians, ms), both at ``--rev`` (default HEAD), and
``profiles/calibration/vidur_attention_decode.csv`` (decode attention kernel medians, ms, of
the only attention table whose content the public history keeps: A100, Llama-2-70B shape at
TP 2, commit :data:`ATTENTION_COMMIT`). Run:
``python bench/extract_calibration.py MIRROR --rev 7d47513363ec447a741ac5e47241580b47724fbf``.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

GPUS = {"a100": "a100", "h100": "h100"}
MODELS = {
    "meta-llama/Llama-2-7b-hf": "Llama-2-7B",
    "meta-llama/Meta-Llama-3-8B": "Llama-3-8B",
    "codellama/CodeLlama-34b-Instruct-hf": "CodeLlama-34B",
    "meta-llama/Llama-2-70b-hf": "Llama-2-70B",
    "meta-llama/Meta-Llama-3-70B": "Llama-3-70B",
}
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
TOKENS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SIZES = (2048, 1048576, 4194304, 16777216, 67108864)
ATTENTION_COMMIT = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"
ATTENTION_PATH = "data/profiling/a100/attention.csv"
ATTENTION_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
ATTENTION_CONTEXTS = (128, 256, 512, 1024, 1280, 2048, 3072, 4032)


def _show(mirror: Path, path: str, rev: str = "HEAD") -> list[dict[str, str]] | None:
    """Rows of a CSV at ``rev`` of the mirror, or None when the file is absent."""
    run = subprocess.run(
        ["git", "-C", str(mirror), "show", f"{rev}:{path}"], capture_output=True, text=True
    )
    if run.returncode != 0 or not run.stdout.strip():
        return None
    return list(csv.DictReader(io.StringIO(run.stdout)))


def main(argv: list[str] | None = None) -> int:
    """Write both extracts from the mirror named on the command line.

    Refuses (one line, exit 2, nothing written) a path that is not a git mirror of vidur.
    """
    parser = argparse.ArgumentParser(
        description="Extract Vidur's measured timings into profiles/calibration/."
    )
    parser.add_argument("mirror", type=Path, help="a git mirror of microsoft/vidur")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "profiles" / "calibration",
        help="folder for the CSV extracts (default: profiles/calibration)",
    )
    parser.add_argument(
        "--rev", default="HEAD", help="commit of the linear-operator and all-reduce tables"
    )
    args = parser.parse_args(argv)
    mirror, out, rev = args.mirror, args.out, args.rev
    head = subprocess.run(
        ["git", "-C", str(mirror), "rev-parse", rev], capture_output=True, text=True
    )
    commit = head.stdout.strip()
    if head.returncode != 0 or not commit:
        print(f"extract_calibration: error: {mirror}: not a git mirror", file=sys.stderr)
        return 2
    if _show(mirror, "data/profiling/network/a100_dgx/all_reduce.csv", rev) is None:
        print(f"extract_calibration: error: {mirror}: no Vidur profiling data", file=sys.stderr)
        return 2
    rows = []
    for gpu in GPUS:
        for repo_model, model in MODELS.items():
            data = _show(mirror, f"data/profiling/compute/{gpu}/{repo_model}/mlp.csv", rev)
            if data is None:
                continue
            for r in data:
                tokens, tp = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
                if tokens not in TOKENS:
                    continue
                layer_ms = sum(float(r[f"time_stats.{op}.median"]) for op in LAYER_OPS)
                rows.append(
                    (
                        gpu,
                        model,
                        tp,
                        tokens,
                        int(r["n_embd"]),
                        int(r["n_expanded_embd"]),
                        int(r["n_head"]),
                        int(r["n_kv_head"]),
                        f"{layer_ms:.4f}",
                    )
                )
    _write_extract(
        out / "vidur_linear_ops.csv",
        f"microsoft/vidur@{commit} data/profiling/compute/<gpu>/<model>/mlp.csv",
        (
            "gpu",
            "model",
            "tp",
            "num_tokens",
            "d_model",
            "d_ff",
            "n_heads",
            "n_kv_heads",
            "layer_ms",
        ),
        sorted(rows),
    )
    ar_rows = []
    for gpu in GPUS:
        data = _show(mirror, f"data/profiling/network/{gpu}_dgx/all_reduce.csv", rev) or []
        for r in data:
            size, workers = int(r["size"]), int(r["num_workers"])
            if size in SIZES and r["devices_per_node"] == r["num_workers"]:
                ar_rows.append((gpu, workers, size, r["time_stats.all_reduce.median"]))
    _write_extract(
        out / "vidur_all_reduce.csv",
        f"microsoft/vidur@{commit} data/profiling/network/<gpu>_dgx/all_reduce.csv",
        ("gpu", "workers", "size_bytes", "median_ms"),
        sorted(set(ar_rows)),
    )
    return _write_attention(mirror, out)


def _write_attention(mirror: Path, out: Path) -> int:
    """Write the decode-attention extract (batch x per-sequence context grid, ms)."""
    data = _show(mirror, ATTENTION_PATH, ATTENTION_COMMIT)
    if data is None:
        print(
            f"extract_calibration: error: {mirror}: no {ATTENTION_PATH} at {ATTENTION_COMMIT}",
            file=sys.stderr,
        )
        return 2
    rows = []
    for r in data:
        if r["is_prefill"] != "False":
            continue
        batch, context = int(r["batch_size"]), int(r["kv_cache_size"])
        if batch not in ATTENTION_BATCHES or context not in ATTENTION_CONTEXTS:
            continue
        heads, kv_heads = int(r["n_q_head"]), int(r["n_kv_head"])
        rows.append(
            (
                "a100",
                "Llama-2-70B",
                r["attention_backend"].split(".")[-1],
                int(r["num_tensor_parallel_workers"]),
                heads,
                kv_heads,
                int(r["n_embd"]) // heads,
                batch,
                context,
                f"{float(r['time_stats.attn_decode.median']):.4f}",
            )
        )
    _write_extract(
        out / "vidur_attention_decode.csv",
        f"microsoft/vidur@{ATTENTION_COMMIT} {ATTENTION_PATH}",
        (
            "gpu",
            "model",
            "backend",
            "tp",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "batch",
            "kv_tokens",
            "attn_ms",
        ),
        sorted(rows),
    )
    return 0


def _write_extract(
    path: Path, source: str, header: Sequence[str], rows: Sequence[Sequence[object]]
) -> None:
    """One extract: a ``# source`` provenance line, the header, the rows (LF endings)."""
    with path.open("w", newline="\n") as handle:
        handle.write(f"# {source}\n")
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
