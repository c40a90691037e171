"""Energy attribution on the node (daemon/energy.py): the split, the rates, the histogram,
and bad input that is skipped and counted, never a negative or infinite energy."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
from daemon_support import MetricsServer, fixture_text
from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.energy import (
    EnergyEstimator,
    EnergyReading,
    RequestEnergyHistogram,
    reading_from,
)
from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.engines import SPECS, extract
from gpugov.daemon.exporter import DomainSnapshot, Exporter, LoopSnapshot
from gpugov.daemon.exposition import parse_page
from gpugov.daemon.observer import DomainObserver
from gpugov.daemon.phase_fit import (
    PhaseCoefficients,
    batch_term,
    learned_phase_model,
    split_components,
)

# A synthetic GPU: idle 100 W, busy power 300 W + 200 W x batch_term (prefill at the
# saturated 500 W), prefill 20 us per prompt token, a decode iteration 8 ms + 0.1 ms per
# running request; the batch moves by up to 2 a second, as a serving batch does.
IDLE_W, BUSY_W, BATCH_W = 100.0, 300.0, 200.0
ALPHA = 2e-5


@dataclass
class Node:
    """Cumulative counters of the synthetic node, one second a window."""

    time_s: float = 0.0
    energy_j: float = 5000.0
    prompt: float = 0.0
    output: float = 0.0
    finished: float = 0.0
    admitted: float = 0.0
    prefill_j: float = 0.0
    decode_j: float = 0.0
    idle_j: float = 0.0
    batch: int = 20

    def window(self, rng: np.random.Generator) -> EnergyReading:
        """Advance one second of random work and read it."""
        busy = float(rng.uniform(0.3, 1.0))
        self.batch = batch = int(np.clip(self.batch + rng.integers(-2, 3), 2, 40))
        prompt = float(rng.integers(0, int(0.4 * busy / ALPHA)))
        prefill_s = ALPHA * prompt
        decode_s = busy - prefill_s
        iteration_s = 0.008 + 0.0001 * batch
        iterations = decode_s / iteration_s
        started = float(rng.integers(0, 4))
        decode = decode_s * (BUSY_W + BATCH_W * batch_term(batch))
        self.output += iterations * batch + started
        self.admitted += started
        self.finished += started
        self.record(prefill_s, decode, busy, prompt)
        return self.read(busy, batch)

    def record(self, prefill_s: float, decode_j: float, busy: float, prompt: float) -> None:
        """Book one second: its prefill (at the saturated power), decode and idle energy."""
        prefill = prefill_s * (BUSY_W + BATCH_W)
        idle = (1.0 - busy) * IDLE_W
        self.time_s += 1.0
        self.energy_j += prefill + decode_j + idle
        self.prefill_j += prefill
        self.decode_j += decode_j
        self.idle_j += idle
        self.prompt += prompt

    def read(self, busy: float, running: int, **extra: object) -> EnergyReading:
        """The node's counters now, as the daemon reads them."""
        return EnergyReading(
            time_s=self.time_s,
            energy_j=self.energy_j,
            prompt_tokens=self.prompt,
            output_tokens=self.output,
            finished_requests=self.finished,
            utilization=busy,
            clock_mhz=1980.0,
            running=float(running),
            kv_tokens=0.0,
            admitted_requests=self.admitted,
            model="m",
            power_limit_w=700.0,
            **extra,  # type: ignore[arg-type]
        )


def test_the_split_adds_up_to_the_measured_energy_and_learns_the_phases() -> None:
    prefill_errors = []
    for seed in range(1, 7):
        rng = np.random.default_rng(seed)
        node, estimator = Node(), EnergyEstimator()
        estimator.update(node.window(rng))
        rows = []
        for _ in range(240):
            before = (node.prefill_j, node.decode_j, node.idle_j)
            window = estimator.update(node.window(rng))
            assert window is not None
            truth = (
                node.prefill_j - before[0],
                node.decode_j - before[1],
                node.idle_j - before[2],
            )
            rows.append((window, truth))
        # Every window's parts add up to its measured energy: the total is never estimated.
        for window, truth in rows:
            assert window.total_j == pytest.approx(sum(truth), rel=1e-9)
            assert min(window.prefill_j, window.decode_j, window.idle_j) >= 0.0
        state = estimator.models["m"]
        assert state.windows.get("prior", 0) > 0 and state.windows.get("fit", 0) > 150
        # After the prior windows the fit recovers the synthetic node's split (its steps
        # estimated from the batch at the windows' ends, as for SGLang).
        late = rows[-100:]
        errors = []
        for index, name in enumerate(("prefill_j", "decode_j", "idle_j")):
            mine = sum(getattr(window, name) for window, _ in late)
            real = sum(truth[index] for _, truth in late)
            errors.append(abs(mine / real - 1.0))
        assert errors[0] < 0.15 and errors[1] < 0.06 and errors[2] < 0.02, (seed, errors)
        prefill_errors.append(errors[0])
    assert float(np.median(prefill_errors)) < 0.05


