"""``gpugov simulate`` and ``gpugov profiles``: offline runs of a controller on the plant."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpugov.daemon.cli_support import (
    CONTROLLER_HELP,
    DEFAULT_PROFILE,
    UsageError,
    build_controller,
    format_summary,
    load_trace_for_cli,
    require_positive,
)
from gpugov.plant import ServingPlant, ServingResult, load_profile, simulate
from gpugov.plant.profile import list_bundled_profiles
from gpugov.plant.scheduler import SCHEDULERS
from gpugov.plant.workload import (
    DEFAULT_TRACE,
    workload_checksum,
)


def write_plot(result: ServingResult, path: Path, title: str = "") -> None:
    """PNG of clock, power, queue and temperature over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 9), sharex=True)
    t = result.time_s
    axes[0].plot(t, result.requested_clock_mhz, label="requested", lw=0.8)
    axes[0].plot(t, result.realized_clock_mhz, label="realised", lw=0.8, alpha=0.8)
    axes[0].set_ylabel("SM clock (MHz)")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].plot(t, result.power_w, lw=0.6, color="tab:red")
    limit = result.metadata.get("plant", {}).get("power_limit_w")
    if limit:
        axes[1].axhline(limit, ls="--", color="k", lw=0.8, label="power limit")
        axes[1].legend(loc="upper right", fontsize=8)
    axes[1].set_ylabel("power (W)")
    axes[2].plot(t, result.prefill_queue, label="waiting for first token", lw=0.8)
    axes[2].plot(t, result.decode_active, label="decoding", lw=0.8)
    axes[2].set_ylabel("requests")
    axes[2].legend(loc="upper right", fontsize=8)
    axes[3].plot(t, result.temperature_c, color="tab:orange", lw=0.8)
    axes[3].set_ylabel("temperature (C)")
    axes[3].set_xlabel("time (s)")
    fig.suptitle(title or result.controller_name)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_simulate(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov simulate``."""
    require_positive("--control-period", args.control_period)
    require_positive("--duration", args.duration)
    require_positive("--load-scale", args.load_scale)
    if args.start < 0:
        raise UsageError(f"--start must be >= 0, got {args.start!r}")
    workload, report = load_trace_for_cli(
        args.trace,
        format=args.trace_format,
        start_s=args.start,
        duration_s=args.duration,
        load_scale=args.load_scale,
    )
    if not workload:
        raise UsageError(f"--trace {args.trace}: the selected window holds no requests")
    profile = load_profile(args.profile)
    plant = ServingPlant.from_profile(profile, latency_noise_cv=args.latency_noise)
    controller = build_controller(args.controller, plant, workload, args.control_period)
    scheduler = SCHEDULERS[args.scheduler]
    result = simulate(
        workload,
        plant,
        scheduler,
        controller,
        seed=args.seed,
        controller_name=args.controller,
        control_period_s=args.control_period,
    )
    metrics = result.metrics.as_dict()
    title = (
        f"gpugov simulate: {args.controller} on {profile.name} ({profile.profile_status}), "
        f"trace {Path(report.path).name} [{len(workload)} requests]"
    )
    print(format_summary(metrics, title))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        series = result.as_dict(stride=args.stride)
        series.pop("metrics")
        payload = {
            "metrics": metrics,
            "metadata": {
                **result.metadata,
                "controller": args.controller,
                "control_period_s": args.control_period,
                "trace": {
                    "path": report.path,
                    "format": report.format,
                    "rows": report.rows,
                    "skipped_zero_token_rows": report.skipped_zero_token_rows,
                    "sha256": report.sha256,
                    "start_s": args.start,
                    "duration_s": args.duration,
                    "load_scale": args.load_scale,
                    "requests": len(workload),
                    "workload_checksum": workload_checksum(workload),
                },
                "series_stride": args.stride,
            },
            "series": series,
        }
        out.write_text(json.dumps(payload, indent=1, allow_nan=False))
        print(f"wrote {out}")
    if args.plot:
        write_plot(result, Path(args.plot), title)
        print(f"wrote {args.plot}")
    return 0


def run_profiles(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov profiles``."""
    rows = list_bundled_profiles()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{'name':<30} {'status':<19} {'TP':>2} {'clocks (MHz)':<12} {'SLO TTFT/TPOT':<22} "
        f"{'worst cal.':>10}  gpu / model"
    )
    for row in rows:
        clock_range = row.get("clock_range_mhz") or ["?", "?"]
        worst = row.get("worst_calibration_error")
        worst_text = "none" if worst is None else f"{worst:.3f}"
        slo = f"{row.get('ttft_slo_s')}s+{row.get('ttft_slo_per_prompt_token_s', 0) * 1e6:g}us/tok"
        slo += f"/{row.get('tpot_slo_s')}s"
        print(
            f"{row['name']:<30} {row['status']:<19} {row.get('tensor_parallel', 1):>2} "
            f"{clock_range[0]}-{clock_range[1]:<7} {slo:<22} {worst_text:>10}  "
            f"{row['gpu']} / {row['model']}"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``simulate`` and ``profiles`` to the ``gpugov`` parser."""
    sim = subparsers.add_parser(
        "simulate",
        help="run a controller on the simulated plant and print its metrics",
        description="Replay a trace through the iteration-level plant under one controller.",
    )
    sim.add_argument("--trace", default=DEFAULT_TRACE,
                     help=f"bundled or shared trace name, or a path (default {DEFAULT_TRACE})")
    sim.add_argument("--trace-format", default="auto",
                     choices=["auto", "azure", "burstgpt", "mooncake", "csv"])
    sim.add_argument("--profile", default=DEFAULT_PROFILE,
                     help=f"bundled profile name or manifest path (default {DEFAULT_PROFILE})")
    sim.add_argument("--controller", default="max", help=CONTROLLER_HELP)
    sim.add_argument("--scheduler", default="chunked", choices=sorted(SCHEDULERS))
    sim.add_argument("--control-period", type=float, default=1.0, metavar="S")
    sim.add_argument("--start", type=float, default=0.0, metavar="S",
                     help="window start, seconds after the trace's first arrival")
    sim.add_argument("--duration", type=float, default=None, metavar="S",
                     help="window length in seconds (default: the whole trace)")
    sim.add_argument("--load-scale", type=float, default=1.0, metavar="X",
                     help="X>1 compresses inter-arrival times (more load), X<1 dilates")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--latency-noise", type=float, default=0.0, metavar="CV",
                     help="coefficient of variation of iteration-time jitter (seeded)")
    sim.add_argument("--out", default=None, metavar="FILE.json")
    sim.add_argument("--stride", type=int, default=10,
                     help="keep every N-th series sample in the JSON (default 10)")
    sim.add_argument("--plot", default=None, metavar="FILE.png")
    sim.set_defaults(handler=run_simulate)

    prof = subparsers.add_parser("profiles", help="list the bundled GPU profiles")
    prof.add_argument("--json", action="store_true")
    prof.set_defaults(handler=run_profiles)


