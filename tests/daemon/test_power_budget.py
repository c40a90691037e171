"""Power budgets per domain: the sources (config, file, NVML), the lowest winning, bad
input kept out, the budget reaching the controller every tick, and the exporter's
need/budget/headroom series; end to end on a fake node (fake NVML, a real /metrics
server, virtual time)."""

from __future__ import annotations

import logging
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from daemon_support import MetricsServer
from fake_pynvml import NVML_ERROR_NOT_SUPPORTED, FakeNvml
from prometheus_client.parser import text_string_to_metric_families

from gpugov.controllers.contract import PowerNeed
from gpugov.daemon.config import parse_config
from gpugov.daemon.errors import ConfigError
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.power_budget import (
    BudgetFile,
    PowerBudget,
    distinct_watts,
    parse_budget_watts,
)
from gpugov.daemon.service import domains_from_config
from gpugov.plant.types import ServingObservation


# ------------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    ("budget", "need", "shown"),
    [
        (600.0, 700.0, ("600", "700")),
        (700.0, 700.4, ("700.0", "700.4")),
        (700.0, 700.04, ("700.00", "700.04")),
        (700.0, 700.004, ("700.000", "700.004")),  # was "700.00 W is below the 700.00 W"
    ],
)
def test_the_over_budget_line_never_prints_the_budget_and_the_need_alike(
    budget: float, need: float, shown: tuple[str, str]
) -> None:
    assert distinct_watts(budget, need) == shown


def test_a_need_at_the_budget_but_for_rounding_is_no_over_budget_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``run --simulate`` of a profile limited to 150 W warned "the power budget 150.00 W
    is below the 150.00 W (+/- 2 W) the SLO needs": the learned need was 7e-12 W over."""
    clocks = (1500.0, 1980.0)

    class AtTheLimit:
        def __call__(self, observation: ServingObservation) -> float:
            return 1980.0

        def power_needed(self) -> PowerNeed:
            return PowerNeed(
                watts=150.00000000000728,
                uncertainty_w=2.0,
                clock_mhz=1980.0,
                holds=False,
                tpot_clock_mhz=1980.0,
                clocks_mhz=clocks,
                curve_w=(120.0, 150.00000000000728),
            )

    budget = PowerBudget("sim")
    budget.resolve(150.0)
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.power_budget"):
        budget.after_decision(AtTheLimit(), 0.0)
    assert budget.over_budget is False and budget.over_budget_events == 0
    assert "over budget" not in caplog.text
    assert budget.status().headroom_w == 0.0  # read -7e-12 W while within budget
    budget.resolve(149.9)
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.power_budget"):
        budget.after_decision(AtTheLimit(), 1.0)
    assert budget.over_budget is True
    assert "the power budget 149.9 W (from nvml) is below the 150.0 W (+/- 2 W)" in caplog.text


@pytest.mark.parametrize(
    ("text", "watts"), [("350", 350.0), (" 350.5\n", 350.5), ('"420W"', 420.0)]
)
def test_a_budget_file_holds_one_number_of_watts(text: str, watts: float) -> None:
    assert parse_budget_watts(text) == watts


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("abc", "not a number"),
        ("-5", "must be positive"),
        ("0", "must be positive"),
        ("nan", "not a number"),
        ("inf", "not a number"),
        ("1_000", "not a number"),  # float() takes underscores
        ("\u0663\u0665\u0660", "not a number"),  # Arabic-Indic 350: float() takes them
        ("\uff13\uff15\uff10", "not a number"),  # full-width 350
        ("3.5e2", "not a number"),
        ("1e300", "not a number"),
        ("0x15e", "not a number"),
        ("1000001", "above the 1,000,000 W ceiling"),
        ("9" * 400, "above the 1,000,000 W ceiling"),  # float() gives inf
    ],
)
def test_bad_budget_text_says_why(text: str, reason: str) -> None:
    """Python's float() grammar is wider than a budget: underscores, exponents, inf and
    nan, any Unicode digits. A budget is plain ASCII decimal, at most a megawatt."""
    with pytest.raises(ValueError, match=reason):
        parse_budget_watts(text)


@pytest.mark.parametrize(("text", "watts"), [("350.", 350.0), (".5", 0.5), ("+350", 350.0)])
def test_a_decimal_point_at_either_end_and_a_plus_sign_are_numbers(text: str, watts: float) -> None:
    assert parse_budget_watts(text) == watts


