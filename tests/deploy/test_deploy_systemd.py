"""The systemd units: `systemd-analyze verify`, the security exposure score, and their shape.

``systemd-analyze verify`` checks that every ``Exec*=`` binary exists, so it runs on a copy
of each unit whose ``/opt/gpugov/venv/bin/gpugov`` is rewritten to this environment's
``gpugov`` (the only difference; the test checks the copy differs in nothing else).
``systemd-analyze security --offline=true`` reads the unit file alone; the main unit must
score at most 3.0 and the observe-only one lower still; in the split mode the privileged
actuator at most 2.5 and the unprivileged governor at most 1.5.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from deploytools import SYSTEMD, gpugov_executable, require_tool

from gpugov.cli import build_parser
from gpugov.daemon.addresses import parse_address
from gpugov.daemon.config import ActuatorBackendConfig, load_config
from gpugov.daemon.errors import ExitCode
from gpugov.daemon.sd_notify import MIN_WATCHDOG_S

INSTALLED_GPUGOV = "/opt/gpugov/venv/bin/gpugov"
MAIN = SYSTEMD / "gpugov.service"
OBSERVE = SYSTEMD / "gpugov-observe.service"
ACTUATOR = SYSTEMD / "gpugov-actuator.service"
GOVERNOR = SYSTEMD / "gpugov-governor.service"
MAX_EXPOSURE_MAIN = 3.0
MAX_EXPOSURE_ACTUATOR = 2.5
MAX_EXPOSURE_GOVERNOR = 1.5
UNITS = [MAIN, OBSERVE, ACTUATOR, GOVERNOR]
EXPOSURE = re.compile(r"Overall exposure level for (\S+): (\d+(?:\.\d+)?) ")


def directives(path: Path) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` for every assignment in a unit file, in order."""
    section = ""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def values(path: Path, key: str) -> list[str]:
    """Every value assigned to ``key`` in the unit."""
    return [value for _, k, value in directives(path) if k == key]


def one(path: Path, key: str) -> str:
    """The single value of ``key``; fails when it is missing or repeated."""
    found = values(path, key)
    assert len(found) == 1, f"{path.name}: expected one {key}=, found {found}"
    return found[0]


def verifiable_copy(unit: Path, directory: Path) -> Path:
    """The unit with the installed gpugov path pointed at this environment's gpugov."""
    text = unit.read_text()
    assert INSTALLED_GPUGOV in text, f"{unit.name} no longer runs {INSTALLED_GPUGOV}"
    copy = directory / unit.name
    copy.write_text(text.replace(INSTALLED_GPUGOV, str(gpugov_executable())))
    return copy