@dataclass
class MovingBatchNode(Node):
    """The synthetic node, but each window's batch moves (two halves at unrelated
    batches, only the last one visible at the read), its decode power saturates sooner
    (half at a batch of 2), and the engine counts its steps."""

    steps: float = 0.0

    def window(self, rng: np.random.Generator) -> EnergyReading:
        busy = float(rng.uniform(0.3, 1.0))
        prompt = float(rng.integers(0, int(0.4 * busy / ALPHA)))
        prefill_s = ALPHA * prompt
        decode_s = busy - prefill_s
        decode = 0.0
        last = 1
        for share in (0.5, 0.5):
            last = int(rng.integers(1, 48))
            iterations = share * decode_s / (0.008 + 0.0001 * last)
            decode += share * decode_s * (BUSY_W + BATCH_W * batch_term(last, 2.0))
            self.steps += iterations
            self.output += iterations * last
        self.record(prefill_s, decode, busy, prompt)
        return self.read(busy, last, iterations=self.steps)


def _late_error(node: Node, seed: int, drop: str | None, part: str) -> float:
    """Relative error of the estimated ``part`` energy (a ``WindowEnergy`` field) over
    windows 200 to 299 of ``node``, with the readings' ``drop`` field removed."""
    rng = np.random.default_rng(seed)
    estimator = EnergyEstimator()
    mine = real = 0.0
    for index in range(300):
        before = getattr(node, part)
        reading = node.window(rng)
        if drop is not None:
            reading = replace(reading, **{drop: None})
        window = estimator.update(reading)
        if window is not None and index >= 200:
            mine += getattr(window, part)
            real += getattr(node, part) - before
    return abs(mine / real - 1.0)


def test_engine_step_counts_recover_a_split_the_batch_at_the_ends_cannot() -> None:
    # With the engine's step count (vLLM's tokens-per-step histogram) the fit knows each
    # window's steps and mean batch; without it, the batch at the window's ends guesses.
    counted = _late_error(MovingBatchNode(), 4, None, "decode_j")
    assert counted < 0.05
    assert counted < 0.5 * _late_error(MovingBatchNode(), 4, "iterations", "decode_j")


@dataclass
class ClockedNode(MovingBatchNode):
    """The moving-batch node with its clock moved every window (as a governor moves it):
    compute-bound prefill slows as 1/f and its power falls steeply with the clock, below
    the memory-bound decode's at low clocks and above it at the top one, as measured
    GPUs do; the decode's power falls gently."""

    top_mhz: float = 1980.0

    def window(self, rng: np.random.Generator) -> EnergyReading:
        share = float(rng.uniform(0.25, 1.0))  # f / f_top
        busy = float(rng.uniform(0.3, 1.0))
        prompt = float(rng.integers(0, int(0.4 * busy * share / ALPHA)))
        prefill_s = ALPHA * prompt / share
        decode_s = busy - prefill_s
        batch = int(rng.integers(1, 48))
        iteration_s = (0.008 + 0.0001 * batch) * (0.8 + 0.2 / share)
        iterations = decode_s / iteration_s
        self.steps += iterations
        self.output += iterations * batch
        prefill_w = 80.0 + 520.0 * share**2
        decode_w = 230.0 + 60.0 * share + 180.0 * batch_term(batch, 4.0)
        self.record(0.0, decode_s * decode_w, busy, prompt)
        self.energy_j += prefill_s * prefill_w
        self.prefill_j += prefill_s * prefill_w
        reading = self.read(busy, batch, iterations=self.steps)
        return replace(reading, clock_mhz=self.top_mhz * share)


def test_prefill_power_is_fitted_apart_from_decode_power_across_clocks() -> None:
    # A compute-bound prefill draws less than a memory-bound decode at a low clock and more
    # at the top one: priced as a saturated decode, its energy would be off by tens of
    # percent wherever the governor moves the clock.
    for part in ("prefill_j", "decode_j"):
        assert _late_error(ClockedNode(), 12, None, part) < 0.05


