"""Persistence of the online MPC's learned model in the state directory.

One JSON file per control domain, ``online-model-<domain>.json`` in the state directory
(systemd's ``StateDirectory=``, ``$STATE_DIRECTORY``; or the controller's ``state_dir``),
holding a format tag, the model version, the **key** (the domain's GPU UUIDs and the
engine's ``model_name`` label), the GPUs' NVML names (``gpu_names``, in the key's UUID
order; no part of the key), the SLOs last seen, the control period and the model
(:meth:`controllers.online.identification.OnlineModel.state_dict`).

- A stored model whose key differs from the node's (another model served, a GPU swapped)
  is not applied: it is kept aside (``.other-<UTC time>``, never overwritten) and the
  model is learned again, unless a model kept aside earlier has exactly the node's key
  (the served model went A, B, A): that one is put back and restored. A model learned on
  other supported clocks (another GPU kind behind the same UUIDs: a board swapped in
  place, or a driver that lists other clocks) is another node's the same way: kept aside as
  ``.other-*``, never called corrupt, and put back when the clocks are its own again. A
  ``model_name`` not known yet (None: no engine scrape so far) is no other model: it
  matches the stored one.
- Only a model that learned at least one window is written, so an empty model never
  replaces a stored one, and a deep copy of the wrapper never reads or writes the file.
- A file of another model version (written by an older or newer gpugov: a rollback, or
  an upgrade and back) is not corrupt: it is kept aside as ``.other-*``, whole, with one
  line, and the model is learned anew; the gpugov that reads that version takes it back
  as any kept model.
- A file that is there but cannot be read (its permissions, an I/O error) is left as it
  is, with one line: the model is learned anew, nothing is saved over it, and it is read
  again every save period; once it can be, it is restored (or kept aside where it is
  another node's) and saving resumes.
- A corrupt or partial file is refused with one clear log line, renamed aside
  (``.corrupt-<UTC time>``) and learning starts fresh; it never stops the daemon. Only
  a file that fails the model's own checks is: one the controller's settings cannot use
  (``SettingsRefuseModel``) is kept aside as ``.other-<UTC time>``, whole.
- A model the loader would refuse is never written: each save runs the loader's checks
  (:func:`payload_problem`, the latencies too) first; one that fails them logs one line,
  the last good file is kept and the model goes back to it (learned anew where there is
  none).
- ``gpu_names`` is optional: a file saved before it was kept has none (``gpugov model
  export`` then names no board), and a damaged one (not one name of at most
  :data:`MAX_GPU_NAME_CHARS` printable characters per GPU of the key) is one line naming
  the field; the model is restored all the same, and the next save writes the node's
  names (:func:`stored_gpu_names`).
- Writes are atomic: a temporary file in the same directory, fsynced, then renamed over.
- Writes run on a worker thread (:class:`daemon.deadline.LatestWriter`): a save waits for
  its write up to :data:`~daemon.deadline.WRITE_DEADLINE_S` (the final one at exit, after
  the clocks are reset, :data:`FINAL_SAVE_WAIT_S`), so a hung disk never stalls the loop
  and holds the exit a few seconds at most. A write still running past that is
  a failed save (logged, tried again a save period later); it goes on in the background
  and the newest model posted is written once the disk answers, never an older one after
  it. While it runs, the state file is not read (a restore after the served model
  changes, say): it is treated as one that cannot be read, read again each save period
  once the write has ended.
- Reads run on a worker thread too (:class:`daemon.deadline.LatestReader`), waited for up
  to :data:`~daemon.deadline.READ_DEADLINE_S`: a read that has not answered by then (a
  hung disk or mount) is a file that cannot be read (one line, learned anew without
  saving, read again each save period). While it runs no other read of the file starts;
  once it has ended, the next save period takes its answer and the file is restored.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpugov.controllers.contract import ControllerWrapper
from gpugov.controllers.online.controller import OnlineMPCController, SettingsRefuseModel
from gpugov.controllers.online.identification import MODEL_VERSION, POWER_BLOCKS, TIME_BLOCKS
from gpugov.controllers.online.model_names import SettledName
from gpugov.controllers.online.regression import MAX_STORED_COUNT
from gpugov.daemon.deadline import (
    EXIT_WRITE_WAIT_S,
    READ_DEADLINE_S,
    WRITE_DEADLINE_S,
    LatestReader,
    LatestWriter,
    ReadTimeout,
)
from gpugov.daemon.files import (
    InputFileError,
    json_safe,
    loads_json,
    read_input_text,
    write_json_atomic,
)
from gpugov.daemon.limits import MAX_CLOCK_MHZ, MAX_COUNT, MAX_SECONDS
from gpugov.plant.input_files import finite_number
from gpugov.plant.types import MPCDiagnostics, ServingObservation

log = logging.getLogger("gpugov.model")

FORMAT = "gpugov-online-model"
SAVE_EVERY_S = 60.0
FINAL_SAVE_WAIT_S = EXIT_WRITE_WAIT_S
"""How long the final save at exit waits for its write (the clocks are reset by then): a
slow disk still gets the last minute's learning."""
KEPT_LOOKED_AT = 16
"""Kept-aside models (``.other-*``, newest first) read when the served model or the GPUs
change, for one learned on exactly this key before."""
MAX_THERMAL_COEFFICIENT = 1e6
"""The largest magnitude of a stored thermal coefficient of ``T' = a T + b + c P``
(``a`` a window's decay near 1, ``b`` a few degrees, ``c`` hundredths of a degree per
watt): a state file beyond is no thermal fit (1e308 was restored, and written back)."""
MAX_GPU_NAME_CHARS = 95
"""The longest GPU name a state file keeps: NVML's device name buffer
(``NVML_DEVICE_NAME_V2_BUFFER_SIZE``) holds 96 bytes with the terminating NUL."""


