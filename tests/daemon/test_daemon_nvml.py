"""NvmlBackend's real code against the fake pynvml module; the error table."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import fake_pynvml as fp
import pytest
from daemon_support import MetricsServer, fixture_text, node_commands_on, run_ticks
from fake_pynvml import FakeNvml

from gpugov.daemon.backend import DryRunBackend, GpuBackend, GpuSample
from gpugov.daemon.config import parse_config
from gpugov.daemon.errors import (
    PERMISSION_DENIED_MESSAGE,
    ConfigError,
    GpuError,
    GpuLost,
    GpuUnavailable,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
    from_nvml,
)
from gpugov.daemon.nvml import NvmlBackend, nvml_device_count
from gpugov.daemon.service import domains_from_config


def test_fake_errors_behave_like_pynvml() -> None:
    error = fp.NVMLError(fp.NVML_ERROR_NO_PERMISSION)
    assert type(error).__name__ == "NVMLError_NoPermission"
    assert isinstance(error, fp.NVMLError_NoPermission)
    assert error.value == 4
    assert fp.NVMLError_GpuIsLost().value == 15
    assert str(fp.NVMLError(fp.NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (fp.NVML_ERROR_NO_PERMISSION, PermissionDenied),
        (fp.NVML_ERROR_NOT_SUPPORTED, NotSupported),
        (fp.NVML_ERROR_FUNCTION_NOT_FOUND, NotSupported),
        (fp.NVML_ERROR_GPU_IS_LOST, GpuLost),
        (fp.NVML_ERROR_DRIVER_NOT_LOADED, GpuUnavailable),
        (fp.NVML_ERROR_TIMEOUT, TransientGpuError),
        (fp.NVML_ERROR_CORRUPTED_INFOROM, GpuError),
        (12345, GpuError),
    ],
)
def test_error_table(code: int, kind: type[GpuError]) -> None:
    translated = from_nvml(fp.NVMLError(code), "lock clocks", gpu="0")
    assert type(translated) is kind
    assert translated.code == code
    assert translated.gpu == "0"


def test_a_lock_refused_as_a_frequency_not_supported_is_not_said_as_no_lock_at_all() -> None:
    """FREQ_NOT_SUPPORTED (24) refuses that clock: the line said the GPU or its driver
    does not lock SM clocks at all, and sent the operator to a dry run."""
    translated = from_nvml(
        fp.NVMLError(fp.NVML_ERROR_FREQ_NOT_SUPPORTED), "lock clocks to 1200,1200 MHz", gpu="0"
    )
    assert isinstance(translated, NotSupported)
    assert str(translated).endswith(
        "(NVML code 24): the driver refuses that SM clock (FREQ_NOT_SUPPORTED), though the "
        "GPU lists it (nvmlDeviceGetSupportedGraphicsClocks)"
    )
    assert "does not lock SM clocks" in str(
        from_nvml(fp.NVMLError(fp.NVML_ERROR_NOT_SUPPORTED), "lock clocks to 1,1 MHz")
    )


def test_permission_message_is_the_one_clear_line() -> None:
    translated = from_nvml(fp.NVMLError(fp.NVML_ERROR_NO_PERMISSION), "lock clocks")
    assert PERMISSION_DENIED_MESSAGE in str(translated)
    # A power limit needs the same privilege; its line does not speak of clocks.
    translated = from_nvml(
        fp.NVMLError(fp.NVML_ERROR_NO_PERMISSION), "set power limit to 400 W", gpu="0"
    )
    assert str(translated) == (
        "GPU 0: set power limit to 400 W: needs root or CAP_SYS_ADMIN; "
        "run with --dry-run to observe only"
    )


def test_sample_reads_everything_in_base_units(fake_nvml: FakeNvml) -> None:
    backend = NvmlBackend(1, nvml=fake_nvml)
    assert isinstance(backend, GpuBackend)
    assert backend.label == "1"
    sample = backend.sample()
    assert sample.gpu == "1"
    assert sample.power_w == pytest.approx(350.0)  # instant field, not the 1 s average
    assert sample.energy_j == pytest.approx(1000.0)
    assert sample.temperature_c == 55
    assert sample.sm_clock_mhz == 1980
    assert sample.utilization == pytest.approx(0.8)
    assert sample.clock_event_reasons == 0
    assert sample.power_limit_w == pytest.approx(700.0)
    assert sample.read_errors == ()
    # Power and energy come from one field-values call.
    assert fake_nvml.calls["nvmlDeviceGetFieldValues"] == 1
    assert "nvmlDeviceGetPowerUsage" not in fake_nvml.calls
    backend.close()
    assert fake_nvml.initialized == 0


def test_open_by_uuid(fake_nvml: FakeNvml) -> None:
    backend = NvmlBackend("GPU-fake-0001", nvml=fake_nvml)
    assert backend.index == 1
    with pytest.raises(GpuUnavailable):
        NvmlBackend("GPU-nope", nvml=fake_nvml)


def test_fake_error_messages_are_pynvmls() -> None:
    """The fake said "NVML Error with code N" for UNINITIALIZED, LIBRARY_NOT_FOUND and
    LIB_RM_VERSION_MISMATCH (and others), where pynvml has words of its own: a line the
    daemon builds from one (no driver, the driver gone) was tested against text no node
    prints. Every code the fake can raise says what the installed nvidia-ml-py says."""
    pynvml = pytest.importorskip("pynvml")
    table = pynvml.NVMLError._errcode_to_string
    codes = [value for name, value in vars(fp).items() if name.startswith("NVML_ERROR_")]
    for code in codes:
        if code in table:
            assert str(fp.NVMLError(code)) == table[code], code
            assert str(fp.NVMLError(code)) == str(pynvml.NVMLError(code)), code
    assert set(table) <= set(codes)  # the fake can raise every code pynvml names
    assert str(fp.NVMLError(fp.NVML_ERROR_LIBRARY_NOT_FOUND)) == "NVML Shared Library Not Found"
    assert str(fp.NVMLError_Uninitialized()) == "Uninitialized"


def test_no_driver_is_unavailable() -> None:
    fake = FakeNvml(1)
    fake.driver_loaded = False
    with pytest.raises(GpuUnavailable, match="Driver Not Loaded"):
        NvmlBackend(0, nvml=fake)
    with pytest.raises(GpuUnavailable):
        nvml_device_count(fake)


def test_device_count(fake_nvml: FakeNvml) -> None:
    assert nvml_device_count(fake_nvml) == 2
    assert fake_nvml.initialized == 0


def test_supported_clocks_ascending_and_cached(fake_nvml: FakeNvml) -> None:
    backend = NvmlBackend(0, nvml=fake_nvml)
    clocks = backend.supported_clocks_mhz()
    assert clocks[0] == 345 and clocks[-1] == 1980
    assert list(clocks) == sorted(clocks)
    backend.supported_clocks_mhz()
    assert fake_nvml.calls["nvmlDeviceGetSupportedGraphicsClocks"] == 1
    assert backend.max_clock_mhz() == 1980


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ((1410, 0, 1980, 1410), (1410, 1980)),  # unsorted, a duplicate, a 0 MHz entry
        ((0xFFFFFFFF, 1980, 1410), (1410, 1980)),  # an unsigned -1: no GPU runs there
        ((0,), None),  # nothing a lock may ask for
        ((), None),
    ],
)
def test_supported_clocks_keep_only_clocks_a_gpu_runs_at(
    listed: tuple[int, ...], expected: tuple[int, ...] | None, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml([fp.FakeGpu(index=0, graphics_clocks_mhz=listed)])
    backend = NvmlBackend(0, nvml=fake)
    if expected is None:
        with pytest.raises(NotSupported, match="no supported graphics clocks listed"):
            backend.supported_clocks_mhz()
        return
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.nvml"):
        assert backend.supported_clocks_mhz() == expected
        assert backend.supported_clocks_mhz() == expected
    dropped = [r.getMessage() for r in caplog.records if "no GPU runs at" in r.getMessage()]
    assert len(dropped) == 1  # one line, not one per call


def test_a_memory_clock_no_gpu_runs_at_is_not_the_one_whose_clocks_are_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The highest listed memory clock was 0xFFFFFFFF; its graphics clocks NOT_FOUND, and
    # the GPU was refused at the start (exit 4) though NVML lists the real ones.
    fake = FakeNvml(1)
    listed = fake.nvmlDeviceGetSupportedMemoryClocks
    fake.nvmlDeviceGetSupportedMemoryClocks = lambda handle: [*listed(handle), 0xFFFFFFFF, 0]  # type: ignore[method-assign]
    backend = NvmlBackend(0, nvml=fake)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.nvml"):
        assert backend.supported_clocks_mhz() == tuple(range(345, 1981, 15))
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: NVML listed 2 supported memory clock(s) no GPU runs at (4294967295, 0); ignored"
    ]
    fake.nvmlDeviceGetSupportedMemoryClocks = lambda handle: [0xFFFFFFFF]  # type: ignore[method-assign]
    with pytest.raises(NotSupported, match="no supported memory clocks listed"):
        NvmlBackend(0, nvml=fake).supported_clocks_mhz()


def test_clocks_listed_above_the_gpus_max_clock_are_not_locked(
    caplog: pytest.LogCaptureFixture, metrics_server: MetricsServer
) -> None:
    """A board that lists graphics clocks past the SM clock it reaches (a GeForce boost
    table, a power-limited SKU): locked at the top listed clock it ran at its max clock
    with no event reason, read back as someone else's change and locked again every
    other tick, counted in gpugov_gpu_external_clock_changes_total. The clocks above its
    max clock (nvmlDeviceGetMaxClockInfo) are not offered; one line says so."""
    fake = FakeNvml([fp.FakeGpu(index=0, max_clock_mhz=1755)])
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.nvml"):
        backend = NvmlBackend(0, nvml=fake)
        assert backend.supported_clocks_mhz() == tuple(range(345, 1756, 15))
        backend.supported_clocks_mhz()
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: NVML lists SM clocks up to 1980 MHz, above the 1755 MHz it runs at most "
        "(nvmlDeviceGetMaxClockInfo); the 15 clock(s) above it are not used"
    ]
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {"kind": "vllm", "url": metrics_server.url, "timeout_s": 0.9},
                    "controller": {"kind": "max"},
                }
            ],
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    try:
        run_ticks(assembled.domains, 8)
        assert assembled.domains[0].actuator.external_changes == {"0": 0}
    finally:
        assembled.close()
    locks = [w for w in fake.writes if w[0] == "nvmlDeviceSetGpuLockedClocks"]
    assert locks == [("nvmlDeviceSetGpuLockedClocks", 0, 1755, 1755)]  # locked once


@pytest.mark.parametrize("max_clock", [1975, 0, 0xFFFFFFFF, 300])
def test_a_max_clock_near_the_top_or_no_gpus_keeps_the_listed_clocks(max_clock: int) -> None:
    """A max clock a few MHz off the top listed clock (NVML: "can differ by a few MHz"),
    or one no GPU has (0, an unsigned -1, below every listed clock), leaves the list."""
    fake = FakeNvml([fp.FakeGpu(index=0, max_clock_mhz=max_clock)])
    assert NvmlBackend(0, nvml=fake).supported_clocks_mhz() == tuple(range(345, 1981, 15))


def test_a_max_clock_that_cannot_be_read_keeps_the_listed_clocks() -> None:
    fake = FakeNvml([fp.FakeGpu(index=0, max_clock_mhz=1755)])
    fake.fail("nvmlDeviceGetMaxClockInfo", fp.NVML_ERROR_NOT_SUPPORTED)
    assert NvmlBackend(0, nvml=fake).supported_clocks_mhz() == tuple(range(345, 1981, 15))


@pytest.mark.parametrize("code", [fp.NVML_ERROR_TIMEOUT, fp.NVML_ERROR_UNKNOWN])
def test_a_max_clock_read_that_fails_for_now_at_the_start_is_tried_again(code: int) -> None:
    """A max clock read that fails once at the start (TIMEOUT, UNKNOWN) is tried again with
    the clock lists' retries: taken as unreadable, the clocks above the board's max stayed
    offered for the whole run (the list is read once), and a lock at the top one was read
    back as someone else's change and written again every other tick."""
    from gpugov.daemon.gpu_open import open_backend

    fake = FakeNvml([fp.FakeGpu(index=0, max_clock_mhz=1755)])
    fake.fail("nvmlDeviceGetMaxClockInfo", code)
    backend = open_backend(0, nvml=fake, sleep=lambda _s: None)  # type: ignore[arg-type]
    try:
        assert backend.supported_clocks_mhz() == tuple(range(345, 1756, 15))
        assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 2
    finally:
        backend.close()


