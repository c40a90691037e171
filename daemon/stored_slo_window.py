"""The SLO budget window a stored ``mpc-online`` model carries across a restart: what it was
measured against, which boot it is of, and this run's SLO counters going on from it; apart
from when the model itself is restored or saved (:mod:`daemon.model_store`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpugov.plant.input_files import finite_number
from gpugov.plant.types import ServingObservation

if TYPE_CHECKING:
    from gpugov.controllers.budget import AttainmentBudget

SAME_BOOT_TOLERANCE_S = 5.0
"""Most disagreement between two readings of the boot time (the wall clock less the
monotonic clock) for both to be of one boot: NTP steps the wall clock by less."""


def boot_unix_s() -> float:
    """When this machine booted, on the wall clock (the wall clock less the monotonic
    clock, which starts at boot): a stored SLO window is of this boot where it matches."""
    return time.time() - time.monotonic()


def budget_terms(
    budget: AttainmentBudget | None, observation: ServingObservation
) -> dict[str, float | None]:
    """What the SLO budget's window is measured against: the latency SLOs the
    observation carries (the config's), the per-prompt TTFT allowance and the
    target (:func:`same_terms` compares them at a restore)."""
    return {
        "ttft_slo_s": observation.ttft_slo_s,
        "tpot_slo_s": observation.tpot_slo_s,
        "ttft_slo_per_prompt_token_s": observation.ttft_slo_per_prompt_token_s,
        "attainment": None if budget is None else budget.target.attainment,
        "window_s": None if budget is None else budget.window_s,
    }


def restore_window(
    budget: AttainmentBudget | None,
    payload: dict[str, Any],
    observation: ServingObservation,
    *,
    path: Path,
    say: Callable[[int, str], None],
) -> list[Any] | None:
    """Go on measuring the SLO window the stored run measured (its misses and its
    looseness) where the file holds it, from this boot (a reboot restarts the engine
    and its counters) and within the window
    (:meth:`controllers.budget.AttainmentBudget.load_state`, its times moved from the
    stored run's clock to this one's by the wall clock's time since the save); a
    part it cannot read is one log line (``say``), never the model's loss. Returns the
    restored window's snapshots where it was applied (for :func:`counter_base`), else
    None."""
    state = payload.get("slo_budget")
    clock = payload.get("clock")
    saved_at = finite_number(payload.get("saved_at_unix_s"))
    if budget is None or state is None or saved_at is None or not isinstance(clock, dict):
        return None
    then = finite_number(clock.get("time_s"))
    boot = finite_number(clock.get("boot_unix_s"))
    if then is None or boot is None or abs(boot - boot_unix_s()) > SAME_BOOT_TOLERANCE_S:
        return None  # another boot, or no clock to place the window on: a new window
    terms = budget_terms(budget, observation)
    stored_terms = payload.get("slo_budget_terms")
    if not same_terms(stored_terms, terms):
        # Its counts were judged against those SLOs and its looseness earned against
        # that target: under tighter ones it spent a budget this run does not have.
        say(
            logging.INFO,
            f"{path}: SLO budget window not applied: it was measured against "
            f"{terms_text(stored_terms)}, this run's are {terms_text(terms)}; a new "
            "window at a looseness of 1",
        )
        return None
    now_unix = time.time()
    shift = observation.time_s - (now_unix - saved_at) - then
    try:
        applied = budget.load_state(state, observation.time_s, shift)
    except ValueError as error:
        say(logging.WARNING, f"{path}: SLO budget not applied: {error}")
        return None
    if not applied:
        return None
    say(
        logging.INFO,
        f"{path}: SLO budget window restored (looseness {budget.looseness:.2f})",
    )
    snapshots: list[Any] = state["snapshots"]
    return snapshots


def counter_base(
    snapshots: list[Any], observation: ServingObservation
) -> tuple[float | None, ...] | None:
    """Where this run's SLO counters go on from: the restored window's last snapshot where
    they start again (a node's attainment estimator starts at zero with each daemon): read
    as counters gone back, they dropped the window at its first update. None where they
    already go on from it (an engine's own) or there is no snapshot."""
    if not snapshots:
        return None
    last = [finite_number(value) for value in snapshots[-1][1:5]]
    now = slo_counters(observation)
    for index in (0, 2):
        last_within, last_count = last[index], last[index + 1]
        if last_within is None or last_count is None:
            continue
        within, count = now[index], now[index + 1]
        if within is None or count is None or within < last_within or count < last_count:
            return tuple(last)
    return None


def counted_on(
    observation: ServingObservation, base: tuple[float | None, ...] | None
) -> ServingObservation:
    """``observation`` with its SLO counters going on from ``base`` (:func:`counter_base`)."""
    if base is None:
        return observation
    now = slo_counters(observation)
    total = [None if n is None else n + (b or 0.0) for n, b in zip(now, base, strict=True)]
    return replace(
        observation,
        ttft_within_slo_total=total[0],
        ttft_count_total=total[1],
        tpot_within_slo_total=total[2],
        tpot_count_total=total[3],
    )


def slo_counters(observation: ServingObservation) -> list[float | None]:
    """The observation's cumulative SLO counters: TTFT within and count, TPOT within and
    count (None where unmeasured)."""
    return [
        finite_number(value)
        for value in (
            observation.ttft_within_slo_total,
            observation.ttft_count_total,
            observation.tpot_within_slo_total,
            observation.tpot_count_total,
        )
    ]


def same_terms(stored: object, terms: dict[str, float | None]) -> bool:
    """Whether a stored window's ``slo_budget_terms`` are ``terms`` (each the same
    number, or unset in both); False where the file keeps none (saved before it kept
    them: what its window was measured against is not known)."""
    if not isinstance(stored, dict):
        return False
    for name, value in terms.items():
        kept = finite_number(stored.get(name))
        if value is None or kept is None:
            if (value is None) != (stored.get(name) is None):
                return False
        elif not math.isclose(kept, float(value), rel_tol=1e-9):
            return False
    return True


def terms_text(terms: object) -> str:
    """A window's terms for a log line: ``TTFT 2 s, TPOT 0.1 s, 0.99 over 600 s``."""
    if not isinstance(terms, dict):
        return "terms the file does not keep (saved before it kept them)"

    def number(name: str) -> str:
        value = finite_number(terms.get(name))
        return "none" if value is None else f"{value:g}"

    allowance = finite_number(terms.get("ttft_slo_per_prompt_token_s"))
    per_token = "" if allowance is None else f" + {allowance:g} s a prompt token"
    return (
        f"TTFT {number('ttft_slo_s')} s{per_token}, TPOT {number('tpot_slo_s')} s, "
        f"{number('attainment')} over {number('window_s')} s"
    )


__all__ = [
    "SAME_BOOT_TOLERANCE_S",
    "boot_unix_s",
    "budget_terms",
    "counted_on",
    "counter_base",
    "restore_window",
    "same_terms",
    "slo_counters",
    "terms_text",
]
