"""The state file of ``mpc-online``'s learned model: its name, its format and the checks of
every stored field (the loader's, which each save runs first); read by ``gpugov model`` too."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

from gpugov.controllers.online.identification import MODEL_VERSION, POWER_BLOCKS, TIME_BLOCKS
from gpugov.controllers.online.regression import MAX_STORED_COUNT
from gpugov.daemon.files import InputFileError, loads_json, read_input_text
from gpugov.daemon.limits import MAX_CLOCK_MHZ, MAX_COUNT, MAX_POWER_W, MAX_SECONDS
from gpugov.plant.input_files import finite_number

FORMAT = "gpugov-online-model"
"""The state file's format tag (its ``format`` field)."""
MAX_THERMAL_COEFFICIENT = 1e6
"""The largest magnitude of a stored thermal coefficient of ``T' = a T + b + c P``
(``a`` a window's decay near 1, ``b`` a few degrees, ``c`` hundredths of a degree per
watt): a state file beyond is no thermal fit (1e308 was restored, and written back)."""
MAX_REGRESSION_MAGNITUDE = 1e12
"""The largest magnitude of a stored regression's number (its mean, covariances and noise
variance: latencies of seconds, powers of watts and their squares): a state file beyond
is no fit (a mean of 1e308 overflowed numpy in ``model show``, printing its
RuntimeWarning, and ``model export`` wrote a profile from it)."""
MAX_GPU_NAME_CHARS = 95
"""The longest GPU name a state file keeps: NVML's device name buffer
(``NVML_DEVICE_NAME_V2_BUFFER_SIZE``) holds 96 bytes with the terminating NUL."""


class StoredModelError(ValueError):
    """A state file is corrupt or partial; the message names the file and the problem."""


class UnreadableStateError(StoredModelError):
    """A state file that is there but cannot be read (its permissions, an I/O error): not
    its content's fault, so it is neither set aside nor saved over."""


class OtherVersionError(StoredModelError):
    """A state file another gpugov wrote, with another model version: not corrupt, kept
    for that gpugov (a rollback and its upgrade again)."""


def model_path(directory: Path, domain: str) -> Path:
    """The state file of ``domain``."""
    return directory / f"online-model-{domain}.json"


def read_stored(path: Path) -> dict[str, Any]:
    """Parse and check a state file.

    Raises:
        FileNotFoundError: no file.
        UnreadableStateError: there but not readable (permissions, an I/O error).
        StoredModelError: not a file, not JSON, wrong format or version, fields missing.
    """
    if not path.exists():
        raise FileNotFoundError(path)
    try:
        text = read_input_text(path, "state")
    except InputFileError as error:
        if isinstance(error.__cause__, OSError):
            raise UnreadableStateError(str(error)) from error
        raise StoredModelError(str(error)) from error
    try:
        payload = loads_json(text)
    except json.JSONDecodeError as error:
        raise StoredModelError(
            f"{path}:{error.lineno}: not valid JSON ({error.msg}); partial write?"
        ) from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise StoredModelError(f"{path}: not a gpugov online-model file")
    try:
        _check_payload(payload)
    except OtherVersionError as error:
        raise OtherVersionError(f"{path}: {error}") from error
    except StoredModelError as error:
        raise StoredModelError(f"{path}: {error}") from error
    return payload


STORED_ROLES = ("colocated", "prefill", "decode")
"""The roles a stored model may have been learned in (``role``; absent: colocated)."""


def stored_role(payload: dict[str, Any]) -> str | None:
    """The role of the domain the stored model was learned on (a file without one was
    saved before roles were stored: colocated), or None where the field is not a role."""
    role = payload.get("role", "colocated")
    return role if isinstance(role, str) and role in STORED_ROLES else None


def payload_problem(payload: dict[str, Any]) -> str | None:
    """What is wrong with a state file's content (the whole object), naming the field,
    or None: the loader's checks, which
    :meth:`daemon.model_store.PersistentOnlineModel.save` runs before writing too, so the
    daemon never writes a file it would refuse."""
    try:
        _check_payload(payload)
    except StoredModelError as error:
        return str(error)
    return None