@dataclass
class LatePromptNode(MovingBatchNode):
    """The moving-batch node with vLLM's prompt counter: a window's prompt tokens count
    only in the next window (when the prefill they belong to is done), while the
    tokens-per-step histogram counts them as its steps run them."""

    pending_prompt: float = 0.0
    step_tokens: float = 0.0

    def window(self, rng: np.random.Generator) -> EnergyReading:
        prompt, output, admitted = self.prompt, self.output, self.admitted
        reading = super().window(rng)
        ran = self.prompt - prompt
        self.step_tokens += ran + (self.output - output) - (self.admitted - admitted)
        counted = self.prompt - ran + self.pending_prompt
        self.pending_prompt = ran
        return replace(reading, prompt_tokens=counted, iteration_tokens=self.step_tokens)


def test_step_tokens_place_prompt_tokens_where_their_prefill_ran() -> None:
    # vLLM counts a prompt's tokens once its prefill is done; the tokens its steps ran,
    # less the decode tokens, say which window ran them.
    placed = _late_error(LatePromptNode(), 8, None, "prefill_j")
    assert placed < 0.05
    assert placed < 0.5 * _late_error(LatePromptNode(), 8, "iteration_tokens", "prefill_j")


@dataclass
class TimedPhasesNode(MovingBatchNode):
    """The moving-batch node as TGI reports it: no step count and no utilisation, but the
    seconds of its prefill and decode forward passes."""

    prefill_forward_s: float = 0.0
    decode_forward_s: float = 0.0

    def window(self, rng: np.random.Generator) -> EnergyReading:
        prompt, idle_j = self.prompt, self.idle_j
        reading = super().window(rng)
        prefill_s = ALPHA * (self.prompt - prompt)
        busy_s = 1.0 - (self.idle_j - idle_j) / IDLE_W
        self.prefill_forward_s += prefill_s
        self.decode_forward_s += busy_s - prefill_s
        return replace(
            reading,
            utilization=None,
            iterations=None,
            prefill_forward_s=self.prefill_forward_s,
            decode_forward_s=self.decode_forward_s,
        )


def test_timed_forward_passes_give_the_split_without_utilisation() -> None:
    # TGI times its prefill and decode forward passes: the busy time and its prefill
    # share are then measured, not read off the GPU's utilisation.
    rng = np.random.default_rng(6)
    node, estimator = TimedPhasesNode(), EnergyEstimator()
    mine = np.zeros(3)
    real = np.zeros(3)
    for index in range(200):
        before = np.array([node.prefill_j, node.decode_j, node.idle_j])
        window = estimator.update(node.window(rng))
        if window is not None and index >= 100:
            mine += [window.prefill_j, window.decode_j, window.idle_j]
            real += np.array([node.prefill_j, node.decode_j, node.idle_j]) - before
    np.testing.assert_allclose(mine, real, rtol=0.03)


def test_rates_are_ml_energy_units_over_the_trailing_minute() -> None:
    rng = np.random.default_rng(2)
    node, estimator = Node(), EnergyEstimator(trailing_s=10.0)
    for _ in range(30):
        estimator.update(node.window(rng))
    rates = estimator.rates("m")
    last = list(estimator.models["m"].trailing)
    assert len(last) == 10
    request_j = sum(w.prefill_j + w.decode_j for w in last)
    assert rates.joules_per_output_token == pytest.approx(
        request_j / sum(w.output_tokens for w in last)
    )
    assert rates.joules_per_prompt_token == pytest.approx(
        sum(w.prefill_j for w in last) / sum(w.prompt_tokens for w in last)
    )
    assert rates.joules_per_request == pytest.approx(
        request_j / sum(w.finished_requests for w in last)
    )
    assert estimator.rates("other").joules_per_output_token is None


