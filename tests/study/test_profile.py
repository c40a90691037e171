"""``gpugov profile`` against ``gpugov emulate``: the written profile matches the emulated
truth on profiles of very different shapes; resume, dry run and bad input."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from study_support import (
    SMALL_BATCH,
    SMALL_CONTEXT,
    small_sweep_settings,
    start_emulator_process,
)
from synthetic import make_profile

from gpugov.cli import main
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.lockstate import LockState
from gpugov.plant import PerformanceProfile, ServingPlant, load_profile
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.accuracy import compare, memory_bound_profile, write_profile_files
from gpugov.study.profiler.sweep import Interrupted, Sweep, SweepSettings, default_decode_points
from gpugov.study.profiler.write import write_profile


@contextlib.contextmanager
def emulator_process(profile: PerformanceProfile, directory: Path) -> Iterator[str]:
    """``gpugov emulate`` in its own process (as on a node: the profiler and the emulator
    do not share an interpreter); yields its URL."""
    process, url = start_emulator_process(write_profile_files(profile, directory))
    try:
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _gpu_sample(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/gpu/0/sample", timeout=5) as response:
        return json.loads(response.read())


def _server(profile: PerformanceProfile) -> EmulatorServer:
    plant = ServingPlant.from_profile(
        profile,
        power_limit_w=1000.0,
        thermal_limit_c=95.0,
        ambient_temperature_c=30.0,
        thermal_resistance_c_per_w=0.05,
        thermal_time_constant_s=30.0,
    )
    server = EmulatorServer(EmulatedNode(plant), "127.0.0.1", 0)
    server.start()
    return server


@pytest.fixture
def synthetic_emulator() -> Iterator[EmulatorServer]:
    server = _server(make_profile())
    yield server
    server.close()


def _profile(url: str, out: Path, *extra: str) -> int:
    return main(
        [
            "profile",
            "--engine-url",
            url,
            "--gpus",
            "0",
            "--backend",
            "emulated",
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("truth_factory", "clocks", "reference"),
    [
        (make_profile, "1980,1290,600", ("32", "1024")),
        (memory_bound_profile, "1500,1050,600", ("32", "2048")),
    ],
    ids=["h100-like", "memory-bound"],
)
def test_profile_matches_the_emulated_truth(
    truth_factory: Any, clocks: str, reference: tuple[str, str], tmp_path: Path
) -> None:
    truth = truth_factory()
    with emulator_process(truth, tmp_path) as url:
        code = _profile(
            url,
            tmp_path,
            "--clock-list",
            clocks,
            "--dwell",
            "0.5",
            "--name",
            "measured",
            "--reference-batch",
            reference[0],
            "--reference-context",
            reference[1],
        )
        assert code == 0
        time.sleep(0.1)
        sample = _gpu_sample(url)  # reset at the end: no lock, back at the top clock
        assert not sample["clock_event_reasons"] & 0x2
        assert sample["sm_clock_mhz"] == round(truth.realized_clock(truth.clock_mhz[-1]))
    measured = load_profile(tmp_path / "measured.json")
    assert measured.profile_status == "emulated" and not measured.is_measured
    assert measured.manifest["measured_clocks_mhz"] == sorted(int(c) for c in clocks.split(","))
    report = compare(measured, truth)
    for row in report["rows"]:
        assert row["median_abs_error"] < 0.05, row
        assert row["worst_abs_error"] < 0.15, row
    fits = measured.manifest["fits"]["per_clock"]
    # The fits are reported with their R^2; on a loaded machine (client and emulator
    # share two cores with other work) token timings jitter, so only ask that the
    # latency model explains most of the variance.
    assert all(0.5 < f["decode_model"]["r_squared"] <= 1.0 for f in fits)
    assert all(f["prefill_slope_r_squared"] > 0.99 for f in fits)
    selection = measured.manifest["clock_profile_selection"]
    realized = selection["realized_clock_median_mhz_by_requested"]
    for clock in clocks.split(","):
        assert realized[clock] == pytest.approx(truth.realized_clock(float(clock)), abs=1.0)


# The tests below check the sweep's bookkeeping (reset, resume, dry run, refusal), not its
# accuracy: they measure around a smaller decode reference than the default 64 x 1024,
# whose design points need about ten times the prompt tokens prefilled at every clock; the
# two that measure a whole sweep take 1290 MHz as their low clock, not 600, where the same
# points take about twice as long in real time.
SMALL_REFERENCE = ("--reference-batch", str(SMALL_BATCH), "--reference-context", str(SMALL_CONTEXT))


def _settings(dwell: float) -> SweepSettings:
    """What ``_profile(..., "--clock-list", "1980,1290", "--dwell", DWELL, *SMALL_REFERENCE)``
    sweeps (``--resume`` compares them)."""
    return small_sweep_settings(dwell)  # type: ignore[no-any-return]


def test_interrupted_sweep_resets_and_resumes(
    synthetic_emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = synthetic_emulator.url
    backend = EmulatedBackend(0, emulator=url)
    stop = threading.Event()
    state_dir = tmp_path / "state"
    sweep = Sweep(
        [backend],
        url,
        "gpugov-emulated",
        _settings(0.5),
        tmp_path,
        stop=stop,
        progress_enabled=False,
        lock_state=LockState(state_dir),
    )
    with pytest.raises(Interrupted):
        sweep.run(check_load=lambda record: stop.set())
    backend.close()
    assert synthetic_emulator.node.gpu_state[0].locked is None
    assert LockState(state_dir).read() == {}  # the interrupt's reset removed its entry
    lines = [json.loads(line) for line in (tmp_path / "sweep-state.jsonl").read_text().splitlines()]
    assert [row["clock_mhz"] for row in lines if row["kind"] == "clock"] == [1980]
    first = lines[1]
    state = tmp_path / "sweep-state.jsonl"
    kept = state.read_text()
    flags = ("--clock-list", "1980,1290", "--dwell", "0.5", *SMALL_REFERENCE)
    state_flag = ("--state-dir", str(state_dir))
    (state_dir / "locks.json").unlink()  # what the resumed run writes
    # Without --resume a sweep that measured clocks is refused, not wiped.
    assert _profile(url, tmp_path, *flags, "--name", "fresh") == 2
    assert state.read_text() == kept
    # A damaged record is refused by line and field, before any clock is set.
    damaged = dict(first, prefill={**first["prefill"], "tokens_per_s": "x"})
    state.write_text(json.dumps(lines[0]) + "\n" + json.dumps(damaged) + "\n")
    assert _profile(url, tmp_path, *flags, "--resume") == 2
    assert synthetic_emulator.node.gpu_state[0].locked is None
    state.write_text(kept + '{"kind": "clock", "clock_mhz": 6')  # a torn last write: ignored
    capsys.readouterr()
    code = _profile(url, tmp_path, *flags, "--resume", "--name", "resumed", *state_flag)
    assert code == 0
    assert "no --state-dir" not in capsys.readouterr().err  # recorded: no warning
    # The lock of the clock it measured was recorded; the end's reset removed its entry,
    # and the state directory was let go.
    assert json.loads((state_dir / "locks.json").read_text())["gpus"] == {}
    LockState(state_dir).hold()
    rows = [json.loads(line) for line in (tmp_path / "sweep-state.jsonl").read_text().splitlines()]
    assert [row["clock_mhz"] for row in rows if row["kind"] == "clock"] == [1980, 1290]
    assert rows[1] == first  # the measured clock was kept, not measured again
    assert load_profile(tmp_path / "resumed.json").clock_mhz[-1] == 1980
    code = _profile(url, tmp_path, "--clock-list", "1980,600", *SMALL_REFERENCE, "--resume")
    assert code == 1  # different settings: refused, nothing overwritten


@pytest.mark.parametrize(
    ("signum", "code", "word"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_stopped_sweep_says_how_in_its_exit_line(
    synthetic_emulator: EmulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signum: signal.Signals,
    code: int,
    word: str,
) -> None:
    """Ctrl-C ends ``profile`` with 130, SIGTERM with 143 (it was 130, as ``load``'s
    was), each with one line, after the clocks were reset."""
    import os

    state = tmp_path / "sweep-state.jsonl"

    def stop_once_measuring() -> None:  # the sweep runs (its state file is there)
        deadline = time.monotonic() + 60.0
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    sender = threading.Thread(target=stop_once_measuring, daemon=True)
    sender.start()
    result = _profile(
        synthetic_emulator.url, tmp_path, "--clock-list", "1980,600", "--dwell", "0.5",
        *SMALL_REFERENCE,
    )  # fmt: skip
    sender.join()
    assert result == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"gpugov: {word}; clocks reset; rerun with --resume to continue ({tmp_path})"
    assert synthetic_emulator.node.gpu_state[0].locked is None


def test_a_profile_cut_short_mid_write_leaves_the_earlier_one_whole(
    synthetic_emulator: EmulatorServer, tmp_path: Path
) -> None:
    """The CSV and manifest were written in place, one after the other: a write that
    failed midway (here past a file-size limit: the disk full) left a corrupt profile, or
    a new CSV under the old manifest. Both are now replaced together or not at all."""
    from study_support import run_past_file_size

    flags = ("--clock-list", "1980,1290", "--dwell", "0.3", *SMALL_REFERENCE, "--name", "p")
    assert _profile(synthetic_emulator.url, tmp_path, *flags) == 0
    csv, manifest = tmp_path / "p.csv", tmp_path / "p.json"
    before = {path: (path.read_bytes(), path.stat().st_ino) for path in (csv, manifest)}
    limit = len(before[manifest][0]) - 512  # the manifest (its measurements) is past it
    assert len(before[csv][0]) < limit, "the CSV must fit: the manifest's write is cut"
    argv = ["profile", "--engine-url", synthetic_emulator.url, "--gpus", "0", "--backend"]
    argv += ["emulated", "--out", str(tmp_path), "--quiet", *flags, "--resume"]
    # Every clock is in the state file: the resumed run only writes the profile again.
    cut = run_past_file_size(argv, limit_bytes=limit)
    assert cut.returncode == 1, cut.stderr
    assert cut.stderr.splitlines() == [f"gpugov: error: {manifest}: File too large"]
    assert {path: (path.read_bytes(), path.stat().st_ino) for path in before} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "p.csv",
        "p.json",
        "sweep-state.jsonl",
    ]  # no temporary left
    assert load_profile(manifest).manifest["measured_clocks_mhz"] == [1290, 1980]
    assert _profile(synthetic_emulator.url, tmp_path, *flags, "--resume") == 0
    assert manifest.stat().st_ino != before[manifest][1]  # written anew, in one piece
    assert load_profile(manifest).manifest["measured_clocks_mhz"] == [1290, 1980]


def test_dry_run_changes_nothing(
    synthetic_emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = synthetic_emulator.node
    state_dir = tmp_path / "state"
    governor = LockState(state_dir)
    governor.hold()  # a running governor: a dry run, which locks nothing, still runs
    try:
        code = _profile(
            synthetic_emulator.url, tmp_path, "--dry-run", "--dwell", "0.3", *SMALL_REFERENCE,
            "--state-dir", str(state_dir),
        )  # fmt: skip
    finally:
        governor.release()
    assert code == 0
    assert sorted(path.name for path in state_dir.iterdir()) == ["gpugov.lock"]  # untouched
    assert node.gpu_state[0].locked is None and node.simulations[0].requested_clock_mhz == 1980
    record = json.loads((tmp_path / "dry-run.json").read_text())
    assert record["prefill"]["tokens_per_s"] == pytest.approx(20_000.0, rel=0.05)
    assert not (tmp_path / "sweep-state.jsonl").exists()
    assert "changed nothing" in capsys.readouterr().out


def test_unreachable_engine_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new"
    code = _profile("http://127.0.0.1:9", out, "--clocks", "3")
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpugov: error: --engine-url: engine at")
    assert not out.exists()  # a refused run leaves no empty --out directory


@pytest.mark.parametrize("clocks", ["1005,1005", "1005"])
def test_a_clock_list_of_one_clock_is_refused_before_the_engine_is_asked(
    clocks: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One clock (or one given twice) sweeps nothing: known from the flag alone, it is
    refused before any work; the engine URL here answers nothing, and the line is the
    clock list's, not the engine's."""
    out = tmp_path / "new"
    assert _profile("http://127.0.0.1:9", out, "--clock-list", clocks) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--clock-list" in err[0] and "two different clocks" in err[0]
    assert not out.exists()