def _mig_node() -> FakeNvml:
    """GPU 0 whole, GPU 1 in MIG mode with two MIG devices."""
    return FakeNvml([fp.FakeGpu(index=0), fp.FakeGpu(index=1, mig_uuids=("MIG-a1", "MIG-b1"))])


def test_a_gpu_named_by_a_mig_devices_uuid_is_governed_as_its_whole_gpu() -> None:
    """A MIG device's clocks are its GPU's (a lock acts on the whole GPU, and NVML answers a
    MIG handle's device calls NOT_SUPPORTED): it is opened, read, locked and keyed as that
    GPU, its index, UUID and clocks. Opened on the MIG handle, it was refused at the start
    (``no such GPU``) where the NVML index was asked of it."""
    fake = _mig_node()
    backend = NvmlBackend("MIG-b1", nvml=fake)
    try:
        assert (backend.label, backend.uuid) == ("1", "GPU-fake-0001")
        assert backend.name == "NVIDIA H100 80GB HBM3"
        assert backend.supported_clocks_mhz() == tuple(range(345, 1981, 15))
        assert backend.sample().sm_clock_mhz == 1980
        backend.lock_clocks(1410, 1410)
        assert [gpu.locked for gpu in fake.gpus] == [None, (1410, 1410)]
    finally:
        backend.close()


