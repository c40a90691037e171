"""The emulated node: one simulated plant per engine replica, advanced in (scaled) real time.

A background thread advances every replica's :class:`~gpugov.plant.PlantSimulation` to the
wall clock every ``tick_s``; requests are injected as they arrive and their tokens are
handed to the HTTP handlers as the plant's iterations produce them. The node is data
parallel: its replicas of the engine each get requests, each request sent to the replica
with the fewest unfinished requests, ties in turn (vLLM's ``engine`` label tells them
apart on ``/metrics``).

A replica runs on ``tensor_parallel`` GPUs (the profile's: its rates and powers describe
the whole tensor-parallel group, the domain), so ``--gpus N`` is N GPUs and
``N / tensor_parallel`` replicas; replica ``r`` runs on GPUs ``r * TP .. r * TP + TP - 1``.
With a profile of one GPU (TP 1) each GPU is one replica. Each GPU of a group is its own
NVML device: its own clock lock, its own injected fault, its own index and UUID, and
reads of its share of the group's power, energy and power limit (``1 / TP`` each, so the
group's GPUs sum to the plant's). Its temperature is the group's thermal state (the
plant's thermal model is each GPU's, ``ServingPlant``), and its utilisation the group's
busy share (every GPU of a group runs every iteration). The group's plant runs at the
clock its GPUs realise together: a tensor-parallel step ends in collectives that wait
for the slowest GPU, so the group's clock is the lowest of its GPUs' locks (an unlocked
GPU counts at the top clock), and every GPU of the group reports that clock as its SM
clock (the emulator models one clock per group; a real GPU locked above its group's
slowest shows its own clock while it waits).

Each replica also has its own engine page, :data:`REPLICA_METRICS_PATH`
(``/replica/<r>/metrics``, its engine labelled ``engine="0"``), as each engine process
of a real node serves its own ``/metrics`` on its own port; ``/metrics`` is every
replica's together (as one vLLM serving them data parallel labels them ``engine="0"``,
``"1"``, ...). A governor domain per replica points at its replica's page.
:meth:`EmulatedNode.replica_layout` lists each replica's GPUs, role and page
(``GET /gpu``).

The GPUs are named as NVML names the profile's GPU (:func:`emulated_gpu_name`) and carry
UUIDs derived from the profile and their index (:func:`emulated_gpu_uuid`), so a
governor's learned model, keyed on the UUIDs, follows the profile across restarts and
never crosses to another. Each plant attributes its energy to the requests it served
(``plant/attribution.py``); a finished request's is kept for ``GET /gpugov/energy``
(:meth:`EmulatedNode.energy_report`, the latest :data:`MAX_ENERGY_RECORDS`). Everything
here is guarded by one lock.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpugov.daemon.profile_identity import (
    profile_gpu_name,
    profile_gpu_uuid,
    profile_gpu_uuids,
)
from gpugov.daemon.vllm_view import (
    E2E_BUCKETS_S,
    ITL_BUCKETS_S,
    TTFT_BUCKETS_S,
    Histogram,
)
from gpugov.daemon.vllm_view import LENGTH_BUCKETS as ALL_LENGTH_BUCKETS
from gpugov.plant import PerformanceProfile, PlantSimulation, ServingPlant

log = logging.getLogger(__name__)

LENGTH_BUCKETS = tuple(b for b in ALL_LENGTH_BUCKETS if b <= 131_072)
"""vLLM's 1-2-5 bounds for its request-length histograms (``vllm:request_prompt_tokens``,
``vllm:request_generation_tokens``), up to the longest model length it serves; a node
keeps those up to its own :attr:`EmulatedNode.max_model_len`, as vLLM does."""

# NVML return codes the emulated GPU answers with (nvml.h NVML_ERROR_*).
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_GPU_IS_LOST = 15
# nvmlClocksEventReasonApplicationsClocksSetting: a clock lock holds the clock down.
CLOCK_EVENT_APPLICATIONS_CLOCKS_SETTING = 0x2
NVML_UTILIZATION_SAMPLE_S = 1.0
"""The period NVML's GPU utilisation covers (between 1/6 s and 1 s by product, per its
docs): the emulated GPU reports the share of that much plant time an iteration ran."""

FAULTS = ("none", "no-permission", "not-supported", "lost")

REPLICA_METRICS_PATH = "/replica/{}/metrics"
"""Engine replica ``r``'s own metrics page (``str.format`` with ``r``): what its engine
process serves on its own port on a real node, its engine labelled ``engine="0"``."""
ADVANCE_STEP_S = 1.0
"""The most plant seconds the advancing thread computes with the node's lock held."""
ADVANCE_BUDGET_S = 0.2
"""Wall seconds of computing one advance may take before the node falls behind."""

