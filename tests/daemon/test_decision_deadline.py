"""An outside controller that hangs costs its domain ticks at the fail-safe, never the loop:
on a node its call runs on a worker thread with a deadline (``daemon.deadline``). The
end-to-end cases run the daemon's loop on virtual time with long periods: the deadline is
still a wall-clock one (a hung call costs it once, in real time), while a call that
returns at once, a loopback scrape and the late call's return after its release each have
seconds to happen, however loaded the machine. They assert what happened tick by tick,
not how long it took."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from daemon_support import JOIN_S, MetricsServer, eventually, run_ticks
from fake_pynvml import FakeNvml

from gpugov.controllers.contract import layers
from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_config import ExternalControllerConfig
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.deadline import DecisionDeadline, DecisionTimeout, EscapedCall
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.errors import ConfigError, ControllerFailure
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.service import domains_from_config
from gpugov.plant.types import ServingObservation

LOCK = "nvmlDeviceSetGpuLockedClocks"
RESET = "nvmlDeviceResetGpuLockedClocks"
CLOCKS = (900.0, 1200.0, 1500.0, 1800.0)
PERIOD_S = 0.1
LOOP_PERIOD_S = 30.0
"""The end-to-end cases' period, on virtual time: the engine's data goes stale only after
three scrapes in a row fail, each given :data:`SCRAPE_TIMEOUT_S`."""
SCRAPE_TIMEOUT_S = 10.0
DEADLINE_S = 2.0
"""A decision's deadline where a call that returns at once must make it (the thread
hand-over can take a while on a loaded machine); a hung call costs it once."""

PACKAGE = '''
"""An outside governor that hangs (a blocking call that does not return) from a step on."""

import threading

release = threading.Event()
calls = []
threads = []
hang_from = [2]


def make(context):
    low = context.supported_clocks_mhz[0]

    def decide(observation):
        calls.append(observation.step_index)
        threads.append(threading.current_thread())
        if observation.step_index >= hang_from[0]:
            release.wait(60.0)  # "hung" until the test releases it
        return low

    return decide
'''


@pytest.fixture
def hanging(module_on_path: Callable[[str, str], str]) -> Iterator[Any]:
    """The module ``hanging_governor``; whatever a test leaves hung is released after it."""
    module_on_path("hanging_governor", PACKAGE)
    import hanging_governor

    yield hanging_governor
    hanging_governor.release.set()


def _config(
    url: str,
    *,
    failsafe: str = "max",
    period_s: float = PERIOD_S,
    engine: dict[str, Any] | None = None,
    **controller: Any,
) -> Any:
    return parse_config(
        {
            "daemon": {"period_s": period_s},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "failsafe": failsafe,
                    "engine": {"kind": "vllm", "url": url, **(engine or {})},
                    "controller": {
                        "kind": "external",
                        "factory": "hanging_governor:make",
                        **controller,
                    },
                }
            ],
        }
    )


def _loop_config(url: str, failsafe: str = "max") -> Any:
    """A node for the end-to-end cases (period :data:`LOOP_PERIOD_S`, deadline
    :data:`DEADLINE_S`)."""
    return _config(
        url,
        failsafe=failsafe,
        period_s=LOOP_PERIOD_S,
        engine={"timeout_s": SCRAPE_TIMEOUT_S},
        decision_timeout_s=DEADLINE_S,
    )


def _virtual_loop() -> TimedLoop:
    clock = VirtualClock()
    return TimedLoop(LOOP_PERIOD_S, clock=clock, sleep=clock.sleep)


def _observation(step: int = 0) -> ServingObservation:
    return ServingObservation(
        time_s=float(step),
        step_index=step,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        supported_clocks_mhz=CLOCKS,
    )


# --------------------------------------------------------------- the wrapper alone
def test_a_late_call_raises_and_no_new_call_starts_until_it_returns(hanging: Any) -> None:
    inner = hanging.make(ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS))
    deadline = DecisionDeadline(inner, DEADLINE_S)
    assert deadline(_observation(0)) == 900.0
    assert deadline(_observation(1)) == 900.0
    with pytest.raises(DecisionTimeout, match=rf"within its deadline of {DEADLINE_S:g} s"):
        deadline(_observation(2))
    for step in (3, 4):
        with pytest.raises(DecisionTimeout, match="still running"):
            deadline(_observation(step))
    assert hanging.calls == [0, 1, 2]  # nothing new started behind the hung call
    assert deadline.busy and deadline.timeouts == 3
    hanging.hang_from[0] = 10**9
    hanging.release.set()
    assert len(set(hanging.threads)) == 1 and hanging.threads[0] is not threading.main_thread()
    assert eventually(lambda: not deadline.busy)  # the late call returns on its own thread
    assert deadline(_observation(5)) == 900.0  # its late answer was discarded, a new call
    assert hanging.calls == [0, 1, 2, 5] and deadline.late_results_discarded == 1


def test_an_exception_passes_through_unchanged() -> None:
    def broken(observation: ServingObservation) -> float:
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError, match="bug"):
        DecisionDeadline(broken, 1.0)(_observation())


@pytest.mark.parametrize(
    ("escape", "said"),
    [
        (KeyboardInterrupt, "raised KeyboardInterrupt()"),
        (SystemExit, "called sys.exit(None)"),
        (GeneratorExit, "raised GeneratorExit()"),
    ],
)
def test_what_is_no_exception_raised_on_the_worker_is_the_controllers_failure(
    escape: type[BaseException], said: str
) -> None:
    """No signal reaches the worker thread: a KeyboardInterrupt there is the outside code's
    own (as a sys.exit() is), one more failed decision; raised again on the loop's thread it
    stopped the node as a Ctrl-C would (exit 130, 'interrupted', no line naming the
    controller)."""

    def escaping(observation: ServingObservation) -> float:
        raise escape()

    with pytest.raises(EscapedCall) as info:
        DecisionDeadline(escaping, 1.0)(_observation())
    assert str(info.value) == said and isinstance(info.value.__cause__, escape)


def test_a_copy_has_its_own_worker_and_no_late_call(hanging: Any) -> None:
    inner = hanging.make(ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS))
    deadline = DecisionDeadline(inner, 0.05)
    deadline.name = "outside"
    with pytest.raises(DecisionTimeout):
        deadline(_observation(2))
    copied = copy.deepcopy(deadline)
    assert not copied.busy and copied.name == "outside" and copied.deadline_s == 0.05


def test_a_busy_controller_is_not_closed() -> None:
    release = threading.Event()
    closed: list[bool] = []

    class Hung:
        def __call__(self, observation: ServingObservation) -> float:
            release.wait(60.0)
            return 900.0

        def close(self) -> None:
            closed.append(True)

    deadline = DecisionDeadline(Hung(), 0.02)
    try:
        with pytest.raises(DecisionTimeout):
            deadline(_observation())
        deadline.close()
        assert closed == []
    finally:
        release.set()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_deadline_must_be_positive_and_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        DecisionDeadline(lambda observation: 900.0, bad)


# --------------------------------------------------------------- who gets one
def test_only_an_outside_controller_on_wall_time_gets_a_deadline(hanging: Any) -> None:
    outside = parse_controller_spec("hanging_governor:make")
    wall = ControllerContext(period_s=0.5, supported_clocks_mhz=CLOCKS)
    virtual = ControllerContext(period_s=0.5, supported_clocks_mhz=CLOCKS, time_mode="virtual")
    (deadline,) = [
        x for x in layers(build_controller(outside, wall)) if isinstance(x, DecisionDeadline)
    ]
    assert deadline.deadline_s == 0.5  # the control period by default
    assert deadline.name == "hanging_governor:make"
    assert not any(
        isinstance(x, DecisionDeadline) for x in layers(build_controller(outside, virtual))
    )
    for spec in ("max", "fixed:1200", "reactive"):
        chain = build_controller(parse_controller_spec(spec), wall)
        assert not any(isinstance(x, DecisionDeadline) for x in layers(chain)), spec
    spec = ExternalControllerConfig(
        kind="external", factory="hanging_governor:make", decision_timeout_s=0.2
    )
    (deadline,) = [
        x for x in layers(build_controller(spec, wall)) if isinstance(x, DecisionDeadline)
    ]
    assert deadline.deadline_s == 0.2


def test_the_config_bounds_the_deadline(hanging: Any) -> None:
    config = _config("http://127.0.0.1:1/metrics", decision_timeout_s=0.05)
    assert config.domains[0].controller.decision_timeout_s == 0.05
    with pytest.raises(ConfigError, match=r"decision_timeout_s \(0.5 s\) must be at most"):
        _config("http://127.0.0.1:1/metrics", decision_timeout_s=0.5)
    for bad in (0.0, 0.001, float("nan"), float("inf"), -1.0):
        with pytest.raises(ConfigError, match="decision_timeout_s"):
            _config("http://127.0.0.1:1/metrics", decision_timeout_s=bad)


# --------------------------------------------------------------- the real loop
@pytest.mark.parametrize("failsafe", ["max", "unlock"])
def test_a_hung_outside_controller_costs_ticks_at_the_failsafe_not_the_loop(
    vllm_server: MetricsServer, hanging: Any, caplog: pytest.LogCaptureFixture, failsafe: str
) -> None:
    fake = FakeNvml(1)
    assembled = domains_from_config(_loop_config(vllm_server.url, failsafe), nvml=fake)
    domain = assembled.domains[0]
    (deadline,) = [x for x in layers(domain.controller) if isinstance(x, DecisionDeadline)]

    def on_step(step: int, records: list[TickRecord]) -> None:
        if step == 6:
            hanging.hang_from[0] = 10**9
            hanging.release.set()
            # The released call returns on its worker; the next tick is after that.
            assert eventually(lambda: not deadline.busy)

    try:
        with caplog.at_level("WARNING", logger="gpugov.daemon.loop"):
            records, stats = run_ticks(assembled.domains, 14, on_step=on_step, loop=_virtual_loop())
    finally:
        assembled.close()
    assert stats.ticks == 14  # the loop kept ticking through the hang
    # The hung tick (the first call from step 2) is the first fail-safe one, and so is
    # every tick while the call runs; after the release it decides again.
    failsafe_ticks = [r.step for r in records if r.failsafe]
    assert failsafe_ticks == [2, 3, 4, 5, 6]
    assert all(r.decision_mhz is None for r in records if r.failsafe)
    assert records[-1].requested_mhz == 345.0 and not records[-1].failsafe
    if failsafe == "max":
        assert {r.requested_mhz for r in records if r.failsafe} == {1980.0}
    else:
        assert all(r.applied_mhz is None for r in records if r.failsafe)
    # One call was hung; no other call started while it ran (the first is the warm-up's).
    assert hanging.calls == [0, 0, 1, 2, *range(7, 14)]
    assert domain.fallback_counts()["controller_timeout"] == len(failsafe_ticks)
    assert "controller_error" not in domain.fallback_counts()
    lines = [r.getMessage() for r in caplog.records]
    late = [line for line in lines if "did not decide in time" in line]
    assert len(late) == 1 and "domain llm" in late[0] and "hanging_governor:make" in late[0]
    assert len([line for line in lines if "decides again" in line]) == 1
    assert domain.controller_failures == 0
    assert fake.writes[-1] == (RESET, 0) and fake.locked(0) is None
    # The warm-up (before the loop) and every decision ran on the worker, within the
    # deadline: never on the loop's thread.
    assert all(thread is not threading.main_thread() for thread in hanging.threads)
    (worker,) = set(hanging.threads)
    worker.join(JOIN_S)  # closing the controller at exit retired it
    assert not worker.is_alive()


def test_a_persistent_hang_stops_the_daemon_with_the_clocks_reset(
    vllm_server: MetricsServer, hanging: Any
) -> None:
    fake = FakeNvml(1)
    assembled = domains_from_config(_loop_config(vllm_server.url), nvml=fake)
    records: list[TickRecord] = []
    try:
        with pytest.raises(ControllerFailure) as info:
            run(
                assembled.domains,
                _virtual_loop(),
                on_tick=records.extend,
                before_tick=lambda now, step: step >= 1000,
                max_controller_failures=3,
            )
    finally:
        assembled.close()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "domain llm: controller 'hanging_governor:make' did not decide in time 3 time(s) in a row"
    )
    assert isinstance(info.value.__cause__, DecisionTimeout)
    decided = [r.step for r in records if not r.failsafe]
    timed_out = [r.step for r in records if r.failsafe]
    assert decided == [0, 1]
    assert timed_out == [2, 3]  # two survived timeouts; the third stops it, unrecorded
    assert hanging.calls == [0, 0, 1, 2]  # the warm-up's, the decisions, the hung one
    assert (LOCK, 0, 345, 345) in fake.writes
    assert fake.writes[-1] == (RESET, 0) and fake.locked(0) is None


def test_an_in_tree_controller_runs_on_the_loops_thread(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(1)
    config = parse_config(
        {
            "daemon": {"period_s": LOOP_PERIOD_S},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {
                        "kind": "vllm",
                        "url": vllm_server.url,
                        "timeout_s": SCRAPE_TIMEOUT_S,
                    },
                    "controller": {"kind": "reactive"},
                }
            ],
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    domain = assembled.domains[0]
    assert not any(isinstance(x, DecisionDeadline) for x in layers(domain.controller))
    seen: list[threading.Thread] = []
    innermost = layers(domain.controller)[-2]  # the wrapper around the algorithm
    algorithm = innermost.inner  # type: ignore[attr-defined]

    def spy(observation: ServingObservation) -> float:
        seen.append(threading.current_thread())
        return float(algorithm(observation))

    innermost.inner = spy  # type: ignore[attr-defined]
    before = {t.ident for t in threading.enumerate()}
    try:
        run_ticks(assembled.domains, 3, loop=_virtual_loop())
    finally:
        assembled.close()
    assert seen == [threading.main_thread()] * 3
    started = [t for t in threading.enumerate() if t.ident not in before]
    assert not any(t.name.startswith("gpugov-controller") for t in started)  # no worker