def _check_payload(payload: dict[str, Any]) -> None:
    version = payload.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoredModelError(f"model version must be an integer, got {version!r:.40}")
    if version != MODEL_VERSION:
        raise OtherVersionError(f"model version {version!r}, this gpugov reads {MODEL_VERSION}")
    for key in ("key", "model"):
        if not isinstance(payload.get(key), dict):
            raise StoredModelError(f"field {key!r} is missing or not an object")
    key = payload["key"]
    uuids = key.get("gpu_uuids")
    if not isinstance(uuids, list) or not all(isinstance(uuid, str) for uuid in uuids):
        raise StoredModelError("key.gpu_uuids is missing or not a list of names")
    name = key.get("model_name")
    if name is not None and not isinstance(name, str):
        raise StoredModelError(f"key.model_name must be a name, got {name!r}")
    if stored_role(payload) is None:
        raise StoredModelError(
            f"role must be one of {', '.join(STORED_ROLES)}, got {payload.get('role')!r:.40}"
        )
    # Bounded as the config bounds them (what the daemon saves): 1e300 prompt tokens gave
    # no usable profile, and a longer SLO exported a profile its loader refuses.
    for field_name in ("mean_prompt_tokens", "mean_output_tokens"):
        value = payload.get(field_name)
        if value is not None and not 0.0 < (finite_number(value) or 0.0) <= MAX_COUNT:
            raise StoredModelError(
                f"{field_name} must be a positive number of at most {MAX_COUNT:g} tokens, "
                f"got {value!r:.40}"
            )
    slos = payload.get("slos")
    if slos is not None and not isinstance(slos, dict):
        raise StoredModelError("field 'slos' is not an object")
    for field_name in ("ttft_slo_s", "tpot_slo_s"):
        value = (slos or {}).get(field_name)
        if value is not None and not 0.0 < (finite_number(value) or 0.0) <= MAX_SECONDS:
            raise StoredModelError(
                f"slos.{field_name} must be a positive number of at most {MAX_SECONDS:g} s "
                f"(ten years), got {value!r:.40}"
            )
    value = (slos or {}).get("thermal_limit_c")
    if value is not None and not (finite_number(value) or 0.0) > 0.0:
        raise StoredModelError(f"slos.thermal_limit_c must be a positive number, got {value!r:.40}")
    status = payload.get("status")
    if status is not None and not isinstance(status, dict):
        raise StoredModelError(
            f"status must be an object (the controller's learning status), got {status!r:.40}"
        )
    problem = model_state_problem(payload["model"])
    if problem is not None:
        raise StoredModelError(problem)


def gpu_names_problem(value: object, gpus: int) -> str | None:
    """What is wrong with ``value`` as the ``gpu_names`` of a domain of ``gpus`` GPUs,
    naming the field, or None: it must be a list of one NVML name per GPU (``""`` for one
    that reports none), each at most :data:`MAX_GPU_NAME_CHARS` printable characters."""
    if not isinstance(value, list) or len(value) != gpus:
        return (
            f"gpu_names must be a list of {gpus} names (one per GPU of key.gpu_uuids), "
            f"got {value!r:.40}"
        )
    for index, name in enumerate(value):
        if not isinstance(name, str) or len(name) > MAX_GPU_NAME_CHARS or not name.isprintable():
            return (
                f"gpu_names[{index}] must be a GPU's NVML name of at most "
                f"{MAX_GPU_NAME_CHARS} printable characters, got {name!r:.40}"
            )
    return None


def stored_gpu_names(payload: dict[str, Any]) -> tuple[str, ...] | None:
    """The NVML names of the GPUs of a state file's key (checked by :func:`read_stored`),
    in the order of ``key.gpu_uuids``; None where the file keeps none (saved before
    ``gpu_names`` was kept). Not checked by :func:`read_stored`: a damaged name is no
    reason to lose the model.

    Raises:
        ValueError: ``gpu_names`` is damaged (:func:`gpu_names_problem`, naming it).
    """
    value = payload.get("gpu_names")
    if value is None:
        return None
    problem = gpu_names_problem(value, len(payload["key"]["gpu_uuids"]))
    if problem is not None:
        raise ValueError(problem)
    return tuple(value)


