"""``mpc-online``'s learned model kept in the state directory: when it is restored, saved,
kept aside or put back (:class:`PersistentOnlineModel`); the file: :mod:`daemon.stored_model`;
the SLO budget window stored with it: :mod:`daemon.stored_slo_window`."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpugov.controllers.contract import ControllerWrapper
from gpugov.controllers.online.controller import OnlineMPCController, SettingsRefuseModel
from gpugov.controllers.online.identification import MODEL_VERSION
from gpugov.controllers.online.model_names import SettledName
from gpugov.daemon.deadline import (
    EXIT_WRITE_WAIT_S,
    READ_DEADLINE_S,
    WRITE_DEADLINE_S,
    LatestReader,
    LatestWriter,
    ReadTimeout,
)
from gpugov.daemon.files import json_safe, remove_left_temporaries, write_json_atomic
from gpugov.daemon.limits import MAX_PERIOD_S, MIN_PERIOD_S
from gpugov.daemon.stored_model import (
    FORMAT,
    OtherVersionError,
    StoredModelError,
    UnreadableStateError,
    gpu_names_problem,
    model_path,
    payload_problem,
    read_stored,
    stored_gpu_names,
    stored_role,
)
from gpugov.daemon.stored_slo_window import (
    boot_unix_s,
    budget_terms,
    counted_on,
    counter_base,
    restore_window,
)
from gpugov.plant.input_files import finite_number
from gpugov.plant.types import MPCDiagnostics, ServingObservation

log = logging.getLogger("gpugov.model")

SAVE_EVERY_S = 60.0
FINAL_SAVE_WAIT_S = EXIT_WRITE_WAIT_S
"""How long the final save at exit waits for its write (the clocks are reset by then): a
slow disk still gets the last minute's learning."""
KEPT_LOOKED_AT = 16
"""Kept-aside models (``.other-*``, newest first) read when the served model or the GPUs
change, for one learned on exactly this key before."""


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


