"""One governor per GPU on a node (``daemon.gpu_hold``): a second run on a GPU another
gpugov holds stops before any write, naming the GPU and the holder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fake_pynvml import FakeNvml

from gpugov.daemon.config import parse_config
from gpugov.daemon.gpu_hold import SCOPE_ENV, GpuHeld, hold_gpu, holder_of, release
from gpugov.daemon.service import domains_from_config

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's"
)


def test_a_held_gpu_is_refused_naming_the_holder_and_free_again_once_let_go() -> None:
    first = hold_gpu("GPU-aa", "nvml", named="0")
    assert first is not None
    with pytest.raises(GpuHeld) as held:
        hold_gpu("GPU-aa", "nvml", named="0")
    assert str(held.value).startswith(
        f"GPU 0 (GPU-aa) is held by another gpugov on this node (pid {os.getpid()} ("
    )
    assert held.value.holder.startswith(f"pid {os.getpid()}")
    # Another GPU, and the same GPU through a split-mode writer, are told apart by UUID.
    other = hold_gpu("GPU-bb", "nvml", named="GPU-bb")
    with pytest.raises(GpuHeld, match=r"^GPU GPU-aa is held"):
        hold_gpu("GPU-aa", "actuator", named="GPU-aa")
    release([first])
    again = hold_gpu("GPU-aa", "actuator", named="0")
    release([again, other])  # type: ignore[list-item]


def test_emulated_gpus_are_held_per_emulator_and_simulated_ones_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = hold_gpu("GPU-emu-0", "emulated", named="0", emulator="http://127.0.0.1:8000")
    # The same UUID behind another emulator is another GPU.
    two = hold_gpu("GPU-emu-0", "emulated", named="0", emulator="http://127.0.0.1:8001")
    with pytest.raises(GpuHeld):
        hold_gpu("GPU-emu-0", "emulated", named="0", emulator="http://127.0.0.1:8000/")
    assert hold_gpu("GPU-sim-0", "simulated", named="0") is None
    # Another scope is another set of holds (two fake nodes on one machine).
    monkeypatch.setenv(SCOPE_ENV, "elsewhere")
    three = hold_gpu("GPU-emu-0", "emulated", named="0", emulator="http://127.0.0.1:8000")
    release([h for h in (one, two, three) if h is not None])


def _config(state_dir: Path, gpus: list[int], name: str = "llm") -> object:
    return parse_config(
        {
            "daemon": {"period_s": 0.25, "state_dir": str(state_dir)},
            "domains": [
                {
                    "name": name,
                    "gpus": gpus,
                    "engine": {"url": "http://127.0.0.1:9/metrics"},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                }
            ],
        }
    )


def test_a_second_daemon_with_its_own_state_directory_is_refused_before_any_write(
    tmp_path: Path,
) -> None:
    """Two daemons, each with its own ``daemon.state_dir`` (a second unit, a run by hand
    beside the unit), on one GPU: the state directory's hold could not see it, and both
    locked the GPU, each undoing the other's clock. The second is refused naming the
    domain, the GPU and the holder, before it writes anything; once the first has gone,
    a start takes the GPU; a dry run (which writes nothing) may watch beside it."""
    fake = FakeNvml(2)
    first = domains_from_config(_config(tmp_path / "a", [0, 1]), nvml=fake)  # type: ignore[arg-type]
    try:
        with pytest.raises(GpuHeld) as held:
            domains_from_config(_config(tmp_path / "b", [1], "other"), nvml=fake)  # type: ignore[arg-type]
        assert str(held.value).startswith(
            "domain 'other': gpus: GPU 1 (GPU-fake-0001) is held by another gpugov on this "
            f"node (pid {os.getpid()} ("
        )
        assert str(held.value).endswith(
            "two governors would fight over its clocks; stop the other one (systemctl stop "
            "gpugov) or give this one other GPUs"
        )
        assert fake.calls.get("nvmlDeviceSetGpuLockedClocks", 0) == 0
        assert fake.calls.get("nvmlDeviceResetGpuLockedClocks", 0) == 0
        watching = domains_from_config(
            _config(tmp_path / "c", [1]),  # type: ignore[arg-type]
            nvml=fake,
            dry_run=True,
        )
        watching.close()
    finally:
        first.close()
    domains_from_config(_config(tmp_path / "b", [1], "other"), nvml=fake).close()  # type: ignore[arg-type]


def test_the_holder_is_told_to_every_probe_and_no_one_once_let_go() -> None:
    """A hold listened and never took a connection: each probe's stayed queued, and past
    the listen queue (about nine) a probe read 'pid unknown', then no holder at all.
    Released, the GPU can be held again at once."""
    held = hold_gpu("GPU-cc", "nvml", named="0")
    assert held is not None
    try:
        for _ in range(30):
            holder = holder_of("GPU-cc", "nvml")
            assert holder is not None and holder.startswith(f"pid {os.getpid()} (")
    finally:
        release([held])
    assert holder_of("GPU-cc", "nvml") is None
    for _ in range(20):
        again = hold_gpu("GPU-cc", "nvml", named="0")
        assert again is not None
        release([again])
