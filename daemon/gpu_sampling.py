"""A domain's GPU sampling: each GPU's sample per tick, implausible readings and failed reads
counted and logged at a bounded rate; it shares only the tick with the observer's engine side.

On a node each GPU's sample is read on a worker thread under :data:`GPU_READ_DEADLINE_S`
(:class:`~daemon.deadline.LatestReader`): an NVML call that hangs (a driver in trouble)
costs the loop that deadline once, then the GPU's samples count as failed reads while the
call hangs (no second read starts), and the loop goes on deciding from the engine and
writing clocks instead of stalling until the watchdog kills it. A tick's reads of the
domain's GPUs all start at once and share that one deadline: eight GPUs that hang
together cost the tick 2 s, not 16.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpugov.daemon.backend import (
    POWER_OVER_LIMIT_FACTOR,
    GpuBackend,
    GpuSample,
    clock_tolerance_mhz,
    plausible_clock,
    plausible_energy,
    plausible_power,
)
from gpugov.daemon.deadline import LatestReader, ReadTimeout
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import TransientGpuError

# The observer's logger, not this module's: these lines were the observer's and keep the
# name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.observer")

GPU_READ_DEADLINE_S = 2.0
"""The longest one GPU's sample may hold a node's loop: a healthy NVML sample takes
milliseconds, nvidia-smi's a fraction of a second under its own timeout, so only a hung
call reaches it; far below the unit's ``WatchdogSec=`` (30 s) even for eight GPUs."""


def read_within(
    backend: GpuBackend, method: str, what: str, read_deadline_s: float | None = None
) -> Any:
    """``backend.method()`` where the backend has that method, else None; with
    ``read_deadline_s`` read on a worker thread, a hung call None (one warning naming
    ``what``): the start-time reads of what a GPU accepts or does by itself. A read that
    fails for now (:class:`~daemon.errors.TransientGpuError`) is unknown too."""
    read = getattr(backend, method, None)
    if read is None:
        return None
    reader = (
        None
        if read_deadline_s is None
        else LatestReader(read, read_deadline_s, name=f"gpu-{method}-{backend.label}")
    )
    try:
        return read() if reader is None else reader.read()
    except TransientGpuError as error:
        log.debug("GPU %s: its %s not read: %s", backend.label, what, error)
        return None
    except ReadTimeout:
        log.warning(
            "GPU %s: its %s not read within %g s (a hung GPU call); taken as unknown",
            backend.label,
            what,
            read_deadline_s,
        )
        return None


def power_limit_range_w(
    backend: GpuBackend, read_deadline_s: float | None = None
) -> tuple[float, float] | None:
    """``backend``'s (lowest, highest) settable power limit in watts, or None; with
    ``read_deadline_s`` read on a worker thread, a hung call an unknown range (warned)."""
    return read_within(  # type: ignore[no-any-return]
        backend, "power_limit_constraints_w", "power limit constraints", read_deadline_s
    )


