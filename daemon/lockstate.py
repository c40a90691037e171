"""What this daemon last locked, persisted so the next start can undo it after a crash.

NVML has no getter for a clock lock (``docs/nvml-notes.md`` 1.3), so a daemon that
was SIGKILLed, OOM-killed or lost power leaves no trace on the GPU that can be read back
exactly. :class:`LockState` keeps one small JSON file in the state directory (systemd's
``StateDirectory=`` gives ``$STATE_DIRECTORY``; Kubernetes mounts a hostPath there):

```json
{"version": 1, "gpus": {"GPU-8f2e...": {"gpu": "0", "min_mhz": 1410, "max_mhz": 1410,
                                     "pid": 4242, "time": "2026-11-30T10:00:00+00:00",
                                     "boot_id": "0f3c...", "start_ticks": 1234567}}}
```

``boot_id`` and ``start_ticks`` name the writing process for good with its pid
(:func:`process_identity`): whether it still runs is told by them, not by the wall clock.
A lock entry of an earlier boot holds no lock (a reboot resets clock locks) and is dropped
when the file is read (:func:`written_in_earlier_boot`).

An entry is written after every lock write and removed after every reset, keyed by the
GPU's UUID (indices can change across reboots). A power limit gpugov sets is kept beside
them, under ``"power_limits"``, written *before* the limit is (so a crash between the two
still leaves the limit to restore) and removed once the limit found before the first
write is back (:class:`daemon.power_limit.PowerLimitActuator`):

```json
"power_limits": {"GPU-8f2e...": {"gpu": "0", "original_mw": 700000, "set_mw": 300000,
                               "held_mw": 350000,
                               "pid": 4242, "time": "2026-11-30T10:00:00+00:00"}}
```

``held_mw``, when there, is the limit gpugov held before its last write, which the GPU
keeps if that write did not land (it hung, failed, or the process died first): the next
start takes either as gpugov's and restores ``original_mw``.

The file is replaced atomically (write to a temporary file, then ``os.replace``). A state
file that cannot be read, or a state directory that cannot be held, is logged once and
ignored: the daemon then reconciles from what NVML shows. A write that fails (a full
disk, a read-only or unwritable state directory) leaves the file out of date (``stale``):
it is counted (``write_failures``; ``gpugov_lock_state_write_failures_total`` and
``gpugov_lock_state_stale_active``), written again once per tick (:meth:`LockState.retry`)
until it goes through, and logged at most once a minute (the first failure, a reminder
while it lasts, and one line when the file is written again).

Writes run on a worker thread (:class:`daemon.deadline.LatestWriter`): the caller waits
for its write up to :data:`~daemon.deadline.WRITE_DEADLINE_S`, so the orders the record
keeps (a power limit's entry before the limit is set, a lock's after the lock) hold on a
working disk. A write still running past that (a hung disk or mount) leaves the file out
of date exactly as a failed write does; it goes on in the background, the newest record
is written once the disk answers (never an older one after it), and while it hangs
later writes do not wait at all. Each tick's retry counts it as a failed write while it
runs and takes the file as up to date once it has gone through, without writing it
again (on a disk slower than the deadline, a write again would run past it too). At the
exit's resets the writes are only handed over
(:meth:`LockState.defer_writes`), so no GPU's reset waits on the disk, and
:meth:`LockState.flush` then waits for the last one, within the same bound.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from gpugov.daemon.deadline import WRITE_DEADLINE_S, CallTimeout, LatestWriter, SerialCalls
from gpugov.daemon.episode_log import FailureRun
from gpugov.daemon.errors import ConfigError
from gpugov.daemon.files import (
    json_safe,
    loads_json,
    read_input_text,
    remove_left_temporaries,
    write_json_atomic,
)
from gpugov.daemon.limits import MAX_POWER_W
from gpugov.plant.input_files import finite_number

log = logging.getLogger(__name__)

STATE_FILE = "locks.json"
HOLD_FILE = "gpugov.lock"
"""The file a running daemon holds an exclusive ``flock`` on (:meth:`LockState.hold`)."""
NO_RECORD = object()
"""What :meth:`LockState._load` gives for a file that is missing or cannot be read."""
WRITE_FAILURE_LOG_EVERY_S = 60.0
"""While writes of the file keep failing, one reminder line per this many seconds."""
RECORD_VERSION = 1
"""The lock record's ``version`` this gpugov reads and writes."""
_SAID: set[tuple[str, ...]] = set()
"""The warnings about a lock record this process gave (its path, what): a command that
reads it once per GPU (``gpugov reset-clocks``, ``status``, a start's reconcile) says each
once, not once a read."""