def set_aside(path: Path, now: Callable[[], float] = time.time, tag: str = "corrupt") -> Path:
    """Rename a file out of the way, kept (``<name>.<tag>-<UTC time>``: a refused file for
    inspection, ``other`` a model for another GPU or served model); return the new path.
    A name already taken (two set aside in one second: a served model going A, B, A) gets
    a count (``-2``, ``-3``, ...), so no kept file is ever overwritten (one daemon holds a
    state directory: its lock file). Only the :data:`KEPT_LOOKED_AT` newest of a tag are
    kept, this one always among them: the older ones are never read again, and a daemon
    whose served model is renamed at every deploy filled its state directory."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now()))
    target = path.with_name(f"{path.name}.{tag}-{stamp}")
    count = 1
    while target.exists() or target.is_symlink():
        count += 1
        target = path.with_name(f"{path.name}.{tag}-{stamp}-{count}")
    os.replace(path, target)
    others = [kept for kept in kept_aside(path, tag) if kept != target]
    for oldest in _newest_first(others)[KEPT_LOOKED_AT - 1 :]:
        with contextlib.suppress(OSError):  # one that cannot go is tried again next time
            oldest.unlink()
    return target


def kept_aside(path: Path, tag: str) -> list[Path]:
    """The files :func:`set_aside` kept of ``path`` under ``tag``: exactly
    ``<name>.<tag>-<UTC time>[-count]``, not another domain's whose name begins like it
    (a domain ``a.json.other-x`` beside ``a``: a pattern would take its files for
    ``a``'s, and the pruning deleted them)."""
    pattern = re.compile(re.escape(f"{path.name}.{tag}-") + r"\d{8}T\d{6}Z(?:-\d+)?")
    return [
        kept for kept in path.parent.glob(f"{path.name}.{tag}-*") if pattern.fullmatch(kept.name)
    ]


READ_ONLY_LEFT = "left as it is (a dry run writes nothing)"
"""What a read-only store says of a file it does not apply."""


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
    nor writes the state file. ``read_only`` (a dry run) restores the stored model and
    writes nothing: no save, and a file it cannot apply is left where it is.
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
        read_only: bool = False,
    ) -> None:
        super().__init__(inner)
        self.read_only = read_only
        """Restore, never write (a dry run beside the node's daemon: its saves replaced
        the daemon's model, and its set-asides moved the daemon's file)."""
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
        self._counter_base: tuple[float | None, ...] | None = None
        """What the SLO counters the controller sees start from (``ttft`` within and count,
        ``tpot`` within and count): the restored window's last snapshot, where this run's
        counters start again (a node's are its own, from zero at each start)."""
        self.restored = False
        self._name_adopted = False
        """The key's model name is the stored file's, adopted while the engine named none
        (no real name seen since)."""
        self._temporaries_checked = False
        """Whether the temporary files an interrupted save left were looked for."""
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
        if self.read_only:
            return READ_ONLY_LEFT
        try:
            return f"kept as {set_aside(self.path, tag='other').name}"
        except OSError as error:
            return f"could not keep it aside ({error}): the next save replaces it"

    def _set_aside(
        self,
        reason: str,
        key: ModelKey | None = None,
        observation: ServingObservation | None = None,
    ) -> bool:
        """Set a refused state file aside as corrupt, one line; with ``key`` and
        ``observation``, put back the model kept for them in its place
        (:meth:`_take_back_in_place`) and return whether one was (else the model is
        learned anew)."""
        if self.read_only:
            self._say(
                logging.WARNING, f"learned model refused: {reason}; {READ_ONLY_LEFT}; learning anew"
            )
            return False
        try:
            aside = set_aside(self.path)
            where = f"; set aside as {aside.name}"
        except OSError as rename_error:
            where = f"; could not set it aside: {rename_error}"
        taken = (
            key is not None
            and observation is not None
            and self._take_back_in_place(key, observation)
        )
        then = "" if taken else "; learning anew"
        self._say(logging.WARNING, f"learned model refused: {reason}{where}{then}")
        return taken

    def _take_back_in_place(self, key: ModelKey, observation: ServingObservation) -> bool:
        """:meth:`_take_back` once the state file was moved out of the way (refused, or
        another gpugov's): a damaged file, or a rollback past the gpugov that kept this
        one's model aside, had the kept model learned anew, and the first save then made
        it unreachable (a state file that fits the key is never put back over)."""
        if self.read_only or self.path.exists() or self.path.is_symlink():
            return False
        return self._take_back(key, observation)

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
        clocks = observation.supported_clocks_mhz
        try:
            payload = self._read_stored()
        except FileNotFoundError:
            self._remove_left_temporaries()
            if self._take_back(key, observation):
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
            taken = self._take_back_in_place(key, observation)
            self._say(
                logging.WARNING,
                f"{error} (written by another gpugov); not applied; {kept}"
                + ("" if taken else "; learning anew"),
            )
            if taken:
                self._restore(observation)
            return
        except StoredModelError as error:
            if self._set_aside(str(error), key, observation):
                self._restore(observation)
            return
        self._remove_left_temporaries()
        stored = ModelKey(
            tuple(str(u) for u in payload["key"]["gpu_uuids"]), payload["key"].get("model_name")
        )
        if not stored.fits(key) and self._take_back(key, observation):
            self._restore(observation)
            return
        if stored.fits(key) and not _same_clocks(payload["model"]["clocks_mhz"], clocks):
            # Another GPU kind behind the same UUIDs: another node's model, not a corrupt
            # one; kept aside whole (a model kept for these clocks comes back instead).
            # (A name still unknown here is the stored one's, as a restore would adopt.)
            if self._take_back(
                ModelKey(key.gpu_uuids, key.model_name or stored.model_name), observation
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
            # With the file out of the way, another domain's model of exactly this key is
            # this one's (two domains' names swapped: each name's file held the other's).
            taken = self._take_back_in_place(key, observation)
            self._say(
                logging.INFO,
                f"{self.path}: stored model is for {stored.as_dict()}, this node is "
                f"{key.as_dict()}; not applied{kept}" + ("" if taken else "; learning anew"),
            )
            if taken:
                self._restore(observation)
            return
        role = stored_role(payload)
        if role != observation.role:
            # Learned in another pool role (a prefill pool learns no decode latency): not
            # corrupt, and not this domain's; kept aside whole, as another node's, and a
            # model kept for this role comes back instead.
            if self._take_back(
                ModelKey(key.gpu_uuids, key.model_name or stored.model_name), observation
            ):
                self._restore(observation)
                return
            self._say(
                logging.INFO,
                f"{self.path}: stored model was learned in a {role} pool, this domain is "
                f"{observation.role}; not applied; {self._keep_aside()}; learning anew",
            )
            return
        model_state = self._at_this_period(payload)
        try:
            self.inner.restore(model_state, observation)
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
            self._name_adopted = True
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

    def _at_this_period(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The stored model with its thermal fit (``T' = a T + b + c P`` per window) moved
        to this run's control period where it was learned at another: the time constant
        is counted in windows, so a period changed 1 s -> 0.25 s made it 4x shorter."""
        state: dict[str, Any] = payload["model"]
        stored = finite_number(payload.get("control_period_s"))
        period = float(self.inner.control_period_s)
        if stored is None or not MIN_PERIOD_S <= stored <= MAX_PERIOD_S:
            return state  # unknown (saved before it was kept, or hand-edited): as it is
        if math.isclose(stored, period, rel_tol=1e-9):
            return state
        thermal = state["thermal"]
        a, b, c = (float(value) for value in thermal["mean"])
        if not 0.0 < a < 1.0:
            return state  # no RC fit yet: nothing per window to convert
        ratio = period / stored
        converted = a**ratio
        scale = (1.0 - converted) / (1.0 - a)  # the same ambient and resistance
        gains = (ratio * a ** (ratio - 1.0), scale, scale)  # d(new)/d(stored), per parameter
        covariance = [
            [float(value) * gains[row] * gains[column] for column, value in enumerate(line)]
            for row, line in enumerate(thermal["covariance"])
        ]
        self._say(
            logging.INFO,
            f"{self.path}: the model was learned at a control period of {stored:g} s, this "
            f"run's is {period:g} s: its thermal fit (per control window) is converted",
        )
        mean = [converted, b * scale, c * scale]
        return {**state, "thermal": {**thermal, "mean": mean, "covariance": covariance}}

    def _restore_budget(self, payload: dict[str, Any], observation: ServingObservation) -> None:
        """Go on measuring the stored SLO budget window where it applies
        (:func:`daemon.stored_slo_window.restore_window`), this run's counters going on
        from its last snapshot where they start again. Not once this run's window has
        counted a request (the served model changed mid-run): the window is the domain's,
        whatever model it serves, and the stored one would drop its misses."""
        budget = self.inner.budget
        if budget is not None and budget.last is not None and budget.last.requests > 0:
            if payload.get("slo_budget") is not None:
                self._say(
                    logging.INFO,
                    f"{self.path}: SLO budget window not applied: this run's window has "
                    f"measured {budget.last.requests:g} requests, and goes on",
                )
            return
        snapshots = restore_window(
            self.inner.budget, payload, observation, path=self.path, say=self._say
        )
        if snapshots is not None and self._counter_base is None:
            self._counter_base = counter_base(snapshots, observation)

    def _take_back(self, key: ModelKey, observation: ServingObservation) -> bool:
        """Put back, as the state file, the newest model kept aside for exactly ``key``
        and learned on ``observation``'s supported clocks in its role (``.other-*``: the
        served model went A, B, A, or the GPUs, GPU kind or pool role moved back), the
        current file kept aside in its place; False where
        none is kept (a name still unknown has no model of its own). Another domain's
        state file for exactly ``key`` and ``clocks`` is taken over the same way: the
        domain was renamed in the config, and its model was learned anew under the new
        name while the old file sat unread. Only the :data:`KEPT_LOOKED_AT` newest kept
        files, and as many other domains' files, are read (none when ``read_only``:
        putting one back moves files)."""
        if key.model_name is None or self.read_only:
            return False
        clocks = observation.supported_clocks_mhz
        kept = _newest_first(kept_aside(self.path, "other"))
        # Another domain's state file holding exactly this key: the same domain renamed in
        # the config (no two domains share a GPU, so it is no live domain's model). Looked
        # for only while this domain has no file of its own (a rename's first start): each
        # read is a few milliseconds on the loop's thread.
        renamed = (
            []
            if self.path.exists()
            else _newest_first(
                candidate
                for candidate in self.path.parent.glob("online-model-*.json")
                if candidate.name != self.path.name and _domain_file(candidate.name)
            )
        )
        # ... and what another domain kept aside (its name swapped with this one's: it kept
        # this domain's GPUs' model aside as another node's before this domain looked).
        renamed += (
            []
            if self.path.exists()
            else _newest_first(
                candidate
                for candidate in self.path.parent.glob("online-model-*.json.other-*")
                if not candidate.name.startswith(f"{self.path.name}.")
                and _domain_file(candidate.name.split(".other-", 1)[0])
            )[:KEPT_LOOKED_AT]
        )
        for candidate in kept[:KEPT_LOOKED_AT] + renamed[:KEPT_LOOKED_AT]:
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
            if stored_role(payload) != observation.role:
                continue
            if candidate in renamed and not _named_by_uuid(stored):
                # GPUs keyed by index (nvidia-smi, a simulated run's "0") name no board: a
                # simulated run's model saved beside the node's is not this node's.
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
            if candidate in renamed:
                domain = candidate.name.split(".other-", 1)[0]
                domain = domain.removeprefix("online-model-").removesuffix(".json")
                self._say(
                    logging.INFO,
                    f"{self.path}: took over the model of domain {domain!r} "
                    f"({candidate.name}): the same GPUs and served model (a domain renamed)",
                )
            else:
                self._say(logging.INFO, f"{self.path}: put back the model kept as {candidate.name}")
            return True
        return False

    def save(self, *, final: bool = False) -> bool:
        """Write the model now; False when there is nothing learned to write (or this is
        a non-persisting copy or a read-only store), or when the write failed (logged;
        ``final``: the last try, at shutdown, said as such)."""
        model = self.inner.model
        if not self.persist or self.read_only or model is None or self.key is None:
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
            # The loader checks a prefill pool's model by its prefill latency alone.
            "role": "colocated" if observation is None else observation.role,
            "status": json_safe(self.inner.status()),
            "model": model.state_dict(),
        }
        if self.gpu_names is not None:
            payload["gpu_names"] = list(self.gpu_names)
        if self.inner.budget is not None and observation is not None:
            payload["slo_budget"] = json_safe(self.inner.budget.state_dict())
            payload["slo_budget_terms"] = json_safe(budget_terms(self.inner.budget, observation))
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
                model.check_latencies(stored_role(payload) or "colocated")
            except ValueError as error:
                problem = str(error)
        return problem

    def _roll_back(self, problem: str, *, final: bool) -> None:
        """The model learned a state its loader refuses: the last good file is kept, and
        the model goes back to it (learned anew where there is none). One line. A model in
        its warm-up is only not saved: it goes on learning."""
        if final or self._last_observation is None:
            self._say(
                logging.WARNING,
                f"{self.path}: learned model not saved: {problem} (the loader would refuse "
                "it); the last good file is kept",
            )
            return
        model = self.inner.model
        if model is not None and not model.warmed_up:
            # A model in its warm-up has not seen enough to identify its top clock's
            # latencies (its first window may be prefill alone): it is not saved yet and
            # goes on learning; going back would throw its windows away at every try.
            log.debug("%s: learned model not saved yet (in its warm-up): %s", self.path, problem)
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

    def _remove_left_temporaries(self) -> None:
        """Remove the temporary files of saves a killed run left (a SIGKILL, a power
        loss or an exit under a slow disk between the write and its rename), one line:
        each was a whole model's size, and nothing removed them. Once a run, after a read
        of the state file answered (the directory is listed on the loop's thread: not on
        a disk that hangs); not by a read-only store or a copy, nor while a save runs."""
        if self._temporaries_checked or not self.persist or self.read_only or self._writer.busy:
            return
        self._temporaries_checked = True
        removed = remove_left_temporaries(self.path)
        if removed:
            self._say(
                logging.INFO,
                f"{self.path}: removed {len(removed)} temporary file(s) an interrupted save "
                f"left ({', '.join(removed[:3])}{', ...' if len(removed) > 3 else ''})",
            )

    def _can_take_back_now(self) -> bool:
        """Whether a model kept aside may be put back mid-run: none was restored, the
        store persists and writes, the file is not unreadable and no save is running."""
        return (
            not self.restored
            and self.persist
            and not self.read_only
            and not self._unreadable
            and not self._writer.busy
        )

    def _follow_key(self, observation: ServingObservation) -> None:
        """Restore on the first observation; re-learn when the served model changes (a
        new name that has held a few observations: :class:`SettledName`)."""
        if self.key is None:
            name = observation.model_name
            self.key = ModelKey(self.gpu_uuids, name)
            self._restore(observation)
            return
        # A name adopted from the file is a guess, not the engine's word: the engine's
        # first real name is taken at once, as a first name is (a stored model of another
        # served model otherwise decided the clock for the ticks a new name settles in).
        held = None if self._name_adopted else self.key.model_name
        name = self._settled_name.update(observation.model_name, held)
        if observation.model_name is not None:
            self._name_adopted = False
        if name is None or name == self.key.model_name:
            return
        if self.key.model_name is None:
            # The engine's first real name: the same model as far as we know.
            self.key = ModelKey(self.gpu_uuids, name)
            self.inner.model_name = name
            if self._can_take_back_now() and self._take_back(self.key, observation):
                # Nothing was restored while the name was unknown (no kept model can be
                # picked without it): a node whose daemon started before its engine
                # goes on from the model kept for this key, not one learned anew.
                self.inner.reset(observation)
                self.inner.model_name = name
                self._restore(observation)
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
        observation = counted_on(observation, self._counter_base)
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


def _named_by_uuid(key: ModelKey) -> bool:
    """Whether every GPU of ``key`` is named by an NVML UUID (``GPU-...``, ``MIG-...``),
    which names one board for good; an index does not."""
    return bool(key.gpu_uuids) and all(uuid.startswith(("GPU-", "MIG-")) for uuid in key.gpu_uuids)


def _domain_file(name: str) -> bool:
    """Whether ``name`` is the state file of a domain a config can name (a hand-made
    ``online-model-a<newline>b.json`` is none: its name would cut a log line in two)."""
    from gpugov.daemon.config import DOMAIN_NAME_PATTERN, MAX_DOMAIN_NAME_CHARS

    domain = name.removeprefix("online-model-").removesuffix(".json")
    return len(domain) <= MAX_DOMAIN_NAME_CHARS and bool(re.fullmatch(DOMAIN_NAME_PATTERN, domain))


def _newest_first(paths: Iterable[Path]) -> list[Path]:
    """``paths`` by their last change, newest first (one gone meanwhile: last)."""

    def changed(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(paths, key=changed, reverse=True)


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
    "ModelKey",
    "PersistentOnlineModel",
    "learned_windows",
    "set_aside",
]