def _reading(time_s: float, energy: float | None, tokens: float, **extra: object) -> EnergyReading:
    fields = {
        "time_s": time_s,
        "energy_j": energy,
        "prompt_tokens": tokens,
        "output_tokens": tokens,
        "finished_requests": tokens / 100.0,
        "utilization": 0.5,
        "running": 4.0,
        "model": "m",
        "power_limit_w": 700.0,
    }
    fields.update(extra)
    return EnergyReading(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"energy": None}, "energy_unavailable"),  # NVML NotSupported / a failed read
        ({"energy": math.nan}, "energy_not_finite"),
        ({"energy": math.inf}, "energy_not_finite"),
        ({"energy": 10.0}, "energy_counter_reset"),  # the counter went back (reset, wrap)
        ({"energy": 1e9}, "energy_implausible"),  # a jump far above the power limit
        ({"tokens": 5.0}, "engine_restart"),  # the engine's counters started over
        ({"model": "other"}, "engine_restart"),
    ],
)
def test_bad_input_is_skipped_counted_and_the_series_continue(
    bad: dict[str, object], reason: str
) -> None:
    estimator = EnergyEstimator()
    energy, tokens = 1000.0, 1000.0
    for step in range(5):
        energy, tokens = energy + 300.0, tokens + 500.0
        estimator.update(_reading(float(step), energy, tokens))
    broken = _reading(5.0, bad.get("energy", energy + 300.0), bad.get("tokens", tokens + 500.0))
    if "model" in bad:
        broken = replace(broken, model=str(bad["model"]))
    assert estimator.update(broken) is None
    assert estimator.skipped[reason] == 1
    assert sum(estimator.skipped.values()) == 1
    # The next good readings are attributed again, from the reading that ended the bad one.
    base_energy = broken.energy_j if broken.energy_j and math.isfinite(broken.energy_j) else 0
    later = []
    for step in range(6, 9):
        base_energy = (base_energy or energy) + 300.0
        later.append(
            estimator.update(
                replace(
                    _reading(float(step), base_energy, (broken.prompt_tokens or 0) + 500 * step),
                    model=broken.model,
                )
            )
        )
    windows = [w for w in later if w is not None]
    assert windows, "the series did not continue after the bad window"
    for state in estimator.models.values():
        for value in (state.prefill_j, state.decode_j, state.idle_j):
            assert math.isfinite(value) and value >= 0.0


def test_a_missing_energy_counter_is_counted_once_per_window_not_per_tick() -> None:
    estimator = EnergyEstimator(min_window_s=1.0)
    for tick in range(10):
        estimator.update(_reading(tick * 0.5, None, 100.0 * tick))
    assert estimator.skipped["energy_unavailable"] == 5
    assert estimator.models == {}


def test_a_failed_scrape_extends_the_window_instead_of_splitting_it() -> None:
    estimator = EnergyEstimator()
    estimator.update(_reading(0.0, 1000.0, 0.0))
    assert estimator.update(_reading(1.0, 1400.0, 0.0, engine_fresh=False)) is None
    window = estimator.update(_reading(2.0, 1800.0, 1000.0))
    assert window is not None
    assert window.duration_s == 2.0 and window.total_j == pytest.approx(800.0)
    assert window.prompt_tokens == 1000.0


def test_split_components_never_go_negative() -> None:
    odd = PhaseCoefficients(
        idle_w=-5.0, prefill_w=400.0, decode_w=-1.0, prefill_s_per_token=1.0
    )  # a prefill time longer than the busy time is capped
    parts = split_components(0.5, 0.5, 10_000.0, 100.0, odd)
    assert all(p >= 0 for p in parts)
    assert split_components(0.2, 0.8, 0.0, 100.0, None)[0] == 0.0  # prior, decode only


def test_request_histogram_places_requests_at_the_rule_value() -> None:
    histogram = RequestEnergyHistogram(bounds_j=(10.0, 100.0, 1000.0))
    # Two requests of 500 prompt tokens (bucket 200-800) and 100 output tokens (50-150).
    prompt = ((200.0, 0.0), (800.0, 2.0), (math.inf, 2.0))
    output = ((50.0, 0.0), (150.0, 2.0), (math.inf, 2.0))
    histogram.add(prompt, output, j_prompt=0.01, j_output=0.5)
    # Midpoints: 500 x 0.01 + 100 x 0.5 = 55 J each.
    assert histogram.count == 2.0
    assert histogram.sum_j == pytest.approx(110.0)
    assert histogram.buckets() == [("10.0", 0.0), ("100.0", 2.0), ("1000.0", 2.0), ("+Inf", 2.0)]


def test_request_histogram_from_the_engines_token_histograms() -> None:
    estimator = EnergyEstimator(min_window_s=0.0)
    zero = ((100.0, 0.0), (1000.0, 0.0), (math.inf, 0.0))
    three = ((100.0, 0.0), (1000.0, 3.0), (math.inf, 3.0))
    estimator.update(_reading(0.0, 1000.0, 0.0, prompt_buckets=zero, output_buckets=zero))
    estimator.update(_reading(1.0, 1300.0, 1000.0, prompt_buckets=three, output_buckets=three))
    view = estimator.snapshot().models[0]
    assert view.histogram_buckets is not None
    assert view.histogram_buckets[-1] == ("+Inf", 3.0)
    assert view.histogram_sum_j > 0


