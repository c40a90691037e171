"""``mpc-online``'s efficiency floor: no period below the clocks the learned model shows
cost more energy than a faster one for the prompts arriving.

The MPC's fluid model charges a period at its phase's busy power whenever work is left in
it, however early the work ends at that clock, so it sees no gain in finishing a prompt
sooner and idling (``docs/online.md``, "No race to idle in the MPC"); the idle parking
picks the lowest clock the measured latencies allow. Where power rises slowly with the
clock, a slower clock then costs *more* energy per prompt: a prompt that lands in a period
parked low, or one prefilled in a busy period held low, is both slower and dearer. The
floor reads the learned model. A domain that keeps up with its prompts draws, on average,

    c(f) = P_idle(f) + r * (P_prefill(f) - P_idle(f)) * prefill_s_per_token(f)
                     + d * (P_decode(f) - P_idle(f))

watts at clock ``f``, with ``r`` the prompt tokens prefilled per second recently and ``d``
the share of recent time the domain had replies decoding. Decode is priced by its share of
the time, not per token: its requests stream in at the rate they arrive, and a faster
clock shortens each iteration but grows no idle gap while replies keep decoding (the batch
only shrinks), which is the MPC's own view of a busy period.

A clock is *surely dearer* when the model has seen it (busy windows there) and even its
optimistic cost (the prefill latency at its mean less ``z`` standard deviations) exceeds
the pessimistic cost (its mean plus ``z``) of the cheapest clock it has seen by more than
:data:`EVIDENCE`, a wide margin: a learned model can be confidently wrong about a clock.
Energy per prompt falls and then rises with the clock, so where the lowest clock the model
has seen is surely dearer than a faster one, no slower clock is worth running at: the
floor is then the lowest clock whose mean cost is within :data:`TOLERANCE` of the model's
cheapest (a clock it has not seen priced by it from the seen ones); raising the clock
costs no latency, and the model refines the clocks it then runs at. Where the lowest seen
clock is not surely dearer, the floor is the lowest clock and changes nothing: on every
bundled profile the lowest clocks are the cheapest, and the exploration reaches the clocks
below the lowest seen one as before.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.efficiency import MIX_MEMORY_S, TOLERANCE, WorkMix, cheapest_within
from gpugov.controllers.online.identification import OnlineModel
from gpugov.controllers.online.prediction import work_power

FloatArray = NDArray[np.float64]

EVIDENCE = 0.2
"""Relative margin by which the lowest seen clock's optimistic cost must exceed the
cheapest seen clock's pessimistic one before the floor acts: a learned model can be
confidently wrong about a clock (a latency part its windows there never exercised, priced
by the prior's 1/f law), and the floor would then raise the clock for nothing, so only a
wide gap counts as evidence of a trend."""


def power_for_work(
    model: OnlineModel,
    realized_mhz: FloatArray,
    prompt_rate: float,
    decode_share: float,
    z: float,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(mean, optimistic, pessimistic)`` watts at each realised clock while prefilling
    ``prompt_rate`` prompt tokens per second and decoding ``decode_share`` of the time
    (module notes); the bounds take the prefill latency at ``z`` standard deviations under
    and over its mean (the powers at their means)."""
    rows = model.predict_rows(realized_mhz, 1.0, 0.0)
    return work_power(rows, prompt_rate, decode_share, z)


def efficiency_floor(
    model: OnlineModel, prompt_rate: float, decode_share: float, z: float, minimum_visits: int
) -> float:
    """The lowest supported clock worth running at (module notes): the lowest clock
    unless the lowest clock the model has seen at least ``minimum_visits`` busy windows is
    surely dearer than the cheapest seen one."""
    clocks = model.clocks_mhz
    seen = np.flatnonzero(model.visits >= minimum_visits)
    if seen.size < 2 or not prompt_rate > 0.0:
        return float(clocks[0])
    realized = clocks * model.realized_ratio
    # The seen clocks alone first (a few of them): on a board whose lowest clocks are the
    # cheapest the answer is known from them.
    mean, optimistic, pessimistic = power_for_work(
        model, realized[seen], prompt_rate, decode_share, z
    )
    finite = np.isfinite(mean) & np.isfinite(optimistic) & np.isfinite(pessimistic)
    if not finite.all():
        mean, optimistic, pessimistic = mean[finite], optimistic[finite], pessimistic[finite]
        if mean.size < 2:
            return float(clocks[0])
    cheapest = int(np.argmin(mean))
    if cheapest == 0 or not optimistic[0] > (1.0 + EVIDENCE) * pessimistic[cheapest]:
        return float(clocks[0])  # no evidence that any slower clock costs more
    every, _, _ = power_for_work(model, realized, prompt_rate, decode_share, 0.0)
    return cheapest_within(clocks, every)


def domain_floor(
    model: OnlineModel, mix: WorkMix, role: str, z: float, minimum_visits: int
) -> float:
    """:func:`efficiency_floor` for a domain of ``role`` from its recent ``mix``: a prefill
    pool decodes nothing; a decode pool prefills nothing, so its floor is the lowest
    clock."""
    rate, share = mix.for_role(role)
    return efficiency_floor(model, rate, share, z, minimum_visits)


__all__ = [
    "EVIDENCE",
    "MIX_MEMORY_S",
    "TOLERANCE",
    "WorkMix",
    "domain_floor",
    "efficiency_floor",
    "power_for_work",
]