def _numbers(value: object, field: str, length: int | None = None) -> list[float]:
    """``value`` as a list of finite numbers (``length`` of them when given).

    Raises:
        ValueError: naming ``field``.
    """
    if not isinstance(value, list) or (length is not None and len(value) != length):
        size = "a list of numbers" if length is None else f"a list of {length} numbers"
        raise ValueError(f"{field} must be {size}")
    numbers = [finite_number(item) for item in value]
    for index, number in enumerate(numbers):
        if number is None:
            raise ValueError(f"{field}[{index}] must be a finite number, got {value[index]!r:.40}")
    return [float(number) for number in numbers if number is not None]


def _clocks(value: object, field: str) -> list[float]:
    """Two or more positive clocks, ascending, at most :data:`MAX_CLOCK_MHZ`."""
    try:
        clocks = _numbers(value, field)
    except ValueError:
        clocks = []
    if (
        len(clocks) < 2
        or not all(0.0 < clock <= MAX_CLOCK_MHZ for clock in clocks)
        or any(b <= a for a, b in itertools.pairwise(clocks))
    ):
        raise ValueError(
            f"{field} must be two or more positive clocks, ascending, at most {MAX_CLOCK_MHZ:g} MHz"
        )
    return clocks


def _count(value: object, field: str) -> None:
    number = finite_number(value)
    if number is None or not 0.0 <= number <= MAX_STORED_COUNT or number != math.floor(number):
        raise ValueError(f"{field} must be a count, got {value!r:.40}")


def _bounded(numbers: list[float], field: str) -> list[float]:
    """``numbers``, each within :data:`MAX_REGRESSION_MAGNITUDE` of 0.

    Raises:
        ValueError: naming ``field`` and the index.
    """
    for index, number in enumerate(numbers):
        if abs(number) > MAX_REGRESSION_MAGNITUDE:
            raise ValueError(
                f"{field}[{index}] must be a finite number within "
                f"±{MAX_REGRESSION_MAGNITUDE:g}, got {number!r:.40}"
            )
    return numbers


def _regression(state: object, field: str, size: int, *, bound_mean: bool = True) -> list[float]:
    """Check a stored :class:`RecursiveLeastSquares` of ``size`` parameters (the
    numbers only: symmetry and definiteness are its own ``load_state``'s); its mean.
    ``bound_mean`` False: the caller bounds the mean itself (the thermal fit, tighter)."""
    if not isinstance(state, dict):
        raise ValueError(f"{field} is missing or not an object")
    mean = _numbers(state.get("mean"), f"{field}.mean", size)
    if bound_mean:
        _bounded(mean, f"{field}.mean")
    for name in ("covariance", "prior_covariance"):
        rows = state.get(name)
        if not isinstance(rows, list) or len(rows) != size:
            raise ValueError(f"{field}.{name} must be a {size} x {size} matrix of numbers")
        for index, row in enumerate(rows):
            where = f"{field}.{name}[{index}]"
            _bounded(_numbers(row, where, size), where)
    noise = finite_number(state.get("noise_variance"))
    if noise is None or not 0.0 < noise <= MAX_REGRESSION_MAGNITUDE:
        raise ValueError(
            f"{field}.noise_variance must be a positive number of at most "
            f"{MAX_REGRESSION_MAGNITUDE:g}, got {state.get('noise_variance')!r:.40}"
        )
    forgetting = finite_number(state.get("forgetting"))
    if forgetting is None or not 0.0 < forgetting <= 1.0:
        raise ValueError(
            f"{field}.forgetting must lie in (0, 1] (the share of the evidence kept per "
            f"update), got {state.get('forgetting')!r:.40}"
        )
    _count(state.get("samples"), f"{field}.samples")
    residual = finite_number(state.get("residual_ms"))
    if residual is None or residual < 0.0:
        raise ValueError(
            f"{field}.residual_ms must be a number >= 0, got {state.get('residual_ms')!r:.40}"
        )
    return mean


