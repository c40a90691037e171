"""An outside controller that breaks the controller contract on a node: an answer that is
not a clock, ``sys.exit()`` while deciding, a change to the observation, a warm-up that
never returns. The node runs on (the chain's top clock or the fail-safe, one log line)
and every lock is reset at exit.

The node cases run the daemon's loop on virtual time with long periods: an outside
controller's deadline is still a wall-clock one (a hung warm-up costs it once, in real
time), while a call that returns at once and a loopback scrape each have seconds to
happen, however loaded the machine."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_support import MetricsServer, eventually, run_ticks
from fake_pynvml import FakeNvml

from gpugov.controllers.contract import layers
from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.deadline import DecisionDeadline
from gpugov.daemon.decide import ControllerContext, build_controller, warm_up
from gpugov.daemon.domain import Domain, TickRecord
from gpugov.daemon.loop import TimedLoop, VirtualClock
from gpugov.daemon.outside import OutsideController, OutsideExit, not_a_clock
from gpugov.daemon.safety import invalid_decisions
from gpugov.daemon.service import domains_from_config
from gpugov.plant.types import ServingObservation

RESET = "nvmlDeviceResetGpuLockedClocks"
CLOCKS = (900.0, 1200.0, 1500.0, 1800.0)
PERIOD_S = 30.0
"""The nodes' period, on virtual time: the engine's data goes stale only after three
scrapes in a row fail, each given :data:`SCRAPE_TIMEOUT_S`."""
SCRAPE_TIMEOUT_S = 10.0
DEADLINE_S = 2.0
"""The outside controller's decision deadline: a call that returns at once makes it even
when the thread hand-over is slow on a loaded machine; a hung call costs it once."""

PACKAGE = '''
"""Outside governors that misbehave, steered by the test through module globals."""

import threading

answer = [1200.0]
exit_at = [10**9]
release = threading.Event()
hang_first = [False]
seen_time_s = []


def scripted(context):
    def decide(observation):
        if hang_first[0]:
            hang_first[0] = False
            release.wait(60.0)
        if observation.step_index >= exit_at[0]:
            raise SystemExit(3)
        return answer[0]

    return decide


escape = [GeneratorExit()]


def escaping(context):
    def decide(observation):
        raise escape[0]

    return decide


class _ClosesEscaping:
    def __call__(self, observation):
        return 1200.0

    def close(self):
        raise escape[0]


def escaping_close(context):
    return _ClosesEscaping()


def vandal(context):
    def decide(observation):
        seen_time_s.append(observation.time_s)
        object.__setattr__(observation, "time_s", -1.0)
        object.__setattr__(observation, "decode_active", 10**6)
        return context.supported_clocks_mhz[0]

    return decide
'''


@pytest.fixture
def governor(module_on_path: Callable[[str, str], str]) -> Iterator[Any]:
    """The module ``misbehaving_governor``; anything left hung is released after a test."""
    module_on_path("misbehaving_governor", PACKAGE)
    import misbehaving_governor

    yield misbehaving_governor
    misbehaving_governor.release.set()


def _observation(step: int = 0) -> ServingObservation:
    return ServingObservation(
        time_s=float(step),
        step_index=step,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=2,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        supported_clocks_mhz=CLOCKS,
    )


def _node(url: str, factory: str) -> Any:
    return parse_config(
        {
            "daemon": {"period_s": PERIOD_S},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {"kind": "vllm", "url": url, "timeout_s": SCRAPE_TIMEOUT_S},
                    "controller": {
                        "kind": "external",
                        "factory": factory,
                        "decision_timeout_s": DEADLINE_S,
                    },
                }
            ],
        }
    )


def _run(domains: Any, ticks: int) -> list[TickRecord]:
    """The daemon's loop on virtual time until ``ticks`` ticks have run: their records."""
    clock = VirtualClock()
    return run_ticks(domains, ticks, loop=TimedLoop(PERIOD_S, clock=clock, sleep=clock.sleep))[0]