def _first_time(*what: str) -> bool:
    """Whether this process has not yet given the warning ``what`` (and now has)."""
    if what in _SAID:
        return False
    _SAID.add(what)
    return True


class NewerLockRecord(ConfigError):
    """A lock record a later gpugov wrote (a higher ``version``): read as this one's, it
    was rewritten as version 1 without the fields this gpugov does not know."""


class StateDirectoryHeld(ConfigError):
    """Another process holds the state directory (:meth:`LockState.hold`): a running
    ``gpugov run``, or a ``gpugov profile`` keeping its locks there.

    Attributes:
        directory: the state directory.
        holder: who holds it, as its hold file names it: ``"pid 4242"``, or
            ``"pid unknown"``.
    """

    def __init__(self, message: str, directory: Path, holder: str) -> None:
        super().__init__(message)
        self.directory = directory
        self.holder = holder


def _held_elsewhere(handle: IO[str], directory: Path) -> StateDirectoryHeld:
    """The refusal of a state directory another process holds (its hold file ``handle``,
    closed here, names it by pid)."""
    try:
        handle.seek(0)
        holder = handle.read(32).strip()
    except (OSError, UnicodeDecodeError):
        holder = ""  # a hold file of other bytes (a device, a damaged file)
    handle.close()
    who = f"pid {holder}" if holder.isascii() and holder.isdigit() else "pid unknown"
    return StateDirectoryHeld(
        f"{directory}: another gpugov run ({who}) holds this state "
        "directory; run one daemon per node (or give each its own state_dir and GPUs)",
        directory,
        who,
    )


def refuse_if_held(directory: Path) -> None:
    """Raise the refusal a start on ``directory`` would get, where another process holds
    it now (:meth:`LockState.hold`); take nothing, make nothing. For a start refused on
    something else first that a running daemon explains (its metrics port, taken).

    Raises:
        StateDirectoryHeld: another process holds it.
    """
    import fcntl

    try:
        handle = open(directory / HOLD_FILE, encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError:
        return  # no hold file, or none that can be read: nothing to say here
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _held_elsewhere(handle, directory) from None
    except OSError:
        pass
    handle.close()  # its lock, if taken, goes with it


def model_hold_path(directory: Path, domain: str) -> Path:
    """The file :func:`hold_model_file` holds for domain ``domain``'s learned model."""
    return directory / f"online-model-{domain}.lock"


class _NoFileLock(OSError):
    """A hold file that was made but takes no ``flock`` (a filesystem without file
    locks: NFS without its lock daemon, ENOLCK)."""


def _held_file(path: Path) -> tuple[IO[str], OSError | None]:
    """``path`` (made, with its folder) held by this process: an exclusive ``flock``,
    which the kernel releases when the process ends, with this process's pid written in
    it unbuffered (a pid left in a buffer by a failed write would fail again at the
    release); and the error the pid's write met, where it did (held all the same: the
    flock is the hold, the pid only names the holder to a second run).

    Raises:
        StateDirectoryHeld: another process holds it (:func:`_held_elsewhere`).
        _NoFileLock: it takes no ``flock``.
        OSError: it cannot be made or opened.
    """
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held for the run)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _held_elsewhere(handle, path.parent) from None
    except OSError as error:
        handle.close()
        raise _NoFileLock(*error.args) from error
    try:
        os.ftruncate(handle.fileno(), 0)
        os.write(handle.fileno(), f"{os.getpid()}\n".encode())
    except OSError as error:
        return handle, error
    return handle, None


