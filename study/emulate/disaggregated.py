"""The emulated node in a disaggregated layout (``gpugov emulate --layout MPND``).

``M`` prefill and ``N`` decode engine replicas, each a
:class:`~gpugov.plant.PlantSimulation` on ``tensor_parallel`` GPUs (the profile's: one
GPU, or a tensor-parallel group served as in the colocated layout, each GPU with its
own clock lock and its ``1 / TP`` share of the group's power, the group at its slowest
GPU's clock). Replicas ``0..M-1`` are the prefill pool and ``M..M+N-1`` the decode pool,
so the prefill pool is GPUs ``0..M*TP-1`` and the decode pool the next ``N*TP``; with
a profile of one GPU, ``MPND`` is ``M`` and ``N`` GPUs, as in the plant's
:class:`~gpugov.plant.disaggregated_layout.PoolSpec`. A completion follows the plant's
disaggregated model (``plant/disaggregated.py``, ``docs/plant.md``): a prefill engine
(in turn) runs the prompt and produces the first token at the end of the prefill; the
prompt's KV cache then moves to a decode engine (in turn) in
``fixed_s + prompt_tokens * kv_bytes_per_token / bandwidth``
(:meth:`DisaggregatedPlant.transfer_s`, the interconnect's stated defaults); the decode
engine admits it into its batch (:meth:`PlantSimulation.add_prefilled_request`) and
generates the rest. A one-token completion ends at the prefill.

Each pool serves its own vLLM V1 page, as a disaggregated vLLM deployment runs a prefill
and a decode instance: ``/prefill/metrics`` and ``/decode/metrics`` (:data:`POOL_PATHS`),
each with its engines labelled ``engine="0"``, ``"1"``, ... The prefill page counts each
request as a prefill instance does (``max_tokens=1``: one generated token, finished
``length``, its TTFT); the decode page counts the tokens after the first, the
inter-token latencies (the first of them includes the transfer, as the plant's TPOT
does), the request's end and finish reason, and the NIXL connector's series (transfer
time and bytes, ``vllm:num_requests_waiting_by_reason{reason="deferred"}`` for requests
whose KV cache is on the way, ``vllm:prompt_tokens_by_source_total`` with every prompt
token ``external_kv_transfer``). Each engine also serves its own page at
``/replica/<r>/metrics`` (its pool's series, its engine labelled ``engine="0"``), as
each instance of a real deployment serves its own. ``GET /gpugov/energy`` keeps its
contract: a request's
energy is its prefill engine's share plus its decode engine's, and the totals cover
both pools.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpugov.plant import ServingPlant
from gpugov.plant.disaggregated_layout import INTERCONNECTS, DisaggregatedPlant, PoolSpec
from gpugov.study.emulate.metrics import (
    _histogram,
    _labels,
    _number,
    created,
    family,
    render_metrics,
)
from gpugov.study.emulate.node import EmulatedNode, EnergyRecord, Histogram, Stream

COLOCATED = "colocated"
POOL_PATHS = {"/prefill/metrics": "prefill", "/decode/metrics": "decode"}
"""The pools' metrics pages: path -> pool role."""
_LAYOUT = re.compile(r"^([1-9][0-9]{0,3})P([1-9][0-9]{0,3})D$", re.IGNORECASE)

# vLLM's NixlPromMetrics buckets (nixl_connector.py): transfer seconds and bytes.
XFER_TIME_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
XFER_BYTES_BUCKETS = tuple(float(2**k) for k in range(20, 36, 2))


def parse_layout(text: str) -> tuple[int, int] | None:
    """``"colocated"`` -> None; ``"MPND"`` (``1P1D``, ``2P2D``, ...) -> (M, N).

    Raises:
        ValueError: one line saying what a layout is.
    """
    if text.strip().lower() == COLOCATED:
        return None
    match = _LAYOUT.match(text.strip())
    if match is None:
        raise ValueError(
            f"expected colocated or MPND with M prefill and N decode engine replicas "
            f"(1P1D, 2P2D), "
            f"got {text[:40]!r}"
        )
    return int(match.group(1)), int(match.group(2))