def test_a_file_value_over_the_ceiling_for_the_domain_keeps_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gpu-power-limit"
    path.write_text("700")
    budget = BudgetFile(path, scale=8.0, domain="llm")
    assert budget.read() == 5600.0
    path.write_text("200000")  # 1.6 MW for 8 GPUs
    caplog.set_level(logging.WARNING)
    assert budget.read() == 5600.0
    assert [r.getMessage() for r in caplog.records] == [
        f"domain llm: power budget file {path} gives 1,600,000 W for the domain, above the "
        "1,000,000 W ceiling of any domain (72 GPUs of 1.4 kW draw about 100 kW); "
        "keeping 5600 W"
    ]


def test_a_budget_unchecked_against_an_unknown_lowest_limit_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The emulated GPUs and nvidia-smi report no power-limit constraints: a budget of 10 W
    cannot be refused as below them, and the line that puts it in force says so."""
    path = tmp_path / "budget"
    path.write_text("10")
    caplog.set_level(logging.INFO, logger="gpugov.daemon.power_budget")
    assert PowerBudget("emu", file=BudgetFile(path, domain="emu")).resolve(700.0) == 10.0
    assert PowerBudget("nv", file=BudgetFile(path, minimum_w=5.0)).resolve(700.0) == 10.0
    assert [r.getMessage() for r in caplog.records] == [
        "domain emu: power budget 10 W (from file; not checked against the GPUs' lowest "
        "settable power limit, which their backend does not report)",
        "domain nv: power budget 10 W (from file)",
    ]


# ---------------------------------------------------------------------- the file
def test_budget_file_is_reread_when_it_changes_and_bad_input_keeps_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gpu-power-limit"
    path.write_text("300")
    budget = BudgetFile(path, scale=2.0, minimum_w=400.0, domain="llm")  # per GPU, 2 GPUs
    assert budget.read() == 600.0
    path.write_text("350")  # rewritten in place, maybe within one timestamp tick
    assert budget.read() == 700.0
    caplog.set_level(logging.WARNING)
    for bad, why in (("abc", "not a number"), ("-1", "positive"), ("150", "below the lowest")):
        caplog.clear()
        path.write_text(bad)
        assert budget.read() == 700.0 and budget.read() == 700.0  # kept, twice
        assert len(caplog.records) == 1 and why in caplog.text and "keeping 700 W" in caplog.text
    assert budget.errors == 3
    caplog.clear()
    path.unlink()  # the file disappears
    assert budget.read() == 700.0 and budget.read() == 700.0
    assert [r.getMessage() for r in caplog.records] == [
        f"domain llm: power budget file {path} cannot be read: No such file or directory; "
        "keeping 700 W"
    ]
    path.write_text("250")
    assert budget.read() == 500.0 and budget.problem is None
    assert budget.errors == 4


def test_a_budget_file_over_its_size_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "budget"
    path.write_text("1" * 5000)
    budget = BudgetFile(path)
    assert budget.read() is None and budget.errors == 1
    assert budget.problem == "is 5,000 bytes, over the 4 KiB limit of a budget file"


def test_the_lowest_source_wins_and_a_failed_nvml_read_keeps_the_last(tmp_path: Path) -> None:
    path = tmp_path / "budget"
    path.write_text("450")
    budget = PowerBudget("d", config_w=500.0, file=BudgetFile(path))
    assert budget.resolve(1400.0) == 450.0 and budget.source == "file"
    assert budget.sources_w == {"config": 500.0, "file": 450.0, "nvml": 1400.0}
    assert budget.resolve(400.0) == 400.0 and budget.source == "nvml"
    assert budget.resolve(None) == 400.0 and budget.source == "nvml"  # last NVML value
    assert PowerBudget("e").resolve(None) is None


# --------------------------------------------------------------------- NVML
def test_nvml_reports_the_power_limit_range_in_watts() -> None:
    fake = FakeNvml(1)
    fake.gpus[0].power_limit_min_mw = 150_000
    backend = NvmlBackend(0, nvml=fake)
    try:
        assert backend.power_limit_constraints_w() == (150.0, 700.0)
        fake.fail("nvmlDeviceGetPowerManagementLimitConstraints", NVML_ERROR_NOT_SUPPORTED)
        assert backend.power_limit_constraints_w() is None
    finally:
        backend.close()


# ------------------------------------------------------------ end to end on a node
CURVE_OFFSET_W = 100.0
CURVE_SLOPE_W_PER_MHZ = 0.3
NEED_MHZ = 1500.0
TPOT_MHZ = 1200.0


class NeedingController:
    """An outside controller with a model: asks for 1980 MHz and reports a need of
    1500 MHz on a linear power curve (``PowerNeeding``)."""

    def __init__(self, clocks: tuple[float, ...]) -> None:
        self.clocks = clocks
        self.limits: list[float | None] = []

    def __call__(self, observation: ServingObservation) -> float:
        self.limits.append(observation.power_limit_w)
        return 1980.0

    def power_needed(self) -> PowerNeed | None:
        curve = tuple(CURVE_OFFSET_W + CURVE_SLOPE_W_PER_MHZ * c for c in self.clocks)
        return PowerNeed(
            watts=CURVE_OFFSET_W + CURVE_SLOPE_W_PER_MHZ * NEED_MHZ,
            uncertainty_w=12.0,
            clock_mhz=NEED_MHZ,
            holds=True,
            tpot_clock_mhz=TPOT_MHZ,
            clocks_mhz=self.clocks,
            curve_w=curve,
        )


def needing_controller(context: Any) -> NeedingController:
    """The factory a node calls (``controller = {kind = "external", ...}``)."""
    return NeedingController(tuple(context.supported_clocks_mhz))


def _config(url: str, **domain: Any) -> Any:
    section = {
        "name": "llm",
        "gpus": [0, 1],
        "engine": {"kind": "vllm", "url": url, "timeout_s": 0.9},
        "controller": {"kind": "external", "factory": f"{__name__}:needing_controller"},
        **domain,
    }
    return parse_config({"daemon": {"period_s": 1.0}, "domains": [section]})


def _samples(page: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name.startswith("gpugov_power_"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_budgets_reach_the_controller_every_tick_and_are_published(
    vllm_server: MetricsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gpu-power-limit"
    path.write_text("400")  # per GPU: 800 W for the domain
    fake = FakeNvml(2)  # 700 W each: 1400 W
    config = _config(vllm_server.url, power_budget_w=900.0, power_budget_file=str(path))
    assembled = domains_from_config(config, nvml=fake)
    exporter = Exporter(port=0)
    pages: dict[int, str] = {}
    clock = VirtualClock()
    requested: list[float | None] = []

    def before_tick(now_s: float, step: int) -> bool:
        # Changes made before a tick take effect at that tick.
        if step == 2:
            path.write_text("300")  # 600 W
        if step == 3:
            path.write_text("abc")  # refused: 600 W kept
        if step == 4:
            path.unlink()  # gone: 600 W kept
        if step == 5:
            for gpu in fake.gpus:
                gpu.power_limit_mw = 250_000  # a node agent lowers the NVML limit: 500 W
        return step >= 7

    def on_tick(records: Any) -> None:
        requested.append(records[0].requested_mhz)
        if records[0].step in (1, 6):
            with urllib.request.urlopen(exporter.url, timeout=5) as response:
                pages[records[0].step] = response.read().decode()

    caplog.set_level(logging.INFO, logger="gpugov.daemon.power_budget")
    try:
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            exporter=exporter,
            on_tick=on_tick,
            before_tick=before_tick,
        )
    finally:
        exporter.close()
        assembled.close()
    domain = assembled.domains[0]
    algorithm = domain.controller.unwrapped
    assert isinstance(algorithm, NeedingController)
    # The budget in force reached the controller at the tick it changed.
    assert algorithm.limits == [800.0, 800.0, 600.0, 600.0, 600.0, 500.0, 500.0]
    # Within budget (need 550 W) the clock is capped at the highest clock that fits
    # the budget: 800 W and 600 W fit 1980 and 1665 MHz; over budget (500 W) 1320 MHz,
    # above the TPOT clock (1200 MHz) the running requests need.
    assert requested == [1980.0, 1980.0, 1665.0, 1665.0, 1665.0, 1320.0, 1320.0]
    assert fake.locked(0) is None and fake.locked(1) is None  # no lock left behind
    first, last = _samples(pages[1]), _samples(pages[6])
    assert first[("gpugov_power_needed_watts", (("domain", "llm"),))] == 550.0
    assert first[("gpugov_power_needed_uncertainty_watts", (("domain", "llm"),))] == 12.0
    assert first[("gpugov_power_budget_watts", (("domain", "llm"), ("source", "file")))] == 800.0
    assert first[("gpugov_power_headroom_watts", (("domain", "llm"),))] == 250.0
    assert first[("gpugov_power_over_budget_active", (("domain", "llm"),))] == 0.0
    for source, watts in (("config", 900.0), ("file", 800.0), ("nvml", 1400.0)):
        key = ("gpugov_power_budget_source_watts", (("domain", "llm"), ("source", source)))
        assert first[key] == watts
    assert last[("gpugov_power_budget_watts", (("domain", "llm"), ("source", "nvml")))] == 500.0
    assert last[("gpugov_power_headroom_watts", (("domain", "llm"),))] == -50.0
    assert last[("gpugov_power_over_budget_active", (("domain", "llm"),))] == 1.0
    assert last[("gpugov_power_over_budget_tpot_active", (("domain", "llm"),))] == 0.0
    assert last[("gpugov_power_over_budget_events_total", (("domain", "llm"),))] == 1.0
    assert last[("gpugov_power_budget_file_errors_total", (("domain", "llm"),))] == 2.0
    # One line per file problem, one over-budget event naming what slips.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("power budget file" in line for line in warnings) == 2
    over = [line for line in warnings if "over budget" in line]
    assert len(over) == 1 and "TTFT of queued requests slips" in over[0]


def test_with_the_gpus_own_limit_alone_the_guard_reports_and_the_firmware_holds(
    vllm_server: MetricsServer,
) -> None:
    fake = FakeNvml(2)
    for gpu in fake.gpus:
        gpu.power_limit_mw = 250_000  # 500 W for the domain: below the 550 W need
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    clock = VirtualClock()
    requested: list[float | None] = []
    try:
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            on_tick=lambda records: requested.append(records[0].requested_mhz),
            before_tick=lambda now_s, step: step >= 3,
        )
    finally:
        assembled.close()
    domain = assembled.domains[0]
    assert domain.controller.unwrapped.limits == [500.0, 500.0, 500.0]
    assert requested == [1980.0, 1980.0, 1980.0]  # the decision passes unchanged
    assert domain.budget.over_budget and domain.budget.capped_decisions == 0


def test_a_config_budget_below_the_gpus_lowest_limit_is_refused_before_any_work(
    vllm_server: MetricsServer,
) -> None:
    fake = FakeNvml(2)  # each accepts 200-700 W: at least 400 W for the domain
    with pytest.raises(ConfigError, match=r"power_budget_w \(300 W\) is below the lowest"):
        domains_from_config(_config(vllm_server.url, power_budget_w=300.0), nvml=fake)
    assert fake.writes == [] and fake.initialized == 0


class _Needs:
    """A controller whose power need is set by the test (``watts``)."""

    def __init__(self) -> None:
        self.watts = 100.0

    def __call__(self, observation: ServingObservation) -> float:
        return 1980.0

    def power_needed(self) -> PowerNeed:
        return PowerNeed(
            watts=self.watts,
            uncertainty_w=2.0,
            clock_mhz=1980.0,
            holds=False,
            tpot_clock_mhz=1980.0,
            clocks_mhz=(1500.0, 1980.0),
            curve_w=(90.0, self.watts),
        )


def test_the_within_budget_line_follows_only_an_over_budget_line_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A budget that flaps within a minute logged one over-budget line (the rest are rate
    limited) and then a "within the power budget again after 0 s" line for each unlogged
    episode; an unlogged episode that lasts is logged once the minute has passed."""
    needs = _Needs()
    budget = PowerBudget("emu")
    budget.resolve(150.0)
    caplog.set_level(logging.INFO, logger="gpugov.daemon.power_budget")
    for now_s, watts in [(0.0, 200.0), (3.0, 100.0), (4.0, 200.0), (4.2, 100.0)]:
        needs.watts = watts
        budget.after_decision(needs, now_s)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "over budget" in lines[0] and "again after 3 s" in lines[1]
    assert budget.over_budget_events == 2
    caplog.clear()
    for now_s, watts in [(10.0, 200.0), (30.0, 200.0), (61.0, 200.0), (70.0, 100.0)]:
        needs.watts = watts
        budget.after_decision(needs, now_s)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "over budget" in lines[0] and "again after 60 s" in lines[1]
