"""The controller spec's text and names: a ``--controller`` value parsed into its config,
the one name of a configured controller (and the names older versions wrote), and the
outside factories a spec may name (``MODULE:FACTORY``, an installed entry point).

:mod:`daemon.decide` builds the controller a spec describes; this module only reads and
names specs, so a command can check a ``--controller`` value before any work.
"""

from __future__ import annotations

import difflib
import math
import os
from typing import Any

from pydantic import ValidationError

from gpugov.daemon.controller_config import (
    ControllerConfig,
    ExternalControllerConfig,
    FixedControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OnlineMPCControllerConfig,
    OpenLoopControllerConfig,
    PowerCapControllerConfig,
    PowerProfileControllerConfig,
    PriorHintsConfig,
    ReactiveControllerConfig,
    controller_kinds,
)
from gpugov.daemon.limits import MAX_CLOCK_MHZ, MAX_POWER_W
from gpugov.plant.input_files import plain_float

CONTROLLER_SPEC_HELP = (
    "max | fixed:MHZ | reactive | open-loop:PLAN.json | mpc[:PROFILE] | mpc-slsqp[:PROFILE]"
    " | mpc-online[:PRIOR_PROFILE | :gpu=NAME,params_b=B,active_params_b=B,tp=N | :auto=off]"
    " | power-cap[:W] | dps | power-profile[:PROFILE] | default-dvfs | agft | pid"
    " | throttllem | greenllm | voltana"
    " | MODULE:FACTORY | an installed gpugov.controllers entry point's name"
)
ENTRY_POINT_GROUP = "gpugov.controllers"
"""The entry-point group an outside package registers its controller factories in."""
PEER_KINDS_WITHOUT_ARGUMENT = (
    "dps",
    "default-dvfs",
    "agft",
    "pid",
    "throttllem",
    "greenllm",
    "voltana",
)
"""Peer governors (``controllers/peers``) whose ``--controller`` spec takes no argument."""
ONLINE_HINT_KEYS = {
    "gpu": "gpu",
    "params_b": "params_b",
    "active_params_b": "active_params_b",
    "tp": "tensor_parallel",
    "tensor_parallel": "tensor_parallel",
    "profile": "prior_profile",
    "auto": "auto_hints",
}
"""``--controller mpc-online:KEY=VALUE,...`` keys -> config fields."""

OLD_CONTROLLER_NAMES = {
    "maximum": "max",
    "maximum_clock": "max",
    "maximum_clock_controller": "max",
    "max_clock": "max",
    "reactive_governor": "reactive",
    "open_loop_clock": "open-loop",
    "open_loop": "open-loop",
    "offline": "open-loop",
    "Offline plan": "open-loop",
    "mpc_clock": "mpc",
    "mpc_fast": "mpc",
    "mpc_slsqp_clock": "mpc-slsqp",
    "mpc_slsqp": "mpc-slsqp",
    "best_fixed": "best-fixed",
    "window_oracle": "window-oracle",
}
"""Names older versions wrote (metrics labels, recordings, JSON) -> the one name now."""


def canonical_controller_name(name: str) -> str:
    """The one name of a controller (``max``, ``fixed:MHZ``, ``reactive``, ``open-loop``,
    ``mpc``, ``mpc-slsqp``), also for a name an older recording or result carries."""
    if name.startswith("fixed_") and name.endswith("_mhz"):
        return f"fixed:{name[len('fixed_') : -len('_mhz')]}"
    return OLD_CONTROLLER_NAMES.get(name, name)


def spec_name(spec: ControllerConfig) -> str:
    """The one name of a configured controller: its ``--controller`` spec without the
    argument (``fixed`` keeps its clock: ``fixed:1410``). Metrics labels, recordings,
    JSON and figures all use it."""
    if isinstance(spec, FixedControllerConfig):
        return f"fixed:{spec.clock_mhz:g}"
    if isinstance(spec, ExternalControllerConfig):
        return spec.name or spec.factory
    return str(spec.kind)