def _run_node(
    url: str, factory: str, ticks: int, caplog: pytest.LogCaptureFixture | None = None
) -> tuple[list[TickRecord], Domain, FakeNvml]:
    """A one-GPU node with the outside controller ``factory`` run for ``ticks`` ticks (the
    loop's WARNING lines captured in ``caplog`` when given), then closed: (its records,
    its domain, its fake NVML)."""
    fake = FakeNvml(1)
    assembled = domains_from_config(_node(url, factory), nvml=fake)
    capturing = (
        contextlib.nullcontext()
        if caplog is None
        else caplog.at_level("WARNING", logger="gpugov.daemon.loop")
    )
    try:
        with capturing:
            records = _run(assembled.domains, ticks)
    finally:
        assembled.close()
    return records, assembled.domains[0], fake


# ------------------------------------------------------------------ the edge alone
@pytest.mark.parametrize(
    "answer",
    [
        math.nan,
        math.inf,
        -math.inf,
        -100.0,
        0.0,
        "fast",
        "1200",
        None,
        True,
        np.bool_(False),
        b"1200",
        object(),
    ],
    # A bare object's repr holds its address, which differs between xdist workers.
    ids=lambda answer: "object" if type(answer) is object else repr(answer),
)
def test_an_answer_that_is_not_a_clock_runs_the_top_clock_and_is_counted(
    governor: Any, answer: Any
) -> None:
    """A string (even a numeric one), None, a bool, NaN, an infinity, zero or a negative
    clock is not a clock: the chain runs the top clock, counts it and keeps its repr."""
    governor.answer[0] = answer
    for mode in ("virtual", "wall"):
        context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS, time_mode=mode)  # type: ignore[arg-type]
        chain = build_controller(parse_controller_spec("misbehaving_governor:scripted"), context)
        assert chain(_observation()) == CLOCKS[-1], mode
        assert invalid_decisions(chain) == 1
        (edge,) = [x for x in layers(chain) if isinstance(x, OutsideController)]
        assert edge.invalid_answers == 1 and edge.last_invalid == not_a_clock(answer)
        assert edge.last_invalid is not None and len(edge.last_invalid) <= 60
        chain.close()


@pytest.mark.parametrize(
    ("answer", "clock"),
    [(1234.5, 1200.0), (1.0, 900.0), (1e9, 1800.0), (np.float32(1500.0), 1500.0), (1500, 1500.0)],
)
def test_a_clock_off_the_list_or_out_of_range_is_quantised(
    governor: Any, answer: Any, clock: float
) -> None:
    """A positive finite clock is the controller's to ask for: the chain quantises it onto
    the supported clocks and counts nothing."""
    governor.answer[0] = answer
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS, time_mode="virtual")
    chain = build_controller(parse_controller_spec("misbehaving_governor:scripted"), context)
    assert chain(_observation()) == clock
    assert invalid_decisions(chain) == 0


def test_sys_exit_while_deciding_is_an_error_not_an_exit(governor: Any) -> None:
    governor.exit_at[0] = 0
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS, time_mode="virtual")
    chain = build_controller(parse_controller_spec("misbehaving_governor:scripted"), context)
    with pytest.raises(OutsideExit, match=r"called sys.exit\(3\) while deciding"):
        chain(_observation())


ESCAPES = [GeneratorExit(), asyncio.CancelledError(), SystemExit(3)]
"""What outside code may raise that is no ``Exception``: a generator's close, an asyncio
task's cancellation, ``sys.exit()`` (KeyboardInterrupt stays Ctrl-C's)."""


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda error: type(error).__name__)
def test_a_base_exception_while_deciding_is_an_error_not_an_exit(
    governor: Any, escape: BaseException
) -> None:
    governor.escape[0] = escape
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS, time_mode="virtual")
    chain = build_controller(parse_controller_spec("misbehaving_governor:escaping"), context)
    with pytest.raises(OutsideExit, match="while deciding"):
        chain(_observation())


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda error: type(error).__name__)
def test_a_node_survives_a_base_exception_in_a_decision_and_resets_the_clocks(
    vllm_server: MetricsServer, governor: Any, escape: BaseException
) -> None:
    """A GeneratorExit or an asyncio CancelledError in an outside decision ended the run
    in a traceback (exit 1); each is now the controller's failure, as sys.exit() is."""
    governor.escape[0] = escape
    records, domain, fake = _run_node(vllm_server.url, "misbehaving_governor:escaping", 3)
    assert [r.failsafe for r in records] == [True, True, True]
    assert domain.fallback_counts()["controller_error"] == 3
    assert fake.writes[-1] == (RESET, 0) and fake.locked(0) is None