@dataclass(frozen=True, slots=True)
class ModelKey:
    """What a learned model belongs to: the domain's GPUs and the served model."""

    gpu_uuids: tuple[str, ...]
    model_name: str | None

    def __post_init__(self) -> None:
        """The GPUs as a set, in one order: the model is the domain's whole, whatever order
        the config lists them in (indices can change order across reboots)."""
        object.__setattr__(self, "gpu_uuids", tuple(sorted(self.gpu_uuids)))

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"gpu_uuids": list(self.gpu_uuids), "model_name": self.model_name}

    def fits(self, other: ModelKey) -> bool:
        """Same GPUs, and the same served model unless either name is unknown (None)."""
        if self.gpu_uuids != other.gpu_uuids:
            return False
        names = (self.model_name, other.model_name)
        return None in names or names[0] == names[1]


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


def payload_problem(payload: dict[str, Any]) -> str | None:
    """What is wrong with a state file's content (the whole object), naming the field,
    or None: the loader's checks, which :meth:`PersistentOnlineModel.save` runs before
    writing too, so the daemon never writes a file it would refuse."""
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


def _regression(state: object, field: str, size: int) -> list[float]:
    """Check a stored :class:`RecursiveLeastSquares` of ``size`` parameters (the
    numbers only: symmetry and definiteness are its own ``load_state``'s); its mean."""
    if not isinstance(state, dict):
        raise ValueError(f"{field} is missing or not an object")
    mean = _numbers(state.get("mean"), f"{field}.mean", size)
    for name in ("covariance", "prior_covariance"):
        rows = state.get(name)
        if not isinstance(rows, list) or len(rows) != size:
            raise ValueError(f"{field}.{name} must be a {size} x {size} matrix of numbers")
        for index, row in enumerate(rows):
            _numbers(row, f"{field}.{name}[{index}]", size)
    noise = finite_number(state.get("noise_variance"))
    if noise is None or not noise > 0.0:
        raise ValueError(
            f"{field}.noise_variance must be a positive number, got "
            f"{state.get('noise_variance')!r:.40}"
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
        limit = finite_number(state.get("power_limit_w"))
        if limit is None or not limit > 0.0:
            raise ValueError(
                f"model.power_limit_w must be a positive number, got "
                f"{state.get('power_limit_w')!r:.40}"
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
        thermal = _regression(state.get("thermal"), "model.thermal", 3)
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


def set_aside(path: Path, now: Callable[[], float] = time.time, tag: str = "corrupt") -> Path:
    """Rename a file out of the way, kept (``<name>.<tag>-<UTC time>``: a refused file for
    inspection, ``other`` a model for another GPU or served model); return the new path.
    A name already taken (two set aside in one second: a served model going A, B, A) gets
    a count (``-2``, ``-3``, ...), so no kept file is ever overwritten (one daemon holds a
    state directory: its lock file)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now()))
    target = path.with_name(f"{path.name}.{tag}-{stamp}")
    count = 1
    while target.exists() or target.is_symlink():
        count += 1
        target = path.with_name(f"{path.name}.{tag}-{stamp}-{count}")
    os.replace(path, target)
    return target


class PersistentOnlineModel(ControllerWrapper):
    """Wraps an :class:`OnlineMPCController`: restores its model from the state file on
    the first observation (or when the served model changes), saves it every
    ``save_every_s`` of observation time and on :meth:`close`. Storage trouble is logged,
    never raised.

    ``gpu_names`` are the GPUs' NVML names in the order of ``gpu_uuids`` (stored with the
    model for ``gpugov model export`` to name the board; empty: none known, none stored).

    The key is the domain's GPU UUIDs and the engine's ``model_name``. A ``model_name`` of
    None (the engine's first scrape has not come in, or the engine labels no model) is
    *unknown*, not another model: it matches a stored model of the same GPUs, and the
    first real name is adopted. The model is learned anew only when the GPUs or the
    engine's real ``model_name`` differ from the stored ones.

    Only a model that learned at least one window is saved, so an empty model never
    replaces a stored one; a deep copy (a probe, such as a dummy decision) neither reads
    nor writes the state file.
    """

    inner: OnlineMPCController

    def __init__(
        self,
        inner: OnlineMPCController,
        directory: Path,
        domain: str,
        gpu_uuids: Sequence[str],
        *,
        gpu_names: Sequence[str] = (),
        save_every_s: float = SAVE_EVERY_S,
        write_deadline_s: float = WRITE_DEADLINE_S,
        read_deadline_s: float = READ_DEADLINE_S,
    ) -> None:
        super().__init__(inner)
        self.path = model_path(directory, domain)
        self._writer = LatestWriter(self._write_file, write_deadline_s, name=f"model-{domain}")
        # Read at the first observation and once a save period while unreadable: no
        # thread kept between reads.
        self._reader: LatestReader[dict[str, Any]] = LatestReader(
            self._read_file, read_deadline_s, name=f"model-{domain}", idle_s=0.0
        )
        self.gpu_uuids = tuple(str(u) for u in gpu_uuids)
        self.messages: list[str] = []
        self.gpu_names = self._names_to_store([str(name) for name in gpu_names])
        """The GPUs' names as the state file keeps them (the key's UUID order), or None."""
        self.save_every_s = float(save_every_s)
        self.key: ModelKey | None = None
        self.persist = True
        self._last_save_s = -math.inf
        self.save_failed = False
        self._unreadable = False
        """The state file was there but could not be read: nothing is saved over it, and
        each save period reads it again (restored once it can be)."""
        """Whether the last write failed (logged): it is tried again a save period later,
        not at every tick."""
        self._last_observation: ServingObservation | None = None
        self.restored = False
        self._settled_name = SettledName()
        self.__name__ = inner.__name__

    def __deepcopy__(self, memo: dict[int, Any]) -> PersistentOnlineModel:
        """A copy that never touches the state file (a probe, such as a dummy decision)."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            setattr(clone, name, copy.deepcopy(value, memo))
        clone.persist = False
        return clone

    def _say(self, level: int, message: str) -> None:
        log.log(level, message)
        self.messages.append(message)
        del self.messages[:-20]

    def _names_to_store(self, names: list[str]) -> tuple[str, ...] | None:
        """``names`` (one per GPU of ``gpu_uuids``) in the key's UUID order, or None where
        none are given or they are not one storable name per GPU (one line says which:
        the loader would call them damaged)."""
        if not names:
            return None
        problem = gpu_names_problem(names, len(self.gpu_uuids))
        if problem is not None:
            self._say(
                logging.WARNING,
                f"{self.path}: the GPUs' names are not kept with the model: {problem}",
            )
            return None
        ordered = sorted(zip(self.gpu_uuids, names, strict=True), key=lambda pair: pair[0])
        return tuple(name for _, name in ordered)

    def _keep_aside(self) -> str:
        """Keep the state file aside whole as another node's (``.other-*``); say where,
        or why it could not be."""
        try:
            return f"kept as {set_aside(self.path, tag='other').name}"
        except OSError as error:
            return f"could not keep it aside ({error}): the next save replaces it"

    def _set_aside(self, reason: str) -> None:
        try:
            aside = set_aside(self.path)
            where = f"; set aside as {aside.name}"
        except OSError as rename_error:
            where = f"; could not set it aside: {rename_error}"
        self._say(logging.WARNING, f"learned model refused: {reason}{where}; learning anew")

    def _restore(self, observation: ServingObservation) -> None:
        """Start from the stored model when its key fits ``self.key`` (a name still
        unknown on either side fits any); adopt the stored name when ours is unknown."""
        key = self.key
        assert key is not None
        if not self.persist:
            return
        if self._writer.busy:
            # A save still running (a hung disk): what the file will hold is not known
            # until it ends, and a rename here could be overtaken by it. Nothing is saved
            # over the file meanwhile; each save period looks again.
            if not self._unreadable:
                self._say(
                    logging.WARNING,
                    f"{self.path}: an earlier save has not finished (a hung disk or mount); "
                    f"not read now; learning anew without saving, and read again every "
                    f"{self.save_every_s:g} s once that save has ended",
                )
            self._unreadable = True
            return
        try:
            payload = self._read_stored()
        except FileNotFoundError:
            if self._take_back(key, observation.supported_clocks_mhz):
                self._restore(observation)
            return
        except UnreadableStateError as error:
            # Its permissions or the disk, not its content: left as it is, and nothing is
            # saved over it (a save replaces the file whatever its mode) while it stays so.
            if not self._unreadable:
                self._say(
                    logging.WARNING,
                    f"{error}; not applied and left as it is; learning anew without "
                    f"saving, and read again every {self.save_every_s:g} s: once it can "
                    "be read (its permissions fixed, the disk back) it is restored",
                )
            self._unreadable = True
            return
        except OtherVersionError as error:
            # Another gpugov's model (a rollback, or a node upgraded and back): kept
            # aside whole, never called corrupt; that gpugov reads it again.
            kept = self._keep_aside()
            self._say(
                logging.WARNING,
                f"{error} (written by another gpugov); not applied; {kept}; learning anew",
            )
            return
        except StoredModelError as error:
            self._set_aside(str(error))
            return
        stored = ModelKey(
            tuple(str(u) for u in payload["key"]["gpu_uuids"]), payload["key"].get("model_name")
        )
        clocks = observation.supported_clocks_mhz
        if not stored.fits(key) and self._take_back(key, clocks):
            self._restore(observation)
            return
        if stored.fits(key) and not _same_clocks(payload["model"]["clocks_mhz"], clocks):
            # Another GPU kind behind the same UUIDs: another node's model, not a corrupt
            # one; kept aside whole (a model kept for these clocks comes back instead).
            # (A name still unknown here is the stored one's, as a restore would adopt.)
            if self._take_back(
                ModelKey(key.gpu_uuids, key.model_name or stored.model_name), clocks
            ):
                self._restore(observation)
                return
            kept = f"; {self._keep_aside()}"
            self._say(
                logging.INFO,
                f"{self.path}: stored model was learned on other supported clocks "
                f"({_clock_range(payload['model']['clocks_mhz'])}, this GPU "
                f"{_clock_range(clocks)}); not applied{kept}; learning anew",
            )
            return
        if not stored.fits(key):
            # Kept aside, not left to be overwritten by the first save of the model
            # learned anew: a node moved back (another GPU, the old model served again)
            # can have it back by renaming it.
            kept = f"; {self._keep_aside()}"
            self._say(
                logging.INFO,
                f"{self.path}: stored model is for {stored.as_dict()}, this node is "
                f"{key.as_dict()}; not applied{kept}; learning anew",
            )
            return
        try:
            self.inner.restore(payload["model"], observation)
        except SettingsRefuseModel as error:
            # The controller's settings, not the file: kept whole (never named corrupt,
            # never overwritten by the model learned anew).
            kept = self._keep_aside()
            self._say(
                logging.WARNING,
                f"{self.path}: learned model not applied: {error} (the controller's "
                f"settings, not the file); {kept}; learning anew",
            )
            return
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            self._set_aside(f"{self.path}: {error}")
            return
        if key.model_name is None and stored.model_name is not None:
            key = self.key = stored
        self.inner.model_name = key.model_name
        self.restored = True
        model = self.inner.model
        counts = (
            "no samples"
            if model is None
            else f"{model.time.samples} latency, {model.power.samples} power and "
            f"{model.thermal.samples} thermal samples"
        )
        # The latency count is the one `gpugov model show` calls samples.
        self._say(logging.INFO, f"{self.path}: learned model restored ({counts})")
        try:
            stored_gpu_names(payload)
        except ValueError as error:
            # Only `model export` reads them: the model is the node's all the same.
            self._say(
                logging.WARNING,
                f"{self.path}: {error}; left out (the model is restored, and the next save "
                "writes this node's GPU names)",
            )
        self._restore_budget(payload, observation)

    def _restore_budget(self, payload: dict[str, Any], observation: ServingObservation) -> None:
        """Go on measuring the SLO window the stored run measured (its misses and its
        looseness) where the file holds it, from this boot (a reboot restarts the engine
        and its counters) and within the window
        (:meth:`controllers.budget.AttainmentBudget.load_state`, its times moved from the
        stored run's clock to this one's by the wall clock's time since the save); a
        part it cannot read is one log line, never the model's loss."""
        budget = self.inner.budget
        state = payload.get("slo_budget")
        clock = payload.get("clock")
        saved_at = finite_number(payload.get("saved_at_unix_s"))
        if budget is None or state is None or saved_at is None or not isinstance(clock, dict):
            return
        then = finite_number(clock.get("time_s"))
        boot = finite_number(clock.get("boot_unix_s"))
        if then is None or boot is None or abs(boot - boot_unix_s()) > SAME_BOOT_TOLERANCE_S:
            return  # another boot, or no clock to place the window on: a new window
        now_unix = time.time()
        shift = observation.time_s - (now_unix - saved_at) - then
        try:
            applied = budget.load_state(state, observation.time_s, shift)
        except ValueError as error:
            self._say(logging.WARNING, f"{self.path}: SLO budget not applied: {error}")
            return
        if applied:
            self._say(
                logging.INFO,
                f"{self.path}: SLO budget window restored (looseness {budget.looseness:.2f})",
            )

    def _take_back(self, key: ModelKey, clocks: Sequence[float]) -> bool:
        """Put back, as the state file, the newest model kept aside for exactly ``key``
        and learned on ``clocks`` (``.other-*``: the served model went A, B, A, or the GPUs
        or GPU kind moved back), the current file kept aside in its place; False where
        none is kept (a name still unknown has no model of its own). Only the
        :data:`KEPT_LOOKED_AT` newest kept files are read."""
        if key.model_name is None:
            return False
        kept = sorted(
            self.path.parent.glob(f"{self.path.name}.other-*"),
            key=lambda candidate: candidate.stat().st_mtime if candidate.exists() else 0.0,
            reverse=True,
        )
        for candidate in kept[:KEPT_LOOKED_AT]:
            try:
                payload = read_stored(candidate)
            except (OSError, StoredModelError):
                continue
            stored = ModelKey(
                tuple(str(u) for u in payload["key"]["gpu_uuids"]),
                payload["key"].get("model_name"),
            )
            if stored != key or not _same_clocks(payload["model"]["clocks_mhz"], clocks):
                continue
            try:
                if self.path.exists():
                    set_aside(self.path, tag="other")
                os.replace(candidate, self.path)
            except OSError as error:
                self._say(
                    logging.WARNING,
                    f"{candidate}: the model kept for {key.as_dict()} could not be put "
                    f"back ({error}); learning anew",
                )
                return False
            self._say(logging.INFO, f"{self.path}: put back the model kept as {candidate.name}")
            return True
        return False

    def save(self, *, final: bool = False) -> bool:
        """Write the model now; False when there is nothing learned to write (or this is
        a non-persisting copy), or when the write failed (logged; ``final``: the last
        try, at shutdown, said as such)."""
        model = self.inner.model
        if not self.persist or model is None or self.key is None:
            return False
        if self._unreadable and not self._read_again():
            return False
        model = self.inner.model
        if model is None:
            return False
        if learned_windows(self.inner) == 0:
            return False  # never replace a stored model with an empty one
        observation = self._last_observation
        payload = {
            "format": FORMAT,
            "version": MODEL_VERSION,
            "key": self.key.as_dict(),
            "saved_at_unix_s": time.time(),
            "slos": {
                "ttft_slo_s": None if observation is None else observation.ttft_slo_s,
                "tpot_slo_s": None if observation is None else observation.tpot_slo_s,
                "thermal_limit_c": None if observation is None else observation.thermal_limit_c,
            },
            "mean_prompt_tokens": self.inner.mean_prompt_tokens,
            "mean_output_tokens": self.inner.mean_output_tokens,
            "control_period_s": self.inner.control_period_s,
            "status": json_safe(self.inner.status()),
            "model": model.state_dict(),
        }
        if self.gpu_names is not None:
            payload["gpu_names"] = list(self.gpu_names)
        if self.inner.budget is not None and observation is not None:
            payload["slo_budget"] = json_safe(self.inner.budget.state_dict())
            payload["clock"] = {"time_s": observation.time_s, "boot_unix_s": boot_unix_s()}
        problem = self._unsaveable(payload)
        if problem is not None:
            self._roll_back(problem, final=final)
            return False
        try:
            self._writer.write(payload, FINAL_SAVE_WAIT_S if final else None)
        except (OSError, ValueError) as error:  # WriteTimeout too: the write goes on
            self.save_failed = True
            again = (
                "not saved: the model learned since the last save is lost"
                if final
                else f"tried again in {self.save_every_s:g} s"
            )
            self._say(
                logging.WARNING,
                f"{self.path}: cannot save the learned model: {error} ({again})",
            )
            return False
        self.save_failed = False
        return True

    def _write_file(self, payload: dict[str, Any]) -> None:
        """The worker's write of ``payload`` (the temporary file, fsync, rename)."""
        write_json_atomic(self.path, payload)

    def _read_file(self) -> dict[str, Any]:
        """The worker's read of the state file (:func:`read_stored`)."""
        return read_stored(self.path)

    def _read_stored(self) -> dict[str, Any]:
        """:func:`read_stored` of the state file on the reader's worker thread, within
        its deadline: a read that has not answered by then, or that still runs, is a file
        that cannot be read.

        Raises:
            FileNotFoundError, UnreadableStateError, StoredModelError: as
                :func:`read_stored`.
        """
        try:
            return self._reader.read()
        except ReadTimeout as error:
            raise UnreadableStateError(f"{self.path}: cannot read state file: {error}") from error

    def _read_again(self) -> bool:
        """Read a state file that could not be read again: False while it still cannot;
        else it is restored as at a start (or kept aside where it is another node's) and
        saving resumes."""
        if self._writer.busy:
            return False  # an earlier save still runs (a hung disk): not read meanwhile
        try:
            self._read_stored()
        except UnreadableStateError:
            return False
        except (FileNotFoundError, StoredModelError):
            pass  # gone or damaged meanwhile: the restore below says which
        self._unreadable = False
        observation = self._last_observation
        if observation is not None:
            self._say(logging.INFO, f"{self.path}: can be read again")
            self._restore(observation)
        return not self._unreadable

    def _unsaveable(self, payload: dict[str, Any]) -> str | None:
        """Why the loader would refuse ``payload`` (its own checks, and the latencies
        :meth:`OnlineModel.load_state` checks), or None."""
        problem = payload_problem(json_safe(payload))
        model = self.inner.model
        if problem is None and model is not None and model.time.samples > 0:
            try:
                model.check_latencies()
            except ValueError as error:
                problem = str(error)
        return problem

    def _roll_back(self, problem: str, *, final: bool) -> None:
        """The model learned a state its loader refuses: the last good file is kept, and
        the model goes back to it (learned anew where there is none). One line."""
        if final or self._last_observation is None:
            self._say(
                logging.WARNING,
                f"{self.path}: learned model not saved: {problem} (the loader would refuse "
                "it); the last good file is kept",
            )
            return
        self._say(
            logging.WARNING,
            f"{self.path}: learned model not saved: {problem} (the loader would refuse it); "
            "the last good file is kept and the model goes back to it",
        )
        observation = self._last_observation
        self.restored = False
        self.inner.reset(observation)
        self.inner.model_name = None if self.key is None else self.key.model_name
        self._restore(observation)

    def _follow_key(self, observation: ServingObservation) -> None:
        """Restore on the first observation; re-learn when the served model changes (a
        new name that has held a few observations: :class:`SettledName`)."""
        if self.key is None:
            name = observation.model_name
            self.key = ModelKey(self.gpu_uuids, name)
            self._restore(observation)
            return
        name = self._settled_name.update(observation.model_name, self.key.model_name)
        if name is None or name == self.key.model_name:
            return
        if self.key.model_name is None:
            # The engine's first real name: the same model as far as we know.
            self.key = ModelKey(self.gpu_uuids, name)
            self.inner.model_name = name
            return
        self.save()  # the old model's last state, before it is reset
        self._say(
            logging.INFO,
            f"{self.path}: the engine now serves {name!r} (was {self.key.model_name!r})",
        )
        self.key = ModelKey(self.gpu_uuids, name)
        self.restored = False
        self.inner.reset(observation)
        self.inner.model_name = name
        self._restore(observation)

    def __call__(self, observation: ServingObservation) -> float:
        self._follow_key(observation)
        self._last_observation = observation
        decision = self.inner(observation)
        due = observation.time_s - self._last_save_s >= self.save_every_s
        # A write that failed waits a save period as one that worked does (a read-only or
        # full disk logged one line a tick).
        if due and (self.save() or self.save_failed or self._unreadable):
            self._last_save_s = observation.time_s
        return decision

    def close(self) -> None:
        """Save on shutdown (when there is anything learned), then close the inner one."""
        self.save(final=True)
        super().close()

    def diagnostics(self) -> MPCDiagnostics:
        """The inner controller's diagnostics."""
        return self.inner.diagnostics()

    def status(self) -> dict[str, Any]:
        """The inner controller's learning status."""
        return self.inner.status()

    @property
    def fallback_reasons(self) -> dict[str, int]:
        """The inner MPC's fallbacks by reason."""
        return self.inner.fallback_reasons


SAME_BOOT_TOLERANCE_S = 5.0
"""Most disagreement between two readings of the boot time (the wall clock less the
monotonic clock) for both to be of one boot: NTP steps the wall clock by less."""


def boot_unix_s() -> float:
    """When this machine booted, on the wall clock (the wall clock less the monotonic
    clock, which starts at boot): a stored SLO window is of this boot where it matches."""
    return time.time() - time.monotonic()


def _same_clocks(stored: Sequence[float], node: Sequence[float]) -> bool:
    """Whether a stored model's clocks (ascending, checked by :func:`read_stored`) are the
    node's supported clocks (any order); True where the node lists too few to tell (the
    controller refuses such an observation itself)."""
    ours = sorted({float(clock) for clock in node})
    if len(ours) < 2:
        return True
    return len(ours) == len(stored) and all(
        math.isclose(float(a), b, rel_tol=1e-9, abs_tol=1e-6)
        for a, b in zip(stored, ours, strict=True)
    )


def _clock_range(clocks: Sequence[float]) -> str:
    """``N clocks, LOW-HIGH MHz`` for a log line."""
    values = [float(clock) for clock in clocks]
    if not values:
        return "no clocks"
    return f"{len(values)} clocks, {min(values):g}-{max(values):g} MHz"


def learned_windows(controller: OnlineMPCController) -> int:
    """Windows the controller's model has folded in (latency, power and thermal fits;
    0 when it has none)."""
    model = controller.model
    if model is None:
        return 0
    return int(model.time.samples + model.power.samples + model.thermal.samples)


__all__ = [
    "FORMAT",
    "MAX_GPU_NAME_CHARS",
    "ModelKey",
    "PersistentOnlineModel",
    "StoredModelError",
    "UnreadableStateError",
    "gpu_names_problem",
    "learned_windows",
    "model_path",
    "model_state_problem",
    "payload_problem",
    "read_stored",
    "set_aside",
    "stored_gpu_names",
]