MAX_ENERGY_RECORDS = 100_000
"""Finished requests ``GET /gpugov/energy`` keeps (the latest; bounded memory)."""

UNNAMED_GPU = "Emulated GPU"
"""The name of an emulated GPU whose profile states no GPU (no family: no GPU hint)."""
UNNAMED_MODEL = "gpugov-emulated"
"""The model id an emulated engine serves when its profile names no model a client can
send."""
MAX_MODEL_ID_CHARS = 256
"""The longest model id the emulator serves (``--served-model-name``)."""


def served_model_name(profile: PerformanceProfile) -> str:
    """The model id an emulated engine of ``profile`` serves unless told another (its
    ``/v1/models`` id and every ``model_name`` label): the profile's ``model``, as the
    simulated engine of ``simulate`` and ``run --simulate`` labels it, so that
    ``mpc-online``'s model-size hint reads the same on the emulator as in a study;
    :data:`UNNAMED_MODEL` where it names none, or none a client can send (printable, at
    most :data:`MAX_MODEL_ID_CHARS` characters)."""
    model = profile.manifest.get("model")
    if not isinstance(model, str) or not model.isprintable():
        return UNNAMED_MODEL
    return model if 0 < len(model) <= MAX_MODEL_ID_CHARS else UNNAMED_MODEL


def emulated_gpu_name(profile: PerformanceProfile) -> str:
    """The NVML name of an emulated GPU of ``profile``
    (:func:`~daemon.profile_identity.profile_gpu_name`, as a simulated node names it);
    :data:`UNNAMED_GPU` when the profile states none."""
    return profile_gpu_name(profile) or UNNAMED_GPU


def tp_multiple_message(gpus: int, tensor_parallel: int, profile_name: str) -> str:
    """The one line refusing a GPU count that is not a whole number of replicas."""
    return (
        f"--gpus {gpus}: profile {profile_name} is tensor parallel {tensor_parallel} (each "
        f"engine replica runs on {tensor_parallel} GPUs); give a multiple of "
        f"{tensor_parallel}, such as {tensor_parallel} for one replica"
    )


def emulated_gpu_uuid(profile: PerformanceProfile, gpu: int) -> str:
    """The NVML UUID of emulated GPU ``gpu`` of ``profile``
    (:func:`daemon.profile_identity.profile_gpu_uuid`, as a simulated node's GPU of the
    profile has it). The same profile gives the same UUIDs on every start, so a governor
    restarted against a restarted emulator restores its model; another profile (another
    GPU, model or table) gives others, so no model learned on one is applied to the
    other."""
    return profile_gpu_uuid(profile, gpu)


@dataclass
class EngineStats:
    """One replica's cumulative counters, in vLLM V1's terms."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"length": 0, "stop": 0, "abort": 0})
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    """Time per output token per finished request of two tokens or more
    (``vllm:request_time_per_output_token_seconds``): what the TPOT SLO judges."""
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS_S))
    prompt_lengths: Histogram = field(default_factory=lambda: Histogram(LENGTH_BUCKETS))
    """Prompt tokens per finished request (``vllm:request_prompt_tokens``)."""
    output_lengths: Histogram = field(default_factory=lambda: Histogram(LENGTH_BUCKETS))
    """Tokens generated per finished request (``vllm:request_generation_tokens``)."""


@dataclass
class Stream:
    """One request in flight: the handler reads ``events`` (token counts, then the end)."""

    replica: int
    index: int
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    events: queue.SimpleQueue[tuple[str, int]] = field(default_factory=queue.SimpleQueue)
    sent: int = 0
    last_token_s: float | None = None
    request_id: str = ""
    """The completion's OpenAI ``id`` (the key of ``GET /gpugov/energy``)."""
    energy_j: tuple[float, float] | None = None
    """(prefill J, decode J) the plant attributed to it, set when it finished."""