@pytest.mark.parametrize(
    "escape", [*ESCAPES, KeyboardInterrupt()], ids=lambda error: type(error).__name__
)
def test_a_close_that_raises_a_base_exception_is_one_failed_close(
    vllm_server: MetricsServer,
    governor: Any,
    escape: BaseException,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An outside close raising what is no ``Exception`` killed the close's worker thread
    (a KeyboardInterrupt printed its traceback), and the exit waited the close's whole
    deadline to say it 'has not returned'; it is now one failed close, the clocks reset."""
    governor.escape[0] = escape
    seen: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda hook: seen.append(hook.exc_value)  # type: ignore[assignment,misc]
    try:
        with caplog.at_level("WARNING"):
            _, domain, fake = _run_node(vllm_server.url, "misbehaving_governor:escaping_close", 2)
            domain.close_controller()
    finally:
        threading.excepthook = previous
    assert seen == []
    lines = [r.getMessage() for r in caplog.records]
    assert any("closing the controller failed" in line for line in lines), lines
    assert not any("has not returned" in line for line in lines), lines
    assert fake.writes[-1] == (RESET, 0) and fake.locked(0) is None


def test_the_controller_decides_on_its_own_copy_of_the_observation(governor: Any) -> None:
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS, time_mode="virtual")
    chain = build_controller(parse_controller_spec("misbehaving_governor:vandal"), context)
    # Built in virtual time, it made a node's warm-up decision (an idle node at 0 s).
    assert governor.seen_time_s == [0.0]
    observation = _observation(7)
    assert chain(observation) == CLOCKS[0]
    assert observation.time_s == 7.0 and observation.decode_active == 2
    assert governor.seen_time_s == [0.0, 7.0]


# ------------------------------------------------------------------ on a node
def test_a_node_logs_one_line_and_runs_the_top_clock_for_an_answer_not_a_clock(
    vllm_server: MetricsServer, governor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    governor.answer[0] = "fast"
    records, domain, fake = _run_node(vllm_server.url, "misbehaving_governor:scripted", 5, caplog)
    assert len(records) == 5 and not any(r.failsafe for r in records)
    assert {r.requested_mhz for r in records} == {1980.0}  # FakeNvml's top clock
    assert domain.fallback_counts()["invalid_decision"] == 5
    assert domain.controller_failures == 0
    (line,) = [r.getMessage() for r in caplog.records if "not a clock" in r.getMessage()]
    assert line.startswith("domain llm: controller 'misbehaving_governor:scripted' returned 'fast'")
    assert fake.writes[-1] == (RESET, 0) and fake.locked(0) is None


def test_a_node_survives_sys_exit_in_a_decision_and_resets_the_clocks(
    vllm_server: MetricsServer, governor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    governor.answer[0] = 900.0
    governor.exit_at[0] = 2
    records, domain, fake = _run_node(vllm_server.url, "misbehaving_governor:scripted", 4, caplog)
    assert [r.failsafe for r in records] == [False, False, True, True]
    assert {r.requested_mhz for r in records if r.failsafe} == {1980.0}
    assert domain.fallback_counts()["controller_error"] == 2
    assert any(
        "OutsideExit" in r.getMessage() and "sys.exit(3)" in r.getMessage() for r in caplog.records
    )
    assert fake.writes[-1] == (RESET, 0) and fake.locked(0) is None


def test_a_node_records_the_observation_the_controller_could_not_change(
    vllm_server: MetricsServer, governor: Any
) -> None:
    records, _, _ = _run_node(vllm_server.url, "misbehaving_governor:vandal", 3)
    assert [r.observation.time_s for r in records] == pytest.approx(
        [r.time_s for r in records], abs=1e-6
    )
    assert all(r.observation.decode_active != 10**6 for r in records)


def test_a_warm_up_that_never_returns_does_not_stall_the_node_start(
    vllm_server: MetricsServer, governor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm-up runs within the decision deadline on the worker thread: the start goes
    on, and the loop's ticks hold the fail-safe until the hung call returns."""
    governor.hang_first[0] = True
    fake = FakeNvml(1)
    with caplog.at_level("WARNING", logger="gpugov.daemon.service"):
        assembled = domains_from_config(
            _node(vllm_server.url, "misbehaving_governor:scripted"), nvml=fake
        )
    domain = assembled.domains[0]
    assert any("warm-up decision did not return" in r.getMessage() for r in caplog.records)
    try:
        records = _run(assembled.domains, 2)
        assert all(r.failsafe and r.requested_mhz == 1980.0 for r in records)
        assert domain.fallback_counts()["controller_timeout"] == 2
        governor.release.set()
        (deadline,) = [x for x in layers(domain.controller) if isinstance(x, DecisionDeadline)]
        assert eventually(lambda: not deadline.busy)  # the released call returns on its worker
        records = _run(assembled.domains, 2)
        assert not records[-1].failsafe and records[-1].requested_mhz == 1200.0
    finally:
        assembled.close()
    assert fake.writes[-1] == (RESET, 0) and fake.locked(0) is None


def test_warm_up_of_an_outside_controller_turns_sys_exit_into_an_error(governor: Any) -> None:
    governor.exit_at[0] = 0
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS, time_mode="virtual")
    chain = build_controller(parse_controller_spec("misbehaving_governor:scripted"), context)
    with pytest.raises(OutsideExit):
        warm_up(chain, CLOCKS)