def test_a_reference_batch_beyond_the_kv_cache_is_refused_before_any_work(
    synthetic_emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--reference-context 100000`` made decode points of 16 sequences of 100k tokens,
    more than the KV cache holds: they never decoded together, and the run (a dry run
    too) failed after about six minutes of retries with exit 1. Now one line, exit 2."""
    out = tmp_path / "new"
    assert _profile(synthetic_emulator.url, out, "--reference-context", "100000") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--reference-context" in err[0] and "KV cache" in err[0], err
    assert not out.exists()
    assert synthetic_emulator.node.gpu_state[0].locked is None


def test_decode_points_leave_room_for_the_longest_retry_output() -> None:
    """A point clamped to the model's length left 128 tokens for outputs its retries
    double to 512: the engine refused the request as longer than the model."""
    output = SweepSettings.decode_output_tokens << 3
    for _, prompt in default_decode_points(64, 200_000, 131_072):
        assert prompt + output <= 131_072


def test_an_emulator_faster_than_real_time_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile measures wall-clock rates: against ``gpugov emulate --speed 4`` every rate
    came out four times the plant's. It is refused in one line, before any clock moves."""
    plant = ServingPlant.from_profile(make_profile())
    server = EmulatorServer(EmulatedNode(plant, speed=4.0), "127.0.0.1", 0)
    server.start()
    try:
        out = tmp_path / "new"
        code = _profile(server.url, out, "--clocks", "3")
        sample = _gpu_sample(server.url)
    finally:
        server.close()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--speed 4" in err[0] and "nothing was changed" in err[0]
    assert not out.exists()
    assert sample["sm_clock_mhz"] == max(make_profile().clock_mhz)  # never locked


def test_no_gpu_leaves_no_out_directory(
    synthetic_emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new"
    code = main(
        ["profile", "--engine-url", synthetic_emulator.url, "--gpus", "7", "--backend",
         "emulated", "--out", str(out), "--quiet"]
    )  # fmt: skip
    assert code == 4
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not out.exists()


def test_model_too_small_to_load_the_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    idle = 100.0 + 22.0 * np.arange(345.0, 1981.0, 15.0) / 1980.0
    truth = make_profile()
    tiny = PerformanceProfile(
        clock_mhz=truth.clock_mhz,
        prefill_tokens_per_s=truth.prefill_tokens_per_s,
        decode_tokens_per_s=truth.decode_tokens_per_s,
        prefill_power_w=idle * 1.01,
        decode_power_w=idle * 1.01,
        idle_power_w=idle,
        ttft_slo_s=1.0,
        tpot_slo_s=0.1,
        manifest=truth.manifest,
        name="tiny",
    )
    server = _server(tiny)
    try:
        code = _profile(
            server.url, tmp_path, "--clock-list", "1980,600", "--dwell", "0.3", *SMALL_REFERENCE
        )
        assert code == 1
        assert server.node.gpu_state[0].locked is None
        assert server.node.simulations[0].requested_clock_mhz == 1980
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()
    # One line for the failure, after the warning that no state directory records the lock.
    assert len(err) == 2 and "too small to load the GPU" in err[1] and "clocks reset" in err[1]
    assert err[0].startswith("gpugov: warning: no --state-dir (nor $STATE_DIRECTORY)")


def _domain_record(clock_mhz: int, gpus: int) -> dict[str, Any]:
    """One clock's sweep record of a ``gpus``-GPU domain (powers summed over its GPUs), as
    the sweep stores it, with too few thermal readings for a fit."""
    scale = clock_mhz / 1980.0
    decode = [
        {
            "batch": batch,
            "context_tokens": batch * 1024,
            "iteration_s": (0.01 + 0.0001 * batch + 1e-7 * batch * 1024) / scale,
            "power_w": gpus * (300.0 + 300.0 * scale),
        }
        for batch in (8, 32, 64, 128)
    ]
    return {
        "clock_mhz": clock_mhz,
        "realized_clock_mhz": clock_mhz,
        "decode": decode,
        "prefill": {"tokens_per_s": 40000.0 * scale, "power_w": gpus * 600.0, "r_squared": 1.0},
        "idle_power_w": gpus * 120.0,
        "thermal": [],
    }


def _written_domain(tmp_path: Path, *, gpus: int = 1, reference_batch: int = 64) -> Path:
    """The manifest ``write_profile`` writes for three clocks of a domain of ``gpus``."""
    return write_profile(
        [_domain_record(clock, gpus) for clock in (990, 1500, 1980)],
        tmp_path,
        name=f"domain{gpus}",
        status="emulated",
        gpu_name="Emulated GPU",
        model="m",
        supported_clocks=[990, 1500, 1980],
        power_limit_w=gpus * 700.0,
        settings={"reference_batch": reference_batch, "reference_context_tokens": 1024},
        command="gpugov profile",
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        kv_capacity_tokens=None,
        backend="emulated",
        tensor_parallel=gpus,
    )


def test_an_unfitted_domain_profile_keeps_its_idle_under_the_thermal_limit(
    tmp_path: Path,
) -> None:
    """Without a thermal fit the profiler wrote one GPU's 0.07 C/W against an 8-GPU
    domain's summed powers: its 960 W idle sat at a steady 97 C over the 87 C limit, and
    the loader refused the profile at the end of the sweep. The default now scales with
    the (summed) power limit."""
    profile = load_profile(_written_domain(tmp_path, gpus=8))
    # The domain's GPU count is its tensor_parallel: a node governing the same eight GPUs
    # with this profile is not told it describes another domain.
    assert profile.tensor_parallel == 8
    thermal = profile.manifest["thermal"]
    steady_at_limit = thermal["ambient_temperature_c"] + (
        thermal["thermal_resistance_c_per_w"] * profile.manifest["power_limit_w"]
    )
    assert steady_at_limit < thermal["thermal_limit_c"]
    assert profile.manifest["thermal_fit_r_squared"] is None


def test_a_profile_measured_past_the_default_batch_bound_loads(tmp_path: Path) -> None:
    """A sweep at ``--reference-batch 512`` wrote vLLM's default 256 as the batch bound, and
    the loader refuses a reference batch above the bound: the engine ran the batch, so the
    profile's bound is at least it."""
    engine = load_profile(_written_domain(tmp_path, reference_batch=512)).manifest["engine"]
    assert (engine["reference_batch_size"], engine["max_batch_size"]) == (512, 512)


def test_a_stopped_dry_run_says_it_changed_nothing(
    synthetic_emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run stopped by SIGTERM said 'clocks reset; rerun with --resume to continue',
    though it locks no clock and ``--resume`` has nothing to continue; it says so now."""
    import os

    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        result = _profile(synthetic_emulator.url, tmp_path, "--dry-run", *SMALL_REFERENCE)
    finally:
        timer.cancel()
    assert result == 143
    err = capsys.readouterr().err.strip().splitlines()
    said = "the dry run changed nothing and wrote nothing"
    assert err[-1] == f"gpugov: terminated; {said} ({tmp_path})"
    assert synthetic_emulator.node.gpu_state[0].locked is None
    assert not (tmp_path / "dry-run.json").exists()


def test_a_dry_run_shows_its_progress(
    synthetic_emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run (a minute at --dwell 5, more at longer dwells) showed no progress at all;
    its measurements (idle, prefill, each decode point) are now its progress's steps."""
    argv = ["profile", "--engine-url", synthetic_emulator.url, "--gpus", "0", "--backend"]
    argv += ["emulated", "--out", str(tmp_path), "--dry-run", "--dwell", "0.3"]
    assert main([*argv, *SMALL_REFERENCE]) == 0
    lines = capsys.readouterr().err.splitlines()
    steps = 2 + len(default_decode_points(SMALL_BATCH, SMALL_CONTEXT, 131_072))
    assert any(line.startswith("profile --dry-run:   0.0% (0/") for line in lines)
    assert lines[-1].startswith(f"profile --dry-run: 100.0% ({steps}/{steps} measurements)")
