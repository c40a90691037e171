"""Config bounds: every number the daemon's config and a ``--controller`` spec take has a
range; a value outside it is refused in one line naming the file and the field, and the
range's edge is accepted."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import FakeNvml

import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.nvml as nvml_module
from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.errors import ConfigError
from gpugov.daemon.limits import MAX_POWER_W, MAX_SECONDS

NAN, INF = math.nan, math.inf
SLOS = {"ttft_slo_s": 1.0, "tpot_slo_s": 0.05}

Build = Callable[[Any], dict[str, Any]]


def _domain(**fields: Any) -> dict[str, Any]:
    return {"domains": [{"name": "llm", "gpus": [0], **fields}]}


def controller(kind: str, field: str, **extra: Any) -> tuple[str, Build]:
    """A ``[domains.controller]`` field of ``kind``."""
    return (
        f"domains[0].controller.{field}",
        lambda value: _domain(controller={"kind": kind, field: value, **extra}),
    )


def prior(field: str) -> tuple[str, Build]:
    """A field of ``mpc-online``'s ``prior`` hints."""
    return (
        f"domains[0].controller.prior.{field}",
        lambda value: _domain(controller={"kind": "mpc-online", "prior": {field: value}}),
    )


def domain(field: str, **extra: Any) -> tuple[str, Build]:
    """A ``[[domains]]`` field."""
    return f"domains[0].{field}", lambda value: _domain(**{field: value, **extra})


def table(name: str, field: str, *, fields: dict[str, Any] | None = None, **extra: Any) -> Any:
    """A field of a domain's ``engine``, ``safety`` or ``slo_target`` table."""
    return (
        f"domains[0].{name}.{field}",
        lambda value: _domain(**{name: {field: value, **(fields or {})}, **extra}),
    )


def daemon(field: str, section: str | None = None, **extra: Any) -> tuple[str, Build]:
    """A ``[daemon]`` field, or one of its ``actuator`` or ``zeusd`` table."""
    if section is None:
        return f"daemon.{field}", lambda value: {"daemon": {field: value}, **_domain()}
    return (
        f"daemon.{section}.{field}",
        lambda value: {"daemon": {section: {field: value, **extra}}, **_domain()},
    )