def test_two_mig_devices_of_one_gpu_in_two_domains_are_refused(
    metrics_server: MetricsServer,
) -> None:
    """Two domains on two MIG devices of one GPU would lock that one GPU's clocks each to
    its own plan, every tick undoing the other's; refused at the start naming both, as
    one GPU named by its index and its UUID is."""
    fake = _mig_node()
    engine = {"kind": "vllm", "url": metrics_server.url, "timeout_s": 0.9}
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {"name": "a", "gpus": ["MIG-a1"], "engine": engine, "controller": {"kind": "max"}},
                {"name": "b", "gpus": ["MIG-b1"], "engine": engine, "controller": {"kind": "max"}},
            ],
        }
    )
    with pytest.raises(
        ConfigError,
        match=r"domain 'b': GPU MIG-b1 is GPU-fake-0001, which "
        r"domain 'a' names as GPU MIG-a1; a GPU belongs to one domain",
    ):
        domains_from_config(config, nvml=fake)
    assert fake.initialized == 0  # every GPU opened was closed again


@pytest.mark.parametrize("count", [0xFFFFFFFF, 1025, -1, None, "two"])
def test_a_gpu_count_no_node_has_is_no_usable_gpu(count: object) -> None:
    """NVML counting more GPUs than NVML indices go (0 to 1023; an unsigned -1 from a
    driver in trouble): every GPU of ``--gpus all`` (the actuator, reset-clocks) was that
    many indices, a list of four billion built before the first GPU was opened."""
    fake = FakeNvml(1)
    fake.nvmlDeviceGetCount = lambda: count  # type: ignore[method-assign]
    said = re.escape(repr(count))
    with pytest.raises(GpuUnavailable, match=rf"NVML counts {said} GPUs, which no node has"):
        nvml_device_count(fake)  # type: ignore[arg-type]
    assert fake.initialized == 0


