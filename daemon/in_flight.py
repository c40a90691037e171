"""What the requests in flight on a domain's engine hold, derived from its cumulative
counters and gauges (``docs/daemon.md``): the arrivals since the first scrape, the requests
waiting and still in their prefill, the prompt tokens left of those prefills (their mean and
their tail) and the tokens the requests decoding have generated. The derivations the
observer (:mod:`daemon.observer`) builds a tick's observation from; no I/O, no logging."""

from __future__ import annotations

import math

from gpugov.daemon.engines import EngineSample
from gpugov.daemon.prompt_lengths import (
    residual_prompt_tokens,
    residual_prompt_tokens_quantile,
)


def _nothing_in_flight(engine: EngineSample) -> bool:
    """No request running or waiting."""
    return engine.running_requests <= 0 and engine.waiting_requests <= 0


class _InFlight:
    """What the requests in flight hold, as the difference of two cumulative engine
    counters (first tokens less finished requests; generated tokens less the finished
    requests'): less what the difference held the last time nothing was in flight (what
    requests that ended uncounted left in it), forgotten when the engine restarts."""

    def __init__(self) -> None:
        self._counter: float | None = None
        self._offset = 0.0

    def follow(self, counter: float) -> None:
        """Note the leading counter; one that went backwards is an engine restart, whose
        counters start again from zero."""
        previous, self._counter = self._counter, counter
        if previous is not None and counter < previous:
            self._offset = 0.0

    def in_flight(self, difference: float, idle: bool) -> float:
        """The in-flight part of ``difference``; with nothing in flight (``idle``) it is 0
        and the whole difference becomes the offset."""
        if idle:
            self._offset = difference
            return 0.0
        self._offset = min(self._offset, difference)
        return difference - self._offset


