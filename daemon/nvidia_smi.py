"""Fallback GPU backend through the ``nvidia-smi`` command line (when NVML bindings fail).

Slow (tens of milliseconds per call, more without persistence mode): use it with
periods of a second or more, never as the first choice. The command runner is injected,
so tests fake it. Query fields: ``power.draw.instant`` (falls back to ``power.draw`` on
drivers that lack it), ``clocks_event_reasons.active`` (falls back to
``clocks_throttle_reasons.active``). nvidia-smi exposes no energy counter: ``energy_j``
stays None.
"""

from __future__ import annotations

import csv
import io
import subprocess
from collections.abc import Callable, Sequence

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.errors import (
    PERMISSION_DENIED_MESSAGE,
    RESET_PERMISSION_MESSAGE,
    GpuError,
    GpuLost,
    GpuUnavailable,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.nvml import plausible_clocks

Runner = Callable[[Sequence[str], float], str]


class CommandTimedOut(TransientGpuError):
    """nvidia-smi did not finish within its timeout: told apart from the passing failures
    it names itself ("Unknown Error"), which are no hung call."""


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """Run ``argv``; return stdout.

    Raises:
        GpuUnavailable: the executable is missing.
        CommandTimedOut: it timed out.
        PermissionDenied, NotSupported, GpuLost, GpuError: from its error text.
    """
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as error:
        raise GpuUnavailable(f"{argv[0]} not found") from error
    except subprocess.TimeoutExpired as error:
        raise CommandTimedOut(f"{' '.join(argv)} timed out after {timeout_s:g} s") from error
    if done.returncode != 0:
        raise classify_failure(argv, (done.stderr or "") + (done.stdout or ""))
    return done.stdout


_PASSING_FAILURES = (
    "unknown error",
    "timeout",
    "insufficient external power",
    "interrupt request issue",
    "insufficient memory",
)
"""nvmlErrorString's words for the codes :data:`~daemon.errors.NVML_ERROR_MAP` takes as
passing (UNKNOWN, TIMEOUT, INSUFFICIENT_POWER, IRQ_ISSUE, MEMORY), which nvidia-smi
prints after its own ("Unable to determine the device handle for GPU...: Unknown Error")."""


def classify_failure(argv: Sequence[str], text: str) -> GpuError:
    """Map nvidia-smi's error text onto the daemon's error tree, as NVML's code would be
    (:data:`~daemon.errors.NVML_ERROR_MAP`): a failure it cannot name is a plain
    :class:`~daemon.errors.GpuError`."""
    lowered = text.lower()
    command = " ".join(argv)
    message = f"{command}: {text.strip()[:300]}"
    if "insufficient permissions" in lowered or "permission" in lowered:
        resets = any(arg.startswith(("--reset-gpu-clocks", "-rgc")) for arg in argv)
        needs = RESET_PERMISSION_MESSAGE if resets else PERMISSION_DENIED_MESSAGE
        return PermissionDenied(f"{command}: {needs}")
    if any(
        words in lowered
        for words in ("gpu is lost", "fallen off the bus", "requires restart", "requires reset")
    ):
        return GpuLost(message)
    if "not supported" in lowered or "not a valid field" in lowered:
        return NotSupported(message)
    if any(
        words in lowered
        for words in (
            "couldn't communicate with the nvidia driver",
            "no devices",
            "version mismatch",
        )
    ):
        return GpuUnavailable(message)
    if any(words in lowered for words in _PASSING_FAILURES):
        return TransientGpuError(message)
    return GpuError(message)


_NOT_READ = ("", "n/a", "na", "[n/a]", "[not supported]")
"""What nvidia-smi prints for a field the GPU or driver does not give: no reading, and no
failed one."""


def _number(raw: str) -> float | None:
    """A field's number; None for one the GPU does not give (:data:`_NOT_READ`).

    Raises:
        ValueError: anything else that is no number (``[Unknown Error]``, ``ERR!``, a
            garbled value): nvidia-smi could not read it, a failed read.
    """
    value = raw.strip()
    if value.lower() in _NOT_READ:
        return None
    return float(int(value, 16)) if value.lower().startswith("0x") else float(value)


class NvidiaSmiBackend:
    """One GPU through ``nvidia-smi -i N``.

    Args:
        gpu: index or UUID as nvidia-smi accepts it.
        runner: ``(argv, timeout_s) -> stdout``.
        executable: the nvidia-smi path.
        timeout_s: per command.
    """

    def __init__(
        self,
        gpu: int | str = 0,
        *,
        runner: Runner = run_command,
        executable: str = "nvidia-smi",
        timeout_s: float = 5.0,
    ) -> None:
        self._gpu = str(gpu)
        self._run = runner
        self._exe = executable
        self._timeout_s = timeout_s
        self._power_field = "power.draw.instant"
        self._reasons_field = "clocks_event_reasons.active"
        self._supported: tuple[int, ...] | None = None
        self._closed = False

    @property
    def label(self) -> str:
        """The GPU as given."""
        return self._gpu

    def _check_open(self) -> None:
        """Refuse any call on a closed backend."""
        if self._closed:
            raise GpuUnavailable(f"GPU {self._gpu}: backend is closed", gpu=self._gpu)

    def _command(self, argv: Sequence[str]) -> str:
        """Run one nvidia-smi command (refused once the backend is closed)."""
        self._check_open()
        return self._run(argv, self._timeout_s)

    def _query(self, fields: str) -> list[str]:
        out = self._command(
            [self._exe, "-i", self._gpu, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
        )
        rows = [row for row in csv.reader(io.StringIO(out)) if row]
        if not rows:
            raise TransientGpuError(f"nvidia-smi -i {self._gpu}: empty answer")
        return [cell.strip() for cell in rows[0]]

    def sample(self) -> GpuSample:
        """Power, temperature, SM clock, utilisation, event reasons, power limit.

        Raises:
            GpuLost, GpuUnavailable, TransientGpuError: as the command reports.
        """
        while True:
            fields = (
                f"clocks.sm,{self._power_field},temperature.gpu,utilization.gpu,"
                f"enforced.power.limit,{self._reasons_field}"
            )
            try:
                row = self._query(fields)
                break
            except NotSupported:
                # Older drivers: no instant power, and the Throttle name for event reasons.
                if self._power_field == "power.draw.instant":
                    self._power_field = "power.draw"
                elif self._reasons_field == "clocks_event_reasons.active":
                    self._reasons_field = "clocks_throttle_reasons.active"
                else:
                    raise
        if len(row) < 6:
            raise TransientGpuError(f"nvidia-smi -i {self._gpu}: expected 6 fields, got {row}")
        names = ("sm_clock", "power", "temperature", "utilization", "power_limit")
        values: list[float | None] = []
        errors: list[str] = []
        for name, cell in zip((*names, "clock_event_reasons"), row[:6], strict=True):
            try:
                values.append(_number(cell))
            except ValueError:  # nvidia-smi could not read it: a failed read of that field
                values.append(None)
                errors.append(name)
        clock, power, temperature, utilization, limit, reasons = values
        # Through GpuSample.read, as the NVML backend: a value no GPU gives (a negative
        # power, NaN, a utilisation past 100 %) costs that reading, not the sample.
        return GpuSample.read(
            self._gpu,
            power_w=power,
            temperature_c=temperature,
            sm_clock_mhz=clock,
            utilization=None if utilization is None else utilization / 100.0,
            clock_event_reasons=reasons,
            power_limit_w=limit,
            read_errors=tuple(errors),
        )

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """Graphics clocks listed for the highest memory clock, ascending (cached)."""
        self._check_open()
        if self._supported is None:
            out = self._command(
                [
                    self._exe,
                    "-i",
                    self._gpu,
                    "--query-supported-clocks=memory,graphics",
                    "--format=csv,noheader,nounits",
                ]
            )
            pairs = []
            for row in csv.reader(io.StringIO(out)):
                if len(row) >= 2:
                    try:
                        memory, graphics = _number(row[0]), _number(row[1])
                    except ValueError:  # a row that is no pair of clocks: not one listed
                        continue
                    if memory is not None and graphics is not None:
                        pairs.append((memory, graphics))
            if not pairs:
                raise NotSupported(f"nvidia-smi -i {self._gpu}: no supported clocks listed")
            # NVML's lists' filter: inf, nan, 0 or 0xFFFFFFFF raised or was locked.
            memory_mhz = [memory for memory, _ in pairs]
            top = max(plausible_clocks(memory_mhz, self._gpu, "memory", source="nvidia-smi"))
            graphics_mhz = [g for m, g in pairs if m == top]
            self._supported = plausible_clocks(graphics_mhz, self._gpu, source="nvidia-smi")
        return self._supported

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """``nvidia-smi -i N --lock-gpu-clocks=MIN,MAX``."""
        self._command(
            [self._exe, "-i", self._gpu, f"--lock-gpu-clocks={int(min_mhz)},{int(max_mhz)}"]
        )

    def reset_clocks(self) -> None:
        """``nvidia-smi -i N --reset-gpu-clocks``."""
        self._command([self._exe, "-i", self._gpu, "--reset-gpu-clocks"])

    def close(self) -> None:
        """Nothing to release; later calls raise :class:`~daemon.errors.GpuUnavailable`."""
        self._closed = True
