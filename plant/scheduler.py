"""Batching rules of the serving engine inside the plant.

Each scheduler maps the engine state at the start of an iteration (:class:`SchedulerView`)
to what the iteration runs (:class:`IterationPlan`). A scheduler whose plan never depends
on the state may expose it as ``constant_plan``; the plant then skips building the view.
Admission order is always first come, first served; the plant enforces the batch-size and
KV-cache limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpugov.plant.types import IterationPlan, Scheduler, SchedulerView

CHUNKED_PREFILL_LABEL = "512-token interleaved chunked-prefill surrogate"


@dataclass(frozen=True, slots=True)
class ChunkedPrefillScheduler:
    """vLLM V1 / Sarathi style: every running decode plus prefill chunks, one token budget.

    Decode tokens count against ``token_budget`` (vLLM's ``max_num_batched_tokens``), and
    the rest of the budget goes to prefill chunks, partially prefilled requests first.
    """

    token_budget: int = 512

    @property
    def constant_plan(self) -> IterationPlan:
        """The same plan every iteration, so the plant may skip building a view."""
        return IterationPlan(
            decode=True, prefill_token_budget=self.token_budget, count_decode_in_budget=True
        )

    def __call__(self, view: SchedulerView) -> IterationPlan:
        return self.constant_plan


@dataclass(frozen=True, slots=True)
class PrefillPriorityScheduler:
    """vLLM V0's default: whole-prompt prefill iterations whenever a waiting prompt can be
    admitted, else decode.

    New prompts are prefilled up to ``token_budget`` tokens per iteration (a prompt larger
    than the budget still runs, alone, in chunks of the budget); decodes pause meanwhile.
    A prompt that waits for a batch slot or for KV-cache room lets the running requests
    decode, as vLLM V0's scheduler decodes when no prefill can be scheduled: prefilling
    instead would admit nothing and pause the decodes that free the room, for good.
    """

    token_budget: int = 8192

    def __call__(self, view: SchedulerView) -> IterationPlan:
        if view.prefilling_requests > 0 or (view.waiting_requests > 0 and _admissible(view)):
            return IterationPlan(decode=False, prefill_token_budget=self.token_budget)
        return IterationPlan(decode=True, prefill_token_budget=0)


def _admissible(view: SchedulerView) -> bool:
    """Whether the first waiting request fits a prefill-only iteration: a free batch slot
    and KV-cache room for its prompt (the plant's admission rule)."""
    in_batch = view.decode_active + view.prefilling_requests
    return (
        in_batch < view.max_batch_size
        and view.kv_tokens + view.next_prompt_tokens <= view.kv_capacity_tokens
    )


@dataclass(frozen=True, slots=True)
class DecodePriorityScheduler:
    """Decode-only iterations while any request decodes; prefill only when none does.

    This is the seed MDP's decode-priority heuristic on the detailed plant: TPOT is
    protected, arrivals wait for the decode batch to drain.
    """

    token_budget: int = 8192

    def __call__(self, view: SchedulerView) -> IterationPlan:
        if view.decode_active > 0:
            return IterationPlan(decode=True, prefill_token_budget=0)
        return IterationPlan(decode=False, prefill_token_budget=self.token_budget)


chunked_prefill_scheduler = ChunkedPrefillScheduler()
prefill_priority_scheduler = PrefillPriorityScheduler()
decode_priority_scheduler = DecodePriorityScheduler()

SCHEDULERS: dict[str, Scheduler] = {
    "chunked": chunked_prefill_scheduler,
    "prefill-priority": prefill_priority_scheduler,
    "decode-priority": decode_priority_scheduler,
}


def scheduler_label(scheduler: object) -> str:
    """Human-readable name used in results (the seed's label for chunked prefill)."""
    if isinstance(scheduler, ChunkedPrefillScheduler):
        if scheduler.token_budget == 512:
            return CHUNKED_PREFILL_LABEL
        return f"{scheduler.token_budget}-token interleaved chunked prefill"
    if isinstance(scheduler, PrefillPriorityScheduler):
        return "prefill-priority (vLLM V0 style)"
    if isinstance(scheduler, DecodePriorityScheduler):
        return "decode-priority"
    return str(getattr(scheduler, "__name__", type(scheduler).__name__))