@dataclass(frozen=True, slots=True)
class EnergyRecord:
    """One finished request's true energy, as ``GET /gpugov/energy`` lists it."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    prefill_j: float
    decode_j: float
    finished_at_s: float

    def as_dict(self) -> dict[str, Any]:
        """The contract's JSON object."""
        return {
            "id": self.request_id,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "prefill_j": self.prefill_j,
            "decode_j": self.decode_j,
            "total_j": self.prefill_j + self.decode_j,
            "finished_at_s": self.finished_at_s,
        }


@dataclass
class GpuState:
    """What the emulated GPU's NVML would hold: the lock and any injected fault."""

    fault: str = "none"
    lost_at_s: float | None = None
    locked: tuple[int, int] | None = None


class EmulatedNode:
    """N simulated GPUs serving their engine replicas, advanced to the wall clock.

    Args:
        plant: the plant every replica runs (the profile and limits).
        gpus: number of GPUs, a multiple of ``tensor_parallel`` (default: one replica's).
        tensor_parallel: GPUs per engine replica (default: the plant's
            ``tensor_parallel``); 1 serves each replica as one GPU that carries the whole
            domain.
        seed: seeds the plants and the natural output lengths.
        speed: plant seconds per wall second (1 = real time; >1 only for tests).
        tick_s: wall seconds between advances (token timing resolution).
        clock: wall clock (monotonic seconds).
    """

    def __init__(
        self,
        plant: ServingPlant,
        *,
        gpus: int | None = None,
        tensor_parallel: int | None = None,
        seed: int = 0,
        speed: float = 1.0,
        tick_s: float = 0.002,
        clock: Callable[[], float] = time.monotonic,
        fault: str = "none",
        lost_after_s: float | None = None,
    ) -> None:
        tp = plant.tensor_parallel if tensor_parallel is None else int(tensor_parallel)
        if tp < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {tp}")
        gpus = tp if gpus is None else gpus
        if gpus < 1:
            raise ValueError(f"--gpus must be >= 1, got {gpus}")
        if gpus % tp:
            raise ValueError(tp_multiple_message(gpus, tp, plant.profile.name))
        if not math.isfinite(speed) or speed <= 0:
            raise ValueError(f"speed must be positive, got {speed!r}")
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        self.plant = plant
        self.speed = float(speed)
        self.tick_s = float(tick_s)
        self._clock = clock
        self._start_wall_s = clock()
        self._horizon_s: float | None = None
        """The plant time of the step the advancing thread is catching up to, else None."""
        self._held_back_s = 0.0
        """Plant seconds the clock was set back, the plants unable to keep up with speed."""
        self._said_behind = False
        self.created_unix_s = time.time()
        """When the node's series were made (Unix seconds): each counter's and histogram's
        ``_created`` sample on its page, as prometheus_client stamps them."""
        self.lock = threading.RLock()
        self.tensor_parallel = tp
        """GPUs per engine replica (one tensor-parallel group)."""
        self.gpu_count = gpus
        """GPUs on the node: ``len(self.simulations) * self.tensor_parallel``."""
        replicas = gpus // tp
        self.simulations = [
            PlantSimulation((), plant, seed=seed + replica, fast_forward=True)
            for replica in range(replicas)
        ]
        """One plant per engine replica (its whole tensor-parallel group)."""
        # vLLM bounds its length histograms by the model's length (build_1_2_5_buckets).
        lengths = tuple(b for b in LENGTH_BUCKETS if b <= self.max_model_len)
        self.stats = [
            EngineStats(prompt_lengths=Histogram(lengths), output_lengths=Histogram(lengths))
            for _ in range(replicas)
        ]
        self.gpu_state = [GpuState(fault=fault) for _ in range(gpus)]
        """Each GPU's lock and fault (by GPU index)."""
        if lost_after_s is not None:
            for state in self.gpu_state:
                state.lost_at_s = float(lost_after_s)
        self._streams: list[dict[int, Stream]] = [{} for _ in range(replicas)]
        self._energy_records: deque[EnergyRecord] = deque(maxlen=MAX_ENERGY_RECORDS)
        self._next_replica = 0
        self._rng = np.random.default_rng(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        clocks = plant.profile.clock_mhz
        self.supported_clocks_mhz = tuple(int(round(c)) for c in clocks)
        self.max_clock_mhz = self.supported_clocks_mhz[-1]
        self.gpu_name = emulated_gpu_name(plant.profile)
        """Every GPU's NVML name (:func:`emulated_gpu_name`)."""
        self.gpu_uuids = profile_gpu_uuids(plant.profile, gpus)
        """Each GPU's NVML UUID (:func:`emulated_gpu_uuid`)."""

    # ------------------------------------------------------------------- groups
    @property
    def replicas(self) -> int:
        """Engine replicas (tensor-parallel groups)."""
        return len(self.simulations)

    def replica_of(self, gpu: int) -> int:
        """The engine replica GPU ``gpu`` belongs to."""
        return gpu // self.tensor_parallel

    def group_gpus(self, replica: int) -> range:
        """The GPUs of replica ``replica``'s tensor-parallel group."""
        first = replica * self.tensor_parallel
        return range(first, first + self.tensor_parallel)

    def replica_role(self, replica: int) -> str:
        """The pool role of replica ``replica``'s engine: ``colocated`` here, every
        replica serving both phases (a disaggregated layout's engines are ``prefill`` or
        ``decode``)."""
        return "colocated"

    def replica_pages(self) -> str:
        """Where the replicas' own pages are, for a line: ``/replica/0/metrics``, or
        ``/replica/0/metrics to /replica/R/metrics``."""
        first = REPLICA_METRICS_PATH.format(0)
        if self.replicas == 1:
            return first
        return f"{first} to {REPLICA_METRICS_PATH.format(self.replicas - 1)}"

    def replica_layout(self) -> list[dict[str, object]]:
        """Each engine replica's GPUs, pool role and own metrics page, in replica order
        (``GET /gpu``'s ``replicas``): what a domain per replica lists and scrapes."""
        return [
            {
                "replica": replica,
                "gpus": list(self.group_gpus(replica)),
                "role": self.replica_role(replica),
                "metrics": REPLICA_METRICS_PATH.format(replica),
            }
            for replica in range(self.replicas)
        ]

    def _lock_target_mhz(self, gpu: int) -> int:
        """The clock GPU ``gpu`` is held to: its lock's upper clock, else the top clock."""
        locked = self.gpu_state[gpu].locked
        return self.max_clock_mhz if locked is None else locked[1]

    def group_clock_mhz(self, replica: int) -> int:
        """The clock replica ``replica``'s GPUs run at together (before quantisation):
        the lowest of their locks, an unlocked GPU at the top clock. A tensor-parallel
        step ends in collectives that wait for the slowest GPU."""
        return min(self._lock_target_mhz(gpu) for gpu in self.group_gpus(replica))

    def _request_group_clock(self, gpu: int) -> None:
        """Ask GPU ``gpu``'s group plant for the group's clock (after a lock or reset)."""
        replica = self.replica_of(gpu)
        self.simulations[replica].request_clock(float(self.group_clock_mhz(replica)))

    # --------------------------------------------------------------------- time
    def _wall_plant_s(self) -> float:
        """The plant time the wall clock asks for: wall seconds since the start (less any
        time the node fell behind) times ``speed``."""
        return (self._clock() - self._start_wall_s) * self.speed

    def plant_time_s(self) -> float:
        """Plant seconds since the node started (wall time times ``speed``; while the
        advancing thread catches up in steps, the step it is at)."""
        now = self._wall_plant_s()
        horizon = self._horizon_s
        return now if horizon is None else min(now, horizon)

    def start(self) -> None:
        """Start the thread that advances the plants to the wall clock."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="emulated-plant", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the advancing thread and end every open stream."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        with self.lock:
            for streams in self._streams:
                for stream in streams.values():
                    stream.events.put(("abort", 0))
                streams.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.advance_within_budget()
            except Exception:  # the thread's outermost edge: keep serving, say why
                log.exception("emulated plant failed to advance")
            self._stop.wait(self.tick_s)

    def advance_within_budget(self) -> None:
        """Advance to now in steps of at most :data:`ADVANCE_STEP_S` plant seconds, the
        lock free between them; past :data:`ADVANCE_BUDGET_S` of computing, set the clock
        back to where the plants are (said once). A ``speed`` the plants cannot be computed
        at then runs slower than asked, where each advance covered more than the last and
        held the node's lock for ever longer: no read, page or request was answered."""
        started = time.perf_counter()
        while True:
            with self.lock:
                target = self._wall_plant_s()
                begin = max(self._horizon_s or 0.0, min(s.time_s for s in self.simulations))
                if target - begin <= ADVANCE_STEP_S:
                    self._horizon_s = None
                    self.advance()
                    return
                self._horizon_s = begin + ADVANCE_STEP_S
                self.advance()
                if time.perf_counter() - started < ADVANCE_BUDGET_S:
                    continue
                behind = target - self._horizon_s
                self._start_wall_s = self._clock() - self._horizon_s / self.speed
                self._horizon_s = None
                self._held_back_s += behind
                first = not self._said_behind
                self._said_behind = True
            if first:
                log.warning(
                    "the plants cannot keep up with --speed %g on this machine: the node runs "
                    "slower than asked (its clock held back %.3g plant s so far) and answers "
                    "meanwhile",
                    self.speed,
                    self._held_back_s,
                )
            return

    def advance(self) -> None:
        """Advance every plant to now and hand out the tokens produced since last time."""
        with self.lock:
            now = self.plant_time_s()
            for replica, simulation in enumerate(self.simulations):
                if now > simulation.time_s:
                    simulation.advance_to(now)
                self._deliver(replica, simulation.time_s)

    def _deliver(self, replica: int, now_s: float) -> None:
        simulation = self.simulations[replica]
        stats = self.stats[replica]
        first, finish = simulation.request_times()
        streams = self._streams[replica]
        done = []
        for index, stream in streams.items():
            produced = min(simulation.generated_tokens(index), stream.output_tokens)
            new = produced - stream.sent
            arrival = simulation.requests[index].arrival_time_s
            if new > 0:
                if stream.sent == 0:
                    first_s = first[index]
                    ttft = (first_s if first_s is not None else now_s) - arrival
                    stats.ttft.observe(ttft)
                    stream.last_token_s = first_s if first_s is not None else now_s
                    # As vLLM V1: a prompt's tokens count once its prefill is done.
                    stats.prompt_tokens += stream.prompt_tokens
                    stats.generation_tokens += 1
                    new_after_first = new - 1
                else:
                    new_after_first = new
                if new_after_first > 0:
                    finished = finish[index]
                    end_s = finished if finished is not None else now_s
                    last = stream.last_token_s if stream.last_token_s is not None else end_s
                    stats.itl.observe(max(0.0, end_s - last) / new_after_first, new_after_first)
                    stats.generation_tokens += new_after_first
                    stream.last_token_s = end_s
                stream.sent = produced
                stream.events.put(("tokens", new))
            end = finish[index]
            if end is not None and stream.sent >= stream.output_tokens:
                prefill_j, decode_j = simulation.request_energy(index)
                stream.energy_j = (prefill_j, decode_j)
                self._energy_records.append(
                    EnergyRecord(
                        stream.request_id,
                        stream.prompt_tokens,
                        stream.sent,
                        prefill_j,
                        decode_j,
                        end,
                    )
                )
                stats.e2e.observe(end - arrival)
                made = first[index]
                if stream.sent > 1 and made is not None:
                    stats.tpot.observe((end - made) / (stream.sent - 1))
                stats.prompt_lengths.observe(stream.prompt_tokens)
                stats.output_lengths.observe(stream.sent)
                stats.finished[stream.finish_reason] += 1
                stream.events.put(("done", stream.sent))
                done.append(index)
        for index in done:
            del streams[index]

    # ------------------------------------------------------------------ serving
    @property
    def max_model_len(self) -> int:
        """The longest prompt plus output one request may ask for (the KV cache's size,
        capped like a typical ``--max-model-len``)."""
        engine = self.plant.profile.manifest.get("engine", {})
        cap = int(engine.get("max_model_len", 131_072)) if isinstance(engine, dict) else 131_072
        return min(self.plant.kv_capacity_tokens, cap)

    def natural_output_tokens(
        self, max_tokens: int, ignore_eos: bool, min_tokens: int = 0
    ) -> tuple[int, str]:
        """Output length and finish reason: ``max_tokens`` with ``ignore_eos``; else an
        end-of-sequence drawn from a geometric law (mean 256 tokens), never before
        ``min_tokens`` (vLLM holds the end-of-sequence off until then), capped by it."""
        if ignore_eos:
            return max_tokens, "length"
        with self.lock:
            natural = max(int(self._rng.geometric(1.0 / 256.0)), min_tokens)
        if natural < max_tokens:
            return natural, "stop"
        return max_tokens, "length"

    def submit(
        self, prompt_tokens: int, output_tokens: int, finish_reason: str, request_id: str = ""
    ) -> Stream:
        """Inject a request now on the least-loaded replica; its tokens arrive on the
        returned stream's ``events``. ``request_id`` names it in :meth:`energy_report`."""
        with self.lock:
            self.advance()
            count = len(self.simulations)
            # Fewest requests in flight; ties go round robin (as vLLM's DP balancer).
            replica = min(
                range(count),
                key=lambda r: (len(self._streams[r]), (r - self._next_replica) % count),
            )
            self._next_replica = (replica + 1) % count
            simulation = self.simulations[replica]
            index = simulation.add_request(prompt_tokens, output_tokens)
            stream = Stream(
                replica, index, prompt_tokens, output_tokens, finish_reason, request_id=request_id
            )
            self._streams[replica][index] = stream
            return stream

    def abort(self, stream: Stream) -> None:
        """Abort a request whose client left (as vLLM aborts it): the plant stops
        generating it after its current iteration, and its tokens and its end are counted
        in no ``/metrics`` series from now on."""
        with self.lock:
            streams = self._streams[stream.replica]
            if streams.pop(stream.index, None) is None:
                return  # finished (or the node stopped) already
            self.simulations[stream.replica].cut_short(stream.index)

    def stream_energy(self, stream: Stream) -> tuple[float, float]:
        """(prefill J, decode J) of a request: final once it finished, so far before."""
        if stream.energy_j is not None:
            return stream.energy_j
        with self.lock:
            return self.simulations[stream.replica].request_energy(stream.index)

    def energy_report(self, since_s: float | None = None) -> dict[str, Any]:
        """``GET /gpugov/energy``: the finished requests' true energy (those finished at
        or after ``since_s`` plant seconds, when given; the latest
        :data:`MAX_ENERGY_RECORDS`) and the whole run's totals over every GPU."""
        with self.lock:
            self.advance()
            now = self.plant_time_s()
            records = [
                record.as_dict()
                for record in self._energy_records
                if since_s is None or record.finished_at_s >= since_s
            ]
            prefill = sum(s.energy_ledger.prefill_total_j for s in self.simulations)
            decode = sum(s.energy_ledger.decode_total_j for s in self.simulations)
            idle = sum(s.energy_ledger.idle_j for s in self.simulations)
            total = sum(s.energy_j for s in self.simulations)
            prompt = sum(stats.prompt_tokens for stats in self.stats)
            output = sum(stats.generation_tokens for stats in self.stats)
        return {
            "plant_time_s": now,
            "requests": records,
            "totals": {
                "prefill_j": prefill,
                "decode_j": decode,
                "idle_j": idle,
                "total_j": total,
                "prompt_tokens": prompt,
                "output_tokens": output,
            },
        }

    def engine_state(self, replica: int) -> dict[str, float]:
        """The gauges vLLM exports for one replica: running, waiting, KV usage."""
        with self.lock:
            simulation = self.simulations[replica]
            observation = simulation.observe()
            prefilling = simulation.prefilling_requests
        # As vLLM V1: a prompt whose chunks are being prefilled is a running request.
        running = observation.decode_active + prefilling
        waiting = max(0, observation.waiting_requests - prefilling)
        capacity = observation.kv_capacity_tokens
        return {
            "running": float(running),
            "waiting": float(waiting),
            "kv_usage": observation.kv_tokens / capacity if capacity else 0.0,
        }

    # --------------------------------------------------------------------- GPUs
    def _gpu_error(self, gpu: int) -> int:
        """The NVML code every call on ``gpu`` fails with now (0 when healthy)."""
        state = self.gpu_state[gpu]
        if state.fault == "lost" or (
            state.lost_at_s is not None and self.plant_time_s() >= state.lost_at_s
        ):
            return NVML_ERROR_GPU_IS_LOST
        return NVML_SUCCESS

    def gpu_sample(self, gpu: int) -> dict[str, object]:
        """NVML's reads for one GPU, each a value or ``{"nvmlReturn": code}``."""
        code = self._gpu_error(gpu)
        if code:
            return {"nvmlReturn": code}
        with self.lock:
            self.advance()
            simulation = self.simulations[self.replica_of(gpu)]
            observation = simulation.observe()
            reasons = int(simulation.clock_event_reasons)
            realized = simulation.realized_clock_mhz
            locked = self.gpu_state[gpu].locked
            if locked is not None and self._quantized_mhz(locked[1]) < self.max_clock_mhz:
                reasons |= CLOCK_EVENT_APPLICATIONS_CLOCKS_SETTING
            utilization = simulation.recent_utilization(NVML_UTILIZATION_SAMPLE_S)
            share = 1.0 / self.tensor_parallel  # this GPU's part of its group's draw
            return {
                "power_mw": int(round((observation.power_w or 0.0) * share * 1000.0)),
                "energy_mj": int((observation.energy_j or 0.0) * share * 1000.0),
                "temperature_c": int(round(observation.temperature_c)),
                "sm_clock_mhz": int(round(realized)),
                "utilization_gpu": int(round(100.0 * utilization)),
                "clock_event_reasons": reasons,
                "enforced_power_limit_mw": int(round(self.plant.power_limit_w * share * 1000.0)),
            }

    def _quantized_mhz(self, mhz: float) -> float:
        """The profile clock a lock at ``mhz`` holds (quantised down, as the plant does)."""
        return float(self.plant.profile.quantize_clock(float(mhz), downward=True))

    def gpu_info(self, gpu: int) -> dict[str, object]:
        """Identity and clock tables of one GPU (what NVML's getters return)."""
        code = self._gpu_error(gpu)
        if code:
            return {"nvmlReturn": code}
        return {
            "index": gpu,
            "uuid": self.gpu_uuids[gpu],
            "name": self.gpu_name,
            "max_sm_clock_mhz": self.max_clock_mhz,
            "supported_memory_clocks_mhz": [2619],
            "supported_graphics_clocks_mhz": list(reversed(self.supported_clocks_mhz)),
            # Where the emulated GPU slows itself: its plant's thermal limit (NVML's
            # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN).
            "slowdown_temperature_c": self.plant.thermal_limit_c,
        }

    def lock_clocks(self, gpu: int, min_mhz: int, max_mhz: int) -> int:
        """nvmlDeviceSetGpuLockedClocks: lock the SM clock (after the actuation delay).

        Returns:
            The NVML return code (0 on success).
        """
        code = self._gpu_error(gpu)
        if code:
            return code
        fault = self.gpu_state[gpu].fault
        if fault == "no-permission":
            return NVML_ERROR_NO_PERMISSION
        if fault == "not-supported":
            return NVML_ERROR_NOT_SUPPORTED
        if min_mhz <= 0 or max_mhz < min_mhz:
            return NVML_ERROR_INVALID_ARGUMENT
        with self.lock:
            self.advance()
            # Under load a [min, max] lock runs at max; the plant models one clock, the
            # group's (:meth:`group_clock_mhz`).
            self.gpu_state[gpu].locked = (int(min_mhz), int(max_mhz))
            self._request_group_clock(gpu)
        return NVML_SUCCESS

    def reset_clocks(self, gpu: int) -> int:
        """nvmlDeviceResetGpuLockedClocks: unlock (the GPU boosts to its max clock)."""
        code = self._gpu_error(gpu)
        if code:
            return code
        fault = self.gpu_state[gpu].fault
        if fault == "no-permission":
            return NVML_ERROR_NO_PERMISSION
        if fault == "not-supported":
            return NVML_ERROR_NOT_SUPPORTED
        with self.lock:
            self.advance()
            self.gpu_state[gpu].locked = None
            self._request_group_clock(gpu)
        return NVML_SUCCESS