@pytest.mark.parametrize(
    ("source", "spec", "expected"),
    [
        (
            "import sys\n\ndef make(context):\n    sys.exit('no GPU of mine here')\n",
            "exiting_factory:make",
            "controller factory 'exiting_factory:make' called sys.exit('no GPU of mine here')",
        ),
        (
            "raise SystemExit(3)\n\ndef make(context):\n    return lambda o: 1000.0\n",
            "exiting_factory:make",
            "controller factory 'exiting_factory:make': cannot import 'exiting_factory': "
            "it called sys.exit(3)",
        ),
        (
            "def make(context):\n    raise GeneratorExit\n",
            "exiting_factory:make",
            "controller factory 'exiting_factory:make' raised GeneratorExit()",
        ),
        (
            "import asyncio\n\nraise asyncio.CancelledError\n",
            "exiting_factory:make",
            "controller factory 'exiting_factory:make': cannot import 'exiting_factory': "
            "it raised CancelledError()",
        ),
    ],
    ids=["in-the-factory", "at-import", "generator-exit-in-the-factory", "cancelled-at-import"],
)
def test_sys_exit_in_a_factory_or_its_import_is_one_line_before_any_work(
    module_on_path: Callable[[str, str], str],
    capsys: pytest.CaptureFixture[str],
    source: str,
    spec: str,
    expected: str,
) -> None:
    """A factory (or its module's import) calling sys.exit() is the spec's usage error, as
    any exception there is: it escaped as the process's exit with its argument printed."""
    from gpugov.cli import main

    module_on_path("exiting_factory", source)
    code = main(["simulate", "--controller", spec, "--duration", "1", "--quiet"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpugov: error: "), lines
    assert expected in lines[0]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "def make(context):\n    raise KeyboardInterrupt\n",
            "controller factory 'interrupting_factory:make' raised KeyboardInterrupt()",
        ),
        (
            "raise KeyboardInterrupt\n",
            "controller factory 'interrupting_factory:make': cannot import "
            "'interrupting_factory': it raised KeyboardInterrupt()",
        ),
    ],
    ids=["in-the-factory", "at-import"],
)
def test_a_keyboard_interrupt_a_factory_raises_off_the_main_thread_is_its_failure(
    module_on_path: Callable[[str, str], str], source: str, expected: str
) -> None:
    """A node builds its controllers on a start thread, which no signal reaches: a
    KeyboardInterrupt a factory (or its import) raises there is the factory's own, one
    line naming it, where it stopped the start as a Ctrl-C ('gpugov: interrupted', exit
    130, nothing naming the factory). On the main thread it stays Ctrl-C's."""
    import threading

    from gpugov.daemon.errors import ControllerError

    module_on_path("interrupting_factory", source)
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS)
    raised: list[BaseException] = []

    def build() -> None:
        try:
            build_controller(parse_controller_spec("interrupting_factory:make"), context)
        except BaseException as error:  # the outcome, whatever it is
            raised.append(error)

    worker = threading.Thread(target=build)
    worker.start()
    worker.join(60)
    # The spec's reading imports the module (ValueError); the build calls the factory.
    assert len(raised) == 1 and isinstance(raised[0], ControllerError | ValueError), raised
    assert expected in str(raised[0])
    with pytest.raises(KeyboardInterrupt):
        build_controller(parse_controller_spec("interrupting_factory:make"), context)


