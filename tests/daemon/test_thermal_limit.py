"""A domain's thermal limit against its GPUs' slowdown temperature (NVML's threshold)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import NVML_ERROR_UNKNOWN, FakeNvml
from test_daemon_check_config import _run_code, _write, fake  # noqa: F401 (its fixture)
from test_hung_reads import DEADLINE_S, _HungRead

from gpugov.daemon import node_cli
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.thermal_limit import held_thermal_limit


def test_nvml_reads_the_slowdown_temperature_and_takes_a_failure_as_unknown() -> None:
    gpu_lib = FakeNvml(2)
    gpu_lib.gpus[1].slowdown_temperature_c = 84
    gpus = [NvmlBackend(i, nvml=gpu_lib) for i in range(2)]
    assert [gpu.slowdown_temperature_c() for gpu in gpus] == [87.0, 84.0]
    gpu_lib.gpus[1].slowdown_temperature_c = None  # NOT_SUPPORTED
    assert gpus[1].slowdown_temperature_c() is None
    gpu_lib.fail("nvmlDeviceGetTemperatureThreshold", NVML_ERROR_UNKNOWN, times=None)
    assert gpus[0].slowdown_temperature_c() is None


def test_a_slowdown_temperature_read_failing_for_now_is_read_again() -> None:
    """Read once, at the start: one read failing for now (UNKNOWN, TIMEOUT) left the
    configured thermal limit above the GPU's slowdown temperature for the whole run."""
    gpu_lib = FakeNvml(1)
    gpu_lib.fail("nvmlDeviceGetTemperatureThreshold", NVML_ERROR_UNKNOWN, times=2)
    held, line = held_thermal_limit("llm", 95.0, [NvmlBackend(0, nvml=gpu_lib)], 2.0)
    assert (held, line is not None) == (87.0, True)


@pytest.mark.parametrize(
    ("limit_c", "held_c", "lowered"),
    [(95.0, 84.0, True), (84.0, 84.0, False), (70.0, 70.0, False), (None, None, False)],
)
def test_a_limit_above_a_gpus_slowdown_temperature_is_held_at_it(
    limit_c: float | None, held_c: float | None, lowered: bool
) -> None:
    gpu_lib = FakeNvml(2)
    gpu_lib.gpus[1].slowdown_temperature_c = 84  # the lower of the domain's two
    gpus = [NvmlBackend(i, nvml=gpu_lib) for i in range(2)]
    held, line = held_thermal_limit("llm", limit_c, gpus, read_deadline_s=2.0)
    assert held == held_c
    assert (line is not None) == lowered
    if lowered:
        assert line == (
            "domain 'llm': thermal_limit_c (95 C) is above GPU 1's slowdown temperature "
            "(84 C, NVML), where the GPU slows itself: 84 C is held instead"
        )


def test_a_split_mode_domain_reads_its_gpus_slowdown_temperature_too() -> None:
    """Through the actuator or zeusd the GPU is read through NVML as in the nvml mode: its
    slowdown temperature too. The split backends did not pass it on, so a governor run
    unprivileged (the split mode) held a thermal_limit_c above it, the controllers planning
    to a temperature the die never reaches."""
    from gpugov.daemon.actuator_client import ActuatorBackend, ActuatorClient
    from gpugov.daemon.zeusd import ZeusdBackend, ZeusdClient

    gpu_lib = FakeNvml(2)
    gpu_lib.gpus[1].slowdown_temperature_c = 84
    split = [
        ActuatorBackend(NvmlBackend(0, nvml=gpu_lib), ActuatorClient("/nonexistent.sock")),
        ZeusdBackend(NvmlBackend(1, nvml=gpu_lib), ZeusdClient(socket_path="/nonexistent")),
    ]
    assert [gpu.slowdown_temperature_c() for gpu in split] == [87.0, 84.0]  # type: ignore[attr-defined]
    held, line = held_thermal_limit("llm", 95.0, split, read_deadline_s=2.0)
    assert (held, line is not None) == (84.0, True)


