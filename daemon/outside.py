"""An outside package's controller at gpugov's edge (``kind = "external"``).

Code from another package keeps the controller contract less reliably than the in-tree
kinds, which the conformance suite checks. :class:`OutsideController` is the innermost
layer around it, on a node and in every study: the controller decides on its own copy of
the observation (a change it makes, even through ``object.__setattr__``, never reaches
the safety chain, the recording or the exporter), its ``sys.exit()`` is an error like any
other it raises (the loop survives it; a study reports it), and an answer that is not a
clock in MHz becomes NaN, which :class:`daemon.safety.ClampToSupported` replaces by the
top clock and counts (``invalid_decision``). In virtual time (the studies), where no
deadline bounds a call, a call still running after :data:`SLOW_DECISION_S` wall seconds
is named in one warning line, so a hung controller is never a silent stall.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
import weakref
from typing import Any

from gpugov.controllers.contract import ClockController, ControllerWrapper, chain_layer
from gpugov.daemon.deadline import escape_text
from gpugov.daemon.safety import invalid_decisions
from gpugov.plant.types import ServingObservation

log = logging.getLogger(__name__)

SLOW_DECISION_S = 30.0
"""Wall seconds after which a call still running is named in a warning (virtual time)."""
_WATCH_EVERY_S = 1.0
_watched: weakref.WeakSet[OutsideController] = weakref.WeakSet()
_watch_lock = threading.Lock()
_watcher: list[threading.Thread] = []


def _watch() -> None:
    """The one watcher thread: every second, each watched controller checks its call."""
    while True:
        time.sleep(_WATCH_EVERY_S)
        now_s = time.monotonic()
        for controller in list(_watched):
            controller.check_slow(now_s)


def _start_watching(controller: OutsideController) -> None:
    """Watch ``controller``'s calls (the watcher thread starts with the first one; a
    daemon thread: the exit never waits for it)."""
    with _watch_lock:
        _watched.add(controller)
        if not _watcher:
            thread = threading.Thread(target=_watch, name="gpugov-outside-watch", daemon=True)
            thread.start()
            _watcher.append(thread)


class OutsideExit(RuntimeError):
    """An outside controller called ``sys.exit()`` while deciding, or raised another
    exception that is no error (``GeneratorExit``, an asyncio ``CancelledError``)."""


def not_a_clock(answer: Any) -> str | None:
    """``answer``'s short ``repr`` when it is not a clock in MHz, else None. A clock is a
    finite number above 0 (a NumPy or PyTorch scalar counts); a bool, a string, None,
    NaN, an infinity, zero or a negative number is not."""
    dtype = getattr(answer, "dtype", None)
    if (
        isinstance(answer, bool)
        or getattr(dtype, "kind", None) == "b"
        or str(dtype) == "torch.bool"
    ):
        return _short(answer)
    if answer is None or isinstance(answer, str | bytes):
        return _short(answer)
    try:
        value = float(answer)
    except Exception:  # an outside object's __float__ may raise anything
        return _short(answer)
    if not math.isfinite(value) or value <= 0.0:
        return _short(answer)
    return None


def _short(answer: Any) -> str:
    """``repr(answer)``, cut to 60 characters (a log line stays one short line)."""
    try:
        text = repr(answer)
    except Exception:  # an outside object's __repr__ may raise too
        text = f"<{type(answer).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


class OutsideController(ControllerWrapper):
    """An outside controller's decision on its own copy of the observation, with its
    ``sys.exit()`` raised as :class:`OutsideExit` and an answer that is not a clock
    (:func:`not_a_clock`) returned as NaN for the chain to replace and count.

    Attributes:
        invalid_answers: answers that were not a clock.
        last_invalid: the last such answer, as a short ``repr`` (None: none yet).
    """

    def __init__(self, inner: ClockController, *, watch: bool = False) -> None:
        super().__init__(inner)
        self.invalid_answers = 0
        self.last_invalid: str | None = None
        self.watch = watch
        """Name a call still running after :data:`SLOW_DECISION_S` (virtual time)."""
        self._call: tuple[float, float, int] | None = None
        """The running call: (its wall start, the observation's time_s and step)."""
        self._warned: tuple[float, float, int] | None = None
        if watch:
            _start_watching(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> OutsideController:
        """A copy around a deep copy of the algorithm, watched as this one is."""
        copied = OutsideController(copy.deepcopy(self.inner, memo), watch=self.watch)
        copied.name = self.name
        return copied

    def check_slow(self, now_s: float) -> None:
        """Warn once about the running call when it has taken :data:`SLOW_DECISION_S`."""
        call = self._call
        if call is None or call is self._warned or now_s - call[0] < SLOW_DECISION_S:
            return
        self._warned = call
        log.warning(
            "controller %r has been deciding for %.0f s (at t=%.3fs, step %d); "
            "Ctrl-C stops the run",
            self.name,
            now_s - call[0],
            call[1],
            call[2],
        )

    def __call__(self, observation: ServingObservation) -> float:
        own = copy.copy(observation)  # frozen, but object.__setattr__ would still change it
        if self.watch:
            self._call = (time.monotonic(), observation.time_s, observation.step_index)
        try:
            answer = self.inner(own)
        except (Exception, KeyboardInterrupt):
            raise
        except BaseException as error:  # sys.exit(), GeneratorExit, a CancelledError
            raise OutsideExit(f"{escape_text(error)} while deciding") from error
        finally:
            self._call = None
        problem = not_a_clock(answer)
        if problem is not None:
            self.invalid_answers += 1
            self.last_invalid = problem
            return math.nan
        return float(answer)


def outside_layer(controller: ClockController) -> OutsideController | None:
    """The chain's :class:`OutsideController` layer (None for an in-tree kind)."""
    return chain_layer(controller, OutsideController)


def invalid_decision_note(controller: ClockController, label: str) -> str | None:
    """One line on a run's decisions that were not a clock (the chain ran the top clock
    instead), for a study to report; None when every decision was a clock."""
    count = invalid_decisions(controller)
    if not count:
        return None
    outside = outside_layer(controller)
    last = outside.last_invalid if outside is not None and outside.last_invalid else "nan"
    return (
        f"controller {label!r}: {count} decision(s) were not a clock in MHz (the last: "
        f"{last}); the safety chain ran the top clock instead"
    )


__all__ = [
    "OutsideController",
    "OutsideExit",
    "invalid_decision_note",
    "not_a_clock",
    "outside_layer",
]
