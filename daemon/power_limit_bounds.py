"""The bounds of a domain's power cap: the controller's request as watts, each GPU's share
clamped into the limits it accepts and never above its own, and whether a limit read back is
one a GPU could have (:class:`~daemon.power_limit.PowerLimitActuator` applies the cap).
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpugov.daemon.backend import PowerLimitBackend
from gpugov.daemon.errors import (
    NVML_ERROR_INVALID_ARGUMENT,
    GpuError,
    GpuLost,
    TransientGpuError,
)
from gpugov.daemon.gpu_writer import GpuWriter

# The power limit actuator's logger: these lines were logged there and keep its name.
log = logging.getLogger("gpugov.daemon.power_limit")

_SPLIT_STEPS = 200
"""The most halvings :meth:`PowerLimitBounds.level` makes: far more than a float's
precision needs, from any range, so its search always ends."""
LEARNED_WITHIN_W = 1.0
"""How close to a GPU's lowest limit learned from NVML's refusals (its constraints unread)
gpugov gets: the share stops at the lowest limit taken once it is within this of the
highest refused (:meth:`PowerLimitBounds.refused_below`)."""


class PowerLimitBounds:
    """What a domain's power cap may ask of its GPUs.

    Each GPU's constraints (``nvmlDeviceGetPowerManagementLimitConstraints``) are read once,
    through its writer (so on a node under its deadline, in order with its writes); a
    request that is no positive number of watts is logged once, and a share clamped into a
    GPU's bounds once per GPU and side.

    Args:
        domain: name for logs.
        writers: each GPU's power limit writer, by label.
    """

    def __init__(self, domain: str, writers: Mapping[str, GpuWriter[Any]]) -> None:
        self.domain = domain
        self._writers = writers
        self._read: dict[str, tuple[float, float] | None] = {}
        self.unread: dict[str, GpuError] = {}
        """Per GPU whose constraints' last read failed for now (read again next time), its
        error: its share waits for them (:meth:`constraints`)."""
        self._logged: set[tuple[str, str]] = set()
        self._bad_request_logged = False
        self._learned: dict[str, tuple[float, float]] = {}
        """Per GPU whose constraints cannot be read, (the highest limit NVML refused as
        too low, the lowest it took) in watts: its lowest limit lies between them."""

    def request(self, cap_w: object) -> float | None:
        """The controller's cap as domain watts, or None (the board limit): a value that
        is no finite positive number (text, a bool, NaN, too large for a float) is logged
        once and taken as None (never a cap)."""
        if cap_w is None:
            return None
        value = math.nan  # text and True were read as watts; 10**400 raised OverflowError
        if isinstance(cap_w, numbers.Real) and not isinstance(cap_w, bool):
            with contextlib.suppress(TypeError, ValueError, OverflowError):
                value = float(cap_w)
        if math.isfinite(value) and value > 0.0:
            return value
        if not self._bad_request_logged:
            self._bad_request_logged = True
            log.warning(
                "domain %s: the controller asked for a power cap of %r, not a positive number "
                "of watts; the GPUs keep their own limits",
                self.domain,
                cap_w,
            )
        return None

    def known(self, backend: PowerLimitBackend) -> tuple[float, float] | None:
        """``backend``'s constraints where they were read already (no GPU call: an exit's
        restore spends no deadline on them), else None."""
        return self._read.get(backend.label)

    def constraints(self, backend: PowerLimitBackend) -> tuple[float, float] | None:
        """The (lowest, highest) limit ``backend`` accepts, in watts, read once (through
        its writer); None when it cannot be read now (read again next time; a read that
        failed for now is in :attr:`unread`) or the GPU reports none.

        Raises:
            GpuLost: the GPU fell off the bus.
        """
        label = backend.label
        if label not in self._read:
            try:
                self._read[label] = self._writers[label].call(
                    backend.power_limit_constraints_w, "constraints read"
                )
            except GpuLost:
                raise
            except GpuError as error:
                log.debug("GPU %s: power limit constraints not read: %s", label, error)
                if isinstance(error, TransientGpuError):
                    self.unread[label] = error
                return None
            self.unread.pop(label, None)
        return self._read[label]

    def level(
        self,
        cap_w: float,
        backends: Sequence[PowerLimitBackend],
        originals_w: Mapping[str, float],
        ready: Collection[str],
    ) -> float:
        """The share each GPU is asked for so that their limits, each share clamped into
        the GPU's bounds (:meth:`clamped`), add up to ``cap_w``: an equal share, and where
        a GPU's bounds clamp it, the others take the difference as far as theirs allow
        (GPUs of one domain may hold unequal limits). ``originals_w``: each GPU's limit
        before gpugov where known (its ceiling); the constraints of the GPUs in ``ready``
        are read if not known yet, the others' (a call to them hangs) taken as known.
        A cap the GPUs cannot meet is the equal share, or less (each GPU at its lowest).

        Raises:
            GpuLost: a GPU fell off the bus reading its constraints.
        """
        bounds = []
        for backend in backends:
            label = backend.label
            limits = self.constraints(backend) if label in ready else self._read.get(label)
            lowest = self._learned_lowest(label, 0.0) if limits is None else limits[0]
            highest = math.inf if limits is None else limits[1]
            if (original := originals_w.get(label)) is not None:
                highest = min(highest, original)
            bounds.append((lowest, max(lowest, highest)))
        even = cap_w / len(bounds)

        def total(share: float) -> float:
            return sum(min(max(share, low), high) for low, high in bounds)

        if total(even) >= cap_w:  # the level is at or below the equal share
            low, high = min(b[0] for b in bounds), even
            if total(low) >= cap_w:
                return min(low, even)  # below what they accept together: each at its lowest
        else:  # a GPU's ceiling clamps its share: the others take more
            low, high = even, min(max(b[1] for b in bounds), max(cap_w, even))
            if total(high) <= cap_w:
                return max(high, even)  # more than they hold together: each at its ceiling
        for _ in range(_SPLIT_STEPS):  # the total grows with the share: bisect
            middle = (low + high) / 2.0
            if not low < middle < high or high - low <= 1e-4:
                break  # to 0.1 mW, or as close as floats that large get (no endless loop)
            if total(middle) < cap_w:
                low = middle
            else:
                high = middle
        return high

    def clamped(
        self, backend: PowerLimitBackend, share_w: float, original_w: float, cap_w: float | None
    ) -> float:
        """``share_w``, the GPU's share of the domain's cap ``cap_w``, within the GPU's
        constraints and at most its original limit ``original_w``; a request outside them
        is logged once per GPU and side."""
        label = backend.label
        limits = self.constraints(backend)
        lowest = None if limits is None else limits[0]
        highest = original_w if limits is None else min(limits[1], original_w)
        value = share_w
        side = ""
        if lowest is not None and value < lowest - 1e-9:
            value, side = lowest, "below"
        elif lowest is None and value < (learned := self._learned_lowest(label, value)):
            value = learned  # said once, when NVML first refused (refused_below)
        if value > highest + 1e-9:  # last: never above the original, whatever else holds
            value, side = highest, "above"
        if side and (label, side) not in self._logged:
            self._logged.add((label, side))
            bound = (
                f"the lowest limit it accepts ({lowest:g} W)"
                if side == "below"
                else f"the limit it had before gpugov ({highest:g} W), which gpugov never raises"
                if highest == original_w
                else f"the highest limit it accepts ({highest:g} W)"
            )
            log.warning(
                "domain %s: the power cap %g W asks %g W of GPU %s, %s %s; %g W set instead "
                "(logged once)",
                self.domain,
                cap_w or 0.0,
                share_w,
                label,
                side,
                bound,
                value,
            )
        return value

    def _learned_lowest(self, label: str, unknown_w: float) -> float:
        """The lowest limit a GPU whose constraints cannot be read is asked for: between
        the highest NVML refused and the lowest it took (halving the gap at each write,
        down to :data:`LEARNED_WITHIN_W`), ``unknown_w`` before any refusal."""
        if label not in self._learned:
            return unknown_w
        refused_w, taken_w = self._learned[label]
        if taken_w - refused_w <= LEARNED_WITHIN_W:
            return taken_w
        return (refused_w + taken_w) / 2.0

    def taken(self, backend: PowerLimitBackend, value_w: float) -> None:
        """NVML took ``value_w`` as ``backend``'s limit: where its lowest limit is being
        learned, it lies at or below that."""
        learned = self._learned.get(backend.label)
        if learned is not None and value_w < learned[1]:
            self._learned[backend.label] = (learned[0], value_w)

    def refused_below(
        self, backend: PowerLimitBackend, value_w: float, held_w: float, error: GpuError
    ) -> bool:
        """Whether NVML's refusal of ``value_w`` (``error``) says only that it is below the
        lowest limit of a GPU whose constraints cannot be read (INVALID_ARGUMENT, below the
        ``held_w`` it holds): then its share is kept above ``value_w`` from now on (one
        line), and the cap holds; such a refusal dropped the cap for the whole run."""
        label = backend.label
        if self._read.get(label) is not None or error.code != NVML_ERROR_INVALID_ARGUMENT:
            return False
        refused_w, taken_w = self._learned.get(label, (0.0, held_w))
        if not refused_w < value_w < taken_w:
            return False  # it took as low a limit before: refused for another reason
        if label not in self._learned:
            log.warning(
                "domain %s: GPU %s: NVML refused a power limit of %g W and its power limit "
                "constraints cannot be read: taken as below the lowest limit it accepts, "
                "which gpugov finds from NVML's answers (to %g W) and keeps the GPU's share "
                "above (logged once)",
                self.domain,
                label,
                value_w,
                LEARNED_WITHIN_W,
            )
        self._learned[label] = (value_w, taken_w)
        return True

    def implausible(self, value_w: float, backend: PowerLimitBackend) -> str | None:
        """Why ``value_w``, read as ``backend``'s power limit, is no limit it could have
        (:func:`implausible_limit` within its constraints), or None."""
        return implausible_limit(value_w, self.constraints(backend))


def implausible_limit(value_w: float, bounds: tuple[float, float] | None) -> str | None:
    """Why ``value_w``, read as a GPU's power limit, is no limit it could have (not a
    positive finite number, or outside ``bounds``, the limits it accepts, when known), or
    None. NVML reads 0xFFFFFFFF mW where a value is unknown."""
    if not (math.isfinite(value_w) and value_w > 0.0):
        return f"its power limit reads {value_w:g} W, which is no limit"
    if bounds is None:
        return None
    low, high = bounds
    if math.isfinite(low) and math.isfinite(high) and not low - 1.0 <= value_w <= high + 1.0:
        return f"its power limit reads {value_w:g} W, outside the {low:g}-{high:g} W it accepts"
    return None


__all__ = ["PowerLimitBounds", "implausible_limit"]