@dataclass
class PoolStream(Stream):
    """A request in flight through both pools: its prefill engine, then its decode one."""

    phase: str = "prefill"
    """``prefill``, ``transfer`` or ``decode``."""
    prefill_replica: int = 0
    prefill_index: int = 0
    decode_replica: int | None = None
    first_token_s: float | None = None
    prefill_energy: tuple[float, float] = (0.0, 0.0)
    """(prefill J, decode J) its prefill engine attributed to it."""


@dataclass
class TransferStats:
    """One decode engine's NIXL connector counters (the transfers it received)."""

    seconds: Histogram = field(default_factory=lambda: Histogram(XFER_TIME_BUCKETS_S))
    bytes: Histogram = field(default_factory=lambda: Histogram(XFER_BYTES_BUCKETS))
    in_flight: int = 0
    external_prompt_tokens: int = 0


class DisaggregatedNode(EmulatedNode):
    """``prefill_replicas`` prefill engines and ``decode_replicas`` decode engines of
    ``plant``, each on ``plant.tensor_parallel`` GPUs, joined by the KV transfer over
    ``interconnect``; the colocated node's GPUs, API and energy truth, with one metrics
    page per pool (:func:`render_pool_metrics`).

    Engines are indexed by replica, as in the colocated node (``simulations``,
    ``stats``, ``transfers``); :meth:`pool_replicas` and :meth:`pool_gpus` give a pool's
    replicas and GPUs."""

    def __init__(
        self,
        plant: ServingPlant,
        *,
        prefill_replicas: int,
        decode_replicas: int,
        interconnect: str = "nvlink",
        seed: int = 0,
        speed: float = 1.0,
        tick_s: float = 0.002,
        clock: Callable[[], float] | None = None,
        fault: str = "none",
        lost_after_s: float | None = None,
    ) -> None:
        if prefill_replicas < 1 or decode_replicas < 1:
            raise ValueError(
                f"a disaggregated layout needs >= 1 prefill and >= 1 decode engine, "
                f"got {prefill_replicas}P{decode_replicas}D"
            )
        extra: dict[str, Any] = {} if clock is None else {"clock": clock}
        tp = plant.tensor_parallel
        super().__init__(
            plant,
            gpus=(prefill_replicas + decode_replicas) * tp,
            tensor_parallel=tp,
            seed=seed,
            speed=speed,
            tick_s=tick_s,
            fault=fault,
            lost_after_s=lost_after_s,
            **extra,
        )
        self.layout = DisaggregatedPlant(
            PoolSpec(plant, prefill_replicas),
            PoolSpec(plant, decode_replicas),
            interconnect=interconnect,
        )
        self.prefill_replicas = tuple(range(prefill_replicas))
        """The prefill pool's engine replicas (indices into ``simulations``)."""
        self.decode_replicas = tuple(range(prefill_replicas, prefill_replicas + decode_replicas))
        """The decode pool's engine replicas."""
        self.prefill_gpus = tuple(range(prefill_replicas * tp))
        """The prefill pool's GPUs (every GPU of its replicas' groups)."""
        self.decode_gpus = tuple(range(prefill_replicas * tp, self.gpu_count))
        """The decode pool's GPUs."""
        self.transfers = {replica: TransferStats() for replica in self.decode_replicas}
        """Each decode replica's NIXL connector counters."""
        self._in_transfer: list[tuple[float, int, PoolStream]] = []  # (lands at, seq, stream)
        self._sequence = 0
        self._next_prefill = 0
        self._next_decode = 0

    @property
    def layout_name(self) -> str:
        """``MPND``: the pools' engine replicas."""
        return f"{len(self.prefill_replicas)}P{len(self.decode_replicas)}D"

    def pool_gpus(self, role: str) -> tuple[int, ...]:
        """The GPUs of pool ``role``."""
        return self.prefill_gpus if role == "prefill" else self.decode_gpus

    def pool_replicas(self, role: str) -> tuple[int, ...]:
        """The engine replicas of pool ``role``."""
        return self.prefill_replicas if role == "prefill" else self.decode_replicas

    def replica_role(self, replica: int) -> str:
        """``prefill`` or ``decode``: the pool replica ``replica``'s engine serves."""
        return "prefill" if replica in self.prefill_replicas else "decode"

    # ------------------------------------------------------------------ serving
    def submit(
        self, prompt_tokens: int, output_tokens: int, finish_reason: str, request_id: str = ""
    ) -> Stream:
        """Inject a request now on the next prefill engine (in turn); its tokens arrive on
        the returned stream's ``events``, the first from the prefill, the rest from the
        decode engine its KV cache moves to."""
        with self.lock:
            self.advance()
            replica = self.prefill_replicas[self._next_prefill]
            self._next_prefill = (self._next_prefill + 1) % len(self.prefill_replicas)
            index = self.simulations[replica].add_request(prompt_tokens, 1)
            stream = PoolStream(
                replica,
                index,
                prompt_tokens,
                output_tokens,
                finish_reason,
                request_id=request_id,
                prefill_replica=replica,
                prefill_index=index,
            )
            self._streams[replica][index] = stream
            return stream

    def advance(self) -> None:
        """Advance the prefill engines to now, start the transfers of the prompts they
        finished, land those due in their decode engines, then advance the decode engines
        and hand out their tokens."""
        with self.lock:
            now = self.plant_time_s()
            for replica in self.prefill_replicas:
                simulation = self.simulations[replica]
                if now > simulation.time_s:
                    simulation.advance_to(now)
                self._prefilled(replica)
            while self._in_transfer and self._in_transfer[0][0] <= now:
                lands_at, _, stream = heapq.heappop(self._in_transfer)
                self._land(stream, lands_at)
            for replica in self.decode_replicas:
                simulation = self.simulations[replica]
                if now > simulation.time_s:
                    simulation.advance_to(now)
                self._decoded(replica, simulation.time_s)

    def _prefilled(self, replica: int) -> None:
        """Hand out the first token of each prompt prefill engine ``replica`` finished;
        start its transfer."""
        simulation = self.simulations[replica]
        stats = self.stats[replica]
        first, _ = simulation.request_times()
        streams = self._streams[replica]
        done = [index for index in streams if first[index] is not None]
        for index in done:
            stream = streams.pop(index)
            assert isinstance(stream, PoolStream)
            first_s = float(first[index])  # type: ignore[arg-type]
            arrival = simulation.requests[index].arrival_time_s
            stats.ttft.observe(first_s - arrival)
            stats.e2e.observe(first_s - arrival)
            stats.prompt_tokens += stream.prompt_tokens  # as vLLM V1: once prefilled
            stats.generation_tokens += 1
            stats.finished["length"] += 1  # a prefill instance's request: max_tokens=1
            stats.prompt_lengths.observe(stream.prompt_tokens)
            stats.output_lengths.observe(1)
            stream.prefill_energy = simulation.request_energy(index)
            stream.first_token_s = stream.last_token_s = first_s
            stream.sent = 1
            stream.events.put(("tokens", 1))
            if stream.output_tokens <= 1:
                self._finish(stream, first_s, stream.prefill_energy)
                continue
            decode = self.decode_replicas[self._next_decode]
            self._next_decode = (self._next_decode + 1) % len(self.decode_replicas)
            stream.phase, stream.decode_replica = "transfer", decode
            self.transfers[decode].in_flight += 1
            lands_at = first_s + self.layout.transfer_s(stream.prompt_tokens)
            self._sequence += 1
            heapq.heappush(self._in_transfer, (lands_at, self._sequence, stream))

    def _land(self, stream: PoolStream, lands_at: float) -> None:
        """Put a transferred request into its decode engine's queue at ``lands_at``."""
        replica = stream.decode_replica
        assert replica is not None and stream.first_token_s is not None
        simulation = self.simulations[replica]
        if lands_at > simulation.time_s:
            simulation.advance_to(lands_at)
        index = simulation.add_prefilled_request(
            stream.prompt_tokens, stream.output_tokens, stream.first_token_s
        )
        transfer = self.transfers[replica]
        transfer.in_flight -= 1
        transfer.seconds.observe(lands_at - stream.first_token_s)
        transfer.bytes.observe(self.layout.transfer_bytes(stream.prompt_tokens))
        transfer.external_prompt_tokens += stream.prompt_tokens
        self.stats[replica].prompt_tokens += stream.prompt_tokens
        stream.phase, stream.replica, stream.index = "decode", replica, index
        self._streams[replica][index] = stream

    def _decoded(self, replica: int, now_s: float) -> None:
        """Hand out the tokens decode engine ``replica`` produced since last time, and the
        ends."""
        simulation = self.simulations[replica]
        stats = self.stats[replica]
        _, finish = simulation.request_times()
        streams = self._streams[replica]
        done = []
        for index, stream in streams.items():
            produced = min(simulation.generated_tokens(index), stream.output_tokens)
            new = produced - stream.sent
            end = finish[index]
            if new > 0:
                end_s = end if end is not None else now_s
                last = stream.last_token_s if stream.last_token_s is not None else end_s
                stats.itl.observe(max(0.0, end_s - last) / new, new)
                stats.generation_tokens += new
                stream.last_token_s = end_s
                stream.sent = produced
                stream.events.put(("tokens", new))
            if end is not None and stream.sent >= stream.output_tokens:
                assert isinstance(stream, PoolStream) and stream.first_token_s is not None
                prefill_j, decode_j = simulation.request_energy(index)
                energy = (
                    stream.prefill_energy[0] + prefill_j,
                    stream.prefill_energy[1] + decode_j,
                )
                stats.e2e.observe(end - stream.first_token_s)
                if stream.sent > 1:
                    stats.tpot.observe((end - stream.first_token_s) / (stream.sent - 1))
                # Its lengths as this instance's counters have them: the prompt (its KV
                # cache transferred in), the tokens generated here (the first was prefill's).
                stats.prompt_lengths.observe(stream.prompt_tokens)
                stats.output_lengths.observe(stream.sent - 1)
                stats.finished[stream.finish_reason] += 1
                self._finish(stream, end, energy)
                done.append(index)
        for index in done:
            del streams[index]

    def _finish(self, stream: PoolStream, end_s: float, energy: tuple[float, float]) -> None:
        """Record a finished request's energy and end its stream."""
        stream.energy_j = energy
        stream.phase = "done"
        self._energy_records.append(
            EnergyRecord(
                stream.request_id,
                stream.prompt_tokens,
                stream.sent,
                energy[0],
                energy[1],
                end_s,
            )
        )
        stream.events.put(("done", stream.sent))

    def abort(self, stream: Stream) -> None:
        """Abort a request whose client left: cut short in the engine that holds it; one
        still on the link is dropped when it lands."""
        with self.lock:
            assert isinstance(stream, PoolStream)
            if stream.phase == "transfer":
                self._in_transfer = [item for item in self._in_transfer if item[2] is not stream]
                heapq.heapify(self._in_transfer)
                assert stream.decode_replica is not None
                self.transfers[stream.decode_replica].in_flight -= 1
                stream.phase = "aborted"
                return
            if stream.phase in ("prefill", "decode"):
                super().abort(stream)
                stream.phase = "aborted"

    def stream_energy(self, stream: Stream) -> tuple[float, float]:
        """(prefill J, decode J) of a request over both pools: final once it finished."""
        if stream.energy_j is not None:
            return stream.energy_j
        with self.lock:
            assert isinstance(stream, PoolStream)
            if stream.phase == "prefill":
                return self.simulations[stream.prefill_replica].request_energy(stream.prefill_index)
            if stream.phase == "decode":
                prefill_j, decode_j = self.simulations[stream.replica].request_energy(stream.index)
                return stream.prefill_energy[0] + prefill_j, stream.prefill_energy[1] + decode_j
            return stream.prefill_energy

    def stop(self) -> None:
        """Stop the plants and end every open stream, those on the link too."""
        super().stop()
        with self.lock:
            for _, _, stream in self._in_transfer:
                stream.events.put(("abort", 0))
            self._in_transfer.clear()
            for transfer in self.transfers.values():
                transfer.in_flight = 0

    def engine_state(self, replica: int) -> dict[str, float]:
        """vLLM's gauges for engine ``replica``; a decode engine's waiting requests
        include those whose KV cache is on the link (vLLM's decode instance holds them
        waiting for their remote KV cache)."""
        state = super().engine_state(replica)
        transfer = self.transfers.get(replica)
        if transfer is not None:
            with self.lock:
                state["waiting"] += float(transfer.in_flight)
        return state

    def energy_report(self, since_s: float | None = None) -> dict[str, Any]:
        """The colocated report (totals over both pools; each prompt counted once, on its
        prefill engine), with the layout and each pool's totals (``pools``: prefill,
        decode, idle and total joules of its GPUs)."""
        report = super().energy_report(since_s)
        with self.lock:
            report["totals"]["prompt_tokens"] = sum(
                self.stats[replica].prompt_tokens for replica in self.prefill_replicas
            )
            pools: dict[str, dict[str, Any]] = {}
            for role in ("prefill", "decode"):
                simulations = [self.simulations[r] for r in self.pool_replicas(role)]
                pools[role] = {
                    "gpus": list(self.pool_gpus(role)),
                    "prefill_j": sum(s.energy_ledger.prefill_total_j for s in simulations),
                    "decode_j": sum(s.energy_ledger.decode_total_j for s in simulations),
                    "idle_j": sum(s.energy_ledger.idle_j for s in simulations),
                    "total_j": sum(s.energy_j for s in simulations),
                }
        report["layout"] = self.layout_name
        report["pools"] = pools
        return report