# ------------------------------------------------------------------ entry points
def _install(site: Path, package: str, entries: dict[str, str]) -> None:
    """A distribution ``package`` on ``site`` registering ``entries`` in the group."""
    info = site / f"{package.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[gpugov.controllers]\n{lines}")


def test_a_name_two_packages_register_differently_is_refused_in_one_line(
    governor: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _install(site, "gov-a", {"dup": "misbehaving_governor:scripted", "same": "m:f"})
    _install(site, "gov-b", {"dup": "misbehaving_governor:vandal"})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ValueError) as error:
        parse_controller_spec("dup")
    message = str(error.value)
    assert "\n" not in message and message.startswith("--controller 'dup': 2 installed packages")
    assert "(package gov-a)" in message and "(package gov-b)" in message
    assert message.endswith("name one as MODULE:FACTORY")


def test_the_same_factory_registered_twice_is_one_controller(
    governor: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for site, package in ((tmp_path / "a", "gov-a"), (tmp_path / "b", "gov-a-copy")):
        _install(site, package, {"twice": "misbehaving_governor:scripted"})
        monkeypatch.syspath_prepend(str(site))
    spec = parse_controller_spec("twice")
    assert spec.kind == "external" and spec.factory == "misbehaving_governor:scripted"


def test_a_built_in_name_means_the_built_in_and_a_broken_entry_is_one_line(
    governor: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _install(site, "gov-c", {"mpc": "misbehaving_governor:scripted", "broke": "nowhere_mod:make"})
    monkeypatch.syspath_prepend(str(site))
    assert parse_controller_spec("mpc").kind == "mpc"
    with pytest.raises(ValueError) as error:
        parse_controller_spec("broke")
    assert str(error.value).startswith(
        "--controller 'broke': its gpugov.controllers entry point: controller factory "
        "'nowhere_mod:make': cannot import 'nowhere_mod'"
    )


# ------------------------------------------------------------------ a slow call in a study
def test_a_call_running_past_the_slow_limit_is_named_once(
    governor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """In virtual time no deadline bounds a call; the watcher names one that runs past
    SLOW_DECISION_S (its clock injected here), once per call."""
    from gpugov.daemon import outside

    edge = OutsideController(lambda observation: 1200.0, watch=False)
    edge.name = "slowpoke"
    edge._call = (100.0, 5.0, 50)  # a call started at wall 100 s, observation t=5 s
    with caplog.at_level("WARNING", logger="gpugov.daemon.outside"):
        edge.check_slow(100.0 + outside.SLOW_DECISION_S - 1.0)
        edge.check_slow(100.0 + outside.SLOW_DECISION_S + 1.0)
        edge.check_slow(100.0 + outside.SLOW_DECISION_S + 30.0)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("controller 'slowpoke' has been deciding for 31 s (at t=5.000s")
    assert edge(_observation()) == 1200.0 and edge._call is None
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS, time_mode="virtual")
    chain = build_controller(parse_controller_spec("misbehaving_governor:scripted"), context)
    (watched,) = [x for x in layers(chain) if isinstance(x, OutsideController)]
    assert watched.watch and watched in outside._watched
