"""mpc-online's prior hints where users give them: the config's ``prior`` table, the
``--controller mpc-online:KEY=VALUE,...`` spec, ``gpu = "auto"`` from NVML, and the
domain's enforced power limit read at start."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpugov.controllers.contract import unwrap
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.daemon.backend import GpuSample
from gpugov.daemon.cli_support import UsageError, simulated_controller
from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_config import OnlineMPCControllerConfig, PriorHintsConfig
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.daemon.errors import ConfigError, TransientGpuError
from gpugov.daemon.service import _start_power_limit_w
from gpugov.plant import load_profile
from gpugov.plant.types import Request
from gpugov.plant.zoo import GPUS


def _config(controller: dict[str, Any]) -> Any:
    return parse_config(
        {"domains": [{"name": "llm", "gpus": [0, 1, 2, 3], "controller": controller}]},
        "gpugov.toml",
    )


def test_the_config_takes_hints() -> None:
    config = _config(
        {
            "kind": "mpc-online",
            "prior": {"gpu": "auto", "params_b": 47, "active_params_b": 13, "tensor_parallel": 4},
        }
    )
    spec = config.domains[0].controller
    assert isinstance(spec, OnlineMPCControllerConfig)
    assert spec.prior == PriorHintsConfig(
        gpu="auto", params_b=47.0, active_params_b=13.0, tensor_parallel=4
    )
    # No hint: exactly as before.
    assert _config({"kind": "mpc-online"}).domains[0].controller.prior is None


@pytest.mark.parametrize(
    ("prior", "path", "reason"),
    [
        ({"params_b": 0}, "domains[0].controller.prior.params_b", "greater than 0"),
        ({"params_b": "70B"}, "domains[0].controller.prior.params_b", "valid number"),
        (
            {"tensor_parallel": 0},
            "domains[0].controller.prior.tensor_parallel",
            "greater than or equal to 1",
        ),
        (
            {"params_b": 8, "active_params_b": 13},
            "domains[0].controller.prior",
            "prior.active_params_b (13) exceeds prior.params_b (8)",
        ),
        ({"gpus": "H100"}, "domains[0].controller.prior.gpus", "unknown key"),
    ],
)
def test_a_bad_hint_is_one_line_naming_the_field(
    prior: dict[str, Any], path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _config({"kind": "mpc-online", "prior": prior})
    message = str(info.value)
    assert "\n" not in message
    assert f"gpugov.toml: {path}: " in message and reason in message


def test_a_profile_and_hints_are_not_both_taken() -> None:
    with pytest.raises(ConfigError, match="not both"):
        _config(
            {"kind": "mpc-online", "prior_profile": "h100-sxm-llama3-8b", "prior": {"gpu": "auto"}}
        )


def online_controller(spec: OnlineMPCControllerConfig, **context: Any) -> Any:
    """The algorithm the factory builds for ``spec`` in a context of ``context``."""
    full = ControllerContext(period_s=1.0, supported_clocks_mhz=(900.0, 1980.0), **context)
    return unwrap(build_controller(spec, full))


def test_auto_takes_the_nvml_name_and_the_domain_size(caplog: pytest.LogCaptureFixture) -> None:
    spec = OnlineMPCControllerConfig(
        kind="mpc-online", prior=PriorHintsConfig(gpu="auto", params_b=70.0)
    )
    controller = online_controller(
        spec, gpu_names=("NVIDIA H100 80GB HBM3",) * 4, gpu_count=4, power_limit_w=2_400.0
    )
    assert isinstance(controller, OnlineMPCController)
    assert controller.prior is not None and controller.prior.time_table
    assert controller.prior.board_power_w == pytest.approx(4 * GPUS["h100"].tdp_w)  # TP 4
    assert controller.power_limit_w == pytest.approx(2_400.0)
    # "auto" on a GPU that reports no name, and an unknown name: one warning line each.
    with caplog.at_level(logging.WARNING):
        assert online_controller(spec).prior is None  # type: ignore[union-attr]
        unknown = OnlineMPCControllerConfig(
            kind="mpc-online", prior=PriorHintsConfig(gpu="Tesla V100-SXM2-16GB")
        )
        assert online_controller(unknown).prior is None  # type: ignore[union-attr]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2
    assert "auto" in lines[0] and "V100" in lines[1]


def test_an_omitted_gpu_is_the_nvml_name() -> None:
    """A prior of a parameter count alone takes the domain's GPU as ``auto`` does, as its
    TP degree defaults to the domain's GPU count; it gave no prior and, configured, it
    turned the automatic hints off too, with no line said."""
    spec = OnlineMPCControllerConfig(kind="mpc-online", prior=PriorHintsConfig(params_b=70.0))
    controller = online_controller(spec, gpu_names=("NVIDIA H100 80GB HBM3",) * 4, gpu_count=4)
    assert isinstance(controller, OnlineMPCController)
    assert controller.prior is not None and controller.prior.time_table
    assert controller.prior.board_power_w == pytest.approx(4 * GPUS["h100"].tdp_w)
    assert "70B" in controller.prior.source
    # No GPU name known (an offline check of the config): no prior, as before.
    assert online_controller(spec).prior is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "mpc-online:gpu=NVIDIA H200,params_b=70,tp=4",
            PriorHintsConfig(gpu="NVIDIA H200", params_b=70.0, tensor_parallel=4),
        ),
        (
            "mpc-online:gpu=auto,params_b=46.7,active_params_b=12.9",
            PriorHintsConfig(gpu="auto", params_b=46.7, active_params_b=12.9),
        ),
    ],
)
def test_the_spec_takes_hints(text: str, expected: PriorHintsConfig) -> None:
    spec = parse_controller_spec(text)
    assert isinstance(spec, OnlineMPCControllerConfig)
    assert spec.prior == expected and spec.prior_profile is None
    # The old form still names a prior profile.
    legacy = parse_controller_spec("mpc-online:h100-sxm-llama3-8b")
    assert legacy.prior_profile == "h100-sxm-llama3-8b"  # type: ignore[union-attr]
    assert parse_controller_spec("mpc-online:profile=h100-sxm-llama3-8b").prior_profile == (  # type: ignore[union-attr]
        "h100-sxm-llama3-8b"
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("mpc-online:params_b=seventy", "params_b must be a number"),
        ("mpc-online:params_b=-8", "params_b: Input should be greater than 0"),
        ("mpc-online:tp=two", "tp must be a whole number"),
        ("mpc-online:tp=0", "tensor_parallel: Input should be greater than or equal to 1"),
        ("mpc-online:gpus=H100", "KEY one of"),
        ("mpc-online:params_b=8,active_params_b=13", "prior.active_params_b (13) exceeds"),
        ("mpc-online:params_b=8,params_b=9", "params_b given more than once"),
    ],
)
def test_a_bad_spec_hint_is_one_line(text: str, named: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_controller_spec(text)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--controller {text!r}")
    assert named in message


def test_the_study_commands_build_a_hinted_controller() -> None:
    from synthetic import make_plant

    plant = make_plant(load_profile("h100-sxm-llama3-8b"))
    workload = [Request(0, 0.0, 500, 100)]
    controller = unwrap(
        simulated_controller(
            "mpc-online:gpu=NVIDIA H100 80GB HBM3,params_b=8", plant, workload, 1.0
        )
    )
    assert isinstance(controller, OnlineMPCController)
    assert controller.prior is not None and controller.prior.time_table
    with pytest.raises(UsageError, match="params_b must be a number"):
        simulated_controller("mpc-online:params_b=x", plant, workload, 1.0)


class _Gpu:
    """A backend that reports a fixed enforced power limit (or fails to)."""

    def __init__(self, limit_w: float | None, fail: bool = False) -> None:
        self.label = "0"
        self.limit_w = limit_w
        self.fail = fail

    def sample(self) -> GpuSample:
        if self.fail:
            raise TransientGpuError("read power limit: timeout", gpu="0")
        return GpuSample(
            gpu="0",
            power_w=100.0,
            energy_j=None,
            temperature_c=40.0,
            sm_clock_mhz=1980.0,
            utilization=0.0,
            power_limit_w=self.limit_w,
        )


def test_the_start_power_limit_is_the_domains_sum() -> None:
    def read(gpu: Any) -> Any:  # the domain's read (on a node, under its deadline)
        return gpu.sample()

    assert _start_power_limit_w([_Gpu(700.0), _Gpu(650.0)], read) == pytest.approx(1_350.0)  # type: ignore[list-item]
    # A GPU without a limit, or a failed read: nothing is assumed.
    assert _start_power_limit_w([_Gpu(700.0), _Gpu(None)], read) is None  # type: ignore[list-item]
    assert _start_power_limit_w([_Gpu(700.0), _Gpu(700.0, fail=True)], read) is None  # type: ignore[list-item]


def test_the_simulated_daemon_runs_with_hints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugov.cli import main

    code = main(
        [
            "run",
            "--simulate",
            "--virtual",
            "--duration",
            "30",
            "--controller",
            "mpc-online:gpu=NVIDIA H100 80GB HBM3,params_b=8,tp=1",
            # No metrics server: the default port is one other tests (in parallel) use.
            "--metrics-address",
            "none",
        ]
    )
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert (
        main(
            [
                "run",
                "--simulate",
                "--virtual",
                "--duration",
                "5",
                "--controller",
                "mpc-online:params_b=huge",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "params_b must be a number" in err[0]


def test_a_node_fills_in_auto_and_the_start_power_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_pynvml import FakeNvml

    from gpugov.daemon.service import domains_from_config

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    fake = FakeNvml(2)  # two "NVIDIA H100 80GB HBM3" at a 700 W enforced limit each
    fake.gpus[1].power_limit_mw = 650_000
    config = parse_config(
        {
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0, 1],
                    "engine": {
                        "kind": "vllm",
                        "url": "http://127.0.0.1:9/metrics",
                        "timeout_s": 0.5,
                    },
                    "controller": {"kind": "mpc-online", "prior": {"gpu": "auto", "params_b": 70}},
                }
            ]
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    try:
        controller = unwrap(assembled.domains[0].controller)
        assert isinstance(controller, OnlineMPCController)
        assert controller.power_limit_w == pytest.approx(1_350.0)  # summed at start
        assert controller.prior is not None and "H100" in controller.prior.source
        assert controller.prior.board_power_w == pytest.approx(2 * 700.0)  # TP = 2 GPUs
    finally:
        assembled.close()
