"""What gpugov remembers of a domain's GPUs' power limits: the limit each had before
gpugov (restored on the way out), the limit gpugov holds and the one it last tried, and the
lock record's entry that lets the next start restore them
(:class:`~daemon.power_limit.PowerLimitActuator` decides and writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpugov.daemon.backend import GpuSample, PowerLimitBackend
from gpugov.daemon.lockstate import LockState, gpu_key

SAME_LIMIT_W = 0.5
"""Two power limits closer than this (watts) are the same limit: NVML keeps whole
milliwatts, and a limit read back is the one written."""


def none_of(limit_w: float, limits_w: Sequence[float]) -> bool:
    """Whether ``limit_w`` is none of ``limits_w`` (each more than :data:`SAME_LIMIT_W`
    off; True when there are none): a limit someone else set, not gpugov."""
    return all(abs(limit_w - value) > SAME_LIMIT_W for value in limits_w)


class PowerLimitLedger:
    """Each GPU's power limits as gpugov knows them, in memory and in the lock record.

    Args:
        labels: the domain's GPUs.
        state: where each GPU's original limit is recorded for the next start (None:
            nowhere; a dry run).
    """

    def __init__(self, labels: Iterable[str], state: LockState | None) -> None:
        self.state = state
        self.original_w: dict[str, float] = {}
        """Each GPU's power limit as found before gpugov's first write since it last held
        none (or as a previous run recorded it)."""
        self.held_w: dict[str, float | None] = {label: None for label in labels}
        """The limit gpugov set and holds on each GPU (None: the original is in force)."""
        self.asked_w: dict[str, float] = {}
        """The last limit written or tried on each GPU (a failed write may still be it)."""
        self.outside_w: dict[str, float] = {}
        """Each GPU's last enforced limit that gpugov did not set (the budget source)."""
        self.touched: set[str] = set()
        """The GPUs that may hold a limit of gpugov's: restored on the way out."""

    @property
    def applied_w(self) -> float | None:
        """The domain's power limit as gpugov set it (its GPUs' limits summed, a GPU that
        holds none counted at its original), or None when gpugov holds no limit."""
        if all(value is None for value in self.held_w.values()):
            return None
        total = 0.0
        for label, value in self.held_w.items():
            if value is None:
                value = self.original_w.get(label)
            if value is None:
                return None
            total += value
        return total

    def ours_w(self, label: str) -> list[float]:
        """The limits gpugov set (held) or last tried on the GPU: the GPU's limit is
        someone else's when it is none of them (:func:`none_of`)."""
        return [v for v in (self.held_w[label], self.asked_w.get(label)) if v is not None]

    def record(self, backend: PowerLimitBackend, value_w: float, original_w: float) -> None:
        """Before a write of ``value_w`` to ``backend``, whose own limit is ``original_w``:
        the lock record's entry, so a crash right after still restores it. It names the
        limit the GPU keeps if this write does not land (it hangs, fails, or the process
        dies first), which the next start's reconcile takes as gpugov's too."""
        if self.state is None:
            return
        kept = next(
            (w for w in self.ours_w(backend.label) if abs(w - value_w) > SAME_LIMIT_W), None
        )
        self.state.record_power_limit(
            gpu_key(backend),
            backend.label,
            round(original_w * 1000.0),
            round(value_w * 1000.0),
            held_mw=None if kept is None else round(kept * 1000.0),
        )

    def forget(self, backend: PowerLimitBackend) -> None:
        """The GPU holds no limit of gpugov's any more; its limit is read again before
        gpugov's next write (an operator may set another meanwhile)."""
        label = backend.label
        self.original_w.pop(label, None)
        self.held_w[label] = None
        self.touched.discard(label)
        self.asked_w.pop(label, None)
        if self.state is not None:
            self.state.clear_power_limit(gpu_key(backend))

    def outside_limit_w(self, labels: Iterable[str], samples: Sequence[GpuSample]) -> float | None:
        """The enforced power limit of the GPUs ``labels`` as a budget source, without
        gpugov's own: each GPU's enforced limit, but where that is the limit gpugov set,
        the limit it enforced before gpugov's first write (else its original). None when
        a GPU's limit is unknown this tick (the budget keeps its last value)."""
        total = 0.0
        by_label = {sample.gpu: sample for sample in samples}
        for label in labels:
            sample = by_label.get(label)
            enforced = None if sample is None else sample.power_limit_w
            if enforced is None:
                return None
            if none_of(enforced, self.ours_w(label)):
                self.outside_w[label] = float(enforced)
                total += float(enforced)
            else:
                before = self.outside_w.get(label, self.original_w.get(label))
                if before is None:
                    return None
                total += before
        return total


__all__ = ["SAME_LIMIT_W", "PowerLimitLedger", "none_of"]