class _Learned:
    warmed_up = True

    def phase_power_w(self, clock_mhz: float, phase: str) -> tuple[float, float]:
        return {"idle": 100.0, "prefill": 600.0, "decode": 400.0}[phase], 0.0

    def prefill_s_per_token(self, clock_mhz: float) -> tuple[float, float]:
        return 1e-4, 0.0


class _Controller:
    def __init__(self, model: object) -> None:
        self.model = model

    def __call__(self, observation: object) -> float:
        return 1000.0


def test_learned_model_is_read_only_when_warmed_up() -> None:
    learned = _Learned()
    assert learned_phase_model(_Controller(learned)) is learned
    cold = _Learned()
    cold.warmed_up = False
    assert learned_phase_model(_Controller(cold)) is None
    assert learned_phase_model(_Controller(None)) is None
    estimator = EnergyEstimator(use_learned=True)
    estimator.update(_reading(0.0, 1000.0, 0.0), learned)
    window = estimator.update(_reading(1.0, 1400.0, 1000.0, clock_mhz=1500.0), learned)
    assert window is not None and window.source == "learned"
    # 0.1 s of prefill at 600 W, 0.4 s of decode at 400 W, 0.5 s idle at 100 W, scaled.
    assert window.prefill_j / window.decode_j == pytest.approx(60.0 / 160.0)


def test_engine_token_histograms_are_read_from_vllm_and_sglang_pages() -> None:
    for kind, prefix, prompt, output in (
        ("vllm", "vllm:", "request_prompt_tokens", "request_generation_tokens"),
        ("sglang", "sglang:", "prompt_tokens_histogram", "generation_tokens_histogram"),
    ):
        running = "num_requests_running" if kind == "vllm" else "num_running_reqs"
        waiting = "num_requests_waiting" if kind == "vllm" else "num_queue_reqs"
        lines = [f'{prefix}{running}{{model_name="m"}} 2', f'{prefix}{waiting}{{model_name="m"}} 0']
        for name in (prompt, output):
            lines += [
                f'{prefix}{name}_bucket{{le="100.0",model_name="m"}} 1',
                f'{prefix}{name}_bucket{{le="+Inf",model_name="m"}} 4',
            ]
        spec = SPECS[kind]
        sample = extract(spec, parse_page("\n".join(lines) + "\n", spec.wanted(), kind), kind)
        assert sample.request_prompt_tokens_buckets == ((100.0, 1.0), (math.inf, 4.0))
        assert sample.request_generation_tokens_buckets == ((100.0, 1.0), (math.inf, 4.0))


def _domain_snapshot(estimator: EnergyEstimator) -> DomainSnapshot:
    """A domain snapshot carrying only ``estimator``'s energy view."""
    return DomainSnapshot(
        domain="d",
        controller="mpc",
        gpus=(),
        observation=None,
        requested_mhz=None,
        applied_mhz=None,
        failsafe=False,
        engine_age_s=None,
        engine_scrape_s=0.0,
        decisions_total=0,
        clock_writes_total=0,
        engine_errors_total=0,
        gpu_read_errors_total={},
        fallbacks_total={},
        solve_buckets=(("+Inf", 0.0),),
        solve_sum_s=0.0,
        energy=estimator.snapshot(),
    )


def test_exporter_shows_the_energy_series() -> None:

    rng = np.random.default_rng(3)
    node, estimator = Node(), EnergyEstimator()
    for _ in range(5):
        estimator.update(replace(node.window(rng), prompt_buckets=None))
    estimator.update(_reading(100.0, None, 0.0))  # one skipped window
    snapshot = _domain_snapshot(estimator)
    exporter = Exporter(serve=False)
    exporter.publish([snapshot], LoopSnapshot())
    from prometheus_client import generate_latest

    page = generate_latest(exporter.registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }
    state = estimator.models["m"]
    for phase in ("prefill", "decode", "idle"):
        key = ("gpugov_energy_joules_total", (("domain", "d"), ("model", "m"), ("phase", phase)))
        assert samples[key] == pytest.approx(getattr(state, f"{phase}_j"))
    rate = samples[("gpugov_energy_per_output_token_joules", (("domain", "d"), ("model", "m")))]
    assert rate == pytest.approx(estimator.rates("m").joules_per_output_token)
    skipped = (
        "gpugov_energy_skipped_windows_total",
        (("domain", "d"), ("reason", "energy_unavailable")),
    )
    assert samples[skipped] == 1.0