class InFlightRequests:
    """One domain's engine's requests in flight, from its counters scrape by scrape (each
    of these is called once per tick, in :meth:`daemon.observer.DomainObserver.observe`'s
    order, so that the differences learn their offsets while idle).

    Args:
        role: the domain's pool role (``docs/disaggregated.md``): a decode pool's
            prompts were prefilled elsewhere.
        tail_quantile: the quantile of a prompt's rest behind ``prefill_tail_tokens``.

    Raises:
        ValueError: ``tail_quantile`` is not within (0, 1).
    """

    def __init__(self, role: str, tail_quantile: float) -> None:
        if not 0.0 < tail_quantile < 1.0:
            raise ValueError(f"tail_quantile must lie in (0, 1), got {tail_quantile!r}")
        self.role = role
        self.tail_quantile = tail_quantile
        self._decoding = _InFlight()
        """First tokens less finished requests: the requests decoding."""
        self._generated = _InFlight()
        """Generated tokens less the finished requests': the in-flight requests' tokens."""
        self._prefilled = _InFlight()
        """Prompt tokens as they ran less the prompt counter: the prompts in prefill's."""
        self._arrived_before: float | None = None
        """The requests the engine had seen through before the first scrape (its counter
        then, less the ones in flight): not arrivals this daemon saw."""
        self._last_counter: float | None = None
        """The engine's monotonic request counter at the last scrape (arrivals, else
        finished): one that went back is an engine restart."""

    def arrived_since_start(self, arrived: float, engine: EngineSample) -> float:
        """The engine's arrivals since this daemon's first scrape, the requests then in
        flight included: a daemon started beside an engine that has served for days does
        not read its lifetime as one period's arrivals (the MPC's arrival-rate forecast
        did, and held high clocks for its window). A counter that went back (an engine
        restart) counts from zero again; on a page summed over data-parallel engines it
        counts from that scrape, as from the first: only the restarted engine's share
        went back, and "from zero" read the others' lifetimes as one period's arrivals.
        A simulated run's engine starts at zero, so its counts are unchanged."""
        counter = engine.arrived_requests_total
        if counter is None:
            counter = engine.finished_requests_total or 0.0
        previous, self._last_counter = self._last_counter, counter
        restarted = previous is not None and counter < previous
        if self._arrived_before is None or (restarted and engine.engines > 1):
            in_flight = engine.waiting_requests + engine.running_requests
            self._arrived_before = max(0.0, arrived - in_flight)
        elif restarted:
            self._arrived_before = 0.0
        return max(0.0, arrived - self._arrived_before)

    def waiting(self, engine: EngineSample) -> int:
        """Waiting requests; a decode domain leaves out those vLLM defers (waiting for
        their KV cache to arrive: no clock serves them sooner)."""
        deferred = engine.waiting_deferred_requests
        if self.role == "decode" and deferred is not None:
            return max(0, engine.waiting_requests - deferred)
        return max(0, engine.waiting_requests)

    def local_prompt_tokens(self, engine: EngineSample) -> float:
        """Prompt tokens prefilled on the domain's GPUs so far, as their chunks ran.

        vLLM V1 advances its prompt counter only once a prompt's prefill is done, and
        SGLang (since its collector rewrite) only once the request finishes, which can be
        windows after its chunks ran (a window's work would lag it).
        Where the engine publishes the tokens its steps ran (vLLM's tokens-per-step
        histogram), those less the decode tokens (the generated tokens less the first
        tokens, which prefills make) are the prompt tokens as they ran; tokens whose KV
        cache came from another instance never ran here. Where it counts the prompt
        tokens its prefills computed (SGLang's ``realtime_tokens_total``,
        ``prefill_compute``), that counter is. A decode domain, and an engine without
        either, keep the prompt counter, less (in a disaggregated domain) vLLM's
        ``external_kv_transfer`` prompt tokens."""
        steps = engine.iteration_tokens_total
        generated = engine.generation_tokens_total
        if (
            self.role != "decode"
            and steps is not None
            and generated is not None
            and engine.ttft is not None
        ):
            ran = steps - (generated - engine.ttft.count)
            if math.isfinite(ran):
                return max(0.0, ran)
        computed = engine.prompt_tokens_computed_total
        if self.role != "decode" and computed is not None and math.isfinite(computed):
            return max(0.0, computed)
        total = float(engine.prompt_tokens_total or 0.0)
        external = engine.prompt_tokens_external_total
        if self.role != "colocated" and external is not None:
            return max(0.0, total - external)
        return total

    def prefill_rest(
        self, engine: EngineSample, prefilling: int, done: float | None, mean_prompt: float
    ) -> float:
        """The prompt tokens left of the ``prefilling`` prompts in their prefill.

        Where the engine says how many of their tokens have run (``done``,
        :meth:`prefilled_in_flight`), each is at the rest of a prompt that has run its
        share of them (:func:`residual_prompt_tokens`); elsewhere each is at the
        length-biased rest, at least the mean."""
        if prefilling <= 0:
            return 0.0
        buckets = engine.request_prompt_tokens_buckets
        if done is None:
            biased = residual_prompt_tokens(buckets)
            return prefilling * (mean_prompt if biased is None else max(mean_prompt, biased))
        rest = residual_prompt_tokens(buckets, done / prefilling)
        return prefilling * (mean_prompt if rest is None else rest)

    def prefill_tail(
        self, engine: EngineSample, prefilling: int, done: float | None, expected: float
    ) -> float:
        """The prompt tokens left of the ``prefilling`` prompts at the upper quantile of
        the rest (:attr:`tail_quantile`, :func:`residual_prompt_tokens_quantile`), at
        least ``expected`` (their mean rest): a long prompt's tail, which a prompt queued
        behind it waits for."""
        if prefilling <= 0:
            return 0.0
        rest = residual_prompt_tokens_quantile(
            engine.request_prompt_tokens_buckets,
            self.tail_quantile,
            None if done is None else done / prefilling,
        )
        return expected if rest is None else max(expected, prefilling * rest)

    def prefilled_in_flight(self, engine: EngineSample, ran: float) -> float | None:
        """Prompt tokens that have run of the prompts now in their prefill: the prompt
        tokens as they ran (``ran``, :meth:`local_prompt_tokens`) less the engine's prompt
        counter (prompts whose prefill is done), less what that difference held the last
        time nothing was in flight (prefix-cached tokens the counter has and no step ran).
        None where the engine publishes no per-step tokens (SGLang, TGI) or serves a
        decode pool."""
        if (
            self.role == "decode"
            or engine.iteration_tokens_total is None
            or engine.prompt_tokens_total is None
        ):
            return None
        self._prefilled.follow(ran)
        difference = ran - float(engine.prompt_tokens_total)
        if not math.isfinite(difference):
            return None
        return max(0.0, self._prefilled.in_flight(difference, _nothing_in_flight(engine)))

    def prefilling(self, engine: EngineSample) -> int:
        """Running requests still in their prefill: vLLM and SGLang schedule a prompt's
        chunks as a running request, so their waiting gauge leaves it out. The running
        gauge less the requests that have their first token and have not finished (the
        TTFT histogram's count less the finished counter), less what that difference held
        the last time nothing was in flight. 0 where the engine gives the backlog itself
        (the simulated engine), lacks either counter, or serves a decode pool (its
        prompts were prefilled elsewhere)."""
        if (
            engine.prefill_remaining_tokens is not None
            or engine.ttft is None
            or engine.finished_requests_total is None
            or self.role == "decode"
        ):
            return 0
        first_tokens = engine.ttft.count
        self._decoding.follow(first_tokens)
        decoding = first_tokens - engine.finished_requests_total
        if not math.isfinite(decoding):
            return 0
        running = max(0, engine.running_requests)
        decoding = self._decoding.in_flight(decoding, _nothing_in_flight(engine))
        return int(min(running, max(0, running - round(decoding))))

    def generated_in_flight(self, engine: EngineSample) -> float | None:
        """Tokens generated so far by the requests in flight: the generation counter less
        the finished requests' (the output-length histogram's sum) less the offset of
        requests the histogram never counted; None where the engine gives no such pair,
        or the pair is inconsistent (the histogram ahead of the counter)."""
        total = engine.generation_tokens_total
        finished = engine.finished_generation_tokens_total
        if total is None or finished is None:
            return None
        self._generated.follow(total)
        in_flight = total - finished
        if not math.isfinite(in_flight) or in_flight < 0.0:
            return None
        return self._generated.in_flight(in_flight, _nothing_in_flight(engine))


__all__ = ["InFlightRequests"]