# (the field, values refused, values at the range's edges that are accepted)
BOUNDS: list[tuple[tuple[str, Build], tuple[Any, ...], tuple[Any, ...]]] = [
    # controllers
    (controller("fixed", "clock_mhz"), (0, -1.0, NAN, INF, 100_001.0), (100_000.0,)),
    (controller("reactive", "up_fraction"), (0, -0.1, 1.01, 5.0, 1e308, NAN), (1.0,)),
    (controller("reactive", "down_fraction", up_fraction=1.0), (0, 1.5, NAN), (1.0,)),
    (controller("reactive", "queue_high_tokens"), (0, -1.0, 1e308, INF), (1e9,)),
    (controller("reactive", "idle_utilization"), (-0.1, 1.1, NAN), (0.0, 1.0)),
    (controller("reactive", "step_mhz"), (0, -105.0, 1e308, INF), (100_000.0,)),
    (controller("mpc", "ttft_excess_cap"), (0, -1.0, 1000.5, 1e308, INF), (1000.0,)),
    (controller("mpc-slsqp", "ttft_excess_cap"), (0, 1e308, NAN), (1000.0,)),
    (controller("mpc", "slo_margin"), (0, 1.5, NAN), (1.0,)),
    (controller("mpc", "mean_prompt_tokens"), (0, 1e308), (1e9,)),
    (controller("mpc-online", "warmup_s"), (0, 1e308), (MAX_SECONDS,)),
    (controller("mpc-online", "uncertainty_z"), (-1.0, 10.5, NAN), (0.0, 10.0)),
    (controller("mpc-online", "latency_window_s"), (-1.0, 61.0), (0.0, 60.0)),
    (prior("params_b"), (0, 1e6, NAN), (1e5,)),
    (prior("tensor_parallel"), (0, 65), (1, 64)),
    (controller("power-cap", "cap_w"), (0, -1.0, MAX_POWER_W + 1, 1e308, INF, NAN), (1e6,)),
    (controller("power-cap", "fraction"), (0, 1.1), (1.0,)),
    (controller("power-profile", "cap_w", ceiling_mhz=1500.0), (0, 2e6, INF), (1e6,)),
    (controller("power-profile", "ceiling_mhz"), (0, 1e6), (100_000.0,)),
    (controller("power-profile", "throughput_fraction"), (0, 1.1), (1.0,)),
    (controller("dps", "loop_s"), (0, 1e308), (MAX_SECONDS,)),
    (controller("dps", "window"), (0, 1001), (1, 1000)),
    (controller("default-dvfs", "idle_hold_s"), (-1.0, 1e308), (0.0, MAX_SECONDS)),
    (controller("agft", "max_arms"), (1, 513), (2, 512)),
    (controller("agft", "initial_alpha"), (-1.0, 1000.5, 1e308, NAN), (0.0, 1000.0)),
    (controller("pid", "setpoint"), (0, 2.5, NAN), (2.0,)),
    (controller("pid", "kp"), (-0.1, 100.5, 1e308, NAN), (0.0, 100.0)),
    (controller("pid", "ki"), (-0.1, 1e308, INF), (0.0, 100.0)),
    (controller("pid", "kd"), (-0.1, 1e308, INF), (0.0, 100.0)),
    (controller("throttllem", "margin"), (0, 1.1), (1.0,)),
    (controller("greenllm", "target"), (0, 1.1), (1.0,)),
    (controller("voltana", "margin"), (-1.0, 1.1), (-0.99, 1.0)),
    (controller("voltana", "levels"), (1, 513), (2, 512)),
    # the domain
    (
        ("domains[0].gpus[0]", lambda value: _domain(gpus=[value])),
        # A UUID with an escape, a space or nothing after its prefix passed check-config,
        # and run found no such GPU (exit 4) after opening the others.
        (-1, 1024, 2**32, "GPU-", "GPU-\x1b[2J", "MIG- 1", "GPU-" + "a" * 121),
        (0, 1023, "GPU-8f2e0d1c-4b5a-11ee-9c3b-0123456789ab", "MIG-GPU-8f2e0d1c/1/0"),
    ),
    (domain("thermal_limit_c"), (-5.0, 0, 30.0, 150.5, 1e308, NAN, INF), (30.5, 150.0)),
    (domain("power_budget_w"), (0, -1.0, MAX_POWER_W + 1, 1e308, INF, NAN), (1e6,)),
    (domain("mean_prompt_tokens"), (0, 1e308), (1e9,)),
    (domain("mean_output_tokens"), (0, 1e308), (1e9,)),
    (domain("ttft_slo_s"), (0, 1e308), (MAX_SECONDS,)),
    (domain("tpot_slo_s"), (0, 1e308), (MAX_SECONDS,)),
    (domain("ttft_slo_per_prompt_token_s", ttft_slo_s=1.0), (-1.0, 1e308), (0.0,)),
    (domain("stale_after_s"), (0, 600.5, INF), (600.0,)),
    (table("engine", "timeout_s"), (0.001, 1e308), (0.01,)),
    (table("engine", "max_page_bytes"), (1023, 2**30 + 1, 2**62), (1024, 2**30)),
    (table("slo_target", "attainment", **SLOS), (0, 1, 1.5, NAN), (0.5,)),
    (
        table("slo_target", "window_s", fields={"attainment": 0.99}, **SLOS),
        (0, 31 * 86_400.0 + 1),
        (31 * 86_400.0,),
    ),
    (table("safety", "floor_mhz"), (0, 100_001.0), (100_000.0,)),
    (table("safety", "dwell_s"), (-1.0, 1e308), (0.0, MAX_SECONDS)),
    (table("safety", "min_relock_interval_s"), (-0.1, 10.5), (0.0, 10.0)),
    # the daemon
    (daemon("period_s"), (0.01, 61.0, NAN), (0.05, 60.0)),
    (daemon("max_controller_failures"), (0, 1_000_001), (1, 1_000_000)),
    (daemon("lease_s", "actuator"), (0.1, 601.0), (0.2, 600.0)),
    (daemon("timeout_s", "actuator"), (0.001, 10.5), (0.01,)),
    (daemon("timeout_s", "zeusd", socket="/run/zeusd.sock"), (0.001, 10.5), (0.01,)),
]


def _cases(refused: bool) -> list[Any]:
    return [
        pytest.param(path, build, value, id=f"{path}={value!r}")
        for (path, build), bad, good in BOUNDS
        for value in (bad if refused else good)
    ]