def test_status_shows_the_daemons_last_minute(capsys: pytest.CaptureFixture[str]) -> None:
    from gpugov.daemon import node_cli

    rng = np.random.default_rng(4)
    node, estimator = Node(), EnergyEstimator()
    for _ in range(5):
        estimator.update(node.window(rng))
    rates = estimator.rates("m")
    assert rates.joules_per_output_token is not None and rates.joules_per_request is not None
    with Exporter("127.0.0.1", 0) as exporter:
        exporter.publish([_domain_snapshot(estimator)], LoopSnapshot())
        dead = "http://127.0.0.1:9"
        code = node_cli.main(
            [
                "status",
                "--backend",
                "emulated",
                "--emulator",
                dead,
                "--governor-metrics",
                exporter.url,
            ]
        )
    assert code == 4  # no GPU answers at the dead emulator; the energy line still shows
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == (
        f"energy d/m, last minute: {rates.joules_per_output_token:.3g} J per output token "
        f"(ML.ENERGY's unit), {rates.joules_per_request:.3g} kJ "
        f"({rates.joules_per_request / 3.6:.3g} Wh) per 1,000 requests"
    )
    assert node_cli.main(["status", "--governor-metrics", "ftp://x"]) == 2
    assert "--governor-metrics 'ftp://x': expected http" in capsys.readouterr().err


def test_the_simulated_engine_publishes_per_request_token_histograms() -> None:
    from synthetic import make_plant

    from gpugov.daemon.simulated import SimulatedNode, SimulatedSource
    from gpugov.plant import PlantSimulation
    from gpugov.plant.types import Request

    requests = [Request(i, 0.1 * i, 100 + 300 * i, 3 + 40 * i) for i in range(4)]
    clock = [0.0]
    node = SimulatedNode(PlantSimulation(requests, make_plant()), lambda: clock[0])
    source = SimulatedSource(node)
    clock[0] = 60.0
    node.refresh()
    sample = source.scrape()
    assert sample.request_prompt_tokens_buckets is not None
    assert sample.request_generation_tokens_buckets is not None
    prompt = dict(sample.request_prompt_tokens_buckets)
    output = dict(sample.request_generation_tokens_buckets)
    assert prompt[math.inf] == output[math.inf] == 4.0  # every request finished
    # Prompts 100, 400, 700, 1000 against vLLM's 1-2-5 bounds; outputs 3, 43, 83, 123.
    assert prompt[100.0] == 1.0 and prompt[500.0] == 2.0 and prompt[1000.0] == 4.0
    assert output[5.0] == 1.0 and output[50.0] == 2.0 and output[100.0] == 3.0


def test_no_window_spans_an_engine_of_another_kind_serving_the_same_model(
    metrics_server: MetricsServer,
) -> None:
    """vLLM replaced on the URL by an SGLang serving the same model (kind auto): the window
    across the two took SGLang's lifetime less vLLM's counters as one second's work (8.1e6
    prompt tokens), a joules-per-token no GPU spends, folded into the model's estimate."""
    gpu = _EnergyGpu()
    observer = DomainObserver([gpu], ScrapedSource(metrics_server.url), stale_after_s=30.0)
    estimator = EnergyEstimator()
    model = "meta-llama/Llama-3.1-8B-Instruct"
    vllm = fixture_text("vllm_v1_real.txt").replace("Qwen/Qwen3-0.6B", model)
    windows = []
    for step, page in enumerate([vllm] * 3 + [fixture_text("sglang_real.txt")] * 3):
        metrics_server.page = page
        gpu.energy_j += 400.0  # 400 W
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None
        windows.append(estimator.update(reading_from(observed)))
    assert estimator.skipped["engine_restart"] == 1
    worked = [w for w in windows if w is not None]
    assert worked and max(w.prompt_tokens for w in worked) < 1e3


class _EnergyGpu:
    """A GpuBackend whose energy counter the test moves."""

    label = "0"
    energy_j = 1e6

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return (900, 1980)

    def sample(self) -> GpuSample:
        return GpuSample(gpu=self.label, energy_j=self.energy_j, power_limit_w=700.0)

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self) -> None: ...

    def close(self) -> None: ...