def test_one_gpu_named_twice_in_one_domain_is_said_so(metrics_server: MetricsServer) -> None:
    """Its index and UUID, or two MIG devices of it, in one domain's gpus: the line said
    the GPU belongs to one domain, naming the same domain twice."""
    engine = {"kind": "vllm", "url": metrics_server.url, "timeout_s": 0.9}
    for gpus, line in [
        ([0, "GPU-fake-0000"], "GPU GPU-fake-0000 is GPU-fake-0000, which it names as GPU 0"),
        (["MIG-a1", "MIG-b1"], "GPU MIG-b1 is GPU-fake-0001, which it names as GPU MIG-a1"),
    ]:
        config = parse_config(
            {
                "daemon": {"period_s": 1.0},
                "domains": [
                    {"name": "a", "gpus": gpus, "engine": engine, "controller": {"kind": "max"}}
                ],
            }
        )
        with pytest.raises(ConfigError) as refused:
            domains_from_config(config, nvml=_mig_node())
        assert str(refused.value) == f"domain 'a': {line} too; name each GPU once"


def test_a_gpu_index_that_is_no_number_is_a_gpu_that_cannot_be_opened() -> None:
    fake = FakeNvml(1)
    fake.nvmlDeviceGetIndex = lambda handle: None  # type: ignore[method-assign]
    with pytest.raises(GpuUnavailable, match="GPU GPU-fake-0000: no such GPU or it cannot be"):
        NvmlBackend("GPU-fake-0000", nvml=fake)
    assert fake.initialized == 0


def test_a_failed_open_or_count_whose_shutdown_fails_too_raises_the_daemons_error() -> None:
    # nvmlShutdown's own NVMLError, on the way out, replaced the daemon's error: `gpugov
    # run` ended in a traceback instead of exit 5 naming the lost GPU.
    fake = FakeNvml(1)
    fake.fail("nvmlDeviceGetHandleByIndex", fp.NVML_ERROR_GPU_IS_LOST)
    fake.fail("nvmlShutdown", fp.NVML_ERROR_UNKNOWN, times=None)
    with pytest.raises(GpuLost, match="GPU 0: open GPU failed"):
        NvmlBackend(0, nvml=fake)
    fake.fail("nvmlDeviceGetCount", fp.NVML_ERROR_UNKNOWN)
    with pytest.raises(TransientGpuError, match="count GPUs failed"):
        nvml_device_count(fake)  # type: ignore[arg-type]


def test_supported_clocks_not_supported_is_not_supported(fake_nvml: FakeNvml) -> None:
    fake_nvml.fail("nvmlDeviceGetSupportedGraphicsClocks", fp.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NotSupported):
        NvmlBackend(0, nvml=fake_nvml).supported_clocks_mhz()


def test_power_falls_back_to_average_getter() -> None:
    fake = FakeNvml([fp.FakeGpu(index=0, field_power_supported=False)])
    backend = NvmlBackend(0, nvml=fake)
    assert backend.sample().power_w == pytest.approx(340.0)
    assert backend.sample().energy_j == pytest.approx(1000.0)
    # GPU scope, then MODULE scope, then the getter for good.
    calls = fake.calls["nvmlDeviceGetFieldValues"]
    backend.sample()
    assert fake.calls["nvmlDeviceGetFieldValues"] == calls
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3