class DomainGpus:
    """Samples a domain's GPUs each tick (:meth:`sample`).

    Args:
        backends: the domain's GPUs.
        log_every_s: while a GPU's samples keep failing, one reminder per this many
            seconds; a trouble that comes and goes logs at most one start per this many
            seconds (:class:`~daemon.episode_log.EpisodeLog`).

        read_deadline_s: when given (a node, on the wall clock), each GPU's sample is
            read on a worker thread, a tick's samples all started at once and waited for
            at most this long together; a sample past it (a hung call) is a failed read,
            and so is every later one while it hangs. None (a simulated run): read on the
            caller's thread.
        clock: monotonic seconds, for the tick's shared deadline.

    :attr:`gpu_read_errors` counts, per GPU label, the reads that failed and were
    survived: a whole sample that failed counts one, each field left out of a sample one,
    an implausible clock or power one (``gpugov_gpu_read_errors_total``).
    """

    def __init__(
        self,
        backends: Sequence[GpuBackend],
        *,
        log_every_s: float = 60.0,
        read_deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backends = list(backends)
        self._read_deadline_s = read_deadline_s
        self._clock = clock
        self._readers: dict[str, LatestReader[GpuSample]] = (
            {}
            if read_deadline_s is None
            else {
                b.label: LatestReader(b.sample, read_deadline_s, name=f"gpu-{b.label}")
                for b in self.backends
            }
        )
        self.log_every_s = log_every_s
        self._supported: tuple[float, ...] | None = None
        self._sample_episodes: dict[str, EpisodeLog] = {}
        self.gpu_read_errors: dict[str, int] = {b.label: 0 for b in self.backends}
        self._implausible_logged: set[str | tuple[str, str]] = set()
        self._field_failures: dict[tuple[str, str], int] = {}
        """Per (GPU, sample field): reads of it failed in a row."""
        self._field_episodes: dict[tuple[str, str], EpisodeLog] = {}
        self._power_ceiling_w: dict[str, float | None] = {}
        self._sample_failures: dict[str, tuple[int, float, float]] = {}
        self._clock_bounds: dict[str, tuple[float, float, float]] = {}
        self._energy_read: dict[str, tuple[float, float]] = {}
        """Per GPU, its energy counter as last read and the tick it was read at."""

    @property
    def hanging_reads(self) -> tuple[str, ...]:
        """The GPUs whose sample is still being read past its deadline (on a node)."""
        return tuple(label for label, reader in self._readers.items() if reader.hanging)

    def supported_clocks_mhz(self) -> tuple[float, ...]:
        """Clocks every GPU of the domain supports, ascending (cached)."""
        if self._supported is None:
            common = set(self.backends[0].supported_clocks_mhz())
            for backend in self.backends[1:]:
                common &= set(backend.supported_clocks_mhz())
            self._supported = tuple(float(c) for c in sorted(common))
        return self._supported

    def sample(self, now_s: float) -> tuple[GpuSample, ...]:
        """Each GPU's sample at the tick ``now_s``, in the order of :attr:`backends`; a
        GPU whose sample failed transiently gives an empty one (``read_errors`` =
        ``("sample",)``).

        On a node the reads all start first and are waited for under one deadline: the
        tick lasts at most one :data:`GPU_READ_DEADLINE_S` however many GPUs hang (read
        one after another, N hung GPUs cost it N deadlines).

        Raises:
            GpuLost: a GPU fell off the bus.
        """
        end_s: float | None = None
        if self._readers and self._read_deadline_s is not None:
            for backend in self.backends:
                self._readers[backend.label].start()
            end_s = self._clock() + self._read_deadline_s
        samples = []
        for backend in self.backends:
            try:
                sample = self.read(backend, None if end_s is None else end_s - self._clock())
            except TransientGpuError as error:
                self._report_sample_failure(backend.label, now_s, error)
                sample = GpuSample(gpu=backend.label, read_errors=("sample",))
            else:
                self._report_sample_recovery(backend.label)
                self._report_field_reads(backend.label, sample.read_errors, now_s)
            sample = self._plausible_energy(backend, self._plausible(backend, sample), now_s)
            if sample.read_errors:
                self.gpu_read_errors[backend.label] += len(sample.read_errors)
            samples.append(sample)
        return tuple(samples)

    def read(self, backend: GpuBackend, wait_s: float | None = None) -> GpuSample:
        """``backend``'s sample, under the read deadline where there is one (the loop's
        reads and the start's: a read hung at the start is this reader's late one);
        ``wait_s``: at most this long instead (what is left of a tick's deadline).

        Raises:
            TransientGpuError: the sample failed, or ran past the deadline (it goes on in
                the background and its answer is the next call's once it ends).
            GpuLost: the GPU fell off the bus (a late read's loss too, once it ends).
        """
        reader = self._readers.get(backend.label)
        if reader is None:
            return backend.sample()
        try:
            return reader.read(wait_s)
        except ReadTimeout:
            raise TransientGpuError(
                f"no answer within {reader.deadline_s:g} s (a hung GPU call); its samples "
                "count as failed reads until it returns"
            ) from None

    def _plausible(self, backend: GpuBackend, sample: GpuSample) -> GpuSample:
        """The sample with an SM clock outside what its GPU can run at
        (:func:`~daemon.backend.plausible_clock`), or a power far above what it may draw
        (:func:`~daemon.backend.plausible_power`), taken as a failed read; the first one
        of each per GPU is logged."""
        checked = self._plausible_power(backend, sample)
        if checked.sm_clock_mhz is None:
            return checked
        sample = checked
        bounds = self._clock_bounds.get(backend.label)
        if bounds is None:
            clocks = backend.supported_clocks_mhz()
            bounds = (min(clocks), max(clocks), clock_tolerance_mhz(clocks))
            self._clock_bounds[backend.label] = bounds
        checked = plausible_clock(sample, *bounds)
        if checked is not sample and backend.label not in self._implausible_logged:
            self._implausible_logged.add(backend.label)
            log.warning(
                "GPU %s: SM clock read %.0f MHz, outside the %.0f-%.0f MHz it supports: "
                "counted as a failed read (gpugov_gpu_read_errors_total; not logged again)",
                backend.label,
                sample.sm_clock_mhz,
                bounds[0],
                bounds[1],
            )
        return checked

    def _plausible_energy(self, backend: GpuBackend, sample: GpuSample, now_s: float) -> GpuSample:
        """The sample with an energy counter that advanced further since its last reading
        than the GPU may draw (:func:`~daemon.backend.plausible_energy`) taken as a failed
        read (the first per GPU logged); the next reading is judged against this one, so a
        counter that moved to a new level counts on from it."""
        label = backend.label
        previous = self._energy_read.get(label)
        if sample.energy_j is not None:
            self._energy_read[label] = (sample.energy_j, now_s)
        checked = plausible_energy(sample, previous, now_s, self._power_ceiling_w.get(label))
        if checked is not sample and ("energy", label) not in self._implausible_logged:
            self._implausible_logged.add(("energy", label))
            assert previous is not None and sample.energy_j is not None
            log.warning(
                "GPU %s: energy counter read %.6g J, %.3g J past its reading %.3g s before, "
                "more than it may draw: counted as a failed read (gpugov_gpu_read_errors_total; "
                "not logged again)",
                label,
                sample.energy_j,
                sample.energy_j - previous[0],
                now_s - previous[1],
            )
        return checked

    def _plausible_power(self, backend: GpuBackend, sample: GpuSample) -> GpuSample:
        """The sample with a power reading far above the GPU's highest power limit taken
        as a failed read (logged once per GPU)."""
        if sample.power_w is None:
            return sample
        label = backend.label
        if label not in self._power_ceiling_w:
            limits = None
            try:
                limits = power_limit_range_w(backend, self._read_deadline_s)
            except Exception as error:  # an optional read: the enforced limit serves
                log.debug("GPU %s: power limit constraints not read: %s", label, error)
            high = None if limits is None else float(limits[1])
            self._power_ceiling_w[label] = high if high and math.isfinite(high) else None
        checked = plausible_power(sample, self._power_ceiling_w[label])
        if checked is not sample and ("power", label) not in self._implausible_logged:
            self._implausible_logged.add(("power", label))
            log.warning(
                "GPU %s: power read %.0f W, over %.0fx the most it may draw (%.0f W): counted "
                "as a failed read (gpugov_gpu_read_errors_total; not logged again)",
                label,
                sample.power_w,
                POWER_OVER_LIMIT_FACTOR,
                self._power_ceiling_w[label] or sample.power_limit_w or 0.0,
            )
        return checked

    def _report_sample_failure(self, gpu: str, now_s: float, error: Exception) -> None:
        """One WARNING when a GPU's sample first fails, then one reminder per
        ``log_every_s`` while it keeps failing (a backend that times out every tick, the
        nvidia-smi one, logged every tick); a GPU whose samples fail now and then logs at
        most one such run per ``log_every_s`` (:class:`~daemon.episode_log.EpisodeLog`).
        Each failure is counted in the metrics."""
        count, since_s, reminded_s = self._sample_failures.get(gpu, (0, now_s, now_s))
        count += 1
        if count == 1:
            episodes = self._sample_episodes.get(gpu)
            if episodes is None:  # made once per GPU, not at every failed sample
                episodes = self._sample_episodes[gpu] = EpisodeLog(self.log_every_s)
            note = episodes.start(now_s)
            if note is None:
                log.debug("GPU %s: sample failed: %s", gpu, error)
            else:
                log.warning("GPU %s: sample failed: %s%s", gpu, error, note)
        elif now_s - reminded_s >= self.log_every_s:
            reminded_s = now_s
            self._sample_episodes[gpu].reminded()
            log.warning(
                "GPU %s: samples still failing: %d in a row over %.0f s: %s",
                gpu,
                count,
                now_s - since_s,
                error,
            )
        else:
            log.debug("GPU %s: sample failed: %s", gpu, error)
        self._sample_failures[gpu] = (count, since_s, reminded_s)

    def _report_field_reads(self, gpu: str, failed: tuple[str, ...], now_s: float) -> None:
        """Reads of single fields of a GPU's sample (its temperature, its power, ...) that
        failed while the rest was read: one WARNING when a field first fails, and one INFO
        line when it reads again, each field's starts at most one a ``log_every_s``
        (:class:`~daemon.episode_log.EpisodeLog`), as whole samples are. Each failure is
        counted in the metrics."""
        for name in failed:
            key = (gpu, name)
            count = self._field_failures.get(key, 0)
            if count == 0:
                episodes = self._field_episodes.get(key)
                if episodes is None:
                    episodes = self._field_episodes[key] = EpisodeLog(self.log_every_s)
                note = episodes.start(now_s)
                log.log(
                    logging.DEBUG if note is None else logging.WARNING,
                    "GPU %s: its %s read failed; left out of the sample while it fails "
                    "(gpugov_gpu_read_errors_total)%s",
                    gpu,
                    name,
                    note or "",
                )
            self._field_failures[key] = count + 1
        for key in [k for k in self._field_failures if k[0] == gpu and k[1] not in failed]:
            count = self._field_failures.pop(key)
            logged = self._field_episodes[key].end()
            log.log(
                logging.INFO if logged else logging.DEBUG,
                "GPU %s: its %s reads again after %d failed read(s)",
                gpu,
                key[1],
                count,
            )

    def _report_sample_recovery(self, gpu: str) -> None:
        """One INFO line when a GPU whose samples failed is sampled again."""
        failed = self._sample_failures.pop(gpu, None)
        logged = failed is not None and self._sample_episodes[gpu].end()
        if failed is not None and failed[0] > 1:
            log.log(
                logging.INFO if logged else logging.DEBUG,
                "GPU %s: sampled again after %d failed samples",
                gpu,
                failed[0],
            )