@pytest.mark.parametrize(("path", "build", "value"), _cases(refused=True))
def test_a_value_outside_its_range_is_refused_in_one_line(
    path: str, build: Build, value: Any
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(build(value), "gpugov.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"gpugov.toml: {path}: "), lines[0]


@pytest.mark.parametrize(("path", "build", "value"), _cases(refused=False))
def test_a_value_at_the_edge_of_its_range_is_accepted(path: str, build: Build, value: Any) -> None:
    parse_config(build(value), "gpugov.toml")


def _loop_must_not_start(*args: object, **kwargs: object) -> None:
    raise AssertionError("the config was accepted and the loop started")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("thermal_limit_c = 1e308", "domains[0].thermal_limit_c"),
        ("power_budget_w = inf", "domains[0].power_budget_w"),
        ("gpus = [4294967296]", "domains[0].gpus[0]"),
        ('gpus = ["GPU-\\u001b[2J"]', "domains[0].gpus[0]"),
        ('controller = { kind = "pid", kp = 1e308 }', "domains[0].controller.kp"),
        ('controller = { kind = "power-cap", cap_w = 2e6 }', "domains[0].controller.cap_w"),
        ('controller = { kind = "reactive", step_mhz = nan }', "domains[0].controller.step_mhz"),
    ],
)
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_the_commands_refuse_it_in_one_line_before_any_work(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fake_nvml: FakeNvml,
    line: str,
    field: str,
    command: str,
) -> None:
    # thermal_limit_c = 1e308, gpus = [4294967296] (GPU 0 to pynvml's unsigned int), kp =
    # 1e308 and cap_w = 2e6 passed check-config ("OK") and run opened the GPUs with them.
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: fake_nvml)
    monkeypatch.setattr(node_cli, "load_pynvml", lambda: fake_nvml)
    monkeypatch.setattr(node_cli, "run", _loop_must_not_start)
    path = tmp_path / "gpugov.toml"
    gpus = "" if line.startswith("gpus") else "gpus = [0]\n"
    path.write_text(f'[daemon]\nmetrics_address = ""\n\n[[domains]]\nname = "llm"\n{gpus}{line}\n')
    argv = ["check-config", str(path), "--offline"]
    if command == "run":
        argv = ["run", "--config", str(path), "--dry-run"]
    assert node_cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"gpugov: error: {path}: {field}: "), lines[0]
    assert captured.out == ""


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fixed:1e9", "needs a clock in (0, 100000] MHz"),
        ("fixed:nan", "needs a clock in (0, 100000] MHz"),
        ("power-cap:2e6", "needs a number of watts in (0, 1e+06]"),
        ("power-cap:1e308", "needs a number of watts in (0, 1e+06]"),
        ("power-cap:-1", "needs a number of watts in (0, 1e+06]"),
        ("mpc-online:tp=65", "tensor_parallel: Input should be less than or equal to 64"),
        ("open-loop:plan\x00.json", "plan: a path cannot hold a NUL byte"),
    ],
)
def test_a_controller_spec_outside_its_range_is_one_line(spec: str, message: str) -> None:
    # fixed:1e9 and open-loop with a NUL (a sweep grid's TOML string can hold one) were
    # pydantic's four-line report.
    with pytest.raises(ValueError) as info:
        parse_controller_spec(spec)
    assert len(str(info.value).splitlines()) == 1, str(info.value)
    assert str(info.value).startswith("--controller ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("spec", "field", "value"),
    [("fixed:100000", "clock_mhz", 100_000.0), ("power-cap:1000000", "cap_w", MAX_POWER_W)],
)
def test_a_controller_spec_at_the_edge_is_accepted(spec: str, field: str, value: float) -> None:
    assert getattr(parse_controller_spec(spec), field) == value


@pytest.mark.parametrize(
    ("data", "field"),
    [  # each value is its bound, a multiple of the period that rounds above it
        (
            {"daemon": {"period_s": 0.05}, **_domain(stale_after_s=0.075)},
            "stale_after_s",
        ),
        (
            {
                "daemon": {
                    "period_s": 0.1,
                    "backend": "actuator",
                    "actuator": {"lease_s": 0.3, "timeout_s": 0.05},
                },
                **_domain(engine={"timeout_s": 0.05}),
            },
            "lease_s",
        ),
        (
            {
                "daemon": {"period_s": 0.1},
                **_domain(slo_target={"window_s": 1.2, "attainment": 0.9}, **SLOS),
            },
            "window_s",
        ),
    ],
)
def test_a_bound_that_is_a_multiple_of_the_period_is_accepted_at_its_edge(
    data: dict[str, Any], field: str
) -> None:
    parse_config(data)  # was refused: "(0.3 s) must be at least 3 x period_s (0.3 s)"
    short = {**data, "daemon": {**data["daemon"], "period_s": data["daemon"]["period_s"] * 1.01}}
    with pytest.raises(ConfigError, match=field):
        parse_config(short)
