"""``gpugov check-config`` against the node (fake NVML): it refuses what ``run`` refuses at
start, with ``run``'s exit code, opens the GPUs read-only, skips the GPU part without a
driver or with ``--offline``, and warns about SLO rules that can never have data."""

from __future__ import annotations

import socket
from pathlib import Path

import fake_pynvml as fp
import pytest
from fake_pynvml import FakeNvml

import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.nvml as nvml_module
from gpugov.daemon.node_check import SLO_ALERTS, SLO_RECORDING_RULES

SLOS = "ttft_slo_s = 1.0\ntpot_slo_s = 0.05\n"
ENGINE = '[domains.engine]\nurl = "http://127.0.0.1:9/metrics"\n'


class LoopStarted(Exception):
    """``run`` got past every start check (the loop is replaced by this)."""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(2)
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: fake)
    monkeypatch.setattr(node_cli, "load_pynvml", lambda: fake)

    def loop(*args: object, **kwargs: object) -> None:
        raise LoopStarted

    monkeypatch.setattr(node_cli, "run", loop)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    return fake


def _write(tmp_path: Path, daemon: str = "", domain: str = "", tables: str = "") -> Path:
    path = tmp_path / "gpugov.toml"
    path.write_text(
        f'[daemon]\nmetrics_address = ""\n{daemon}\n'
        f'[[domains]]\nname = "llm"\ngpus = [0, 1]\n{SLOS}{domain}\n{ENGINE}{tables}'
    )
    return path


def _run_code(path: Path) -> int:
    """What ``run --dry-run`` answers at start: its exit code, or -1 when it got as far
    as the loop."""
    try:
        return node_cli.main(["run", "--config", str(path), "--dry-run"])
    except LoopStarted:
        return -1


