"""NvidiaSmiBackend with a fake command runner."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fake_nvidia_smi import FakeNvidiaSmi, FakeSmiGpu

from gpugov.daemon.errors import (
    GpuLost,
    GpuUnavailable,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.gpu_sampling import DomainGpus
from gpugov.daemon.nvidia_smi import NvidiaSmiBackend, classify_failure, run_command


def _fake(old_driver: bool = False) -> FakeNvidiaSmi:
    """A fake nvidia-smi whose GPU runs at 1410 MHz under a power cap, two memory clocks."""
    gpus = [
        FakeSmiGpu(
            sm_clock_mhz=1410.0,
            event_reasons=0x4,
            supported_mhz={3201: (1980, 1965, 345), 1593: (1200,)},
        )
        for _ in range(4)
    ]
    return FakeNvidiaSmi(gpus, old_driver=old_driver)


def test_sample_and_clocks() -> None:
    smi = _fake()
    backend = NvidiaSmiBackend(3, runner=smi)
    sample = backend.sample()
    assert sample.gpu == "3" and sample.sm_clock_mhz == 1410.0 and sample.power_w == 352.1
    assert sample.temperature_c == 61 and sample.utilization == pytest.approx(0.87)
    assert sample.power_limit_w == 700.0 and sample.clock_event_reasons == 4
    assert sample.energy_j is None
    assert backend.supported_clocks_mhz() == (345, 1965, 1980)
    backend.lock_clocks(1200, 1200)
    backend.reset_clocks()
    assert smi.calls[-2] == ["nvidia-smi", "-i", "3", "--lock-gpu-clocks=1200,1200"]
    assert smi.calls[-1] == ["nvidia-smi", "-i", "3", "--reset-gpu-clocks"]


def test_old_driver_fields_fall_back() -> None:
    smi = _fake(old_driver=True)
    sample = NvidiaSmiBackend(0, runner=smi).sample()
    assert sample.power_w == 352.1
    assert "power.draw," in smi.calls[-1][3] and "clocks_throttle_reasons" in smi.calls[-1][3]


def test_na_fields_are_none() -> None:
    backend = NvidiaSmiBackend(
        0, runner=lambda argv, t: "[N/A], [N/A], 40, [Not Supported], N/A, 0x0\n"
    )
    sample = backend.sample()
    assert sample.power_w is None and sample.sm_clock_mhz is None and sample.utilization is None


def test_a_field_nvidia_smi_could_not_read_is_a_failed_read_not_an_absent_one() -> None:
    """nvidia-smi prints a field it failed to read as ``[Unknown Error]`` (``ERR!`` in its
    table), where one the GPU lacks is ``[N/A]`` or ``[Not Supported]``: both were None
    with no failed read named, so gpugov_gpu_read_errors_total and the field's warning
    never saw a power or clock read failing through nvidia-smi."""
    backend = NvidiaSmiBackend(
        0,
        runner=lambda argv, t: "[Unknown Error], ERR!, 40, [N/A], [Not Supported], 0xZZ\n",
    )
    sample = backend.sample()
    assert sample.sm_clock_mhz is None and sample.power_w is None
    assert sample.utilization is None and sample.power_limit_w is None
    assert sample.temperature_c == 40.0
    assert sample.read_errors == ("sm_clock", "power", "clock_event_reasons")


def test_values_no_gpu_gives_cost_their_reading_not_the_sample() -> None:
    """nvidia-smi prints what the driver returns; a negative power, NaN, infinity, a
    utilisation past 100 % or event reasons that are no mask are failed reads (they
    raised ValueError from the sample, or reached the controller as NaN)."""
    backend = NvidiaSmiBackend(0, runner=lambda argv, t: "nan, -5.0, inf, 250, 700.00, 0xZZ\n")
    sample = backend.sample()
    assert sample.sm_clock_mhz is None and sample.power_w is None
    assert sample.temperature_c is None and sample.utilization is None
    assert sample.power_limit_w == 700.0 and sample.clock_event_reasons is None
    assert set(sample.read_errors) == {
        "sm_clock",
        "power",
        "temperature",
        "utilization",
        "clock_event_reasons",  # 0xZZ, as its docstring says; it was left uncounted
    }


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Failed to set clocks for GPU 0: Insufficient Permissions", PermissionDenied),
        ("Unable to determine the device handle for GPU 0000:00:1E.0: GPU is lost.", GpuLost),
        ("Setting locked GPU clocks is not supported for GPU 0.", NotSupported),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            GpuUnavailable,
        ),
        # NVML's own words (nvmlErrorString), each as NVML's code is taken: UNKNOWN and
        # TIMEOUT were a plain GpuError, so one failed query ended the run.
        (
            "Unable to determine the device handle for GPU0000:17:00.0: Unknown Error",
            TransientGpuError,
        ),
        ("Failed to initialize NVML: Unknown Error", TransientGpuError),
        ("Unable to query GPU 0: Timeout", TransientGpuError),
        ("GPU 00000000:17:00.0: Insufficient External Power", TransientGpuError),
        ("Failed to initialize NVML: Driver/library version mismatch", GpuUnavailable),
        ("GPU 00000000:17:00.0: GPU requires reset", GpuLost),
    ],
)
def test_error_text_classified(text: str, kind: type) -> None:
    assert type(classify_failure(["nvidia-smi"], text)) is kind


def test_a_query_failing_for_a_passing_reason_is_a_failed_sample_not_the_end() -> None:
    """nvidia-smi's "Unknown Error" on one query raised a plain GpuError out of the tick's
    sampling and ended the run; it is one failed sample, as NVML's UNKNOWN is."""
    fake = FakeNvidiaSmi(1)
    failing = [True]

    def runner(argv: Sequence[str], timeout_s: float) -> str:
        if failing[0] and any(a.startswith("--query-gpu=") for a in argv):
            failing[0] = False
            raise classify_failure(argv, "Unable to determine the device handle: Unknown Error")
        return fake(argv, timeout_s)

    gpus = DomainGpus([NvidiaSmiBackend(0, runner=runner)])
    assert gpus.sample(0.0)[0].read_errors == ("sample",)
    assert gpus.sample(1.0)[0].sm_clock_mhz == 1980.0
    assert gpus.gpu_read_errors == {"0": 1}


def test_missing_executable() -> None:
    with pytest.raises(GpuUnavailable, match="not found"):
        run_command(["/nonexistent/nvidia-smi", "-L"], 1.0)


def test_supported_clocks_pass_nvml_s_filter(caplog: pytest.LogCaptureFixture) -> None:
    """inf, nan, 0 and 0xFFFFFFFF in nvidia-smi's list are dropped with one warning, as
    NVML's are (inf raised OverflowError, nan ValueError; 0xFFFFFFFF became the top)."""
    listed = "3201, inf\n3201, 1980\n0xFFFFFFFF, 2100\nnan, 1500\n3201, 0\n3201, nan\n1593, 1200\n"
    backend = NvidiaSmiBackend(0, runner=lambda argv, timeout_s: listed)
    with caplog.at_level("WARNING"):
        assert backend.supported_clocks_mhz() == (1980,)
    lines = [r.getMessage() for r in caplog.records if "no GPU runs at" in r.getMessage()]
    assert len(lines) == 2 and all(line.startswith("GPU 0: nvidia-smi listed") for line in lines)
    only_garbage = NvidiaSmiBackend(0, runner=lambda argv, timeout_s: "inf, inf\n")
    with pytest.raises(NotSupported, match="no supported memory clocks listed"):
        only_garbage.supported_clocks_mhz()