def test_no_slowdown_temperature_keeps_the_configured_limit() -> None:
    gpu_lib = FakeNvml(1)
    gpu_lib.gpus[0].slowdown_temperature_c = None
    assert held_thermal_limit("llm", 120.0, [NvmlBackend(0, nvml=gpu_lib)]) == (120.0, None)


@pytest.mark.usefixtures("fake")  # NVML's GPUs, slowing themselves at 87 C
def test_run_holds_the_lowered_limit_and_check_config_says_so_word_for_word(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """thermal_limit_c = 95 on GPUs that slow themselves at 87 C: run's observations
    state 87 C (the controllers plan to it) and both commands say so in one line."""
    from gpugov.daemon import service

    built: dict[str, float | None] = {}
    original = service.build_domain

    def build_domain(*args: object, **kwargs: object) -> object:
        built["thermal_limit_c"] = kwargs["thermal_limit_c"]  # type: ignore[assignment]
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service, "build_domain", build_domain)
    path = _write(tmp_path, domain="thermal_limit_c = 95.0\n")
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.service"):
        assert _run_code(path) == -1
    line = (
        "domain 'llm': thermal_limit_c (95 C) is above GPU 0's slowdown temperature "
        "(87 C, NVML), where the GPU slows itself: 87 C is held instead"
    )
    assert built == {"thermal_limit_c": 87.0}
    assert [r.getMessage() for r in caplog.records if "thermal_limit_c" in r.getMessage()] == [line]
    capsys.readouterr()
    assert node_cli.main(["check-config", str(path)]) == 0
    assert line in capsys.readouterr().err


def test_a_hung_slowdown_read_keeps_the_configured_limit_and_holds_no_start(
    safety: list[Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The threshold read hangs (a wedged firmware): the start waits one read deadline,
    takes the slowdown temperature as unknown (one line) and holds the configured limit."""
    gpu_lib = FakeNvml(1)
    hung = _HungRead(gpu_lib.nvmlDeviceGetTemperatureThreshold)
    safety.append(hung)
    monkeypatch.setattr(gpu_lib, "nvmlDeviceGetTemperatureThreshold", hung)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        held = held_thermal_limit(
            "llm", 95.0, [NvmlBackend(0, nvml=gpu_lib)], read_deadline_s=DEADLINE_S
        )
    assert held == (95.0, None) and hung.hung
    assert [r.getMessage() for r in caplog.records] == [
        f"GPU 0: its slowdown temperature not read within {DEADLINE_S:g} s (a hung GPU "
        "call); taken as unknown"
    ]


def test_an_emulated_gpu_slows_at_its_plants_thermal_limit() -> None:
    """gpugov emulate's GPUs state where they slow themselves (their plant's thermal
    limit), so a domain's limit above it is held there as on a node."""
    from gpugov.daemon.emulated import EmulatedBackend
    from gpugov.plant import ServingPlant, load_profile
    from gpugov.study.emulate.node import EmulatedNode
    from gpugov.study.emulate.server import EmulatorServer

    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    hot = plant.with_overrides(ambient_temperature_c=45.0, thermal_limit_c=75.0)
    server = EmulatorServer(EmulatedNode(hot, gpus=1), "127.0.0.1", 0)
    server.start()
    try:
        backend = EmulatedBackend(0, emulator=server.url)
        try:
            assert backend.slowdown_temperature_c() == 75.0
            held, line = held_thermal_limit("llm", 90.0, [backend], read_deadline_s=2.0)
        finally:
            backend.close()
    finally:
        server.close()
    assert held == 75.0
    assert line == (
        "domain 'llm': thermal_limit_c (90 C) is above GPU 0's slowdown temperature (75 C, "
        "NVML), where the GPU slows itself: 75 C is held instead"
    )