REFUSED = {
    "missing GPU index": ("", "gpus = [0, 7]", "", 4),
    "missing GPU UUID": ("", 'gpus = ["GPU-nope"]', "", 4),
    "one GPU by index and by UUID": ("", 'gpus = [0, "GPU-fake-0000"]', "", 2),
    "floor above the top clock": ("", "", "[domains.safety]\nfloor_mhz = 2500\n", 2),
    "fixed clock above the top clock": (
        "",
        "",
        '[domains.controller]\nkind = "fixed"\nclock_mhz = 2500\n',
        2,
    ),
    "fixed clock below the lowest clock": (
        "",
        "",
        '[domains.controller]\nkind = "fixed"\nclock_mhz = 100\n',
        2,
    ),
    "missing plan file": (
        "",
        "",
        '[domains.controller]\nkind = "open-loop"\nplan = "/nonexistent/plan.json"\n',
        2,
    ),
    "unknown mpc profile": ("", "", '[domains.controller]\nkind = "mpc"\nprofile = "nope"\n', 2),
    "unknown prior profile": (
        "period_s = 0.25",
        "",
        '[domains.controller]\nkind = "mpc-online"\nprior_profile = "nope"\n',
        2,
    ),
    "record directory missing": ('record = "/nonexistent/dir/run.jsonl"', "", "", 2),
    "record on a device": ('record = "/dev/zero"', "", "", 2),
    "plan from a device": (
        "",
        "",
        '[domains.controller]\nkind = "open-loop"\nplan = "/dev/zero"\n',
        2,
    ),
    "period under the floor": ("period_s = 1e-9", "", "", 2),
    "empty state directory": ('state_dir = ""', "", "", 2),
    "empty controller state directory": (
        "",
        "",
        '[domains.controller]\nkind = "mpc-online"\nstate_dir = " "\n',
        2,
    ),
    "metrics address not on this host": ('metrics_address = "192.0.2.1:9400"', "", "", 2),
    "power cap below the GPUs' lowest limit": (
        "",
        "",
        '[domains.controller]\nkind = "power-cap"\ncap_w = 10.0\n',
        2,
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_check_config_refuses_what_run_refuses_with_its_exit_code(
    case: str, tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon, gpus, tables, code = REFUSED[case]
    text = _write(tmp_path, daemon=daemon, tables=tables).read_text()
    if gpus:
        text = text.replace("gpus = [0, 1]", gpus)
    path = tmp_path / "case.toml"
    path.write_text(text)
    assert node_cli.main(["check-config", str(path)]) == code
    err = capsys.readouterr().err
    assert err.startswith("gpugov: error: ") and "Traceback" not in err
    assert fake.writes == [] and fake.initialized == 0  # read-only, every handle closed
    assert _run_code(path) == code


PROFILES = Path(__file__).resolve().parents[2] / "profiles"
RECORD_ON_AN_INPUT = {
    "the config file": ("{config}", "", "the config file"),
    "the open-loop plan": (
        "{plan}",
        '[domains.controller]\nkind = "open-loop"\nplan = "{plan}"\n',
        "domain 'llm' controller.plan",
    ),
    "the mpc profile": (
        "{manifest}",
        '[domains.controller]\nkind = "mpc"\nprofile = "{manifest}"\n',
        "domain 'llm' controller.profile",
    ),
    "the mpc profile's CSV": (
        "{csv}",
        '[domains.controller]\nkind = "mpc"\nprofile = "{manifest}"\n',
        "domain 'llm' controller.profile's CSV",
    ),
    "the prior profile": (
        "{manifest}",
        '[domains.controller]\nkind = "mpc-online"\nprior_profile = "{manifest}"\n',
        "domain 'llm' controller.prior_profile",
    ),
    "the power-profile profile's CSV": (
        "{csv}",
        '[domains.controller]\nkind = "power-profile"\nprofile = "{manifest}"\n',
        "domain 'llm' controller.profile's CSV",
    ),
}


@pytest.mark.parametrize("case", sorted(RECORD_ON_AN_INPUT))
def test_a_record_file_the_config_reads_is_refused_by_both(
    case: str, tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """``daemon.record`` on the open-loop plan, a profile or the config itself: check-config
    said OK and run refused only the config file, then overwrote the others."""
    import shutil

    for name in ("h100-sxm-llama3-8b.json", "h100-sxm-llama3-8b.csv"):
        shutil.copy(PROFILES / name, tmp_path / name)
    files = {
        "config": tmp_path / "gpugov.toml",
        "plan": tmp_path / "plan.json",
        "manifest": tmp_path / "h100-sxm-llama3-8b.json",
        "csv": tmp_path / "h100-sxm-llama3-8b.csv",
    }
    files["plan"].write_text("{}\n")
    record, tables, field = RECORD_ON_AN_INPUT[case]
    path = _write(
        tmp_path, daemon=f'record = "{record.format(**files)}"', tables=tables.format(**files)
    )
    kept = {file: file.read_bytes() for file in files.values()}
    line = (
        f"gpugov: error: daemon.record {record.format(**files)}: is {field}, which it would "
        "overwrite"
    )
    _refused_by_both(path, line, capsys)
    assert {file: file.read_bytes() for file in files.values()} == kept


def _refused_by_both(path: Path, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``check-config`` (online and offline) and ``run`` refuse the config at ``path`` with
    ``line``, exit 2."""
    for offline in ([], ["--offline"]):
        assert node_cli.main(["check-config", str(path), *offline]) == 2
        errors = [text for text in capsys.readouterr().err.splitlines() if "error:" in text]
        assert errors[0] == line
    assert _run_code(path) == 2
    assert capsys.readouterr().err.splitlines() == [line]


RECORD_ON_A_STATE_FILE = {
    "the lock record": ("state/locks.json", "", "the lock state file"),
    "the hold file": ("state/gpugov.lock", "", "the state directory's hold file"),
    "the learned model": (
        "state/online-model-llm.json",
        '[domains.controller]\nkind = "mpc-online"\n',
        "domain 'llm''s learned model",
    ),
    "a controller's own state_dir": (
        "models/online-model-llm.json",
        '[domains.controller]\nkind = "mpc-online"\nstate_dir = "{tmp}/models"\n',
        "domain 'llm''s learned model",
    ),
    "a learned model's hold file": (
        "models/online-model-llm.lock",
        '[domains.controller]\nkind = "mpc-online"\nstate_dir = "{tmp}/models"\n',
        "domain 'llm''s learned model's hold file",
    ),
}


@pytest.mark.parametrize("made", [True, False], ids=["there", "not yet made"])
@pytest.mark.parametrize("case", sorted(RECORD_ON_A_STATE_FILE))
def test_a_record_on_a_file_of_the_state_directory_is_refused_by_both(
    case: str, made: bool, tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """``daemon.record`` on the lock record, the hold file or a learned model: both said OK,
    and the recorder moved the file aside (the lock record, the model lost to the next
    start; the hold file's flock no longer on the file a second daemon opens)."""
    name, tables, what = RECORD_ON_A_STATE_FILE[case]
    record = tmp_path / name
    record.parent.mkdir()
    if made:
        record.write_text("{}\n")
    path = _write(
        tmp_path,
        daemon=f'state_dir = "{tmp_path}/state"\nrecord = "{record}"\nperiod_s = 0.25',
        tables=tables.format(tmp=tmp_path),
    )
    line = f"gpugov: error: daemon.record {record}: is {what}, which it would overwrite"
    _refused_by_both(path, line, capsys)
    assert sorted(p.name for p in record.parent.iterdir()) == ([record.name] if made else [])


def test_a_good_config_passes_both_and_check_config_names_the_gpus(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, tables="[domains.safety]\nfloor_mhz = 900\n")
    assert node_cli.main(["check-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"{path}: OK" in captured.out
    assert "NVML: 2 GPU(s)" in captured.out
    assert "domain llm: GPU 0, 1 (NVIDIA H100 80GB HBM3): 110 supported clocks, 345-1980 MHz" in (
        captured.out
    )
    assert captured.err == ""
    assert fake.writes == [] and fake.initialized == 0
    assert _run_code(path) == -1


@pytest.mark.parametrize(
    ("gpus", "said"),
    [
        ("[0, 7]", "GPU 7: no such GPU"),
        ('["GPU-nope"]', "GPU GPU-nope: open GPU failed: Not Found"),
    ],
)
def test_a_gpu_the_node_lacks_is_named_with_its_domain_by_both(
    gpus: str, said: str, tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """A domain's GPU the node does not have: the line named the GPU alone ("GPU 7: no such
    GPU ..."), not the domain whose gpus lists it, on a node of several domains."""
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("gpus = [0, 1]", f"gpus = {gpus}"))
    assert _run_code(path) == 4
    run_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert run_line.startswith(f"gpugov: error: domain 'llm': gpus: {said}"), run_line
    assert node_cli.main(["check-config", str(path)]) == 4
    assert capsys.readouterr().err.splitlines() == [run_line]


def test_a_metrics_address_not_on_this_host_is_runs_own_line(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """run said 'FILE: daemon.metrics_address: cannot serve metrics on ADDRESS: ...; pick
    another', check-config 'daemon.metrics_address ADDRESS: cannot serve metrics: ...'."""
    path = _write(tmp_path)
    path.write_text(
        path.read_text().replace('metrics_address = ""', 'metrics_address = "192.0.2.1:9400"')
    )
    assert _run_code(path) == 2
    run_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert run_line.startswith(f"gpugov: error: {path}: daemon.metrics_address: cannot serve")
    assert node_cli.main(["check-config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [run_line]


def test_gpus_with_no_clock_in_common_are_runs_own_line(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """A domain of two boards that list no clock alike: run and check-config refused it
    in two wordings ("its GPUs (0, 1) have ..." and "GPUs 0, 1 have ...")."""
    fake.gpus[0].graphics_clocks_mhz = (1980, 1965)
    fake.gpus[1].graphics_clocks_mhz = (1500, 1485)
    path = _write(tmp_path)
    assert _run_code(path) == 4
    run_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "domain 'llm'" in run_line and "no supported SM clock in common" in run_line
    assert node_cli.main(["check-config", str(path)]) == 4
    assert capsys.readouterr().err.splitlines() == [run_line]


def test_a_gpu_lost_before_the_start_is_runs_own_line(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU already lost: run said '...; no usable GPU', check-config the bare error."""
    fake.lose(1)
    path = _write(tmp_path)
    assert _run_code(path) == 4
    run_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert run_line.startswith("gpugov: error: GPU 1: ") and run_line.endswith("; no usable GPU")
    assert node_cli.main(["check-config", str(path)]) == 4
    assert capsys.readouterr().err.splitlines() == [run_line]


@pytest.mark.parametrize(
    ("tables", "field", "said"),
    [
        ("[domains.safety]\nfloor_mhz = 2500\n", "safety.floor_mhz", "2500 MHz"),
        # Locked at 1980 MHz and at 345 MHz in silence, where simulate and replay refuse it.
        (
            '[domains.controller]\nkind = "fixed"\nclock_mhz = 2500\n',
            "controller.clock_mhz",
            "2500 MHz",
        ),
        (
            '[domains.controller]\nkind = "fixed"\nclock_mhz = 100\n',
            "controller.clock_mhz",
            "100 MHz",
        ),
    ],
)
def test_a_clock_refusal_is_runs_own_line(
    tables: str,
    field: str,
    said: str,
    tmp_path: Path,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A clock the domain's config sets outside its GPUs' supported range is refused by
    run and by check-config in one and the same line."""
    path = _write(tmp_path, tables=tables)
    assert _run_code(path) == 2
    run_line = capsys.readouterr().err.strip()
    assert f"domain 'llm': {field} ({said})" in run_line and "1980 MHz" in run_line
    assert node_cli.main(["check-config", str(path)]) == 2
    assert run_line in capsys.readouterr().err.splitlines()


def test_every_problem_is_one_line_and_the_first_sets_the_exit_code(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path,
        daemon='record = "/nonexistent/dir/run.jsonl"',
        tables='[domains.safety]\nfloor_mhz = 2500\n[domains.controller]\nkind = "mpc"\n'
        'profile = "nope"\n',
    )
    assert node_cli.main(["check-config", str(path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 3
    assert "daemon.record" in errors[0]
    assert "floor_mhz" in errors[1] and "mpc controller" in errors[2]


def test_a_refused_config_gets_its_problems_alone_not_the_warnings(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config that also draws a warning (no TPOT SLO) and that run refuses (a floor
    above every clock) is its refusal's one line: the warning came first and buried it."""
    path = _write(tmp_path, tables="[domains.safety]\nfloor_mhz = 2500\n")
    path.write_text(path.read_text().replace(SLOS, "ttft_slo_s = 1.0\n"))
    assert node_cli.main(["check-config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "floor_mhz" in lines[0], lines


def test_the_watchdog_period_is_checked_as_run_checks_it(
    tmp_path: Path,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _write(tmp_path, daemon="period_s = 5.0")
    assert node_cli.main(["check-config", str(path), "--watchdog-sec", "8"]) == 2
    assert "WatchdogSec=8s" in capsys.readouterr().err
    assert node_cli.main(["check-config", str(path), "--watchdog-sec", "30"]) == 0
    monkeypatch.setenv("WATCHDOG_USEC", "8000000")
    assert node_cli.main(["check-config", str(path)]) == 2
    capsys.readouterr()
    assert _run_code(path) == 2
    assert "WatchdogSec=8s" in capsys.readouterr().err


def test_a_watchdog_no_period_fits_under_asks_only_for_a_longer_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # WatchdogSec=0.1 said "use a period under 0.05 s", below the least period (0.05 s).
    path = _write(tmp_path, daemon="period_s = 0.05")
    assert node_cli.main(["check-config", str(path), "--offline", "--watchdog-sec", "0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "raise WatchdogSec above 0.1s" in err[0], err
    assert "use a period under" not in err[0]


@pytest.mark.parametrize("value", ["nan", "inf", "abc", "-5", "0", "1e7", "8000000.5", ""])
def test_a_malformed_watchdog_usec_is_refused_in_one_line(
    tmp_path: Path,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    # nan and inf ended check-config in a traceback; the others were read as no watchdog.
    path = _write(tmp_path, daemon="period_s = 5.0")
    monkeypatch.setenv("WATCHDOG_USEC", value)
    for command in (lambda: node_cli.main(["check-config", str(path)]), lambda: _run_code(path)):
        assert command() == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gpugov: error: WATCHDOG_USEC=")
        assert "positive integer of microseconds" in err[0]
        assert captured.out == "" and fake.calls == {}
    # --watchdog-sec is what check-config checks when given: the variable is not read.
    assert node_cli.main(["check-config", str(path), "--offline", "--watchdog-sec", "30"]) == 0


def test_without_a_driver_the_gpu_part_is_skipped_in_one_line(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.driver_loaded = False
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("gpus = [0, 1]", "gpus = [0, 7]"))
    assert node_cli.main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "skipped" in line] == [
        "  GPU checks skipped: initialise NVML failed: Driver Not Loaded (NVML code 9): "
        "no NVIDIA driver on this machine; without a GPU, run `gpugov emulate` and use its "
        'GPUs (--backend emulated --emulator URL, or backend = "emulated" in the config)'
    ]
    # The controllers are still built: a missing profile is still refused.
    path.write_text(path.read_text() + '[domains.controller]\nkind = "mpc"\nprofile = "nope"\n')
    assert node_cli.main(["check-config", str(path)]) == 2


def test_an_nvml_that_fails_otherwise_is_a_problem(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.fail("nvmlInit", fp.NVML_ERROR_LIB_RM_VERSION_MISMATCH, times=None)
    assert node_cli.main(["check-config", str(_write(tmp_path))]) == 4
    assert "NVML code 18" in capsys.readouterr().err


def test_offline_checks_the_file_and_the_controllers_only(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, daemon='record = "/nonexistent/dir/run.jsonl"')
    path.write_text(path.read_text().replace("gpus = [0, 1]", "gpus = [0, 7]"))
    assert node_cli.main(["check-config", str(path), "--offline"]) == 0
    assert "node checks skipped (--offline)" in capsys.readouterr().out
    assert fake.calls.get("nvmlInit", 0) == 0
    path.write_text(path.read_text() + '[domains.controller]\nkind = "mpc"\nprofile = "nope"\n')
    assert node_cli.main(["check-config", str(path), "--offline"]) == 2
    # The domain and its field are named, as run names them.
    assert "domain 'llm': controller: mpc controller: unknown profile 'nope'" in (
        capsys.readouterr().err
    )


def test_offline_warns_of_an_mpc_profile_of_another_tp_degree(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """The TP line needs only the config's GPU count, yet ``--offline`` said OK with no
    word that a TP-1 profile plans a two-GPU domain (the clocks line needs the GPUs: it
    stays online only)."""
    for profile, warned in (("h100-sxm-llama3-8b", True), ("h100-sxm-mixtral-8x7b-tp2", False)):
        tables = f'[domains.controller]\nkind = "mpc"\nprofile = "{profile}"\n'
        path = _write(tmp_path, tables=tables)  # gpus = [0, 1]
        assert node_cli.main(["check-config", str(path), "--offline"]) == 0
        warnings = [line for line in capsys.readouterr().err.splitlines() if line]
        expected = (
            [
                f"gpugov: warning: domain 'llm': controller: mpc profile '{profile}' describes "
                "a domain of 1 GPU(s) (tensor_parallel), this domain has 2: its rates and "
                "powers are another domain's"
            ]
            if warned
            else []
        )
        assert warnings == expected
    assert fake.calls.get("nvmlInit", 0) == 0


def test_a_domain_without_slos_gets_one_warning_line_and_exit_0(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path)
    path.write_text(path.read_text().replace(SLOS, "ttft_slo_s = 1.0\n"))
    assert node_cli.main(["check-config", str(path)]) == 0
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("gpugov: warning: domain 'llm' sets no")
    assert "tpot_slo_s" in warnings[0] and "gpugov_tpot_slo_seconds is not exported" in warnings[0]
    assert all(name in warnings[0] for name in (*SLO_RECORDING_RULES, *SLO_ALERTS))


@pytest.mark.parametrize(
    ("controller", "warned"),
    [
        ('kind = "fixed"\nclock_mhz = 1410\n', True),
        ('kind = "mpc-slsqp"\nprofile = "h100-sxm-llama3-8b"\n', True),
        ("", True),  # the default kind, max
        ('kind = "mpc-online"\n', False),
    ],
)
def test_an_slo_target_its_controller_ignores_gets_one_warning_line(
    tmp_path: Path,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    controller: str,
    warned: bool,
) -> None:
    """Only ``mpc`` and ``mpc-online`` spend an SLO target (an outside controller is given
    it): check-config said 'SLO target 99% over 600 s' for a fixed clock, which neither
    measures nor exports it."""
    target = "[domains.slo_target]\nattainment = 0.99\n"
    tables = target + (f"[domains.controller]\n{controller}" if controller else "")
    path = _write(tmp_path, tables=tables)
    assert node_cli.main(["check-config", "--offline", str(path)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "slo_target" in line]
    if not warned:
        assert warnings == []
        return
    assert len(warnings) == 1 and warnings[0].startswith("gpugov: warning: domain 'llm'")
    assert "ignores" in warnings[0] and "mpc-online" in warnings[0]


def test_mpc_online_slower_than_its_recommended_period_gets_one_warning_line(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """mpc-online's period is 0.25 s, its default alone and the simulated commands'; one
    set slower is warned of, and the period left unset is its own."""
    online = f'[domains.controller]\nkind = "mpc-online"\nstate_dir = "{tmp_path}/models"\n'
    path = _write(tmp_path, daemon="period_s = 1.0", tables=online)
    assert node_cli.main(["check-config", str(path)]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert "domain 'llm' runs mpc-online every 1 s (daemon.period_s)" in warning
    assert "recommended period is 0.25 s" in warning and "4 times slower" in warning
    for daemon in ("period_s = 0.25", ""):
        path = _write(tmp_path, daemon=daemon, tables=online)
        assert node_cli.main(["check-config", str(path)]) == 0
        assert "warning" not in capsys.readouterr().err
    # Unset, but an engine deadline of 0.3 s keeps it at 1 s: the line says how to learn why.
    path = _write(tmp_path, tables=online)
    path.write_text(path.read_text().replace(ENGINE, ENGINE + "timeout_s = 0.3\n", 1))
    assert node_cli.main(["check-config", str(path)]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert "every 1 s (daemon.period_s unset, kept at 1 s by" in warning
    assert "set period_s = 0.25 to be told which" in warning


def test_a_pool_is_warned_only_for_the_slo_its_role_is_judged_on(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SLO rules judge a prefill pool on TTFT and a decode pool on TPOT: a pool that
    sets its role's SLO gets no warning; one that does not is told that one."""
    path = _write(tmp_path)
    prefill = path.read_text().replace(SLOS, 'role = "prefill"\nttft_slo_s = 1.0\n')
    path.write_text(prefill)
    assert node_cli.main(["check-config", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err
    path.write_text(path.read_text().replace('role = "prefill"', 'role = "decode"'))
    assert node_cli.main(["check-config", str(path)]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert "sets no tpot_slo_s" in warning and "ttft" not in warning.split(":")[2]


def test_a_state_directory_run_cannot_keep_files_in_gets_a_warning_line_and_run_starts(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    occupied = tmp_path / "a-file"
    occupied.write_text("")
    path = _write(
        tmp_path,
        daemon=f'state_dir = "{occupied}"\nperiod_s = 0.25',
        tables=f'[domains.controller]\nkind = "mpc-online"\nstate_dir = "{occupied}/models"\n',
    )
    assert node_cli.main(["check-config", str(path)]) == 0
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        f"gpugov: warning: daemon.state_dir {occupied}: exists and is not a directory; run "
        "keeps no lock record and no learned model there, so a restart learns anew",
        f"gpugov: warning: domain 'llm' controller.state_dir {occupied}/models: {occupied} is "
        "not a directory; run keeps no learned model there, so a restart learns anew",
    ]
    assert _run_code(path) == -1  # run starts: it keeps its files nowhere, and says so
    # A directory that does not exist yet is created on the first write: no warning.
    fresh = _write(tmp_path, daemon=f'state_dir = "{tmp_path}/state/gpugov"')
    assert node_cli.main(["check-config", str(fresh)]) == 0
    assert capsys.readouterr().err == ""


def test_mpc_online_with_no_state_directory_is_told_its_model_is_not_kept(
    tmp_path: Path,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With no daemon.state_dir, no $STATE_DIRECTORY and no controller.state_dir, run kept
    the learned model nowhere and said nothing: each restart learned anew in silence. One
    warning line now from run at its start, and a note in check-config's report (the
    unit's StateDirectory= may set it where check-config runs without it); none for a
    domain that keeps its model in its own state_dir, nor for a dry run (it writes nothing
    anyway)."""
    online = '[domains.controller]\nkind = "mpc-online"\n'
    path = _write(tmp_path, daemon="period_s = 0.25", tables=online)
    assert node_cli.main(["check-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    (note,) = [line for line in captured.out.splitlines() if "note:" in line]
    assert note == (
        "  note: domain 'llm' runs mpc-online with no state directory (no "
        "daemon.state_dir, controller.state_dir or $STATE_DIRECTORY): its learned model is "
        "kept nowhere, so each start learns anew; set daemon.state_dir (a systemd unit's "
        "StateDirectory= sets it)"
    )
    with caplog.at_level("WARNING", logger="gpugov"), pytest.raises(LoopStarted):
        node_cli.main(["run", "--config", str(path)])
    assert any("'llm' runs mpc-online with no state directory" in m for m in caplog.messages)
    caplog.clear()
    assert _run_code(path) == -1  # a dry run
    assert not any("no state directory" in m for m in caplog.messages)
    own = online + f'state_dir = "{tmp_path}/models"\n'
    path = _write(tmp_path, daemon="period_s = 0.25", tables=own)
    assert node_cli.main(["check-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "note:" not in captured.out


def test_two_domains_reading_one_engine_page_get_one_warning_line(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two domains whose engine.url name one page (the default's host spelled otherwise)
    each governed their GPUs for the other's load too, and nothing said so."""
    path = tmp_path / "gpugov.toml"
    path.write_text(
        '[daemon]\nmetrics_address = ""\n'
        f'[[domains]]\nname = "a"\ngpus = [0]\n{SLOS}'
        '[domains.engine]\nurl = "http://LOCALHOST:80/metrics"\n'
        f'[[domains]]\nname = "b"\ngpus = [1]\n{SLOS}'
        '[domains.engine]\nurl = "http://localhost/metrics"\n'
    )
    assert node_cli.main(["check-config", str(path), "--offline"]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith("gpugov: warning: domains 'a', 'b' read the same engine page")
    path.write_text(path.read_text().replace("localhost/metrics", "localhost:8001/metrics"))
    assert node_cli.main(["check-config", str(path), "--offline"]) == 0
    assert capsys.readouterr().err == ""


def test_domains_sharing_one_domain_scoped_budget_file_get_one_warning_line(
    tmp_path: Path,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node's budget in one file that two domains read with scope "domain": each held
    the whole number as its own budget, together up to twice it, and nothing said so. A
    per-GPU number ("gpu", the default) shared by domains is one cap for every GPU."""
    budget = tmp_path / "node-budget"
    budget.write_text("1000\n")
    domain_scope = f'power_budget_file = "{budget}"\npower_budget_file_scope = "domain"\n'
    path = tmp_path / "gpugov.toml"
    path.write_text(
        '[daemon]\nmetrics_address = ""\n'
        f'[[domains]]\nname = "a"\ngpus = [0]\n{SLOS}{domain_scope}'
        '[domains.engine]\nurl = "http://127.0.0.1:9/metrics"\n'
        f'[[domains]]\nname = "b"\ngpus = [1]\n{SLOS}power_budget_file = "node-budget"\n'
        '[domains.engine]\nurl = "http://127.0.0.1:10/metrics"\n'
    )
    assert node_cli.main(["check-config", str(path), "--offline"]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning == (
        f"gpugov: warning: domains 'a', 'b' read one power_budget_file ({budget}) and "
        "'a' takes its number as the whole domain's (power_budget_file_scope = \"domain\"): "
        "each holds it as its own budget, so together they may draw more than it; give "
        'each domain its own file, or take the number per GPU (scope "gpu")'
    )
    with caplog.at_level("WARNING", logger="gpugov"):
        assert _run_code(path) == -1
    assert warning.removeprefix("gpugov: warning: ") in caplog.messages
    path.write_text(path.read_text().replace('power_budget_file_scope = "domain"\n', ""))
    assert node_cli.main(["check-config", str(path), "--offline"]) == 0
    assert capsys.readouterr().err == ""


def test_a_metrics_address_flag_that_is_an_engines_page_is_refused_before_any_work(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """run --metrics-address on a domain's engine.url: the file's own address is refused
    so, the flag's was served, and the domain scraped the daemon's own page at every tick
    and sat at its fail-safe ("no vllm:, sglang: or tgi_ metrics on the page")."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("127.0.0.1:9/metrics", f"localhost:{port}/metrics"))
    code = node_cli.main(["run", "--config", str(path), "--metrics-address", f"127.0.0.1:{port}"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"gpugov: error: --metrics-address 127.0.0.1:{port}: domains[0].engine.url "
        f"(http://localhost:{port}/metrics) in {path} is this daemon's own metrics endpoint; "
        "give the serving engine's /metrics URL, or serve the metrics elsewhere\n"
    )
    assert "nvmlInit" not in fake.calls  # refused before any GPU was opened
    with pytest.raises(LoopStarted):  # served elsewhere, the same file runs
        node_cli.main(["run", "--config", str(path), "--dry-run", "--metrics-address", "none"])


def test_the_emulated_example_sets_its_slos(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "emulated.toml"
    assert node_cli.main(["check-config", str(example), "--offline"]) == 0
    assert capsys.readouterr().err == ""


def test_prior_hint_warnings_surface_as_warning_lines(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = '[domains.controller]\nkind = "mpc-online"\nprior = { gpu = "NVIDIA Tesla K80" }\n'
    assert node_cli.main(["check-config", str(_write(tmp_path, tables=tables))]) == 0
    err = capsys.readouterr().err
    assert "gpugov: warning: mpc-online prior: GPU 'NVIDIA Tesla K80' is not a known family" in err
    # gpu = "auto" offline: the name is unknown there, and that is no warning.
    auto = _write(
        tmp_path,
        daemon=f'period_s = 0.25\nstate_dir = "{tmp_path}/state"',
        tables='[domains.controller]\nkind = "mpc-online"\nprior = { gpu = "auto" }\n',
    )
    assert node_cli.main(["check-config", str(auto), "--offline"]) == 0
    assert capsys.readouterr().err == ""


def test_a_metrics_port_held_by_another_program_is_refused_by_both(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        path = _write(tmp_path).read_text().replace('metrics_address = ""', "")
        config = tmp_path / "taken.toml"
        config.write_text(
            path.replace("[daemon]\n", f'[daemon]\nmetrics_address = "127.0.0.1:{port}"\n')
        )
        assert node_cli.main(["check-config", str(config)]) == 2
        assert "Address already in use" in capsys.readouterr().err
        assert _run_code(config) == 2


def test_a_metrics_port_held_by_a_running_gpugov_passes(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugov.daemon.exporter import Exporter

    exporter = Exporter("127.0.0.1", 0)  # the daemon a restart would replace
    try:
        port = exporter.url.rsplit(":", 1)[1].split("/")[0]
        text = _write(tmp_path).read_text()
        config = tmp_path / "running.toml"
        config.write_text(
            text.replace('metrics_address = ""', f'metrics_address = "127.0.0.1:{port}"')
        )
        assert node_cli.main(["check-config", str(config)]) == 0, capsys.readouterr().err
    finally:
        exporter.close()


def test_a_budget_below_the_gpus_lowest_limit_is_runs_own_refusal_and_a_bad_file_warns(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, domain="power_budget_w = 300.0\n")  # 2 GPUs accept >= 400 W
    assert _run_code(path) == 2
    run_line = capsys.readouterr().err.strip()
    assert "power_budget_w (300 W) is below the lowest power limit" in run_line
    assert node_cli.main(["check-config", str(path)]) == 2
    assert run_line in capsys.readouterr().err.splitlines()
    budget = tmp_path / "gpu-power-limit"
    budget.write_text("abc")
    path = _write(tmp_path, domain=f'power_budget_file = "{budget}"\n')
    assert node_cli.main(["check-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert "not a number of watts" in captured.out + captured.err
    budget.write_text("450")
    assert node_cli.main(["check-config", str(path)]) == 0
    assert f"power budget file {budget}: 900 W for the domain" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("profile", "warned"),
    [
        ("h100-sxm-mixtral-8x7b-tp2", []),
        (
            "h100-sxm-llama3-8b",
            ["describes a domain of 1 GPU(s) (tensor_parallel), this domain has 2"],
        ),
        (
            "l40s-llama3-8b",
            [
                "clocks (210-2520 MHz) are not supported by the domain's GPUs (110 clocks, "
                "345-1980 MHz), first 210 MHz",
                "describes a domain of 1 GPU(s)",
            ],
        ),
    ],
)
def test_an_mpc_profile_unlike_the_domains_gpus_is_warned_by_both(
    tmp_path: Path,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    profile: str,
    warned: list[str],
) -> None:
    """An mpc planning on a profile of other clocks passed silently: its planned clocks
    the GPUs lack are locked at a lower one (a 1500-1900 MHz profile on a 1000/1800 MHz
    GPU ran at 1000 MHz in 500 of 501 samples of a simulated minute), and a TP-8
    profile's rates and powers are an 8-GPU domain's."""
    tables = f'[domains.controller]\nkind = "mpc"\nprofile = "{profile}"\n'
    path = _write(tmp_path, tables=tables)  # two fake H100s: 345-1980 MHz in 15 MHz steps
    assert node_cli.main(["check-config", str(path)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(warnings) == len(warned)
    for line, text in zip(warnings, warned, strict=True):
        assert line.startswith(
            f"gpugov: warning: domain 'llm': controller: mpc profile '{profile}'"
        )
        assert text in line
    caplog.clear()
    assert _run_code(path) == -1
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [m for m in logged if "mpc profile" in m] == [
        line.removeprefix("gpugov: warning: ") for line in warnings
    ]


def test_a_record_path_that_is_a_link_is_judged_by_where_it_leads(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link loop, or a link into a missing directory, is refused by check-config and
    by run before any GPU is opened (check-config said OK and run failed after opening
    them); a link to a file not yet written, in a directory that exists, is accepted."""
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    lost = tmp_path / "lost.jsonl"
    lost.symlink_to(tmp_path / "missing" / "run.jsonl")
    fresh = tmp_path / "fresh.jsonl"
    fresh.symlink_to(tmp_path / "records-run.jsonl")
    for link, reason in ((loop, "a symbolic link loop"), (lost, "does not exist")):
        path = _write(tmp_path, daemon=f'record = "{link}"')
        assert node_cli.main(["check-config", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"daemon.record {link}" in err and reason in err
        assert _run_code(path) == 2
        assert reason in capsys.readouterr().err
        assert fake.initialized == 0
    path = _write(tmp_path, daemon=f'record = "{fresh}"')
    assert node_cli.main(["check-config", str(path)]) == 0
    assert _run_code(path) == -1


def test_a_lock_record_of_a_newer_gpugov_is_refused_as_run_refuses_it(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run`` refuses a lock record a newer gpugov wrote (exit 2); check-config said the
    config would run. It now names the record in run's line, and leaves it as it is."""
    state = tmp_path / "state"
    state.mkdir()
    record = state / "locks.json"
    record.write_text('{"version": 3, "gpus": {}}')
    path = _write(tmp_path, daemon=f'state_dir = "{state}"')
    assert node_cli.main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"gpugov: error: {record}: lock record version 3, newer than this gpugov" in err
    assert record.read_text() == '{"version": 3, "gpus": {}}'
    assert node_cli.main(["run", "--config", str(path)]) == 2  # the same refusal
    assert f"{record}: lock record version 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("daemon", "tables", "said"),
    [
        ('emulator = "http://127.0.0.1:9"', "", 'daemon.emulator is set, but backend = "nvml"'),
        ("", '[daemon.zeusd]\nsocket = "/run/z.sock"\n', "[daemon.zeusd] is set, but backend"),
    ],
)
def test_a_backends_settings_under_another_backend_are_said(
    fake: FakeNvml,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    daemon: str,
    tables: str,
    said: str,
) -> None:
    """An emulator address, or a [daemon.zeusd] table, under backend = "nvml" (the
    operator forgot the backend line) was ignored without a word: check-config said OK
    and run drove the real GPUs, where ``--emulator`` with another backend is refused."""
    path = _write(tmp_path, daemon=daemon, tables=tables)
    assert node_cli.main(["check-config", str(path)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if said in line]
    assert len(warnings) == 1 and warnings[0].startswith("gpugov: warning: "), warnings
    with caplog.at_level("WARNING", logger="gpugov"):
        assert _run_code(path) == -1
    assert any(said in message for message in caplog.messages), caplog.messages