def load_factory(reference: str) -> Any:
    """The callable ``"module:attribute"`` names (the attribute may be dotted).

    Raises:
        ValueError: one line naming the reference, when the module cannot be imported or
            has no such callable.
    """
    import importlib

    module_name, colon, attribute = reference.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"controller factory {reference!r}: expected MODULE:FACTORY")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # an outside module: any import error is its own
        raise ValueError(
            f"controller factory {reference!r}: cannot import {module_name!r}: {error}"
            f"{_not_on_path_hint(module_name, error)}"
        ) from None
    except BaseException as error:  # a module that exits on import (a script) is no factory
        from gpugov.daemon.deadline import ctrl_c, escape_text

        if ctrl_c(error):
            raise
        raise ValueError(
            f"controller factory {reference!r}: cannot import {module_name!r}: "
            f"it {escape_text(error)}"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"controller factory {reference!r}: {module_name} has no {attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"controller factory {reference!r}: {attribute} is not callable")
    return target


def _not_on_path_hint(module_name: str, error: Exception) -> str:
    """What to do when the factory's own module (not one it imports) is not found: the
    ``gpugov`` command imports from Python's path, never the working directory, so a
    ``mygov.py`` beside the user is found only through ``PYTHONPATH`` or an install."""
    top = module_name.split(".")[0]
    if not isinstance(error, ModuleNotFoundError) or error.name not in (top, module_name):
        return ""
    for candidate in (f"{top}.py", top):
        if os.path.exists(candidate):
            return (
                f" ({candidate} is in the working directory, which gpugov does not import "
                "from: put its folder on PYTHONPATH, e.g. PYTHONPATH=., or install its package)"
            )
    return " (a factory's module is imported from PYTHONPATH or an installed package)"


def entry_point_factory(name: str) -> str | None:
    """The ``module:factory`` an installed package registers as ``name`` in the
    :data:`ENTRY_POINT_GROUP` entry-point group, or None. A built-in kind's name always
    means the built-in controller (such an entry point is reached only as
    ``MODULE:FACTORY``).

    Raises:
        ValueError: one line, when installed packages register ``name`` with different
            factories (which one runs would depend on the install order).
    """
    from importlib.metadata import entry_points

    found: dict[str, str] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == name:
            dist = getattr(entry, "dist", None)
            found.setdefault(str(entry.value), str(getattr(dist, "name", None) or "?"))
    if len(found) > 1:
        listed = ", ".join(f"{_shown(value)} (package {dist})" for value, dist in found.items())
        raise ValueError(
            f"--controller {name!r}: {len(found)} installed packages register it in "
            f"{ENTRY_POINT_GROUP}: {listed}; name one as MODULE:FACTORY"
        )
    return next(iter(found), None)


def _online_spec(text: str, argument: str) -> OnlineMPCControllerConfig:
    """``mpc-online:ARGUMENT``: a prior profile, or ``KEY=VALUE`` hints separated by
    commas (:data:`ONLINE_HINT_KEYS`).

    Raises:
        ValueError: one line naming the spec and the key.
    """
    if "=" not in argument:
        return OnlineMPCControllerConfig(
            kind="mpc-online", prior_profile=os.path.expanduser(argument)
        )
    fields: dict[str, Any] = {}
    hints: dict[str, Any] = {}
    seen: set[str] = set()
    for item in argument.split(","):
        key, equals, value = (part.strip() for part in item.partition("="))
        if key not in ONLINE_HINT_KEYS or not equals or not value:
            raise ValueError(
                f"--controller {_shown(text)}: expected KEY=VALUE with KEY one of "
                f"{', '.join(sorted(ONLINE_HINT_KEYS))}, got {item!r}"
            )
        if key in seen:
            raise ValueError(f"--controller {_shown(text)}: {key} given more than once")
        seen.add(key)
        name = ONLINE_HINT_KEYS[key]
        if name == "prior_profile":
            fields[name] = os.path.expanduser(value)
            continue
        if name == "auto_hints":
            if value.lower() not in ("on", "off"):
                raise ValueError(
                    f"--controller {_shown(text)}: auto must be on or off, got {_shown(value)}"
                )
            fields[name] = value.lower() == "on"
            continue
        if name in ("params_b", "active_params_b"):
            try:
                number = plain_float(value)
            except ValueError:
                raise ValueError(
                    f"--controller {_shown(text)}: {key} must be a number of billions, "
                    f"got {_shown(value)}"
                ) from None
            hints[name] = number
        elif name == "tensor_parallel":
            if not (value.isascii() and value.isdigit()):
                raise ValueError(
                    f"--controller {_shown(text)}: {key} must be a whole number of GPUs, "
                    f"got {_shown(value)}"
                )
            hints[name] = int(value)
        else:
            hints[name] = value
    try:
        if hints:
            fields["prior"] = PriorHintsConfig(**hints)
        return OnlineMPCControllerConfig(kind="mpc-online", **fields)
    except ValidationError as error:
        raise ValueError(f"--controller {_shown(text)}: {_first_problem(error, 'prior')}") from None


SHOWN_CHARS = 80
"""Most characters of a spec an error line quotes (a spec pasted whole, a file's
contents, is no line to print)."""
SPEC_KINDS = tuple(sorted(controller_kinds() - {"external"}))
"""The controller kinds a spec names, read from the config's union (for the closest one
to a mistyped kind); an outside controller is named by its factory, not a kind."""


def shown_spec(text: str) -> str:
    """``text`` (a spec as given) for an error line, cut to :data:`SHOWN_CHARS`
    characters."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[: SHOWN_CHARS - 3]}... ({len(text)} characters)"


def _shown(value: object) -> str:
    """``value`` quoted for an error line, cut to :data:`SHOWN_CHARS` characters."""
    quoted = repr(value)
    if len(quoted) <= SHOWN_CHARS:
        return quoted
    return f"{quoted[: SHOWN_CHARS - 3]}... ({len(str(value))} characters)"


def did_you_mean(kind: str) -> str:
    """`` (did you mean 'mpc-online'?)`` for the kind closest to ``kind``, else ''."""
    close = difflib.get_close_matches(kind.lower(), SPEC_KINDS, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _first_problem(error: ValidationError, where: str = "") -> str:
    """The first problem pydantic found, as ``field: reason`` (``where`` when the error
    names no field)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or where
    message = str(first["msg"]).removeprefix("Value error, ")
    return message if not where or message.startswith(where) else f"{where}: {message}"


def parse_controller_spec(text: str, *, default_profile: str | None = None) -> ControllerConfig:
    """A command-line ``--controller`` value as a controller config.

    ``max``, ``fixed:1410``, ``reactive``, ``open-loop:plan.json``, ``mpc`` or
    ``mpc:PROFILE`` (default: ``default_profile``); ``mpc-slsqp`` likewise. An argument
    where none is taken (``reactive:foo``), or an MPC profile that is neither a bundled
    profile nor a profile file, is refused.

    Raises:
        ValueError: one line naming the spec and what was expected (a value the config's
            model refuses, such as ``fixed:1e9``, names its field and the bound).
    """
    try:
        return _parse_spec(text, default_profile)
    except ValidationError as error:  # a ValueError too, but pydantic's is many lines
        raise ValueError(f"--controller {_shown(text)}: {_first_problem(error)}") from None


def _parse_spec(text: str, default_profile: str | None) -> ControllerConfig:
    """:func:`parse_controller_spec` before a model's refusal is made one line."""
    kind, colon, argument = text.partition(":")
    if kind in ("mpc", "mpc-slsqp", "power-profile"):
        # A profile file's ~/... is the home's: no shell expands a ~ after the colon.
        argument = os.path.expanduser(argument)
    match kind:
        case "max" | "maximum" | "reactive":
            if colon:
                raise ValueError(
                    f"--controller {_shown(text)}: {kind} takes no argument; "
                    f"expected {CONTROLLER_SPEC_HELP}"
                )
            if kind == "reactive":
                return ReactiveControllerConfig(kind="reactive")
            return MaxControllerConfig(kind="max")
        case "fixed":
            try:
                clock = plain_float(argument)
            except ValueError as error:
                raise ValueError(
                    f"--controller fixed:MHZ needs a number, got {_shown(text)}"
                ) from error
            if not math.isfinite(clock) or not 0 < clock <= MAX_CLOCK_MHZ:
                raise ValueError(
                    f"--controller fixed:MHZ needs a clock in (0, {MAX_CLOCK_MHZ:g}] MHz, "
                    f"got {_shown(text)}"
                )
            return FixedControllerConfig(kind="fixed", clock_mhz=clock)
        case "open-loop":
            if not argument:
                raise ValueError("--controller open-loop:PLAN.json needs the plan file")
            return OpenLoopControllerConfig.model_validate({"kind": "open-loop", "plan": argument})
        case "mpc-online":
            if colon and not argument:
                raise ValueError(
                    f"--controller {_shown(text)}: name a prior profile or KEY=VALUE hints "
                    "after the colon"
                )
            if argument:
                return _online_spec(text, argument)
            return OnlineMPCControllerConfig(kind="mpc-online")
        case "power-cap":
            if not colon:
                return PowerCapControllerConfig(kind="power-cap")
            try:
                watts = plain_float(argument)
            except ValueError:
                watts = math.nan
            if not math.isfinite(watts) or not 0 < watts <= MAX_POWER_W:
                raise ValueError(
                    f"--controller {_shown(text)}: power-cap:W needs a number of watts in "
                    f"(0, {MAX_POWER_W:g}]"
                )
            return PowerCapControllerConfig(kind="power-cap", cap_w=watts)
        case "power-profile":
            if colon and not argument:
                raise ValueError(f"--controller {_shown(text)}: name a profile after the colon")
            if argument:
                _check_profile(argument, text)
                return PowerProfileControllerConfig(kind="power-profile", profile=argument)
            return PowerProfileControllerConfig(kind="power-profile")
        case kind if kind in PEER_KINDS_WITHOUT_ARGUMENT:
            if colon:
                raise ValueError(
                    f"--controller {_shown(text)}: {kind} takes no argument; "
                    f"expected {CONTROLLER_SPEC_HELP}"
                )
            from pydantic import TypeAdapter

            return TypeAdapter(ControllerConfig).validate_python({"kind": kind})
        case "mpc" | "mpc-slsqp":
            if colon and not argument:
                raise ValueError(f"--controller {_shown(text)}: name a profile after the colon")
            profile = argument or default_profile
            if argument:
                _check_profile(argument, text)
            if profile:
                return MPCControllerConfig(kind=kind, profile=profile)
            return MPCControllerConfig(kind=kind)
    if colon and argument:
        try:
            load_factory(text)
        except ValueError as error:
            raise ValueError(
                f"unknown controller {_shown(text)} ({error}); expected {CONTROLLER_SPEC_HELP}"
            ) from None
        return ExternalControllerConfig(kind="external", factory=text)
    registered = None if colon else entry_point_factory(kind)
    if registered is not None:
        try:
            load_factory(registered)
        except ValueError as error:
            raise ValueError(
                f"--controller {kind!r}: its {ENTRY_POINT_GROUP} entry point: {error}"
            ) from None
        return ExternalControllerConfig(kind="external", factory=registered, name=kind)
    raise ValueError(
        f"unknown controller {_shown(text)}{did_you_mean(kind)}; expected {CONTROLLER_SPEC_HELP}"
    )


def _check_profile(name: str, text: str) -> None:
    """Refuse an MPC profile that is neither bundled nor a profile file (one line)."""
    from gpugov.plant.profile import ProfileError
    from gpugov.plant.profile_files import resolve_profile_path

    try:
        resolve_profile_path(name)
    except ProfileError as error:
        raise ValueError(f"--controller {_shown(text)}: {error}") from error


__all__ = [
    "CONTROLLER_SPEC_HELP",
    "ENTRY_POINT_GROUP",
    "ONLINE_HINT_KEYS",
    "PEER_KINDS_WITHOUT_ARGUMENT",
    "canonical_controller_name",
    "did_you_mean",
    "entry_point_factory",
    "load_factory",
    "parse_controller_spec",
    "shown_spec",
    "spec_name",
]
