"""``gpugov emulate``: serve an emulated node (OpenAI API, vLLM /metrics, NVML-like GPUs)."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

from gpugov.daemon import cli_types
from gpugov.daemon.limits import MAX_EMULATED_GPUS, MAX_SECONDS
from gpugov.daemon.stop_signals import StopEvent, set_from_handler

if TYPE_CHECKING:
    from gpugov.study.emulate.node import EmulatedNode


def cmd_emulate(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; print the URL once listening."""
    from gpugov.daemon.addresses import parse_address
    from gpugov.daemon.cli_support import UsageError, load_profile_for_cli, require_positive
    from gpugov.plant import ServingPlant
    from gpugov.plant.input_files import plain_float
    from gpugov.study.emulate.disaggregated import DisaggregatedNode
    from gpugov.study.emulate.node import (
        MAX_MODEL_ID_CHARS,
        EmulatedNode,
        served_model_name,
        tp_multiple_message,
    )
    from gpugov.study.emulate.server import EmulatorServer

    try:
        host, port = parse_address(args.address)
    except ValueError as error:
        raise UsageError(f"--address {error}") from error
    if not cli_types.is_loopback(host):
        raise UsageError(f"--address {args.address}: the emulator serves on loopback only")
    layout = args.layout
    if layout is None and args.interconnect is not None:
        raise UsageError("--interconnect needs a disaggregated --layout (such as 1P1D)")
    plant = ServingPlant.from_profile(load_profile_for_cli("--profile", args.profile))
    tp = plant.tensor_parallel
    if layout is None:
        gpus = args.gpus  # None: one engine replica's GPUs (the profile's tensor_parallel)
        if gpus is None and tp > MAX_EMULATED_GPUS:
            # --gpus takes at most 64, but its default, one replica of a TP 128 profile,
            # started 128 GPUs (a profile may state up to 1024).
            raise UsageError(
                f"--profile {args.profile}: tensor parallel {tp}, one engine replica of "
                f"{tp} GPUs, more than the {MAX_EMULATED_GPUS} GPUs an emulated node has "
                "at most"
            )
    else:
        # MPND counts engine replicas, each the profile's tensor_parallel GPUs.
        gpus = (layout[0] + layout[1]) * tp
        shape = f"{gpus} GPUs" if tp == 1 else f"{gpus} GPUs, {tp} per engine replica"
        if gpus > MAX_EMULATED_GPUS:
            raise UsageError(
                f"--layout {layout[0]}P{layout[1]}D: {shape}, more than the "
                f"{MAX_EMULATED_GPUS} GPUs an emulated node has at most"
            )
        if args.gpus is not None and args.gpus != gpus:
            raise UsageError(
                f"--gpus {args.gpus} disagrees with --layout {layout[0]}P{layout[1]}D "
                f"({shape}); leave --gpus out"
            )
    if gpus is not None and gpus < 1:
        raise UsageError(f"--gpus must be >= 1, got {gpus}")
    require_positive("--speed", args.speed)
    name = args.served_model_name
    if name is None:  # the profile's model, as the simulated engine labels it
        name = args.served_model_name = served_model_name(plant.profile)
    if not name.isprintable() or len(name) > MAX_MODEL_ID_CHARS:
        raise UsageError(
            f"--served-model-name {name[:80]!r}: a model id is printable text of at most "
            f"{MAX_MODEL_ID_CHARS} characters"
        )
    fault, lost_after = "none", None
    if args.fault.startswith("lost-after:"):
        try:
            lost_after = plain_float(args.fault.split(":", 1)[1])
        except ValueError as error:
            raise UsageError(f"--fault {args.fault}: expected lost-after:SECONDS") from error
        if not (math.isfinite(lost_after) and 0.0 <= lost_after <= MAX_SECONDS):
            raise UsageError(f"--fault {args.fault}: SECONDS must lie in [0, {MAX_SECONDS:g}]")
    elif args.fault in ("none", "no-permission", "not-supported", "lost"):
        fault = args.fault
    else:
        raise UsageError(
            f"--fault {args.fault}: expected none, no-permission, not-supported, lost "
            "or lost-after:SECONDS"
        )
    node: EmulatedNode
    if layout is None:
        if gpus is None:
            gpus = tp
        elif gpus % tp:
            raise UsageError(tp_multiple_message(gpus, tp, plant.profile.name))
        node = EmulatedNode(
            plant,
            gpus=gpus,
            seed=args.seed,
            speed=args.speed,
            fault=fault,
            lost_after_s=lost_after,
        )
    else:
        node = DisaggregatedNode(
            plant,
            prefill_replicas=layout[0],
            decode_replicas=layout[1],
            interconnect=args.interconnect or "nvlink",
            seed=args.seed,
            speed=args.speed,
            fault=fault,
            lost_after_s=lost_after,
        )
    try:
        server = EmulatorServer(node, host, port, model=args.served_model_name)
    except OSError as error:
        raise UsageError(
            f"--address {args.address}: cannot listen: {error.strerror or error}"
        ) from error
    stop = StopEvent()
    interrupted = StopEvent()

    def handler(signum: int, frame: FrameType | None) -> None:
        set_from_handler(*((interrupted, stop) if signum == signal.SIGINT else (stop,)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    server.start()
    if isinstance(node, DisaggregatedNode):
        groups = "" if tp == 1 else f", {tp} tensor-parallel GPUs per engine replica"
        print(
            f"gpugov emulate: layout {node.layout_name}, {node.gpu_count} emulated GPU(s) "
            f"{node.gpu_name!r} of profile {plant.profile.name} (prefill "
            f"{_span(node.prefill_gpus)}, decode {_span(node.decode_gpus)}{groups}, "
            f"{node.layout.interconnect}), model {args.served_model_name!r}, serving on "
            f"{server.url} (OpenAI API under /v1, /prefill/metrics, /decode/metrics, "
            f"each replica's page {node.replica_pages()}, GPUs under /gpu)",
            flush=True,
        )
    else:
        print(
            f"gpugov emulate: {node.gpu_count} emulated GPU(s) {node.gpu_name!r} of profile "
            f"{plant.profile.name} ({_replicas(node)}), model {args.served_model_name!r}, "
            f"serving on {server.url} (OpenAI API under /v1, /metrics, each replica's page "
            f"{node.replica_pages()}, GPUs under /gpu)",
            flush=True,
        )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.close()
    if interrupted.is_set():  # Ctrl-C: the one exit code and line of every command
        print("gpugov: interrupted", file=sys.stderr, flush=True)
        return 130
    print("gpugov emulate: stopped", file=sys.stderr, flush=True)
    return 0


def _replicas(node: EmulatedNode) -> str:
    """How the GPUs make engine replicas: ``2 data-parallel engine replicas, one GPU
    each`` or ``2 engine replicas of 4 tensor-parallel GPUs each: GPUs 0-3, 4-7``."""
    count = node.replicas
    noun = "replica" if count == 1 else "replicas"
    tp = node.tensor_parallel
    if tp == 1:
        return f"{count} data-parallel engine {noun}, one GPU each"
    spans = [f"{group[0]}-{group[-1]}" for group in map(node.group_gpus, range(count))]
    if len(spans) > 4:
        spans = [*spans[:2], "...", spans[-1]]
    return f"{count} engine {noun} of {tp} tensor-parallel GPUs each: GPUs {', '.join(spans)}"


def _span(gpus: tuple[int, ...]) -> str:
    """``GPU 0`` or ``GPUs 0-1``."""
    return f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus[0]}-{gpus[-1]}"


def _layout(text: str) -> tuple[int, int] | None:
    """``--layout``'s converter: None (colocated) or (prefill GPUs, decode GPUs)."""
    from gpugov.study.emulate.disaggregated import parse_layout

    try:
        return parse_layout(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _interconnect(text: str) -> str:
    """``--interconnect``'s converter: one of the plant's interconnects."""
    from gpugov.plant.disaggregated_layout import INTERCONNECTS

    if text not in INTERCONNECTS:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(sorted(INTERCONNECTS))}, got {text[:40]!r}"
        )
    return text


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``emulate`` to the ``gpugov`` parser."""
    parser = subparsers.add_parser(
        "emulate",
        help="serve an emulated node: OpenAI API, vLLM /metrics and GPUs, no GPU needed",
        description="Serve, in real time on loopback, a node backed by the simulated plant: "
        "the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models), "
        "vLLM V1's /metrics (every engine replica's; each replica's own page at "
        "/replica/R/metrics, as each engine process of a real node serves its own), and "
        "emulated GPUs (under /gpu, which lists each replica's GPUs and page) that "
        "`gpugov run` drives with "
        'backend = "emulated" and `gpugov profile --backend emulated` measures. Each '
        "completion's usage carries its true energy (energy_j, prefill_energy_j, "
        "decode_energy_j) and GET /gpugov/energy serves every finished request's.",
    )
    parser.add_argument(
        "--profile",
        required=True,
        metavar="NAME|PATH",
        help="the plant's profile: a bundled name (gpugov profiles) or a manifest/CSV path",
    )
    parser.add_argument(
        "--address",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="loopback address to serve on (port 0 picks a free one; default 127.0.0.1:8000)",
    )
    parser.add_argument(
        "--gpus",
        type=cli_types.count(1, MAX_EMULATED_GPUS),
        default=None,
        metavar="N",
        help="emulated GPUs on the node. A profile of one GPU: N data-parallel engine "
        "replicas of one GPU each. A tensor-parallel profile (tensor_parallel T > 1, its "
        "rates and powers the T GPUs'): N/T replicas of T GPUs each, each GPU drawing 1/T "
        "of its replica's power, N a multiple of T. Each replica has its own page, "
        "/replica/R/metrics (/metrics has them all). Default: one replica (1 GPU, or T); "
        "with --layout, the layout's count",
    )
    parser.add_argument(
        "--layout",
        type=_layout,
        default=None,
        metavar="colocated|MPND",
        help="colocated (default: every GPU serves both phases) or disaggregated, M "
        "prefill and N decode engine replicas (1P1D, 2P2D) of the profile's "
        "tensor_parallel T GPUs each: GPUs 0..M*T-1 prefill, the next N*T decode (with "
        "T = 1, M and N GPUs), each pool's vLLM page at /prefill/metrics and "
        "/decode/metrics",
    )
    parser.add_argument(
        "--interconnect",
        type=_interconnect,
        default=None,
        metavar="LINK",
        help="the KV transfer's link in a disaggregated layout: nvlink (default), "
        "infiniband or roce, at the plant's stated bandwidths",
    )
    parser.add_argument(
        "--seed",
        type=cli_types.seed,
        default=0,
        help="seeds the plants and the end-of-sequence draws (default 0)",
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="model id served under /v1/models and in the metrics' model_name labels "
        "(default: the profile's model, as simulate's engine labels it; gpugov-emulated "
        "where the profile names none)",
    )
    parser.add_argument(
        "--speed",
        type=cli_types.speed,
        default=1.0,
        metavar="X",
        help="plant seconds per wall second (default 1, real time; >1 is a test mode: "
        "every time measured by a client shrinks by X)",
    )
    parser.add_argument(
        "--fault",
        default="none",
        metavar="KIND",
        help="inject an NVML failure on every GPU: no-permission, not-supported (locks), "
        "lost, or lost-after:SECONDS (default none)",
    )
    parser.set_defaults(handler=cmd_emulate)