def render_pool_metrics(
    node: DisaggregatedNode, model: str, role: str, replicas: Sequence[int] | None = None
) -> str:
    """Pool ``role``'s vLLM V1 page: its engines' series, and for the decode pool the
    NIXL connector's and the disaggregation's (module docstring). ``replicas`` (of the
    pool) narrows it to those engines, labelled ``engine="0"``, ... in order: one
    engine's own page."""
    engines = node.pool_replicas(role) if replicas is None else tuple(replicas)
    page = render_metrics(node, model, replicas=engines)
    lines: list[str] = []
    made = node.created_unix_s
    every_engine = [_labels(model, engine) for engine in range(len(engines))]

    with node.lock:
        by_source_help = "Number of prompt tokens by source."
        family(lines, "vllm:prompt_tokens_by_source", "counter", by_source_help)
        by_source: list[str] = []
        for engine, replica in enumerate(engines):
            external = node.transfers[replica].external_prompt_tokens if role == "decode" else 0
            local = node.stats[replica].prompt_tokens - external
            for source, value in (
                ("local_compute", local),
                ("local_cache_hit", 0),
                ("external_kv_transfer", external),
            ):
                labels = _labels(model, engine, source=source)
                by_source.append(labels)
                lines.append(f"vllm:prompt_tokens_by_source_total{{{labels}}} {_number(value)}")
        created(lines, "vllm:prompt_tokens_by_source", by_source_help, by_source, made)
        if role == "decode":
            family(
                lines,
                "vllm:num_requests_waiting_by_reason",
                "gauge",
                "Number of waiting requests by reason.",
            )
            for engine, replica in enumerate(engines):
                deferred = float(node.transfers[replica].in_flight)
                waiting = node.engine_state(replica)["waiting"]
                for reason, count in (("capacity", waiting - deferred), ("deferred", deferred)):
                    labels = _labels(model, engine, reason=reason)
                    lines.append(
                        f"vllm:num_requests_waiting_by_reason{{{labels}}} {_number(count)}"
                    )
            for name, attribute, help_text in (
                (
                    "vllm:nixl_xfer_time_seconds",
                    "seconds",
                    "Histogram of transfer duration for NIXL KV Cache transfers.",
                ),
                (
                    "vllm:nixl_bytes_transferred",
                    "bytes",
                    "Histogram of bytes transferred per NIXL KV Cache transfers.",
                ),
            ):
                family(lines, name, "histogram", help_text)
                for engine, replica in enumerate(engines):
                    _histogram(
                        lines,
                        name,
                        every_engine[engine],
                        getattr(node.transfers[replica], attribute),
                    )
                created(lines, name, help_text, every_engine, made)
            failed_help = "Number of failed NIXL KV Cache transfers."
            family(lines, "vllm:nixl_num_failed_transfers", "counter", failed_help)
            lines.extend(
                f"vllm:nixl_num_failed_transfers_total{{{labels}}} 0.0" for labels in every_engine
            )
            created(lines, "vllm:nixl_num_failed_transfers", failed_help, every_engine, made)
    return page + "\n".join(lines) + "\n"


def interconnect_names() -> tuple[str, ...]:
    """The interconnects ``--interconnect`` accepts."""
    return tuple(sorted(INTERCONNECTS))
