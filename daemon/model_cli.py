"""``gpugov model``: show or export what the online MPC (``mpc-online``) has learned.

``gpugov model show [--config F | --state-dir DIR]`` prints each stored model with its
uncertainty; ``gpugov model export --out DIR`` writes it as a profile (CSV + manifest in
the bundled schema) with status ``online-identified``. Reads the state files only; never
touches a GPU. Imports nothing of the study code.
"""

from __future__ import annotations

import argparse
import csv
import errno
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from gpugov.controllers.online.controller import REFERENCE_BATCH, OnlineMPCController
from gpugov.controllers.online.identification import OnlineModel
from gpugov.daemon import cli_types
from gpugov.daemon.cli_outputs import check_output_dir, prepare_output_dir
from gpugov.daemon.cli_support import fail, note, warn, wrote
from gpugov.daemon.config import (
    DOMAIN_NAME_PATTERN,
    MAX_DOMAIN_NAME_CHARS,
    controller_state_dir,
    load_config,
)
from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.daemon.errors import ConfigError, printable
from gpugov.daemon.files import resolve_state_dir, write_files_atomic
from gpugov.daemon.stored_model import (
    StoredModelError,
    read_stored,
    stored_gpu_names,
    stored_role,
)
from gpugov.plant.input_files import finite_number
from gpugov.plant.profile import CSV_COLUMNS


class ModelCliError(ValueError):
    """A usage or input problem; one line naming the flag or file."""