def model_state_problem(state: dict[str, Any]) -> str | None:
    """What is wrong with a stored model's numbers (the file's ``model`` object), naming
    the field, or None. The physical ranges only a file can break: clocks positive and
    ascending, knots among them, per-clock arrays one a clock, every regression's
    numbers finite and shaped for the knots, forgetting in (0, 1], and a board power of
    more than 0 W in each phase at the top clock (where the warm-up's evidence is, as
    for the latencies the model checks itself). What needs the model built (the
    latencies it predicts, definiteness) is :meth:`OnlineModel.load_state`'s."""
    try:
        version = state.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"model.version must be an integer, got {version!r:.40}")
        if version != MODEL_VERSION:
            raise ValueError(
                f"model.version is {state.get('version')!r:.40}, this gpugov reads {MODEL_VERSION}"
            )
        clocks = _clocks(state.get("clocks_mhz"), "model.clocks_mhz")
        knots = _clocks(state.get("knots_mhz"), "model.knots_mhz")
        if knots[0] != clocks[0] or knots[-1] != clocks[-1] or not set(knots) <= set(clocks):
            raise ValueError(
                "model.knots_mhz must be clocks of model.clocks_mhz, from its lowest to its highest"
            )
        # At most the config's bound on a power (the profile loader's): 1e308 W built a
        # prior of NaN in `model show` and exported a profile its loader refuses.
        limit = finite_number(state.get("power_limit_w"))
        if limit is None or not 0.0 < limit <= MAX_POWER_W:
            raise ValueError(
                f"model.power_limit_w must be a positive number of at most {MAX_POWER_W:g} W, "
                f"got {state.get('power_limit_w')!r:.40}"
            )
        ratio = _numbers(state.get("realized_ratio"), "model.realized_ratio", len(clocks))
        if not all(0.0 < value <= 1.0 for value in ratio):
            raise ValueError("model.realized_ratio must lie in (0, 1] (realised over requested)")
        for index, value in enumerate(_numbers(state.get("visits"), "model.visits", len(clocks))):
            _count(value, f"model.visits[{index}]")
        if not isinstance(state.get("warmed_up"), bool):
            raise ValueError(
                f"model.warmed_up must be true or false, got {state.get('warmed_up')!r:.40}"
            )
        _count(state.get("warmup_count"), "model.warmup_count")
        k = len(knots)
        _regression(state.get("time"), "model.time", len(TIME_BLOCKS) * k)
        power = _regression(state.get("power"), "model.power", len(POWER_BLOCKS) * k)
        thermal = _regression(state.get("thermal"), "model.thermal", 3, bound_mean=False)
        for name, value in zip(("a", "b", "c"), thermal, strict=True):
            if not abs(value) <= MAX_THERMAL_COEFFICIENT:
                raise ValueError(
                    f"model.thermal.mean: {name} = {value:.3g} in T' = a T + b + c P, beyond "
                    f"{MAX_THERMAL_COEFFICIENT:g}; no GPU heats or cools so"
                )
        for index, phase in enumerate(POWER_BLOCKS):
            top = power[(index + 1) * k - 1]
            if not top > 0.0:
                raise ValueError(
                    f"model.power.mean: the {phase} power at the top clock {clocks[-1]:g} MHz "
                    f"is {top:.3g} W; a board draws more than 0 W"
                )
    except ValueError as error:
        return str(error)
    return None


__all__ = [
    "FORMAT",
    "MAX_GPU_NAME_CHARS",
    "MAX_THERMAL_COEFFICIENT",
    "STORED_ROLES",
    "OtherVersionError",
    "StoredModelError",
    "UnreadableStateError",
    "gpu_names_problem",
    "model_path",
    "model_state_problem",
    "payload_problem",
    "read_stored",
    "stored_gpu_names",
    "stored_role",
]
