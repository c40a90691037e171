"""A fake ``nvidia-smi`` behind :class:`~gpugov.daemon.nvidia_smi.NvidiaSmiBackend`'s runner.

``FakeNvidiaSmi`` is a runner ``(argv, timeout_s) -> stdout``: it parses the argv the
backend sends (``-i N``, ``--query-gpu=...``, ``--query-supported-clocks=...``,
``--lock-gpu-clocks=MIN,MAX``, ``--reset-gpu-clocks``, ``--format=csv,noheader,nounits``),
answers with nvidia-smi's CSV, and on failure does what
:func:`~gpugov.daemon.nvidia_smi.run_command` does with a non-zero exit: raises
:func:`~gpugov.daemon.nvidia_smi.classify_failure` of nvidia-smi's own error text. A
timed-out command raises :class:`~gpugov.daemon.errors.TransientGpuError`, as there.

State per GPU in :class:`FakeSmiGpu`: a lock moves the SM clock to the highest supported
clock at or below its upper bound (the lowest one when none is) and, below the top clock,
sets ApplicationsClocksSetting (0x2) in ``clocks_event_reasons.active``; a reset returns
to the top clock. Failure injection: ``permission=False`` (lock and reset refused),
``lock_supported=False`` per GPU, ``lose(index)``, ``timeouts`` (the next N commands time
out) and ``old_driver`` (the newer query fields are "not a valid field").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpugov.daemon.errors import TransientGpuError
from gpugov.daemon.nvidia_smi import classify_failure

APPLICATIONS_CLOCKS_SETTING = 0x2


@dataclass
class FakeSmiGpu:
    """One fake GPU as nvidia-smi reports it (H100-like defaults)."""

    sm_clock_mhz: float = 1980.0
    power_w: float = 352.10
    temperature_c: float = 61.0
    utilization_pct: float = 87.0
    power_limit_w: float = 700.0
    event_reasons: int = 0
    supported_mhz: dict[int, tuple[int, ...]] = field(
        default_factory=lambda: {2619: tuple(range(1980, 344, -15))}  # memory -> graphics
    )
    lock_supported: bool = True
    locked: tuple[int, int] | None = None
    lost: bool = False

    @property
    def top_mhz(self) -> int:
        """The top graphics clock of the highest memory clock."""
        return max(self.supported_mhz[max(self.supported_mhz)])


class FakeNvidiaSmi:
    """A runner that answers like nvidia-smi (see the module docstring)."""

    def __init__(
        self,
        gpus: int | list[FakeSmiGpu] = 1,
        *,
        permission: bool = True,
        old_driver: bool = False,
    ) -> None:
        self.gpus = [FakeSmiGpu() for _ in range(gpus)] if isinstance(gpus, int) else gpus
        self.permission = permission
        self.old_driver = old_driver
        self.timeouts = 0
        self.calls: list[list[str]] = []
        self.writes: list[tuple[object, ...]] = []

    def lose(self, index: int) -> None:
        """GPU ``index`` falls off the bus."""
        self.gpus[index].lost = True

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        self.calls.append(list(argv))
        if self.timeouts > 0:
            self.timeouts -= 1
            raise TransientGpuError(f"{' '.join(argv)} timed out after {timeout_s:g} s")
        code, text = self._answer(list(argv))
        if code != 0:
            raise classify_failure(argv, text)
        return text

    # ------------------------------------------------------------------ commands
    def _answer(self, argv: list[str]) -> tuple[int, str]:
        """(exit code, output) of one command."""
        query = next((a for a in argv if a.startswith("--query-gpu=")), None)
        if "-i" not in argv and query is not None:  # every GPU, one row each, as nvidia-smi
            rows = [self._query(gpu, query.split("=", 1)[1], i) for i, gpu in enumerate(self.gpus)]
            failed = next((row for row in rows if row[0] != 0), None)
            return failed or (0, "".join(text for _, text in rows))
        index = int(argv[argv.index("-i") + 1]) if "-i" in argv else 0
        if not 0 <= index < len(self.gpus):
            return 6, "No devices were found\n"
        gpu = self.gpus[index]
        if gpu.lost:
            return 15, (
                f"Unable to determine the device handle for GPU 00000000:{index:02X}:00.0: "
                "GPU is lost.  Reboot the system to recover this GPU\n"
            )
        for argument in argv[1:]:
            if argument.startswith("--query-gpu="):
                return self._query(gpu, argument.split("=", 1)[1], index)
            if argument.startswith("--query-supported-clocks="):
                rows = [
                    f"{memory}, {graphics}"
                    for memory in sorted(gpu.supported_mhz, reverse=True)
                    for graphics in gpu.supported_mhz[memory]
                ]
                return 0, "\n".join(rows) + "\n"
            if argument.startswith("--lock-gpu-clocks="):
                low, high = (int(v) for v in argument.split("=", 1)[1].split(","))
                return self._lock(index, gpu, low, high)
            if argument == "--reset-gpu-clocks":
                return self._reset(index, gpu)
        return 2, f"Invalid combination of input arguments: {' '.join(argv[1:])}\n"

    def _query(self, gpu: FakeSmiGpu, fields: str, index: int) -> tuple[int, str]:
        values = {
            "index": str(index),
            "clocks.sm": f"{gpu.sm_clock_mhz:.0f}",
            "power.draw": f"{gpu.power_w:.2f}",
            "power.draw.instant": f"{gpu.power_w:.2f}",
            "temperature.gpu": f"{gpu.temperature_c:.0f}",
            "utilization.gpu": f"{gpu.utilization_pct:.0f}",
            "enforced.power.limit": f"{gpu.power_limit_w:.2f}",
            "clocks_event_reasons.active": f"0x{gpu.event_reasons:016X}",
            "clocks_throttle_reasons.active": f"0x{gpu.event_reasons:016X}",
        }
        if self.old_driver:
            del values["power.draw.instant"], values["clocks_event_reasons.active"]
        answer = []
        for name in fields.split(","):
            if name not in values:
                return 2, f'Field "{name}" is not a valid field to query.\n'
            answer.append(values[name])
        return 0, ", ".join(answer) + "\n"

    def _lock(self, index: int, gpu: FakeSmiGpu, low: int, high: int) -> tuple[int, str]:
        bus = f"00000000:{index:02X}:00.0"
        if not self.permission:
            return 4, (
                f"The current user does not have permission to change clocks for GPU {bus}.\n"
                "Terminating early due to previous errors.\n"
            )
        if not gpu.lock_supported:
            return 3, f"Setting locked GPU clocks is not supported for GPU {bus}.\n"
        if low > high:
            return 2, f"Failed to set locked GPU clocks for GPU {bus}: Invalid Argument\n"
        supported = sorted(gpu.supported_mhz[max(gpu.supported_mhz)])
        below = [clock for clock in supported if clock <= high]
        gpu.locked = (low, high)
        gpu.sm_clock_mhz = float(below[-1] if below else supported[0])
        if gpu.sm_clock_mhz < gpu.top_mhz:
            gpu.event_reasons |= APPLICATIONS_CLOCKS_SETTING
        else:
            gpu.event_reasons &= ~APPLICATIONS_CLOCKS_SETTING
        self.writes.append(("lock", index, low, high))
        return 0, (
            f'GPU clocks set to "(gpuClkMin {low}, gpuClkMax {high})" for GPU {bus}\nAll done.\n'
        )

    def _reset(self, index: int, gpu: FakeSmiGpu) -> tuple[int, str]:
        if not self.permission:
            return 4, (
                "The current user does not have permission to change clocks for GPU "
                f"00000000:{index:02X}:00.0.\nTerminating early due to previous errors.\n"
            )
        if not gpu.lock_supported:
            return 3, f"Resetting locked GPU clocks is not supported for GPU {index}.\n"
        gpu.locked = None
        gpu.sm_clock_mhz = float(gpu.top_mhz)
        gpu.event_reasons &= ~APPLICATIONS_CLOCKS_SETTING
        self.writes.append(("reset", index))
        return 0, "All done.\n"