def exposure(unit: Path) -> tuple[float, str]:
    """The overall exposure score of ``systemd-analyze security --offline=true`` and its table."""
    tool = require_tool("systemd-analyze")
    result = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    table = result.stdout + result.stderr
    match = EXPOSURE.search(table)
    assert match, f"no overall exposure in the output (exit {result.returncode}):\n{table}"
    assert match.group(1) == unit.name
    return float(match.group(2)), table


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    copy = verifiable_copy(unit, tmp_path)
    result = subprocess.run(
        [tool, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, f"systemd-analyze verify {unit.name} failed:\n{output}"
    assert output == "", f"systemd-analyze verify {unit.name} warned:\n{output}"


def test_main_unit_exposure_at_most_3() -> None:
    score, table = exposure(MAIN)
    assert score <= MAX_EXPOSURE_MAIN, (
        f"{MAIN.name}: overall exposure {score} > {MAX_EXPOSURE_MAIN}\n{table}"
    )


def test_observe_unit_exposure_below_main() -> None:
    main_score, _ = exposure(MAIN)
    score, table = exposure(OBSERVE)
    assert score < main_score, (
        f"{OBSERVE.name}: overall exposure {score} is not below {MAIN.name}'s {main_score}\n{table}"
    )


def test_main_unit_contract() -> None:
    assert one(MAIN, "Type") == "notify"
    assert one(MAIN, "Restart") == "on-failure"
    assert re.fullmatch(r"\d+s", one(MAIN, "WatchdogSec"))
    assert one(MAIN, "ExecStart").endswith("--config /etc/gpugov/config.toml")
    assert one(MAIN, "ExecStopPost") == f"{INSTALLED_GPUGOV} reset-clocks --gpus all"
    assert one(MAIN, "CapabilityBoundingSet") == "CAP_SYS_ADMIN"
    assert one(MAIN, "AmbientCapabilities") == ""
    assert one(MAIN, "DevicePolicy") == "closed"
    allowed = values(MAIN, "DeviceAllow")
    # nvmlInit() opened exactly these on driver 580 (H200): nvidia0, nvidiactl, nvidia-uvm,
    # nvidia-caps/nvidia-cap1 and nvidia-cap2 (read-only). Older drivers name major 195
    # "nvidia-frontend".
    assert sorted(allowed) == sorted(
        [
            "char-nvidia-frontend rw",
            "char-nvidia rw",
            "char-nvidiactl rw",
            "/dev/nvidia-uvm rw",
            "char-nvidia-caps r",
        ]
    )
    assert values(OBSERVE, "DeviceAllow") == allowed
    for key, value in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("IPAddressAllow", "localhost"),
    ):
        assert one(MAIN, key) == value, key
    assert "@system-service" in values(MAIN, "SystemCallFilter")
    # PrivateDevices= would hide /dev/nvidia*; PrivateUsers= would void CAP_SYS_ADMIN.
    assert not values(MAIN, "PrivateDevices")
    assert not values(MAIN, "PrivateUsers")


def test_observe_unit_contract() -> None:
    assert one(OBSERVE, "Type") == "notify"
    assert one(OBSERVE, "ExecStart").endswith("--config /etc/gpugov/config.toml --dry-run")
    assert one(OBSERVE, "CapabilityBoundingSet") == ""
    assert one(OBSERVE, "DynamicUser") == "yes"
    assert not values(OBSERVE, "ExecStopPost")
    assert one(OBSERVE, "Conflicts") == "gpugov.service"
    assert not values(OBSERVE, "PrivateDevices")


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_exec_lines_parse_with_the_real_cli(unit: Path) -> None:
    """Every gpugov command line in the unit is accepted by gpugov's own argument parser."""
    parser = build_parser()
    for key in ("ExecStart", "ExecStopPost"):
        for line in values(unit, key):
            argv = shlex.split(line)
            assert argv[0] == INSTALLED_GPUGOV
            parser.parse_args(argv[1:])  # exits (SystemExit) on an unknown flag


def test_the_example_config_the_readme_installs_is_valid() -> None:
    """deploy/README.md installs deploy/gpugov.example.toml as /etc/gpugov/config.toml."""
    example = SYSTEMD.parent / "gpugov.example.toml"
    assert example.exists(), f"{example} is missing (deploy/README.md installs it)"
    config = load_config(example)
    host, _ = parse_address(config.daemon.metrics_address)
    assert host in {"127.0.0.1", "::1", "localhost"}, "the units allow loopback only"


@pytest.mark.parametrize(
    ("unit", "limit"),
    [(ACTUATOR, MAX_EXPOSURE_ACTUATOR), (GOVERNOR, MAX_EXPOSURE_GOVERNOR)],
    ids=lambda p: getattr(p, "name", str(p)),
)
def test_split_units_exposure(unit: Path, limit: float) -> None:
    score, table = exposure(unit)
    assert score <= limit, f"{unit.name}: overall exposure {score} > {limit}\n{table}"


def test_actuator_unit_contract() -> None:
    """Privileged, CAP_SYS_ADMIN only, no network; serves the governor's user."""
    argv = shlex.split(one(ACTUATOR, "ExecStart"))
    args = build_parser().parse_args(argv[1:])
    assert args.command == "actuator"
    assert args.allow == one(GOVERNOR, "User")
    assert os.path.dirname(args.socket) == "/run/" + one(ACTUATOR, "RuntimeDirectory")
    assert one(ACTUATOR, "ExecStopPost") == f"{INSTALLED_GPUGOV} reset-clocks --gpus all"
    assert one(ACTUATOR, "CapabilityBoundingSet") == "CAP_SYS_ADMIN"
    assert one(ACTUATOR, "AmbientCapabilities") == ""
    assert one(ACTUATOR, "RestrictAddressFamilies") == "AF_UNIX"
    assert one(ACTUATOR, "PrivateNetwork") == "yes"
    assert one(ACTUATOR, "Conflicts") == "gpugov.service"
    assert values(ACTUATOR, "DeviceAllow") == values(MAIN, "DeviceAllow")
    assert not values(ACTUATOR, "PrivateUsers")  # it would void CAP_SYS_ADMIN


def test_governor_unit_contract() -> None:
    """Unprivileged, no capabilities, writes only through the actuator's socket."""
    assert one(GOVERNOR, "DynamicUser") == "yes"
    assert one(GOVERNOR, "CapabilityBoundingSet") == ""
    assert one(GOVERNOR, "AmbientCapabilities") == ""
    assert not values(GOVERNOR, "ExecStopPost")  # the lease resets; it could not
    assert one(GOVERNOR, "ExecStart").endswith("--config /etc/gpugov/config.toml")
    assert "gpugov-actuator.service" in one(GOVERNOR, "Wants").split()
    assert "gpugov-actuator.service" in one(GOVERNOR, "After").split()
    assert set(one(GOVERNOR, "Conflicts").split()) == {"gpugov.service", "gpugov-observe.service"}
    assert "AF_UNIX" in one(GOVERNOR, "RestrictAddressFamilies").split()
    # The socket the actuator serves is the governor's default for backend = "actuator".
    socket = shlex.split(one(ACTUATOR, "ExecStart"))
    path = socket[socket.index("--socket") + 1]
    assert path == str(ActuatorBackendConfig().socket)


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_a_unit_that_may_lock_clocks_resets_them_after_every_stop(unit: Path) -> None:
    """Whatever may lock a clock (CAP_SYS_ADMIN in its bounding set) runs the reset after
    every stop, a crash or a watchdog kill included, so no GPU stays locked low; every
    unit restarts after a failure."""
    may_lock = "CAP_SYS_ADMIN" in one(unit, "CapabilityBoundingSet").split()
    resets = [shlex.split(line)[1:] for line in values(unit, "ExecStopPost")]
    if may_lock:
        assert ["reset-clocks", "--gpus", "all"] in resets, f"{unit.name}: no reset after a stop"
    assert one(unit, "Restart") in {"on-failure", "always"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_every_long_running_gpugov_has_a_watchdog(unit: Path) -> None:
    """`gpugov run` pings every tick and `gpugov actuator` every serving round; both are
    `Type=notify` with a `WatchdogSec=` they can keep (the actuator refuses a shorter one
    than MIN_WATCHDOG_S, `run` one under twice its period)."""
    command = build_parser().parse_args(shlex.split(one(unit, "ExecStart"))[1:]).command
    assert command in {"run", "actuator"}, f"{unit.name}: a new long-running command?"
    assert one(unit, "Type") == "notify"
    assert one(unit, "NotifyAccess") == "main"
    watchdog = one(unit, "WatchdogSec")
    assert re.fullmatch(r"\d+s", watchdog), f"{unit.name}: no watchdog"
    assert int(watchdog[:-1]) >= MIN_WATCHDOG_S


WILL_NOT_FIX_ITSELF = {ExitCode.USAGE, ExitCode.PERMISSION}
"""Bad input and a missing privilege: restarting runs into the same error."""
MAY_FIX_ITSELF = {ExitCode.FAILURE, ExitCode.NO_GPU, ExitCode.GPU_LOST, ExitCode.NOT_RESET}
"""A driver that loads late, a GPU back after a reset, a failure that may pass."""


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_a_unit_does_not_restart_into_an_error_that_will_not_fix_itself(unit: Path) -> None:
    """Exit 2 and 3 fail the unit at once (not five restarts into the same error); the
    codes a restart may cure are still restarted."""
    prevented = {ExitCode(int(code)) for code in one(unit, "RestartPreventExitStatus").split()}
    assert prevented == WILL_NOT_FIX_ITSELF, unit.name
    assert not prevented & MAY_FIX_ITSELF


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_the_units_own_command_with_bad_input_exits_with_a_code_it_does_not_restart(
    unit: Path, tmp_path: Path
) -> None:
    """The unit's ExecStart with a bad config (`run`) or socket path (`actuator`) exits
    with a code its RestartPreventExitStatus= holds, and says why."""
    argv = shlex.split(one(unit, "ExecStart"))[1:]
    if "--config" in argv:
        bad = tmp_path / "config.toml"
        bad.write_text('[daemon]\nperiod_s = "soon"\n')
        argv[argv.index("--config") + 1] = str(bad)
    else:
        argv[argv.index("--socket") + 1] = str(tmp_path / "missing" / "a.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    result = subprocess.run(
        [sys.executable, "-m", "gpugov", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    prevented = {int(code) for code in one(unit, "RestartPreventExitStatus").split()}
    assert result.returncode in prevented, (unit.name, result.returncode, result.stderr)
    assert result.returncode == ExitCode.USAGE
    assert result.stderr.startswith("gpugov: error:"), result.stderr
    assert "Traceback" not in result.stderr