def test_instant_power_found_unsupported_is_tried_again_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The instant power field answered NOT_SUPPORTED once (the call, or the field at each
    scope): as every read NVML says it does not support, tried again a minute later. It
    was given up for good, every later sample the 1 s average (a driver in trouble for a
    moment left the run without instant power)."""
    now = [0.0]
    gpu = fp.FakeGpu(index=0)
    fake = FakeNvml([gpu])
    backend = NvmlBackend(0, nvml=fake, clock=lambda: now[0])
    fake.fail("nvmlDeviceGetFieldValues", fp.NVML_ERROR_NOT_SUPPORTED)
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.nvml"):
        assert [backend.sample().power_w for _ in range(2)] == [pytest.approx(340.0)] * 2
        now[0] += 61.0
        assert backend.sample().power_w == pytest.approx(350.0)  # instant again
        gpu.field_power_supported = False  # the field unsupported at both scopes
        assert backend.sample().power_w == pytest.approx(340.0)
        gpu.field_power_supported = True
        assert backend.sample().power_w == pytest.approx(340.0)  # within the minute
        now[0] += 61.0
        assert backend.sample().power_w == pytest.approx(350.0)
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: NVML reads no instant power; its power is the 1 s average "
        "(nvmlDeviceGetPowerUsage)",
        "GPU 0: its instant power reads again (GPU scope)",
    ] * 2


@pytest.mark.parametrize("code", [fp.NVML_ERROR_TIMEOUT, fp.NVML_ERROR_UNKNOWN])
def test_a_power_field_call_that_fails_for_now_falls_back_to_the_average_getter(
    code: int,
) -> None:
    """The field call failing for now (TIMEOUT, UNKNOWN) cost the sample its power,
    though the average getter answers: a field it answers with such a code fell back to
    it already. The call failing now and then is the average once, then instant again."""
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    fake.fail("nvmlDeviceGetFieldValues", code, times=1)
    first, second = backend.sample(), backend.sample()
    assert first.power_w == pytest.approx(340.0) and first.read_errors == ()
    assert second.power_w == pytest.approx(350.0)  # the field again: not given up
    fake.fail("nvmlDeviceGetFieldValues", code, times=1)
    fake.fail("nvmlDeviceGetPowerUsage", code, times=1)
    assert backend.sample().read_errors == ("power",)  # both failed: a failed read


def test_a_grace_hopper_modules_power_is_read_at_module_scope_from_the_first_sample(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """GPU scope unsupported (a Grace-Hopper module): the first sample read the 1 s
    average getter and only the next ones MODULE scope, a jump in silence from the GPU's
    average to the module's instant power (GPU, CPU and memory). Each power source other
    than the GPU's instant power is said once; every sample reads the module's."""
    gpu = fp.FakeGpu(index=0, module_power_mw=600_000)
    fake = FakeNvml([gpu])
    backend = NvmlBackend(0, nvml=fake)
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.nvml"):
        assert [backend.sample().power_w for _ in range(3)] == [pytest.approx(600.0)] * 3
        assert "nvmlDeviceGetPowerUsage" not in fake.calls
        gpu.module_power_mw = None
        gpu.field_power_supported = False  # and no instant power at all: the average
        other = NvmlBackend(0, nvml=fake)
        assert [other.sample().power_w for _ in range(2)] == [pytest.approx(340.0)] * 2
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: its power is read at MODULE scope (the whole Grace-Hopper module: GPU, CPU "
        "and memory): NVML reads no GPU-scope instant power",
        "GPU 0: NVML reads no instant power; its power is the 1 s average "
        "(nvmlDeviceGetPowerUsage)",
    ]


def test_temperature_and_event_reason_fallbacks() -> None:
    fake = FakeNvml(1)
    fake.remove("nvmlDeviceGetTemperatureV")
    fake.remove("nvmlDeviceGetCurrentClocksEventReasons")
    fake.gpus[0].event_reasons = fp.nvmlClocksEventReasonSwPowerCap
    backend = NvmlBackend(0, nvml=fake)
    for _ in range(2):
        sample = backend.sample()
        assert sample.temperature_c == 55
        assert sample.clock_event_reasons == 0x4
        assert sample.read_errors == ()
    # The new names are asked once, then the old ones only.
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


@pytest.mark.parametrize("code", [fp.NVML_ERROR_NOT_SUPPORTED, fp.NVML_ERROR_DEPRECATED])
def test_event_reasons_not_supported_for_now_keep_the_new_name(code: int) -> None:
    """Only FUNCTION_NOT_FOUND (a driver older than the rename) moves the event reasons
    to the old Throttle name. A NOT_SUPPORTED of the new name moved them for good: on a
    driver without the old symbol (or one answering it DEPRECATED) they were unread for
    the rest of the run, the readback judging every lock without them."""
    now = [0.0]
    fake = FakeNvml(1)
    fake.remove("nvmlDeviceGetCurrentClocksThrottleReasons")
    fake.gpus[0].event_reasons = fp.nvmlClocksEventReasonSwPowerCap
    fake.fail("nvmlDeviceGetCurrentClocksEventReasons", code)
    backend = NvmlBackend(0, nvml=fake, clock=lambda: now[0])
    assert backend.sample().clock_event_reasons is None  # not supported: tried again later
    now[0] += 61.0
    assert backend.sample().clock_event_reasons == 0x4
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in fake.calls


@pytest.mark.parametrize("code", [fp.NVML_ERROR_NOT_SUPPORTED, fp.NVML_ERROR_DEPRECATED])
def test_temperature_not_supported_for_now_keeps_the_versioned_call(code: int) -> None:
    """As the event reasons: only FUNCTION_NOT_FOUND moves the temperature to the deprecated
    nvmlDeviceGetTemperature (to be removed with CUDA 14), not a NOT_SUPPORTED for now."""
    now = [0.0]
    fake = FakeNvml(1)
    fake.remove("nvmlDeviceGetTemperature")
    fake.fail("nvmlDeviceGetTemperatureV", code)
    backend = NvmlBackend(0, nvml=fake, clock=lambda: now[0])
    assert backend.sample().temperature_c is None
    now[0] += 61.0
    assert backend.sample().temperature_c == 55
    assert "nvmlDeviceGetTemperature" not in fake.calls


@pytest.mark.parametrize(
    ("function", "value", "read"),
    [
        ("nvmlDeviceGetTotalEnergyConsumption", None, "energy"),
        ("nvmlDeviceGetTemperatureV", "hot", "temperature"),
        ("nvmlDeviceGetClockInfo", 10**400, "sm_clock"),
        ("nvmlDeviceGetUtilizationRates", None, "utilization"),
        ("nvmlDeviceGetCurrentClocksEventReasons", "0x4", "clock_event_reasons"),
        ("nvmlDeviceGetEnforcedPowerLimit", object(), "power_limit"),
    ],
)
def test_a_reading_that_is_no_number_is_a_failed_read_of_that_field(
    function: str, value: object, read: str
) -> None:
    """A value the binding gives that is no reading (None, text, an integer past any
    float, an empty field list): a failed read of that field, the rest of the sample
    read. It raised out of the sample (TypeError, ValueError, OverflowError, IndexError)
    and ended the loop in a traceback."""
    fake = FakeNvml(1)
    setattr(fake, function, lambda *args: value)
    sample = NvmlBackend(0, nvml=fake).sample()
    assert sample.read_errors == (read,)
    assert sample.sm_clock_mhz == (None if read == "sm_clock" else 1980.0)


@pytest.mark.parametrize("value", [None, "fast", 10**400])
def test_a_max_clock_or_power_limit_that_is_no_number_is_unreadable(value: object) -> None:
    """As a sample's readings: a max clock the binding gives as no number is unreadable
    (the listed clocks kept), a power management limit one a read that failed for now;
    each raised a TypeError, ValueError or OverflowError out of the start or the cap."""
    fake = FakeNvml([fp.FakeGpu(index=0, max_clock_mhz=1755)])
    fake.nvmlDeviceGetMaxClockInfo = lambda *args: value  # type: ignore[method-assign]
    fake.nvmlDeviceGetPowerManagementLimit = lambda *args: value  # type: ignore[method-assign]
    backend = NvmlBackend(0, nvml=fake)
    assert backend.supported_clocks_mhz() == tuple(range(345, 1981, 15))
    assert backend.max_clock_mhz() is None
    with pytest.raises(TransientGpuError, match="power management limit read"):
        backend.power_limit_w()


def test_a_power_field_call_that_answers_no_field_falls_back_to_the_average_getter() -> None:
    fake = FakeNvml(1)
    fake.nvmlDeviceGetFieldValues = lambda *args: []  # type: ignore[method-assign]
    sample = NvmlBackend(0, nvml=fake).sample()
    assert sample.power_w == pytest.approx(340.0) and sample.read_errors == ()


def test_an_energy_counter_that_jumps_further_than_the_gpu_may_draw_is_a_failed_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An energy counter's garbage (2^64 - 1 mJ) was taken as read: its window was 18 PJ,
    which mpc-online's learned power model took in (its power mean past 1e13 W, the model
    no longer saved). Such a reading is a failed read (one line); the next one is judged
    against it, so a counter back at its level, or moved to a new one, counts on."""
    from gpugov.daemon.gpu_sampling import DomainGpus

    fake = FakeNvml(1)
    gpus = DomainGpus([NvmlBackend(0, nvml=fake)])
    seen = []
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        counters_mj = [1_000_000, 1_400_000, 2**64 - 1, 1_800_000, 2_200_000, 9 * 10**12]
        for step, energy_mj in enumerate([*counters_mj, 9 * 10**12 + 400_000]):
            fake.gpus[0].energy_mj = energy_mj
            seen.append(gpus.sample(float(step))[0].energy_j)
    assert seen == [1000.0, 1400.0, None, 1800.0, 2200.0, None, 9e9 + 400.0]
    assert gpus.gpu_read_errors == {"0": 2}
    assert [r.getMessage()[:57] for r in caplog.records] == [
        "GPU 0: energy counter read 1.84467e+16 J, 1.84e+16 J past"
    ]