def hold_model_file(directory: Path, domain: str, name: str) -> IO[str] | None:
    """Hold domain ``domain``'s learned model in ``directory`` (where its ``mpc-online``
    keeps it) for this process: an exclusive ``flock`` on
    ``DIR/online-model-<domain>.lock`` with this process's pid in it, so that a second
    daemon with a domain of that name there (each with its own ``daemon.state_dir``, one
    model directory) does not set this one's model aside and overwrite it at every save.
    Returns the open hold file (closing it lets the model go); None where there is
    nothing to hold (the directory cannot be made, or takes no ``flock``: the model's own
    saves say what is wrong with it). ``name`` is the config field naming the directory.

    Raises:
        StateDirectoryHeld: another process holds it (named, with its pid).
    """
    try:
        # The pid only names the holder to a second run: one that cannot be written
        # leaves the model held all the same.
        handle, _ = _held_file(model_hold_path(directory, domain))
    except StateDirectoryHeld as held:
        raise StateDirectoryHeld(
            f"{name} {directory}: another gpugov run ({held.holder}) keeps domain "
            f"{domain!r}'s learned model here; give each daemon its own state_dir (or its "
            "domains other names)",
            directory,
            held.holder,
        ) from None
    except OSError:
        return None
    return handle


def _unlinked(handle: Any) -> bool:
    """Whether the open file ``handle`` has no name left (removed under this process)."""
    try:
        return os.fstat(handle.fileno()).st_nlink == 0
    except (OSError, ValueError):  # ValueError: closed meanwhile (released)
        return False


