"""One contract, every GPU backend: the :class:`~gpugov.daemon.backend.GpuBackend` protocol's
docstring, checked against NVML (fake ``pynvml``), nvidia-smi (fake runner), the emulated
GPU (a real ``gpugov emulate`` server on loopback), the simulated plant, the split mode's
backends (writes through an in-process ``gpugov actuator`` on a Unix socket, and through a
fake zeusd on loopback), and the dry run around NVML and around the emulated GPU.

Each backend comes as a :class:`BackendCase`: the backend plus the few hooks a contract
test needs (let GPU time pass, count the writes the hardware received, inject a fault).
Adding a backend is one more case in :func:`case`; every test then runs against it.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import fake_pynvml as fp
import pytest
from fake_nvidia_smi import FakeNvidiaSmi
from fake_pynvml import FakeNvml
from fake_zeusd import FakeZeusd
from synthetic import make_plant

from gpugov.daemon.actuator_client import ActuatorBackend, ActuatorClient
from gpugov.daemon.actuator_server import ActuatorServer
from gpugov.daemon.backend import (
    DryRunBackend,
    GpuBackend,
    GpuSample,
    PowerLimitBackend,
    power_limit_backend,
)
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.errors import (
    GpuError,
    GpuLost,
    GpuUnavailable,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.nvidia_smi import NvidiaSmiBackend
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.simulated import SimulatedBackend, SimulatedNode
from gpugov.daemon.zeusd import ZeusdBackend, ZeusdClient
from gpugov.plant import PlantSimulation
from gpugov.plant.types import Request
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer

APPLICATIONS_CLOCKS_SETTING = 0x2
SETTLE_S = 0.1
"""GPU time for a lock to take effect (the plants' actuation delay is 20 ms)."""

CASES = (
    "nvml",
    "nvidia-smi",
    "emulated",
    "simulated",
    "actuator",
    "zeusd",
    "dry-run-nvml",
    "dry-run-emulated",
)
FAULTS = ("no-permission", "not-supported", "lost", "timeout")
"""Faults on a lock (and, lost, on every call); ``read-timeout`` is one failed read."""


class ManualClock:
    """A clock the test moves (seconds); shared by a backend and the GPU behind it."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s


@dataclass
class BackendCase:
    """One backend under test and the hooks the contract tests need.

    ``advance(seconds)`` lets GPU time pass (a lock's actuation delay, the energy counter);
    ``hardware_writes()`` counts the lock and reset writes the GPU received; ``faults``
    injects a failure by name (:data:`FAULTS`; absent: this backend cannot fail that way);
    ``identity`` is the ``(uuid, name)`` the backend should report, None where it names no
    GPU; ``open_missing`` opens a GPU that does not exist.
    """

    backend: GpuBackend
    advance: Callable[[float], None]
    hardware_writes: Callable[[], int]
    faults: Mapping[str, Callable[[], None]] = field(default_factory=dict)
    identity: tuple[str, str] | None = None
    open_missing: Callable[[], GpuBackend] | None = None
    dry_run: bool = False


# ------------------------------------------------------------------------ the cases
def _nvml_case() -> BackendCase:
    """NvmlBackend on a fake pynvml with one H100; its energy counter moves as time passes."""
    nvml = FakeNvml(1)
    gpu = nvml.gpus[0]

    def advance(seconds: float) -> None:
        gpu.energy_mj += int(gpu.power_mw * seconds)  # mW x s = mJ

    return BackendCase(
        backend=NvmlBackend(0, nvml=nvml),
        advance=advance,
        hardware_writes=lambda: len(nvml.writes),
        faults={
            "no-permission": lambda: setattr(nvml, "permission", False),
            "not-supported": lambda: nvml.fail(
                "nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_NOT_SUPPORTED, times=None
            ),
            "lost": lambda: nvml.lose(0),
            "timeout": lambda: nvml.fail(
                "nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_TIMEOUT, times=None
            ),
            "read-timeout": lambda: nvml.fail(
                "nvmlDeviceGetTemperatureV", fp.NVML_ERROR_TIMEOUT, times=1
            ),
        },
        identity=(gpu.uuid, gpu.name),
        open_missing=lambda: NvmlBackend(5, nvml=nvml),
    )


def _nvidia_smi_case() -> BackendCase:
    """NvidiaSmiBackend on a fake nvidia-smi runner with one GPU."""
    smi = FakeNvidiaSmi(1)

    def lock_unsupported() -> None:
        smi.gpus[0].lock_supported = False

    def time_out(commands: int) -> Callable[[], None]:
        return lambda: setattr(smi, "timeouts", commands)

    return BackendCase(
        backend=NvidiaSmiBackend(0, runner=smi),
        advance=lambda seconds: None,  # locks apply at once; nvidia-smi has no energy counter
        hardware_writes=lambda: len(smi.writes),
        faults={
            "no-permission": lambda: setattr(smi, "permission", False),
            "not-supported": lock_unsupported,
            "lost": lambda: smi.lose(0),
            "timeout": time_out(1_000),
            "read-timeout": time_out(1),
        },
        open_missing=lambda: NvidiaSmiBackend(5, runner=smi),
    )


def _emulated_case(server: EmulatorServer, clock: ManualClock) -> BackendCase:
    """EmulatedBackend on the module's emulator, GPU 0; the emulator's writes are counted."""
    state = server.node.gpu_state[0]
    backend = EmulatedBackend(0, emulator=server.url, timeout_s=5.0)
    writes = [0]
    lock, reset = server.node.lock_clocks, server.node.reset_clocks

    def advance(seconds: float) -> None:
        clock.now_s += seconds

    def count_writes() -> int:
        return writes[0]

    def counted(write: Callable[..., int]) -> Callable[..., int]:
        def call(*args: int) -> int:
            code = write(*args)
            writes[0] += code == 0
            return code

        return call

    server.node.lock_clocks = counted(lock)  # type: ignore[method-assign]
    server.node.reset_clocks = counted(reset)  # type: ignore[method-assign]
    return BackendCase(
        backend=backend,
        advance=advance,
        hardware_writes=count_writes,
        faults={
            "no-permission": lambda: setattr(state, "fault", "no-permission"),
            "not-supported": lambda: setattr(state, "fault", "not-supported"),
            "lost": lambda: setattr(state, "fault", "lost"),
        },
        identity=(str(server.node.gpu_info(0)["uuid"]), str(server.node.gpu_info(0)["name"])),
        open_missing=lambda: EmulatedBackend(5, emulator=server.url, timeout_s=5.0),
    )


def _nvml_faults(nvml: FakeNvml, *, lost: bool = True) -> dict[str, Callable[[], None]]:
    """The NVML faults, injected behind a backend that writes through another process."""
    faults: dict[str, Callable[[], None]] = {
        "no-permission": lambda: setattr(nvml, "permission", False),
        "not-supported": lambda: nvml.fail(
            "nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_NOT_SUPPORTED, times=None
        ),
        "timeout": lambda: nvml.fail(
            "nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_TIMEOUT, times=None
        ),
        "read-timeout": lambda: nvml.fail(
            "nvmlDeviceGetTemperatureV", fp.NVML_ERROR_TIMEOUT, times=1
        ),
    }
    if lost:
        faults["lost"] = lambda: nvml.lose(0)
    return faults


def _actuator_case(folder: Path) -> BackendCase:
    """ActuatorBackend: NVML reads, writes through an in-process ``gpugov actuator`` on
    a real Unix socket (its NVML the same fake); closing the backend stops the server."""
    nvml = FakeNvml(1)
    path = folder / "a.sock"
    server_gpu = NvmlBackend(0, nvml=nvml)
    server = ActuatorServer([server_gpu], str(path), str(os.getuid()), min_relock_s=0.0)
    server.listen()
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop.is_set,))
    thread.start()

    def release(client: ActuatorClient) -> None:
        client.close()
        stop.set()
        thread.join(10)
        server.close()
        server_gpu.close()

    client = ActuatorClient(str(path), timeout_s=5.0)
    gpu = nvml.gpus[0]
    return BackendCase(
        backend=ActuatorBackend(NvmlBackend(0, nvml=nvml), client, release=release),
        advance=lambda seconds: None,  # the fake applies a lock at once
        hardware_writes=lambda: len(nvml.writes),
        faults=_nvml_faults(nvml),
        identity=(gpu.uuid, gpu.name),
        open_missing=lambda: ActuatorBackend(NvmlBackend(5, nvml=nvml), client),
    )


def _zeusd_case() -> BackendCase:
    """ZeusdBackend: NVML reads, writes through a fake zeusd on loopback driving the
    same fake NVML. zeusd reports a lost GPU as a server error, so "lost" is the
    reader's alone and not injected here."""
    nvml = FakeNvml(1)
    zeusd = FakeZeusd(nvml)

    class Closing(ZeusdBackend):
        def close(self) -> None:
            super().close()
            zeusd.close()

    gpu = nvml.gpus[0]
    client = ZeusdClient(url=zeusd.url, timeout_s=5.0)
    return BackendCase(
        backend=Closing(NvmlBackend(0, nvml=nvml), client),
        advance=lambda seconds: None,
        hardware_writes=lambda: len(nvml.writes),
        faults=_nvml_faults(nvml, lost=False),
        identity=(gpu.uuid, gpu.name),
        open_missing=lambda: ZeusdBackend(NvmlBackend(5, nvml=nvml), client),
    )


def _simulated_case() -> BackendCase:
    """SimulatedBackend on a plant under steady load, driven by a manual clock."""
    clock = ManualClock(1.0)
    # A steady stream of requests, so the plant is busy and its time moves with the clock.
    workload = tuple(
        Request(request_id=i, arrival_time_s=0.25 * i, prompt_tokens=500, output_tokens=200)
        for i in range(4_000)
    )
    node = SimulatedNode(PlantSimulation(workload, make_plant()), clock)
    backend = SimulatedBackend(node)

    def advance(seconds: float) -> None:
        clock.now_s += seconds

    return BackendCase(
        backend=backend,
        advance=advance,
        hardware_writes=lambda: len(backend.locks) + backend.resets,
    )


def _dry_run(inner: BackendCase) -> BackendCase:
    """The dry run around ``inner``: the same GPU, hooks and faults."""
    return BackendCase(
        backend=DryRunBackend(inner.backend),
        advance=inner.advance,
        hardware_writes=inner.hardware_writes,
        faults=inner.faults,
        identity=inner.identity,
        dry_run=True,
    )


@pytest.fixture(scope="module")
def emulator() -> Iterator[tuple[EmulatorServer, ManualClock]]:
    """One ``gpugov emulate`` server for the module, its plant time moved by the tests."""
    clock = ManualClock()
    server = EmulatorServer(EmulatedNode(make_plant(), clock=clock, tick_s=0.05), "127.0.0.1", 0)
    server.start()
    try:
        yield server, clock
    finally:
        server.close()


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> Iterator[BackendCase]:
    """Each backend in turn, fresh (the emulator's GPU is put back after the test)."""
    name = request.param
    emulated = name.endswith("emulated")
    if name in ("nvml", "dry-run-nvml"):
        built = _nvml_case()
    elif name == "nvidia-smi":
        built = _nvidia_smi_case()
    elif name == "simulated":
        built = _simulated_case()
    elif name == "actuator":
        folder = Path(tempfile.mkdtemp(prefix="gpugov-", dir="/tmp"))  # a short socket path
        request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
        built = _actuator_case(folder)
    elif name == "zeusd":
        built = _zeusd_case()
    else:
        server, clock = request.getfixturevalue("emulator")
        built = _emulated_case(server, clock)
    if name.startswith("dry-run"):
        built = _dry_run(built)
    try:
        yield built
    finally:
        built.backend.close()
        if emulated:
            server, clock = request.getfixturevalue("emulator")
            node = server.node
            for write in ("lock_clocks", "reset_clocks"):
                vars(node).pop(write, None)  # the counting wrappers
            node.gpu_state[0].fault = "none"
            node.reset_clocks(0)
            clock.now_s += SETTLE_S  # the reset takes effect before the next test


# ---------------------------------------------------------------------- helpers
def _settled_sample(case: BackendCase) -> GpuSample:
    """A sample after a lock's actuation delay."""
    case.advance(SETTLE_S)
    return case.backend.sample()


def _middle_clock(clocks: tuple[int, ...]) -> int:
    """A supported clock well below the top."""
    return clocks[len(clocks) // 2]


def _shows_lock(sample: GpuSample) -> bool | None:
    """ApplicationsClocksSetting in the event reasons; None where they are not reported."""
    if sample.clock_event_reasons is None:
        return None
    return bool(sample.clock_event_reasons & APPLICATIONS_CLOCKS_SETTING)


# ---------------------------------------------------------------------- identity
def test_is_a_gpu_backend_with_a_label(case: BackendCase) -> None:
    assert isinstance(case.backend, GpuBackend)
    label = case.backend.label
    assert isinstance(label, str) and label
    assert case.backend.sample().gpu == label


def test_names_its_gpu_where_it_knows_it(case: BackendCase) -> None:
    if case.identity is None:
        pytest.skip("this backend does not name its GPU (no uuid/name)")
    uuid = getattr(case.backend, "uuid", None)
    name = getattr(case.backend, "name", None)
    assert (uuid, name) == case.identity
    assert uuid.startswith(("GPU-", "MIG-"))


# ---------------------------------------------------------------------- reads
def test_supported_clocks_are_positive_ints_ascending(case: BackendCase) -> None:
    clocks = case.backend.supported_clocks_mhz()
    assert isinstance(clocks, tuple) and clocks
    assert all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in clocks)
    assert list(clocks) == sorted(set(clocks))
    assert case.backend.supported_clocks_mhz() == clocks


def test_sample_is_in_base_units(case: BackendCase) -> None:
    top = case.backend.supported_clocks_mhz()[-1]
    sample = case.backend.sample()
    assert isinstance(sample, GpuSample)
    for name in ("power_w", "energy_j", "temperature_c", "sm_clock_mhz", "power_limit_w"):
        value = getattr(sample, name)
        assert value is None or (isinstance(value, float | int) and math.isfinite(value)), name
    # Watts, not milliwatts; Celsius, not millidegrees or kelvin; MHz, not Hz.
    assert sample.power_w is None or 0.0 <= sample.power_w < 2_000.0
    assert sample.power_limit_w is None or 10.0 <= sample.power_limit_w < 2_000.0
    assert sample.temperature_c is None or -40.0 <= sample.temperature_c < 130.0
    assert sample.sm_clock_mhz is None or 0.0 < sample.sm_clock_mhz <= top
    assert sample.energy_j is None or sample.energy_j >= 0.0
    assert sample.utilization is None or 0.0 <= sample.utilization <= 1.0
    assert sample.clock_event_reasons is None or sample.clock_event_reasons >= 0
    assert isinstance(sample.read_errors, tuple)
    assert all(isinstance(name, str) for name in sample.read_errors)


def test_energy_counter_never_decreases(case: BackendCase) -> None:
    first = case.backend.sample()
    case.advance(2.0)
    second = case.backend.sample()
    if first.energy_j is None or second.energy_j is None:
        assert first.energy_j is None and second.energy_j is None  # consistently absent
        return
    assert second.energy_j >= first.energy_j


# ---------------------------------------------------------------------- writes
def test_lock_reads_back(case: BackendCase, caplog: pytest.LogCaptureFixture) -> None:
    clocks = case.backend.supported_clocks_mhz()
    target = _middle_clock(clocks)
    before = case.backend.sample()
    with caplog.at_level(logging.INFO):
        case.backend.lock_clocks(target, target)
    after = _settled_sample(case)
    if case.dry_run:
        assert isinstance(case.backend, DryRunBackend)
        assert case.backend.writes[-1] == ("lock", target, target)
        assert "would lock" in caplog.text
        assert case.hardware_writes() == 0
        assert after.sm_clock_mhz == before.sm_clock_mhz
        return
    assert case.hardware_writes() == 1
    assert after.sm_clock_mhz == target
    assert _shows_lock(after) in (True, None)


def test_top_lock_and_reset(case: BackendCase) -> None:
    clocks = case.backend.supported_clocks_mhz()
    top = clocks[-1]
    case.backend.lock_clocks(top, top)
    at_top = _settled_sample(case)
    case.backend.lock_clocks(clocks[0], clocks[0])
    case.backend.reset_clocks()
    reset = _settled_sample(case)
    if case.dry_run:
        assert isinstance(case.backend, DryRunBackend)
        assert list(case.backend.writes)[-3:] == [
            ("lock", top, top),
            ("lock", clocks[0], clocks[0]),
            ("reset",),
        ]
        assert case.hardware_writes() == 0
        return
    assert at_top.sm_clock_mhz == top
    assert _shows_lock(at_top) in (False, None)
    assert reset.sm_clock_mhz == top
    assert _shows_lock(reset) in (False, None)
    assert case.hardware_writes() == 3


@pytest.mark.parametrize("offset", ["above", "below"])
def test_lock_outside_the_supported_range_is_refused_or_clamped(
    case: BackendCase, offset: str
) -> None:
    clocks = case.backend.supported_clocks_mhz()
    asked = clocks[-1] + 1_000 if offset == "above" else max(1, clocks[0] // 2)
    try:
        case.backend.lock_clocks(asked, asked)
    except GpuError as error:
        assert not case.dry_run, "a dry run writes nothing, so it refuses nothing"
        assert type(error) in (GpuError, NotSupported)
        return
    reading = _settled_sample(case).sm_clock_mhz
    assert reading is None or clocks[0] <= reading <= clocks[-1]
    if not case.dry_run and reading is not None:
        assert reading == (clocks[-1] if offset == "above" else clocks[0])


def test_min_above_max_is_refused(case: BackendCase) -> None:
    clocks = case.backend.supported_clocks_mhz()
    held = _middle_clock(clocks)
    case.backend.lock_clocks(held, held)
    if case.dry_run:
        case.backend.lock_clocks(clocks[-1], clocks[0])  # records it; nothing is written
        assert case.hardware_writes() == 0
        return
    with pytest.raises(GpuError) as raised:
        case.backend.lock_clocks(clocks[-1], clocks[0])
    assert type(raised.value) is GpuError
    assert _settled_sample(case).sm_clock_mhz == held  # the lock held before stays


# ---------------------------------------------------------------------- close
def test_a_power_limit_reads_back_in_watts_where_the_backend_sets_one(
    case: BackendCase, caplog: pytest.LogCaptureFixture
) -> None:
    limited = power_limit_backend(case.backend)
    if limited is None:
        assert not isinstance(case.backend, PowerLimitBackend) or isinstance(
            case.backend, DryRunBackend
        )
        pytest.skip("this backend locks clocks only (a cap controller is refused with it)")
    before = limited.power_limit_w()
    constraints = limited.power_limit_constraints_w()
    assert constraints is not None
    lowest, highest = constraints
    assert 0.0 < lowest < highest < 2_000.0  # watts, not milliwatts
    assert lowest <= before <= highest
    target = round((lowest + highest) / 2.0)
    writes = case.hardware_writes()
    with caplog.at_level(logging.INFO):
        limited.set_power_limit(target)
    if case.dry_run:
        assert "would set the power limit" in caplog.text
        assert case.hardware_writes() == writes
        assert limited.power_limit_w() == before
        return
    assert limited.power_limit_w() == pytest.approx(target)
    limited.set_power_limit(before)
    assert limited.power_limit_w() == pytest.approx(before)


def test_close_is_idempotent_and_final(case: BackendCase) -> None:
    top = case.backend.supported_clocks_mhz()[-1]
    case.backend.close()
    case.backend.close()
    calls: dict[str, Callable[[], object]] = {
        "sample": case.backend.sample,
        "supported_clocks_mhz": case.backend.supported_clocks_mhz,
        "lock_clocks": lambda: case.backend.lock_clocks(top, top),
        "reset_clocks": case.backend.reset_clocks,
    }
    for name, call in calls.items():
        try:
            call()
        except GpuUnavailable as error:
            assert "closed" in str(error), name
        else:
            pytest.fail(f"{name}() on a closed backend did not raise GpuUnavailable")
    assert case.hardware_writes() == 0


# ---------------------------------------------------------------------- errors
def test_a_gpu_that_does_not_exist_is_unavailable(case: BackendCase) -> None:
    if case.open_missing is None:
        pytest.skip("this backend cannot name a GPU that does not exist")
    with pytest.raises(GpuUnavailable):
        missing = case.open_missing()
        missing.supported_clocks_mhz()  # a backend that opens lazily fails on first use


@pytest.mark.parametrize("fault", FAULTS)
def test_failures_become_the_daemons_errors(case: BackendCase, fault: str) -> None:
    if fault not in case.faults:
        pytest.skip(f"this backend cannot be made to fail with {fault!r}")
    backend = case.backend
    top = backend.supported_clocks_mhz()[-1]
    case.faults[fault]()
    if fault == "lost":
        with pytest.raises(GpuLost):
            backend.sample()  # reads go through a dry run too
        if not case.dry_run:
            with pytest.raises(GpuLost):
                backend.lock_clocks(top, top)
        return
    if case.dry_run:
        backend.lock_clocks(top, top)  # never written, so never refused
        backend.reset_clocks()
        assert case.hardware_writes() == 0
        return
    expected: type[GpuError] = {
        "no-permission": PermissionDenied,
        "not-supported": NotSupported,
        "timeout": TransientGpuError,
    }[fault]
    with pytest.raises(expected):
        backend.lock_clocks(top, top)
    if fault == "no-permission":
        with pytest.raises(PermissionDenied, match="root or CAP_SYS_ADMIN"):
            backend.reset_clocks()
    assert case.hardware_writes() == 0


def test_a_transient_read_failure_is_counted_not_fatal(case: BackendCase) -> None:
    if "read-timeout" not in case.faults:
        pytest.skip("this backend's reads cannot be made to time out")
    case.faults["read-timeout"]()
    try:
        failed = case.backend.sample()
    except TransientGpuError:
        pass  # the whole reading failed: the observer counts it and goes on
    else:
        assert failed.read_errors, "a failed read must be named in read_errors"
        for name in failed.read_errors:
            assert getattr(failed, f"{name}_c", getattr(failed, name, None)) is None, name
    again = case.backend.sample()  # the next tick reads again
    assert again.read_errors == () and again.sm_clock_mhz is not None