def stored_files(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """``(domain, state file)`` for every model the arguments point at."""
    if args.config:
        config = load_config(args.config)
        found = []
        for domain in config.domains:
            spec = domain.controller
            if not isinstance(spec, OnlineMPCControllerConfig):
                continue
            # Where the daemon keeps it: the controller's state_dir, else [daemon]'s, else
            # $STATE_DIRECTORY (--state-dir overrides).
            directory = (
                resolve_state_dir(args.state_dir)
                if args.state_dir
                else controller_state_dir(spec, config.daemon.state_dir)
            )
            if directory is None:
                raise ModelCliError(
                    f"{args.config}: domain {domain.name!r} has no state_dir (the "
                    "controller's or [daemon]'s) and $STATE_DIRECTORY is unset; pass --state-dir"
                )
            if directory.exists() and not directory.is_dir():
                # run only warns (check-config's warning) and keeps no model there; this
                # said "no learned model yet", as if one might come.
                raise ModelCliError(
                    f"{args.config}: domain {domain.name!r}: state_dir {directory} is not a "
                    "directory (a file is there), so no learned model is kept in it"
                )
            found.append((domain.name, directory / f"online-model-{domain.name}.json"))
        if not found:
            raise ModelCliError(f"{args.config}: no domain runs the mpc-online controller")
        return found
    directory = resolve_state_dir(args.state_dir)
    if directory is None:
        raise ModelCliError(
            "no state directory: pass --config, --state-dir or set $STATE_DIRECTORY"
        )
    where = f"--state-dir {directory}" if args.state_dir else f"$STATE_DIRECTORY={directory}"
    files = sorted(_model_files(directory, where))
    if not files:
        raise ModelCliError(f"{directory}: no learned model (online-model-*.json) here")
    return [(path.stem.removeprefix("online-model-"), path) for path in files]


def _model_files(directory: Path, where: str) -> list[Path]:
    """The ``online-model-*.json`` files in ``directory`` (``where``: how the user named
    it, the flag or the environment variable, for the error line).

    Raises:
        ModelCliError: the directory is missing, not a directory or unreadable (a
            symbolic link loop too); ``Path.glob`` finds nothing in each, which read as
            "no learned model here" and hid a mistyped path.
    """
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
    except OSError as error:
        reason = {
            errno.ENOENT: "no such directory",
            errno.ENOTDIR: "not a directory",
        }.get(error.errno or 0, f"cannot read it: {error.strerror or error}")
        raise ModelCliError(f"{where}: {reason}") from error
    # Only a domain's name (what the daemon writes): a hand-made online-model-a<newline>b.json
    # was shown, and exported as online-a<newline>b.json with a "wrote" line cut in two.
    return [
        directory / name
        for name in names
        if name.startswith("online-model-")
        and name.endswith(".json")
        and _domain_name(name.removeprefix("online-model-")[: -len(".json")])
    ]


def _domain_name(name: str) -> bool:
    """Whether ``name`` is one a config's domain can have."""
    return len(name) <= MAX_DOMAIN_NAME_CHARS and bool(re.fullmatch(DOMAIN_NAME_PATTERN, name))


KEPT_SHOWN = 3
"""At most this many kept-aside files named in the line (newest first), then a count."""


def _kept_aside(path: Path) -> str:
    """The end of "no learned model yet" for a domain whose models were kept aside
    (``.other-``/``.corrupt-`` beside ``path``), newest first; empty where none is: it read
    as if the model were lost after the engine served another model."""
    try:
        with os.scandir(path.parent) as entries:
            kept = sorted(
                (
                    entry.name
                    for entry in entries
                    if entry.name.startswith((f"{path.name}.other-", f"{path.name}.corrupt-"))
                ),
                key=lambda name: name.rsplit("-", 1)[-1],
                reverse=True,
            )
    except OSError:
        return ""
    if not kept:
        return ""
    shown = ", ".join(ascii(name)[1:-1] for name in kept[:KEPT_SHOWN])
    more = f" and {len(kept) - KEPT_SHOWN} more" if len(kept) > KEPT_SHOWN else ""
    return (
        f" for this domain's node; kept aside beside it: {shown}{more} (.other-: another "
        "node's or served model's, which the daemon puts back when its GPUs and model are "
        "served again; .corrupt-: refused)"
    )


def load_model(path: Path) -> tuple[dict[str, Any], OnlineModel]:
    """The stored payload and the model rebuilt from it.

    Raises:
        ModelCliError: missing, corrupt or partial file (named).
    """
    try:
        payload = read_stored(path)
    except FileNotFoundError as error:
        raise ModelCliError(f"{path}: no learned model yet{_kept_aside(path)}") from error
    except StoredModelError as error:
        raise ModelCliError(str(error)) from error
    state = payload["model"]
    try:
        # read_stored checked the numbers (clocks, shapes, ranges), naming the field.
        model = OnlineModel(state["clocks_mhz"], float(state["power_limit_w"]))
        model.load_state(state, stored_role(payload) or "colocated")
        _controller(payload, model).check_learned()  # as the daemon's restore checks it
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise ModelCliError(f"{path}: stored model is invalid: {error}") from error
    return payload, model


def _controller(payload: dict[str, Any], model: OnlineModel) -> OnlineMPCController:
    controller = OnlineMPCController(
        mean_prompt_tokens=float(payload.get("mean_prompt_tokens") or 1024.0),
        mean_output_tokens=float(payload.get("mean_output_tokens") or 128.0),
    )
    controller.model = model
    controller.model_name = payload["key"].get("model_name")
    return controller


def _thermal_section(
    model: OnlineModel, limit_c: float, idle_w: float, period_s: object
) -> dict[str, Any]:
    """The exported profile's thermal RC: the learned fit where it is physical and idles
    the domain below ``limit_c`` (the profile loader refuses one that does not), its time
    constant in seconds where the model's control period is stored (a model saved before
    the period was stored keeps a neutral 30 s); else a neutral RC that stays under the
    limit, the source saying why."""
    neutral = {
        "ambient_temperature_c": 30.0,
        "thermal_resistance_c_per_w": (limit_c - 30.0) / (1.1 * model.power_limit_w),
        "thermal_time_constant_s": 30.0,
        "thermal_limit_c": limit_c,
    }
    fitted = model.thermal_parameters()
    if fitted is None:
        return {**neutral, "source": "not learned yet: a neutral RC that stays under the limit"}
    ambient, resistance, windows = fitted
    steady = ambient + resistance * idle_w
    if not (ambient < limit_c and steady < limit_c):
        return {
            **neutral,
            "source": (
                f"the learned fit (ambient {ambient:.4g} C, {resistance:.4g} C/W) idles the "
                f"domain at {steady:.4g} C, not below the {limit_c:g} C limit: a neutral RC "
                "that stays under the limit"
            ),
        }
    learned = {
        "ambient_temperature_c": ambient,
        "thermal_resistance_c_per_w": resistance,
        "thermal_limit_c": limit_c,
    }
    # finite_number: a hand-edited period may be a string, a bool, NaN or an integer too
    # large for a float (math.isfinite raised OverflowError on it).
    period = finite_number(period_s)
    constant = windows * period if period is not None and period > 0.0 else math.nan
    if math.isfinite(constant):
        return {
            **learned,
            "thermal_time_constant_s": max(1.0, constant),
            "source": "learned online (per control window)",
        }
    shown = repr(period_s) if len(repr(period_s)) <= 40 else f"{repr(period_s)[:40]}..."
    why = (
        "the model was saved without its control period"
        if period_s is None
        else f"the stored control period {shown} is not a usable number of seconds"
    )
    return {
        **learned,
        "thermal_time_constant_s": 30.0,
        "source": f"learned online (per control window); the time constant a neutral 30 s: {why}",
    }


def gpu_names(payload: dict[str, Any]) -> tuple[tuple[str, ...] | None, str | None]:
    """The stored GPU names of a state file, in its key's UUID order (None where it keeps
    none), and None; or None and what is wrong with them, naming the field, where they are
    damaged (the model is shown and exported without them)."""
    try:
        return stored_gpu_names(payload), None
    except ValueError as error:
        return None, str(error)


def board_name(names: tuple[str, ...] | None) -> tuple[str | None, str]:
    """The board the domain's GPUs are (their one shared NVML name) and ``""``, or None
    and why there is none: no names stored, none reported, or names that differ."""
    if names is None:
        return None, (
            "the state file keeps no GPU name (saved before gpugov kept them, or by a run that "
            "knew none)"
        )
    distinct = sorted(set(names))
    if len(distinct) == 1 and distinct[0]:
        return distinct[0], ""
    if not any(distinct):
        return None, "the domain's GPUs reported no name"
    shown = ", ".join(repr(name) if name else "no name" for name in distinct)
    return None, f"the domain's GPUs have different names ({shown})"


def _gpus_text(uuids: list[str], names: tuple[str, ...] | None) -> str:
    """The key's GPUs for ``model show``: their UUIDs, then the board's name where they
    share one, else each GPU's own beside it."""
    if not uuids:
        return "?"
    board, _ = board_name(names)
    if board is not None:
        return f"{', '.join(uuids)} ({board})"
    if names is None or not any(names):
        return ", ".join(uuids)
    return ", ".join(
        f"{uuid} ({name or 'no name'})" for uuid, name in zip(uuids, names, strict=True)
    )


def describe(
    domain: str,
    path: Path,
    payload: dict[str, Any],
    model: OnlineModel,
    names: tuple[str, ...] | None = None,
) -> str:
    """The model as text: key (with the GPUs' stored ``names``: :func:`gpu_names`), fit
    quality, then per-clock predictions with +- 1 std. The key's UUIDs, GPU names and
    model name (NVML's and the engine's text) are escaped
    (:func:`~gpugov.daemon.errors.printable`)."""
    key = payload["key"]
    residual = model.residual_rms()
    lines = [
        printable(f"domain {domain}: {path}"),
        printable(
            f"  GPUs {_gpus_text(key['gpu_uuids'], names)}; model {key.get('model_name') or '?'}"
        ),
        f"  samples {model.samples}, warmed up {'yes' if model.warmed_up else 'no'}, "
        f"confidence {model.confidence():.2f}; fit RMS: busy {residual['busy_s'] * 1e3:.1f} ms, "
        f"energy {residual['energy_j']:.1f} J, temperature {residual['temperature_c']:.2f} C "
        "(per window)",
        f"  {'clock MHz':>9} {'visits':>7} {'prefill tok/s':>20} {'decode iter ms':>17} "
        f"{'prefill W':>10} {'decode W':>9} {'idle W':>7}",
    ]
    context = float(payload.get("mean_prompt_tokens") or 1024.0) + 0.5 * float(
        payload.get("mean_output_tokens") or 128.0
    )
    clocks = model.clocks_mhz
    shown = sorted(set(np.linspace(0, clocks.size - 1, min(12, clocks.size)).round().astype(int)))
    for index in shown:
        clock = float(clocks[index])
        seconds, seconds_std = model.prefill_s_per_token(clock)
        rate = 1.0 / max(seconds, 1e-12)
        rate_std = rate * seconds_std / max(seconds, 1e-12)
        iteration, iteration_std = model.decode_iteration_s(clock, REFERENCE_BATCH, context)
        powers = [model.phase_power_w(clock, phase)[0] for phase in ("prefill", "decode", "idle")]
        latencies = (
            f"{rate:11.0f} +- {rate_std:5.0f} {iteration * 1e3:8.2f} +- {iteration_std * 1e3:5.2f}"
            if model.samples
            else f"{'-':>20} {'-':>17}"  # only the prior: 1e12 tok/s +- 5e21 with no hint
        )
        watts = (
            f"{powers[0]:10.0f} {powers[1]:9.0f} {powers[2]:7.0f}"
            if model.power.samples
            else f"{'-':>10} {'-':>9} {'-':>7}"  # only the power prior's placeholder
        )
        lines.append(f"  {clock:9.0f} {int(model.visits[index]):7d} {latencies} {watts}")
    lines.append(
        f"  (decode iteration at batch {REFERENCE_BATCH}, context {context:.0f} tokens; "
        "+- one standard deviation)"
        if model.samples
        else "  (no latency learned yet: no busy window since it started learning)"
    )
    if not model.power.samples:
        lines.append("  (no power learned yet: no window with a power reading)")
    return "\n".join(lines)


def export(
    domain: str,
    payload: dict[str, Any],
    model: OnlineModel,
    out: Path,
    ttft_slo_s: float | None,
    tpot_slo_s: float | None,
    names: tuple[str, ...] | None = None,
) -> tuple[Path, Path]:
    """Write ``online-<domain>.csv`` and ``.json`` (status ``online-identified``) in
    ``out``, made (when its parent exists) only once the model is known to export.

    The manifest's ``gpu`` (the board's NVML name, which ``gpugov emulate`` names its
    GPUs after and a ``gpu = "auto"`` prior reads the family from) is the name the
    domain's GPUs share (``names``: :func:`gpu_names`); where none is stored, or they
    differ, it is left out (:func:`board_name` says why). ``gpu_uuids`` lists the GPUs.

    Raises:
        ModelCliError: no latency or no power learned yet, or no SLOs to write, stored or
            given.
        UsageError: ``out`` cannot be made or written in.
    """
    if model.samples == 0:
        # Saved before any busy window (a node stopped before its first traffic): its
        # latency part is only the prior, with no hint a zero latency, and was exported
        # as 1e7 prompt tokens/s on every clock, a profile that simulated to no energy.
        raise ModelCliError(
            f"domain {domain}: the model has learned no latency yet (0 samples: no busy "
            "window since it started learning); nothing to export until the node serves "
            "traffic"
        )
    if model.power.samples == 0:
        # The GPUs gave no power reading (none, or none with an energy counter): the power
        # part is only the prior's placeholder, which was exported as identified curves.
        raise ModelCliError(
            f"domain {domain}: the model has learned no power yet (0 power samples: no "
            "window with a power reading); nothing to export until the GPUs report power"
        )
    slos = payload.get("slos") or {}
    ttft = ttft_slo_s or slos.get("ttft_slo_s")
    tpot = tpot_slo_s or slos.get("tpot_slo_s")
    if not ttft or not tpot:
        raise ModelCliError(
            f"domain {domain}: the stored model has no SLOs; pass --ttft-slo and --tpot-slo"
        )
    controller = _controller(payload, model)
    profile = controller.learned_profile((float(ttft), float(tpot)), pessimistic=False)
    limit = float(slos.get("thermal_limit_c") or 87.0)
    thermal = _thermal_section(
        model, limit, float(np.min(profile.idle_power_w)), payload.get("control_period_s")
    )
    name = f"online-{domain}"
    csv_path, manifest_path = out / f"{name}.csv", out / f"{name}.json"
    context = controller.mean_prompt_tokens + 0.5 * controller.mean_output_tokens
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow([*CSV_COLUMNS, "prefill_s_per_token_std", "decode_iteration_s_std"])
    for index, clock in enumerate(profile.clock_mhz):
        writer.writerow(
            [
                f"{clock:g}",
                f"{profile.prefill_tokens_per_s[index]:.6g}",
                f"{profile.decode_tokens_per_s[index]:.6g}",
                f"{profile.prefill_power_w[index]:.6g}",
                f"{profile.decode_power_w[index]:.6g}",
                f"{profile.idle_power_w[index]:.6g}",
                f"{model.prefill_s_per_token(float(clock))[1]:.6g}",
                f"{model.decode_iteration_s(float(clock), REFERENCE_BATCH, context)[1]:.6g}",
            ]
        )
    key = payload["key"]
    # `gpu` is the board's NVML name (emulate names its GPUs after it): the stored one
    # the GPUs share, never their UUIDs ("NVIDIA 0" was no board).
    board, _ = board_name(names)
    learned = {name: value for name, value in profile.manifest.items() if name != "gpu"}
    manifest = {
        **learned,
        "status": "online-identified",
        "csv": csv_path.name,
        **({"gpu": board} if board is not None else {}),
        "gpu_uuids": list(key["gpu_uuids"]),
        # The domain's GPUs, as gpugov profile writes them: the rates are the domain's and
        # the powers their sum (read as 1, gpugov emulate --gpus 2 made two replicas each
        # drawing the whole domain's power).
        "tensor_parallel": max(1, len(key["gpu_uuids"])),
        "model": key.get("model_name") or "unknown model",
        "ttft_slo_s": float(ttft),
        "tpot_slo_s": float(tpot),
        "power_limit_w": model.power_limit_w,
        "thermal": thermal,
        "provenance": (
            "identified online by gpugov's mpc-online controller from the node's own "
            "engine counters and NVML readings; not a clock sweep (status measured is "
            "reserved for those)"
        ),
        "online_model": {
            "samples": model.samples,
            "confidence": model.confidence(),
            "residual_rms": model.residual_rms(),
            "visits_by_clock_mhz": {
                f"{c:g}": int(v) for c, v in zip(model.clocks_mhz, model.visits, strict=True) if v
            },
        },
    }
    # Made only now, every refusal above behind it: a model with no SLOs to export was
    # refused after an empty --out directory had been made for it.
    prepare_output_dir("--out", out)
    # Together: a failure midway leaves an earlier export whole, never a corrupt profile.
    write_files_atomic(
        {csv_path: text.getvalue(), manifest_path: json.dumps(manifest, indent=2) + "\n"}
    )
    return csv_path, manifest_path


def run_model(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov model show|export``: every model it can read is shown or
    exported; each one it cannot is one error line, and the exit code is then 2."""
    if args.action == "export":
        # Checked now, made only once a model is read: a refusal leaves nothing behind.
        check_output_dir("--out", args.out)
    try:
        files = stored_files(args)
        if args.domain:
            files = [item for item in files if item[0] == args.domain]
            if not files:
                raise ModelCliError(f"--domain {args.domain}: no such domain with a model")
    except (ModelCliError, ConfigError) as error:
        return fail(error)
    code = 0
    for domain, path in files:
        try:
            payload, model = load_model(path)
            names, damaged = gpu_names(payload)
            if args.action == "show":
                if damaged:
                    warn(f"{path}: {damaged}; the model is shown without the GPUs' names")
                print(describe(domain, path, payload, model, names))
            else:
                written = export(
                    domain, payload, model, Path(args.out), args.ttft_slo, args.tpot_slo, names
                )
                for item in written:
                    wrote(item)
                board, why = board_name(names)
                # One line where the manifest names no board: emulate then names its GPUs
                # "Emulated GPU", and a gpu = "auto" prior finds no family in it.
                if damaged:
                    warn(f"{path}: {damaged}; {written[1].name} names no board (no 'gpu')")
                elif board is None:
                    note(f"domain {domain}: {why}; {written[1].name} names no board (no 'gpu')")
        except ModelCliError as error:
            code = fail(str(error))
    return code


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``model show`` and ``model export`` to the ``gpugov`` parser."""
    parser = subparsers.add_parser(
        "model",
        help="show or export the model the mpc-online controller learned",
        description="Read the learned model(s) from the state directory. Exit codes: 0 ok, "
        "2 usage or input error.",
    )
    parser.set_defaults(handler=run_model)  # each action below names itself in `action`
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for action, text in (
        ("show", "print the learned model with its uncertainty"),
        ("export", "write it as a profile CSV + manifest (status online-identified)"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument("--config", metavar="FILE", help="the daemon's TOML config")
        sub.add_argument(
            "--state-dir",
            metavar="DIR",
            default=None,
            help="state directory (default: the config's state_dir or $STATE_DIRECTORY)",
        )
        sub.add_argument("--domain", metavar="NAME", default=None, help="only this domain")
        if action == "export":
            sub.add_argument("--out", required=True, metavar="DIR", help="output directory")
            sub.add_argument(
                "--ttft-slo",
                type=cli_types.duration,
                default=None,
                metavar="S",
                help="TTFT SLO for the manifest (default: the stored one)",
            )
            sub.add_argument(
                "--tpot-slo",
                type=cli_types.duration,
                default=None,
                metavar="S",
                help="TPOT SLO for the manifest (default: the stored one)",
            )
        sub.set_defaults(handler=run_model, action=action)