class LockState:
    """The locks this daemon holds, in ``DIR/locks.json``.

    Args:
        directory: the state directory (created if missing).
        pid: this process's id, stored with every entry.
        clock: monotonic seconds, for the rate-limited write-failure log.
        write_deadline_s: how long a write may hold its caller (:class:`LatestWriter`).

    Raises:
        NewerLockRecord: the file is of a higher version (left as it is).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        write_deadline_s: float = WRITE_DEADLINE_S,
    ) -> None:
        self.path = Path(directory) / STATE_FILE
        self.pid = os.getpid() if pid is None else pid
        self._identity = process_identity(self.pid)
        """The writer's boot and start time (:func:`process_identity`), stamped on each
        entry: which process wrote it, whatever the wall clock did since."""
        self._warned = False
        self.write_failures = 0
        """Writes of the file that failed, retries included
        (``gpugov_lock_state_write_failures_total``)."""
        self.stale = False
        """True while the file is out of date: its last write failed or is still running
        past its deadline (``gpugov_lock_state_stale_active``); :meth:`retry` writes it
        again."""
        self._clock = clock
        self._failures = FailureRun(WRITE_FAILURE_LOG_EVERY_S, clock)
        self._earlier_boot_said: set[str] = set()
        """The entries of an earlier boot already logged (:meth:`_lock_entries`)."""
        data = self._load()
        _refuse_newer(self.path, data)
        self._entries: dict[str, dict[str, Any]] = self._lock_entries(data)
        self._limits: dict[str, dict[str, Any]] = self._limit_entries(data)
        self._held: Any = None
        self._writer = LatestWriter(self._write_file, write_deadline_s, name="lock-state")
        self._hold_check = SerialCalls(
            write_deadline_s, name="lock-state-hold", cause="a hung disk or mount"
        )
        """Where :meth:`_hold_lost` looks at the hold file, within the write deadline."""
        self._written: set[tuple[bool, str]] = set()
        """The entries this process wrote, as ``(power limit, GPU key)``
        (:meth:`written_here`)."""
        self._deferred = False
        """Writes are handed over without waiting (:meth:`defer_writes`)."""
        self._unflushed = False
        """A write was handed over that :meth:`flush` has not waited for."""

    def hold(self) -> None:
        """Hold the state directory for this process: an exclusive ``flock`` on
        ``DIR/gpugov.lock``, which the kernel releases when the process ends, however it
        ends. A second daemon on the same state directory would reset the first one's live
        locks as a crash's leftovers and then fight it for the clocks. A directory where
        the file cannot be made, or locked (a filesystem without ``flock``), is warned
        about (as the lock record is) and not held; a file that is made but cannot take
        the pid (a full disk) is held, with one warning.

        Raises:
            StateDirectoryHeld: another process holds it (named, with its pid).
        """
        path = self.path.parent / HOLD_FILE
        try:
            handle, pid_error = _held_file(path)
        except _NoFileLock as error:
            # No lock to take here, not one held: read as held, with a pid a previous run
            # left in the file, every start was refused.
            log.warning(
                "lock state %s: cannot hold the state directory: %s cannot be locked (%s: a "
                "filesystem without file locks?); the lock record is kept all the same, but "
                "a second gpugov run on this directory is not refused",
                self.path,
                path,
                error,
            )
            return
        except OSError as error:
            self._warn("hold it", error)
            return
        if not self._writer.busy:
            # Held: no other run writes the record here. A record write a killed run left
            # between its temporary file and the rename is removed (nothing else did).
            removed = remove_left_temporaries(self.path)
            if removed:
                log.info(
                    "lock state %s: removed %d temporary file(s) an interrupted write left",
                    self.path,
                    len(removed),
                )
        if pid_error is not None:
            # Held all the same: a full disk, or a link to a device, ended the start in a
            # traceback before any GPU was opened.
            log.warning(
                "lock state %s: holds the state directory but cannot write its pid in %s "
                "(%s); a second gpugov run on it is refused without naming this one",
                self.path,
                path,
                pid_error,
            )
        self._held = handle

    def release(self) -> None:
        """Let the state directory go (:meth:`hold`; the process's end does it too)."""
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def _warn(self, action: str, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            if not _first_time(str(self.path), action, str(error)):
                return
            log.warning(
                "lock state %s: cannot %s (%s); a crash would leave no record of the "
                "locks, reconcile at start falls back to reading the clocks",
                self.path,
                action,
                error,
            )

    def _load(self) -> Any:
        """The file's parsed JSON: :data:`NO_RECORD` when it is missing, or unreadable
        (warned)."""
        try:
            if not self.path.exists():
                return NO_RECORD
            # A safety record: whatever it names is read (a key twice: the last value), as
            # a GPU it names as locked is restored even from a damaged record.
            return loads_json(read_input_text(self.path, "state"), unique_keys=False)
        except (OSError, ValueError) as error:
            self._warn("read it", error)
            return NO_RECORD

    def read(self) -> dict[str, dict[str, Any]]:
        """The entries on disk (empty when the file is missing or unreadable)."""
        return self._lock_entries(self._load())

    def _lock_entries(self, data: Any) -> dict[str, dict[str, Any]]:
        """The clock lock entries of the parsed file ``data``."""
        if data is NO_RECORD:
            return {}
        gpus = data.get("gpus") if isinstance(data, dict) else None
        if not isinstance(gpus, dict):
            self._warn("read it", ValueError("not a lock record: no 'gpus' object"))
            return {}
        entries = {}
        for key, entry in gpus.items():
            if not isinstance(entry, dict):
                continue
            if written_in_earlier_boot(entry):
                # A reboot resets every clock lock: adopted, the lock was taken as held
                # while the GPU ran unlocked, and the readback took that for someone
                # else's change (with external_clock_policy = "yield", the GPU was left
                # ungoverned for the run).
                if str(key) not in self._earlier_boot_said:
                    self._earlier_boot_said.add(str(key))
                    log.info(
                        "lock state %s: GPU %s: the lock a gpugov run (%s, %s) recorded "
                        "is of an earlier boot; a reboot resets clock locks, so it holds "
                        "none: dropped",
                        self.path,
                        key,
                        writer_pid_text(entry),
                        entry.get("time"),
                    )
                continue
            bad = _bad_field(entry)
            if bad is not None:
                # The GPU was locked by a run; only its clocks are unknown.
                log.log(
                    logging.WARNING
                    if _first_time(str(self.path), str(key), bad)
                    else logging.DEBUG,
                    "lock state %s: GPU %s: %s; its locked clocks are taken as unknown",
                    self.path,
                    key,
                    bad,
                )
                entry = {k: v for k, v in entry.items() if k not in ("min_mhz", "max_mhz")}
            entries[str(key)] = entry
        return entries

    def _limit_entries(self, data: Any) -> dict[str, dict[str, Any]]:
        """The power limit entries of the parsed file ``data`` (empty when there are none
        or no file; an entry whose original limit is not a positive whole number of
        milliwatts up to a megawatt (:data:`~daemon.limits.MAX_POWER_W`; pynvml would keep
        the low 32 bits of a larger one) is logged and dropped: nothing known to restore)."""
        limits = data.get("power_limits") if isinstance(data, dict) else None
        if not isinstance(limits, dict):
            return {}
        entries = {}
        for key, entry in limits.items():
            if not isinstance(entry, dict):
                continue
            value = finite_number(entry.get("original_mw"))
            if value is None or not 0 < value <= MAX_POWER_W * 1000.0 or value != int(value):
                said = _first_time(str(self.path), str(key), repr(entry.get("original_mw")))
                log.log(
                    logging.WARNING if said else logging.DEBUG,
                    "lock state %s: GPU %s: original_mw is %r, not a power limit in mW; "
                    "its power limit before gpugov is unknown: check it (nvidia-smi -q -d "
                    "POWER)",
                    self.path,
                    key,
                    entry.get("original_mw"),
                )
                continue
            entries[str(key)] = entry
        return entries

    def power_limits(self) -> dict[str, dict[str, Any]]:
        """Every power limit entry, by GPU key (its UUID)."""
        return dict(self._limits)

    def get_power_limit(self, key: str) -> dict[str, Any] | None:
        """The power limit entry for GPU ``key`` (its UUID), if any."""
        return self._limits.get(key)

    def record_power_limit(
        self, key: str, gpu: str, original_mw: int, set_mw: int, held_mw: int | None = None
    ) -> None:
        """Remember, before it is written, that this process sets GPU ``key``'s power limit
        to ``set_mw`` and that it was ``original_mw`` before gpugov's first write;
        ``held_mw``, the limit gpugov held on it before, which it keeps if this write does
        not land (it hangs, fails, or the process dies first)."""
        values = {"original_mw": int(original_mw), "set_mw": int(set_mw)}
        if held_mw is not None:
            values["held_mw"] = int(held_mw)
        self._put(self._limits, key, gpu, **values)

    def clear_power_limit(self, key: str) -> None:
        """Forget GPU ``key``'s power limit (its original is back)."""
        if self._limits.pop(key, None) is not None:
            self._write()

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry for GPU ``key`` (its UUID), if any."""
        return self._entries.get(key)

    def record(self, key: str, gpu: str, min_mhz: int, max_mhz: int) -> None:
        """Remember that GPU ``key`` is locked to ``[min_mhz, max_mhz]`` by this process."""
        self._put(self._entries, key, gpu, min_mhz=int(min_mhz), max_mhz=int(max_mhz))

    def _put(self, entries: dict[str, dict[str, Any]], key: str, gpu: str, **values: int) -> None:
        """Set GPU ``key``'s entry in ``entries`` to ``values``, stamped with this process
        and the time, and write the file; nothing when this process's entry already
        holds those values (one a previous run with this pid left is stamped anew)."""
        mine = (entries is self._limits, key) in self._written
        self._written.add((entries is self._limits, key))
        held = entries.get(key, {})
        if mine and all(held.get(k) == v for k, v in values.items()):
            return
        entries[key] = {
            "gpu": gpu,
            **values,
            "pid": self.pid,
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **self._identity,
        }
        self._write()

    def written_here(self, key: str, *, power_limit: bool = False) -> bool:
        """Whether GPU ``key``'s lock entry (its power limit entry with ``power_limit``)
        was written by this process. One read from the file at start never was, even with
        this pid: a container's ``gpugov run`` is pid 1 again after a restart."""
        return (power_limit, key) in self._written

    def invalidate(self, key: str) -> None:
        """Drop this process's copy of GPU ``key``'s entry without writing: the next
        :meth:`record` writes it whatever it holds. For a lock found changed by someone
        else, whose tool (``gpugov reset-clocks``) may have cleared the file's entry too."""
        self._entries.pop(key, None)

    def clear(self, key: str) -> None:
        """Forget GPU ``key`` (it was reset)."""
        if self._entries.pop(key, None) is not None:
            self._write()

    def retry(self) -> bool:
        """Write the file again if its last write failed or hung (the loop calls this once
        per tick, so the record catches up once the disk has room, the directory is
        writable again or a hung disk answers); whether the file is up to date now.

        The newest record was handed to the writer when it changed, so a write that ran
        past its deadline is waited for (not at all while it hangs), never posted again:
        one still running counts as a failed write, one that has gone through since makes
        the file up to date, and only one that failed is written again. (Posting it again
        each tick would keep a disk slower than the deadline, not hung, from ever
        counting as up to date: each new write would run past the deadline again.)"""
        if self._hold_lost():
            self._hold_again()
        if self.stale:
            try:
                self._writer.wait()
            except OSError as error:
                if self._writer.busy:
                    self._write_failed(error)  # still running (WriteTimeout): counted
                else:
                    self._write()  # it failed: written again
            else:
                self._write_succeeded()
        return not self.stale

    def _hold_lost(self) -> bool:
        """Whether the hold file was removed under this process (the state directory
        deleted or cleaned while the daemon runs): its ``flock`` then holds a file no
        other run opens, and the lock record went with it. One ``fstat`` of the open
        file, no path looked up, on a worker thread within the write deadline: on a hung
        mount (an NFS ``GETATTR`` that never answers) it held the loop, each tick, with
        no watchdog ping and no stop taken. One that hangs says no (not looked at again
        until it answers)."""
        held = self._held
        if held is None:
            return False
        try:
            return bool(self._hold_check.call(lambda: _unlinked(held)))
        except CallTimeout:
            return False

    def _hold_again(self) -> None:
        """Take the state directory again and write the lock record again, one WARNING:
        until then a second daemon could start on it, and a kill would leave locks no
        record names."""
        directory = self.path.parent
        self.release()
        try:
            self.hold()
        except ConfigError as error:
            log.error("lock state %s: removed under this daemon and now %s", directory, error)
            return
        log.warning(
            "lock state %s: the state directory's files were removed under this daemon "
            "(the directory deleted?); %s, and the lock record written again",
            directory,
            "held again" if self._held is not None else "it could not be held again",
        )
        self._write()

    def defer_writes(self) -> None:
        """From now on hand each write to the writer without waiting for it (the exit's
        resets: one GPU's reset never waits on the disk for another's record);
        :meth:`flush` waits for the last one."""
        self._deferred = True

    def flush(self) -> bool:
        """Wait, at most the write deadline, for the last write :meth:`defer_writes`
        handed over, and count it as any write; whether the file is up to date."""
        if self._unflushed:
            self._unflushed = False
            try:
                self._writer.wait()
            except OSError as error:
                self._write_failed(error)
            else:
                self._write_succeeded()
        return not self.stale

    def _write(self) -> None:
        """Write the file with this process's entries, waiting up to the deadline (not
        at all while an earlier write hangs: :class:`LatestWriter`)."""
        data: dict[str, Any] = {"version": RECORD_VERSION, "gpus": self._entries}
        if self._limits:
            data["power_limits"] = self._limits
        # json_safe: a record read with NaN or Infinity in a field the loader does not
        # check (another GPU's pid) made every write raise ValueError out of the
        # actuator; such a number is written as null. It copies the entries too: the
        # worker writes this tick's record, whatever the loop changes meanwhile.
        payload = json_safe(data)
        if self._deferred:
            self._writer.post(payload)
            self._unflushed = True
            return
        try:
            self._writer.write(payload)
        except OSError as error:  # a failed write, or one still running (WriteTimeout)
            self._write_failed(error)
            return
        self._write_succeeded()

    def _write_file(self, payload: dict[str, Any]) -> None:
        """The worker's write of ``payload`` (the temporary file, fsync, rename)."""
        write_json_atomic(self.path, payload, indent=1)

    def _write_failed(self, error: OSError) -> None:
        """Count a failed write and log it as :class:`~daemon.episode_log.FailureRun`
        decides: the first of a run of failures, then one reminder per
        :data:`WRITE_FAILURE_LOG_EVERY_S` while they last (the lines in between go to
        DEBUG); runs that come and go log at most one start a minute."""
        self.write_failures += 1
        self.stale = True
        line = self._failures.failed()
        if line.kind == "start" and self._deferred:
            # The exit's resets (defer_writes): no tick comes to write it again.
            log.warning(
                "lock state %s: cannot write it (%s): the record still names the locks this "
                "exit reset: the next start resets them again%s",
                self.path,
                error,
                line.note,
            )
        elif line.kind == "start":
            log.warning(
                "lock state %s: cannot write it (%s): the record of the locks is out of date, "
                "and a daemon killed meanwhile leaves locks the next start finds only by "
                "reading the clocks; the daemon writes it again every tick (while it fails, "
                "one line a minute)%s",
                self.path,
                error,
                line.note,
            )
        elif line.kind == "reminder":
            log.warning(
                "lock state %s: still cannot write it: %d failures in a row over %.0f s "
                "(%d not logged): %s",
                self.path,
                line.count,
                line.seconds,
                line.left_out,
                error,
            )
        else:
            log.debug("lock state %s: cannot write it (%s); retrying", self.path, error)

    def _write_succeeded(self) -> None:
        """The file is up to date; one line if writes had been failing."""
        self.stale = False
        ended = self._failures.succeeded()
        if ended is not None:
            count, seconds, loud = ended
            log.log(
                logging.WARNING if loud else logging.DEBUG,
                "lock state %s: written again after %d failed write(s) (%.0f s); the record "
                "of the locks is up to date",
                self.path,
                count,
                seconds,
            )


def _refuse_newer(path: Path, data: Any) -> None:
    """Raise :class:`NewerLockRecord` for a record whose ``version`` is an integer above
    :data:`RECORD_VERSION`; a damaged one (no version, text) is read as before."""
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_VERSION:
        raise NewerLockRecord(
            f"{path}: lock record version {version!r:.40}, newer than this gpugov reads "
            f"({RECORD_VERSION}): a newer gpugov wrote it; run that gpugov, or check the "
            "GPUs' clocks and power limits and move the file aside (it is left as it is)"
        )


def newer_record(directory: Path | None) -> NewerLockRecord | None:
    """The refusal of ``directory``'s lock record when a newer gpugov wrote it, else None
    (no directory, no record, or one this gpugov reads); the file is only read."""
    path = None if directory is None else Path(directory) / STATE_FILE
    try:
        if path is None or not path.exists():
            return None
        _refuse_newer(path, loads_json(read_input_text(path, "state"), unique_keys=False))
    except NewerLockRecord as newer:
        return newer
    except (OSError, ValueError):  # unreadable: LockState warns of it where it is used
        return None
    return None


def process_identity(pid: int) -> dict[str, Any]:
    """``{"boot_id": ..., "start_ticks": ...}`` of process ``pid``: this boot's id
    (``/proc/sys/kernel/random/boot_id``) and when the process started, in clock ticks
    after boot (``/proc/PID/stat``). With its pid they name one process for good, on no
    wall clock: an NTP step neither makes a live writer a leftover nor a pid used again
    its writer. Empty where ``/proc`` does not tell."""
    boot, ticks = _boot_id(), _start_ticks(pid)
    if boot is None or ticks is None:
        return {}
    return {"boot_id": boot, "start_ticks": ticks}


def live_writer(entry: Mapping[str, Any]) -> bool:
    """Whether the process that wrote lock state ``entry`` still runs
    (:func:`live_gpugov_pid` of its pid, time and identity)."""
    return live_gpugov_pid(
        entry.get("pid"),
        entry.get("time"),
        boot_id=entry.get("boot_id"),
        start_ticks=entry.get("start_ticks"),
    )


def recorded_pid(entry: Mapping[str, Any]) -> int | None:
    """The pid lock state ``entry`` names its writer by: a positive integer, else None
    (unknown: a bool, text, zero or a negative number, from a hand edit or a bad disk)."""
    pid = entry.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def writer_pid_text(entry: Mapping[str, Any]) -> str:
    """``"pid 4242"``, lock state ``entry``'s writer in a line; ``"pid unknown"`` where
    it names none (:func:`recorded_pid`)."""
    pid = recorded_pid(entry)
    return "pid unknown" if pid is None else f"pid {pid}"


def left_by(entry: Mapping[str, Any]) -> str:
    """What a lock record entry of another run says: ``a previous gpugov run (pid ...,
    time) left it locked at LOW-HIGH MHz``."""
    low, held = entry.get("min_mhz"), entry.get("max_mhz")
    at = f"at {low}-{held} MHz" if low is not None and held is not None else "(clocks unknown)"
    return (
        f"a previous gpugov run ({writer_pid_text(entry)}, {entry.get('time')}) left it locked {at}"
    )


def written_in_earlier_boot(entry: Mapping[str, Any]) -> bool:
    """Whether lock state ``entry`` is of an earlier boot (its ``boot_id``; False where
    either is unknown): clock locks do not outlive a reboot, so it holds none now."""
    boot, now = entry.get("boot_id"), _boot_id()
    return isinstance(boot, str) and now is not None and boot != now


def live_gpugov_pid(
    pid: object, written: object = None, *, boot_id: object = None, start_ticks: object = None
) -> bool:
    """Whether ``pid`` names a running process other than this one that is a gpugov (its
    command line names gpugov, where ``/proc`` tells) and is the record's writer: where
    the record names its writer's ``boot_id`` and ``start_ticks``
    (:func:`process_identity`), the process with that pid in this boot that started at
    that tick; else (a record of an older gpugov), given the record's ``written`` time,
    one that started before it. A process started after the record was written is the
    pid used again (after a reboot, another gpugov such as the actuator), not its writer.
    A lock record's writer still running is another daemon on the same GPUs, not a crash's
    leftover."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    except (OSError, OverflowError):  # OverflowError: beyond any pid (a damaged record)
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # alive, and no /proc to tell what it is: take it as the writer
    if b"gpugov" not in command:
        return False
    if (
        isinstance(boot_id, str)
        and isinstance(start_ticks, int)
        and not isinstance(start_ticks, bool)
    ):
        now = process_identity(pid)
        if now:
            return now == {"boot_id": boot_id, "start_ticks": start_ticks}
    started, at = _started_unix_s(pid), _unix_s(written)
    return started is None or at is None or started <= at + PID_REUSE_SLACK_S


PID_REUSE_SLACK_S = 2.0
"""How much later than a record's time (whole seconds) its pid's process may have started
and still be taken as its writer: the record's rounding and the start time's."""


def _boot_id() -> str | None:
    """This boot's id, or None where ``/proc`` does not tell."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return None
    return boot or None


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/PID/stat``'s
    22nd field), or None where ``/proc`` does not tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _started_unix_s(pid: int) -> float | None:
    """When process ``pid`` started, in Unix seconds (``/proc/PID/stat``'s start time
    after boot, and the uptime); None where ``/proc`` does not tell."""
    start_ticks = _start_ticks(pid)
    if start_ticks is None:
        return None
    try:
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        ticks_per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime_s - start_ticks / ticks_per_s)


def _unix_s(written: object) -> float | None:
    """A record's ISO 8601 ``time`` in Unix seconds; None when it is no such time."""
    if not isinstance(written, str):
        return None
    try:
        stamp = datetime.datetime.fromisoformat(written)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None
    return stamp.timestamp()


def gpu_key(backend: object) -> str:
    """The key a GPU is stored under: its UUID when the backend knows it, else its label."""
    uuid = getattr(backend, "uuid", None)
    return str(uuid) if uuid else str(getattr(backend, "label", "?"))


def _bad_field(entry: dict[str, Any]) -> str | None:
    """What makes a lock record's clocks unusable (None when they are usable): its
    ``min_mhz`` and ``max_mhz`` must be positive whole clocks."""
    for name in ("min_mhz", "max_mhz"):
        value = entry.get(name)
        number = finite_number(value)
        if number is None or number <= 0 or number != int(number):
            return f"{name} is {value!r}, not a clock in MHz"
    return None