def test_transient_read_error_is_counted_and_survived() -> None:
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    fake.fail("nvmlDeviceGetClockInfo", fp.NVML_ERROR_TIMEOUT, times=1)
    fake.fail("nvmlDeviceGetUtilizationRates", fp.NVML_ERROR_UNKNOWN, times=1)
    sample = backend.sample()
    assert sample.sm_clock_mhz is None and sample.utilization is None
    assert sample.read_errors == ("sm_clock", "utilization")
    assert sample.power_w == pytest.approx(350.0)
    again = backend.sample()
    assert again.sm_clock_mhz == 1980 and again.read_errors == ()


def test_an_unsupported_read_is_left_out_and_tried_again_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read NVML once said it does not support was dropped for good: one spurious
    NOT_SUPPORTED (a driver in trouble, MIG mode switched off again) and the SM clock,
    and so the readback of every lock, or the utilisation, was never read again. It is
    left out and tried again once a minute; one line when it stops, one when it reads."""
    fake = FakeNvml(1)
    now = [0.0]
    backend = NvmlBackend(0, nvml=fake, clock=lambda: now[0])
    fake.fail("nvmlDeviceGetClockInfo", fp.NVML_ERROR_NOT_SUPPORTED, times=2)
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.nvml"):
        assert backend.sample().sm_clock_mhz is None
        now[0] = 59.0
        assert backend.sample().sm_clock_mhz is None
        assert fake.calls["nvmlDeviceGetClockInfo"] == 1  # not asked within the minute
        now[0] = 60.0
        assert backend.sample().sm_clock_mhz is None  # asked: still not supported
        now[0] = 120.0
        sample = backend.sample()
    assert sample.sm_clock_mhz == 1980.0 and sample.read_errors == ()
    assert fake.calls["nvmlDeviceGetClockInfo"] == 3
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: sm_clock not supported; tried again once a minute",
        "GPU 0: sm_clock reads again",
    ]


def test_lost_gpu_raises_on_sample(fake_nvml: FakeNvml) -> None:
    backend = NvmlBackend(0, nvml=fake_nvml)
    fake_nvml.lose(0)
    with pytest.raises(GpuLost):
        backend.sample()


def test_lock_and_reset_call_nvml(fake_nvml: FakeNvml) -> None:
    backend = NvmlBackend(0, nvml=fake_nvml)
    backend.lock_clocks(1410, 1410)
    assert fake_nvml.locked(0) == (1410, 1410)
    backend.reset_clocks()
    assert fake_nvml.locked(0) is None
    assert fake_nvml.writes == [
        ("nvmlDeviceSetGpuLockedClocks", 0, 1410, 1410),
        ("nvmlDeviceResetGpuLockedClocks", 0),
    ]


def test_lock_without_permission() -> None:
    fake = FakeNvml(1, permission=False)
    backend = NvmlBackend(0, nvml=fake)
    with pytest.raises(PermissionDenied, match="CAP_SYS_ADMIN") as info:
        backend.lock_clocks(1410, 1410)
    assert isinstance(info.value.__cause__, fp.NVMLError_NoPermission)


def test_dry_run_reads_but_never_writes(fake_nvml: FakeNvml) -> None:
    backend = DryRunBackend(NvmlBackend(0, nvml=fake_nvml))
    assert backend.sample().power_w == pytest.approx(350.0)
    backend.lock_clocks(1200, 1200)
    backend.reset_clocks()
    assert fake_nvml.writes == []
    assert list(backend.writes) == [("lock", 1200, 1200), ("reset",)]
    assert backend.supported_clocks_mhz()[-1] == 1980


def test_the_energy_counter_is_read_at_every_sample() -> None:
    """Read at most once a second, a sample within that second carried the counter read
    before as if read now: a tick's energy was 0 and the next one's twice it (a 1 s
    loop's ticks land a few ms either side of the second), and AGFT, run at 0.3 s,
    rewarded each cached window as one that spent no energy."""
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    readings = []
    for _ in range(3):
        fake.gpus[0].energy_mj += 300_000
        readings.append(backend.sample().energy_j)
    assert readings == [pytest.approx(1300.0), pytest.approx(1600.0), pytest.approx(1900.0)]
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3


def test_a_reading_no_gpu_gives_costs_that_reading_not_the_sample() -> None:
    sample = GpuSample.read(
        "0",
        power_w=-5.0,
        energy_j=float("nan"),
        temperature_c=float("inf"),
        sm_clock_mhz=1410.0,
        utilization=float("nan"),
        clock_event_reasons=2.0**70,
        power_limit_w=700.0,
        read_errors=("energy",),
    )
    assert (sample.power_w, sample.energy_j, sample.temperature_c) == (None, None, None)
    assert (sample.utilization, sample.clock_event_reasons) == (None, None)
    assert sample.sm_clock_mhz == 1410.0 and sample.power_limit_w == 700.0
    assert sample.read_errors == (
        "energy",
        "power",
        "energy",
        "temperature",
        "utilization",
        "clock_event_reasons",
    )


def test_a_negative_power_from_nvml_is_a_failed_read(fake_nvml: FakeNvml) -> None:
    # NVML's field values come signed or as doubles; the 1 s average is the fallback.
    gpu = fake_nvml.gpus[1]
    gpu.field_power_supported = False
    gpu.average_power_mw = -5_000
    backend = NvmlBackend(1, nvml=fake_nvml)
    sample = backend.sample()
    assert sample.power_w is None and "power" in sample.read_errors
    assert sample.energy_j == pytest.approx(1000.0)
    backend.close()


@pytest.mark.parametrize("percent", [101, 0xFFFFFFFF])
def test_a_utilisation_past_100_percent_from_nvml_is_a_failed_read(
    fake_nvml: FakeNvml, percent: int
) -> None:
    """NVML's utilisation is a percentage (0-100): a value past it (a driver's garbage,
    an unsigned -1) was clamped to 1.0 and exported and planned with as a GPU busy all
    the time; it is a failed read, as past 100 % from nvidia-smi is."""
    fake_nvml.gpus[0].utilization_pct = percent
    sample = NvmlBackend(0, nvml=fake_nvml).sample()
    assert sample.utilization is None and sample.read_errors == ("utilization",)
    fake_nvml.gpus[0].utilization_pct = 100
    assert NvmlBackend(0, nvml=fake_nvml).sample().utilization == 1.0


@pytest.mark.parametrize("limit_mw", [0, 0xFFFFFFFF])
def test_an_enforced_power_limit_no_gpu_has_is_a_failed_read(
    fake_nvml: FakeNvml, limit_mw: int, metrics_server: MetricsServer
) -> None:
    """An enforced power limit of 0 W, or NVML's 0xFFFFFFFF mW for an unknown value
    (4.3 MW), was taken as read: exported as the GPU's limit, summed into the domain's,
    and the node's power budget from NVML became 700 W for two 700 W GPUs drawing it
    (or 4.3 MW). It is a failed read of that field, as bounds no GPU has are."""
    fake_nvml.gpus[0].power_limit_mw = limit_mw
    sample = NvmlBackend(0, nvml=fake_nvml).sample()
    assert sample.power_limit_w is None and sample.read_errors == ("power_limit",)
    assert sample.power_w == pytest.approx(350.0)
    fake_nvml.gpus[0].power_limit_mw = 700_000
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0, 1],
                    "engine": {"kind": "vllm", "url": metrics_server.url, "timeout_s": 0.9},
                }
            ],
        }
    )
    assembled = domains_from_config(config, nvml=fake_nvml)

    def limit_goes_bad(step: int, records: list[Any]) -> None:
        fake_nvml.gpus[0].power_limit_mw = limit_mw

    try:
        records, _ = run_ticks(assembled.domains, 4, on_step=limit_goes_bad)
        assert assembled.domains[0].budget.sources_w == {"nvml": 1400.0}
    finally:
        assembled.close()
    assert all(r.observation.power_limit_w in (1400.0, None) for r in records)


def test_a_gpu_that_cannot_lock_clocks_ends_the_run_in_one_line_that_says_so(
    tmp_path: Path,
    metrics_server: MetricsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A board whose driver refuses locked clocks (NOT_SUPPORTED: a pre-Volta or consumer
    board, some virtual GPUs) ended the run with NVML's words alone, `lock clocks to
    1410,1410 MHz failed: Not Supported`; the line now says what that means and what is
    left (exit 4, one write tried, no retry)."""
    import gpugov.daemon.node_cli as node_cli

    fake = node_commands_on(monkeypatch, FakeNvml(1))
    fake.fail("nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_NOT_SUPPORTED, times=None)
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{tmp_path / "state"}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
        '[domains.controller]\nkind = "fixed"\nclock_mhz = 1410\n'
    )
    assert node_cli.main(["run", "--config", str(config)]) == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == (
        "gpugov: error: GPU 0: lock clocks to 1410,1410 MHz failed: Not Supported (NVML "
        "code 3): this GPU or its driver does not lock SM clocks (nvmlDeviceSetGpuLockedClocks "
        "needs a Volta or newer GPU, and some boards and virtual GPUs refuse it): gpugov "
        "cannot govern it; `gpugov run --dry-run` observes it"
    )
    assert fake.calls["nvmlDeviceSetGpuLockedClocks"] == 1


def test_the_fake_has_every_nvml_error_code_and_class_pynvml_has() -> None:
    """The fake stopped at NO_DATA (21): NOT_READY, GPU_NOT_FOUND, FREQ_NOT_SUPPORTED and
    the other codes nvidia-ml-py defines (and ``daemon/errors.py`` maps) could not be
    raised as their own ``NVMLError_*`` class, as the real module raises them."""
    pynvml = pytest.importorskip("pynvml")
    real = {n: v for n, v in vars(pynvml).items() if n.startswith("NVML_ERROR_")}
    fake = {n: v for n, v in vars(fp).items() if n.startswith("NVML_ERROR_")}
    assert fake == real
    for name, code in real.items():
        class_name = type(pynvml.NVMLError(code)).__name__
        assert type(fp.NVMLError(code)).__name__ == class_name, name
        assert getattr(fp, class_name)().value == code
    for code in set(real.values()) - set(pynvml.NVMLError._errcode_to_string):
        assert str(fp.NVMLError(code)) == f"NVML Error with code {code}"  # pynvml, no driver
