"""Config: the example file validates; every bad field names file, path and reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpugov.daemon.addresses import parse_address
from gpugov.daemon.config import GpugovConfig, load_config, parse_config
from gpugov.daemon.controller_config import controller_kinds
from gpugov.daemon.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "gpugov.example.toml"
MINIMAL = {"domains": [{"name": "llm", "gpus": [0]}]}


def _domain(**overrides: object) -> dict[str, object]:
    return {"domains": [{"name": "llm", "gpus": [0], **overrides}]}


def test_example_config_is_valid() -> None:
    config = load_config(EXAMPLE)
    assert isinstance(config, GpugovConfig)
    assert config.daemon.metrics_address == "127.0.0.1:9400"
    assert config.domains[0].engine.url.startswith("http://127.0.0.1")


def test_defaults() -> None:
    config = parse_config(MINIMAL)
    domain = config.domains[0]
    assert config.daemon.period_s == 1.0 and config.daemon.backend == "nvml"
    assert domain.controller.kind == "max" and domain.failsafe == "max"
    assert domain.safety.dwell_s == 0.5 and config.stale_after_s(domain) == 3.0
    with pytest.raises(Exception, match="frozen"):
        config.daemon.period_s = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "path", "reason"),
    [
        ({"daemon": {"period_s": "fast"}, **MINIMAL}, "daemon.period_s", "valid number"),
        ({"daemon": {"period_s": 0.0}, **MINIMAL}, "daemon.period_s", "greater than or equal"),
        ({"daemon": {"dry_run": "yes"}, **MINIMAL}, "daemon.dry_run", "valid boolean"),
        ({"daemon": {"backend": "dcgm"}, **MINIMAL}, "daemon.backend", "or 'zeusd'"),
        ({"daemon": {"metrics_address": "9400"}, **MINIMAL}, "daemon.metrics_address", "HOST:PORT"),
        ({"daemon": {"bogus": 1}, **MINIMAL}, "daemon.bogus", "unknown key"),
        (
            {"daemon": {"max_controller_failures": 0}, **MINIMAL},
            "daemon.max_controller_failures",
            "greater than or equal to 1",
        ),
        ({"domains": {"name": "x"}}, "domains", "[[domains]]"),
        # Said "Value should have at least 1 item after validation, not 0": pydantic's words.
        ({"domains": []}, "domains", "must hold at least one [[domains]] table, got none"),
        (
            _domain(gpus=[]),
            "domains[0].gpus",
            "must list at least one GPU (an NVML index or a GPU-/MIG- UUID, such as [0]), got none",
        ),
        (_domain(gpus=["eth0"]), "domains[0].gpus[0]", "NVML index"),
        (_domain(gpus=[-1]), "domains[0].gpus[0]", "NVML index"),
        # A PCI bus id (nvidia-smi -i takes one) was refused without saying it is one.
        (
            _domain(gpus=["00000000:18:00.0"]),
            "domains[0].gpus[0]",
            "'00000000:18:00.0' is a PCI bus id, which gpus does not take: name the GPU by "
            "its NVML index or UUID (nvidia-smi -L lists both)",
        ),
        (_domain(name="has space"), "domains[0].name", "pattern"),
        (_domain(engine={"url": "ftp://x"}), "domains[0].engine.url", "http://"),
        (
            _domain(engine={"timeout_s": -1}),
            "domains[0].engine.timeout_s",
            "greater than or equal to 0.01",
        ),
        (_domain(engine={"kind": "trtllm"}), "domains[0].engine.kind", "'auto'"),
        (
            _domain(controller={"kind": "warp-drive"}),
            "domains[0].controller.kind",
            "unknown controller 'warp-drive'",
        ),
        (_domain(controller={"kind": "fixed"}), "domains[0].controller.clock_mhz", "required"),
        (
            _domain(controller={"kind": "fixed", "clock_mhz": "1410"}),
            "domains[0].controller.clock_mhz",
            "valid number",
        ),
        (
            _domain(controller={"kind": "mpc", "horizon_s": 0}),
            "domains[0].controller.horizon_s",
            "greater than 0",
        ),
        (
            _domain(controller={"kind": "max", "clock_mhz": 1}),
            "domains[0].controller.clock_mhz",
            "unknown key",
        ),
        (_domain(safety={"dwell_s": -1}), "domains[0].safety.dwell_s", "greater than or equal"),
        (_domain(safety={"floor_mhz": 0}), "domains[0].safety.floor_mhz", "greater than 0"),
        (
            _domain(safety={"min_relock_interval_s": -0.1}),
            "domains[0].safety.min_relock_interval_s",
            "greater than or equal",
        ),
        (_domain(failsafe="min"), "domains[0].failsafe", "'max' or 'unlock'"),
        (_domain(stale_after_s=float("inf")), "domains[0].stale_after_s", "finite"),
        (
            {"daemon": {"period_s": 0.1}, **_domain(engine={"timeout_s": 0.5})},
            "domains[0].engine.timeout_s",
            "shorter than daemon.period_s",
        ),
        # A problem of two fields said "(top level)", naming none.
        (
            {"domains": [{"name": "a", "gpus": [0]}, {"name": "a", "gpus": [1]}]},
            "domains[1].name",
            "'a' is domains[0]'s name too; give each domain its own",
        ),
        (
            {"domains": [{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [1, 0]}]},
            "domains[1].gpus",
            "GPU 0 is in domains 'a' and 'b'; a GPU belongs to one domain",
        ),
        # Said "GPU 0 is in domains 'a' and 'a'".
        (
            {"domains": [{"name": "a", "gpus": [0, 0]}]},
            "domains[0].gpus",
            "GPU 0 is listed twice in domain 'a'; list each GPU once",
        ),
        # Said "Input is not a valid path for <class 'pathlib.Path'>".
        (
            {"daemon": {"record": 5}, **_domain()},
            "daemon.record",
            'must be a file name in quotes, such as "/var/log/gpugov/run.jsonl", got 5',
        ),
        # Said "Input should be a valid dictionary or instance of DaemonSection", "... a
        # valid tuple": Python's names, not the file's.
        (
            {"daemon": 5, **_domain()},
            "daemon",
            "must be a table of keys (a [daemon] section, or { key = value }), got 5",
        ),
        (
            {"daemon": [{"period_s": 1.0}], **_domain()},
            "daemon",
            "a [daemon] section",
        ),
        ({"domains": [5]}, "domains[0]", "a [[domains]] section"),
        (
            _domain(controller="mpc"),
            "domains[0].controller",
            "a [domains.controller] section, or { key = value }), got 'mpc'",
        ),
        (
            _domain(controller={"kind": "mpc-online", "prior": 70}),
            "domains[0].controller.prior",
            "a [domains.controller.prior] section",
        ),
        (_domain(engine=[1]), "domains[0].engine", "a [domains.engine] section"),
        (_domain(gpus="0"), "domains[0].gpus", "must be an array, such as [0, 1], got '0'"),
        # The other paths said the same.
        (
            {"daemon": {"state_dir": 5}, **_domain()},
            "daemon.state_dir",
            "must be a file or directory name in quotes, got 5",
        ),
        (
            {"daemon": {"actuator": {"socket": True}}, **_domain()},
            "daemon.actuator.socket",
            "must be a file or directory name in quotes, got True",
        ),
        (
            {"daemon": {"backend": "zeusd", "zeusd": {"socket": 1.5}}, **_domain()},
            "daemon.zeusd.socket",
            "must be a file or directory name in quotes, got 1.5",
        ),
        (
            _domain(power_budget_file=700),
            "domains[0].power_budget_file",
            "must be a file or directory name in quotes, got 700",
        ),
        (
            _domain(controller={"kind": "open-loop", "plan": 5}),
            "domains[0].controller.plan",
            "must be a file or directory name in quotes, got 5",
        ),
        (
            _domain(controller={"kind": "mpc-online", "state_dir": ["/var/lib/gpugov"]}),
            "domains[0].controller.state_dir",
            "must be a file or directory name in quotes, got ['/var/lib/gpugov']",
        ),
    ],
)
def test_bad_field_is_named(data: dict[str, object], path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "gpugov.toml")
    message = str(info.value)
    assert f"gpugov.toml: {path}: " in message or f"gpugov.toml: {path} (" in message
    assert "(top level)" not in message
    assert reason in message


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\nperiod_s = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML.*line 1"):
        load_config(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[daemon]\nperiod_s = "x"\n[[domains]]\nname = "a"\ngpus = [0]\n')
    with pytest.raises(ConfigError, match=r"wrong.toml: daemon.period_s"):
        load_config(wrong)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    assert parse_address(":9400") == ("127.0.0.1", 9400)
    with pytest.raises(ValueError):
        parse_address("host:99999")
    # An IPv6 host without its brackets, a bracket left open, a space: served on a host
    # the operator did not write, or refused only when the socket was bound.
    for bad in ("[::1:9400", "::1:9400", "a b:9400", "[::1]]:9400"):
        with pytest.raises(ValueError, match=r"or \[::1\]:9400"):
            parse_address(bad)
    # Written as an IP address that is none: refused only at the bind, after the GPUs
    # were opened.
    for bad in ("999.1.1.1:9400", "1.2.3:9400", "[::g]:9400"):
        with pytest.raises(ValueError, match="names no IP address"):
            parse_address(bad)
    assert parse_address("localhost:9400") == ("localhost", 9400)
    # A host no name encodes (an empty or 64-character label in a non-ASCII name): the
    # socket's bind raised TypeError, a traceback from check-config and run.
    for bad in ("ü..x:9400", f"{'ü' * 64}.de:9400", "a\x00b:9400", "a\x01b:9400"):
        with pytest.raises(ValueError, match="is no host name"):
            parse_address(bad)
    assert parse_address("bücher.de:9400") == ("bücher.de", 9400)


@pytest.mark.parametrize("port", ["٩٤٠٠", "１２３４", "²"])
def test_a_port_in_other_digits_than_ascii_is_refused(port: str) -> None:
    """int() reads Arabic-Indic or fullwidth digits: 127.0.0.1:٩٤٠٠ was served at 9400 and
    check-config said OK; a superscript passed isdigit() and int() refused it in Python's
    words ("invalid literal for int() with base 10")."""
    with pytest.raises(ValueError, match=r"must be HOST:PORT such as 127\.0\.0\.1:9400"):
        parse_address(f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"daemon": {"metrics_address": "ü..x:9400"}, **MINIMAL}, "daemon.metrics_address"),
        (_domain(engine={"url": "http://ü..x/metrics"}), "domains[0].engine.url"),
        (
            {"daemon": {"backend": "emulated", "emulator": "http://ü..x:8000"}, **MINIMAL},
            "daemon.emulator",
        ),
        (
            {"daemon": {"backend": "zeusd", "zeusd": {"url": "http://ü..x:4938"}}, **MINIMAL},
            "daemon.zeusd.url",
        ),
    ],
)
def test_a_host_that_is_no_name_is_refused_naming_the_field(
    data: dict[str, object], path: str
) -> None:
    """check-config said OK to an engine URL or emulator no scrape could reach, and a
    metrics address that check-config and run ended in a traceback on."""
    with pytest.raises(ConfigError) as info:
        parse_config(data, "gpugov.toml")
    assert str(info.value).startswith(f"gpugov.toml: {path}: ")
    assert "is no host name (label empty or too long)" in str(info.value)


def test_emulated_backend_needs_an_emulator_url() -> None:
    """backend = "emulated" without emulator = URL is one clear error; with it, valid."""
    with pytest.raises(ConfigError, match="needs emulator"):
        parse_config({"daemon": {"backend": "emulated"}, **MINIMAL})
    config = parse_config(
        {"daemon": {"backend": "emulated", "emulator": "http://127.0.0.1:8000"}, **MINIMAL}
    )
    assert config.daemon.emulator == "http://127.0.0.1:8000"


def test_the_recommended_mpc_period_is_valid_with_the_default_timeout(tmp_path: Path) -> None:
    """``period_s = 0.5`` alone: the unset engine timeout follows the period."""
    path = tmp_path / "gpugov.toml"
    path.write_text(
        '[daemon]\nperiod_s = 0.5\n\n[[domains]]\nname = "llm"\ngpus = [0]\n\n'
        '[domains.controller]\nkind = "mpc"\n\n[domains.safety]\ndwell_s = 0.5\n'
    )
    config = load_config(path)
    assert config.domains[0].engine.timeout_s == 0.25
    # The default period keeps the 0.5 s deadline; a table without the key too.
    assert parse_config(MINIMAL).domains[0].engine.timeout_s == 0.5
    table = _domain(engine={"kind": "vllm"})
    assert parse_config({"daemon": {"period_s": 0.2}, **table}).domains[0].engine.timeout_s == 0.1
    # A timeout the file sets is kept, and refused when not shorter than the period.
    assert parse_config({"daemon": {"period_s": 0.5}, **_domain(engine={"timeout_s": 0.3})})
    with pytest.raises(ConfigError) as info:
        parse_config({"daemon": {"period_s": 0.5}, **_domain(engine={"timeout_s": 0.5})}, "f.toml")
    message = str(info.value)
    assert message.count("\n") == 0
    assert "domains[0].engine.timeout_s (0.5 s) must be shorter than daemon.period_s" in message
    assert "leave it unset for 0.25 s" in message


def test_max_controller_failures_default() -> None:
    assert parse_config(MINIMAL).daemon.max_controller_failures == 10
    config = parse_config({"daemon": {"max_controller_failures": 1}, **MINIMAL})
    assert config.daemon.max_controller_failures == 1


def test_the_example_config_runs_mpc_online_at_its_period_under_a_target() -> None:
    """The example is what the benchmarks measure: ``mpc-online`` every 0.25 s under a
    99 % SLO target; the engine's scrape deadline follows the period."""
    config = load_config(EXAMPLE)
    domain = config.domains[0]
    assert domain.controller.kind == "mpc-online" and config.daemon.period_s == 0.25
    assert domain.slo_target is not None and domain.slo_target.attainment == 0.99
    assert domain.engine.timeout_s == 0.125


@pytest.mark.parametrize("period", ["0.5", "1.0"])
def test_the_example_config_at_another_period_is_valid(tmp_path: Path, period: str) -> None:
    """The example recommends ``period_s = 0.5`` for ``mpc``: changing only that works."""
    text = EXAMPLE.read_text()
    assert "period_s = 0.25 " in text
    path = tmp_path / "config.toml"
    path.write_text(text.replace("period_s = 0.25 ", f"period_s = {period} ", 1))
    config = load_config(path)
    assert config.daemon.period_s == float(period)
    assert config.domains[0].engine.timeout_s == min(0.5, float(period) / 2)


def test_a_period_too_long_for_a_float_is_the_field_error(tmp_path: Path) -> None:
    # A 401-digit period_s raised OverflowError while the engine timeouts were filled in.
    path = tmp_path / "gpugov.toml"
    path.write_text(f"[daemon]\nperiod_s = 1{'0' * 400}\n\n[[domains]]\nname = 'llm'\ngpus = [0]\n")
    with pytest.raises(ConfigError, match="period_s"):
        load_config(path)


def test_a_number_past_the_digit_limit_is_a_toml_error(tmp_path: Path) -> None:
    path = tmp_path / "gpugov.toml"
    path.write_text(f"[daemon]\nperiod_s = 1{'0' * 5000}\n")
    with pytest.raises(ConfigError, match="more digits than can be read"):
        load_config(path)


@pytest.mark.parametrize(
    ("daemon", "message"),
    [
        ({"emulator": "http://127.0.0.1:70000"}, "daemon.emulator: .*Port out of range"),
        ({"emulator": "http://[::1"}, "daemon.emulator: .*Invalid IPv6 URL"),
        ({"emulator": "http://"}, "daemon.emulator: must name a host"),
        ({"record": "a\x00b"}, "daemon.record: a path cannot hold a NUL byte"),
        ({"state_dir": "a\x00b"}, "daemon.state_dir: a path cannot hold a NUL byte"),
    ],
    ids=["port", "ipv6", "no-host", "nul-record", "nul-state"],
)
def test_addresses_and_paths_no_system_call_takes_are_config_errors(
    daemon: dict[str, str], message: str
) -> None:
    # check-config said OK (or raised), and run crashed on them.
    with pytest.raises(ConfigError, match=message):
        parse_config({"daemon": daemon, "domains": [{"name": "llm", "gpus": [0]}]})


@pytest.mark.parametrize(
    ("daemon", "domain", "field"),
    [
        ({}, {"engine": {"url": "http://127.0.0.1:0/metrics"}}, "domains[0].engine.url"),
        ({"backend": "emulated", "emulator": "http://127.0.0.1:0"}, {}, "daemon.emulator"),
        ({"backend": "zeusd", "zeusd": {"url": "http://127.0.0.1:0"}}, {}, "daemon.zeusd.url"),
    ],
    ids=["engine", "emulator", "zeusd"],
)
def test_a_url_at_port_0_is_a_config_error(
    daemon: dict[str, object], domain: dict[str, object], field: str
) -> None:
    # Port 0 reaches nothing: check-config said OK and every scrape or write failed (the
    # engine's domain sat at its fail-safe), where --engine-url refused it.
    with pytest.raises(ConfigError, match=re.escape(field) + ": .*port 0"):
        parse_config({"daemon": daemon, "domains": [{"name": "llm", "gpus": [0], **domain}]})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:8000/me trics", "cannot hold spaces or control characters"),
        ("http://127.0.0.1:8000/metrics\r\nX: y", "cannot hold spaces or control characters"),
        ("http://[::1:8000/metrics", "is not a URL"),
        ("http://gpugov:s3cret@127.0.0.1:8000/metrics", "cannot hold credentials"),
        ("https://token@engine.example:443/metrics", "cannot hold credentials"),
    ],
    ids=["space", "crlf", "ipv6", "user-password", "user"],
)
def test_an_engine_url_http_client_refuses_is_a_config_error(url: str, message: str) -> None:
    # check-config said OK and the daemon sat at the fail-safe, an InvalidURL every tick
    # (credentials: dropped from every request, a 401 every tick).
    domain = {"name": "llm", "gpus": [0], "engine": {"url": url}}
    with pytest.raises(ConfigError, match=message) as caught:
        parse_config({"domains": [domain]})
    assert "\r" not in str(caught.value).replace("\\r", "")
    assert "s3cret" not in str(caught.value)  # a password is not echoed


@pytest.mark.parametrize(
    ("data", "path", "reason"),
    [
        (_domain(controller={"kind": "mpc-online", "warmup_s": 1e308}), "warmup_s", "less than"),
        (
            _domain(controller={"kind": "mpc-online", "hinted_warmup_s": 1e308}),
            "hinted_warmup_s",
            "less than",
        ),
        (_domain(controller={"kind": "mpc-online", "memory_s": 1e308}), "memory_s", "less than"),
        (
            _domain(controller={"kind": "mpc-online", "uncertainty_z": 1e308}),
            "uncertainty_z",
            "less than or equal to 10",
        ),
        (
            _domain(controller={"kind": "mpc-online", "mean_prompt_tokens": 1e308}),
            "mean_prompt_tokens",
            "less than or equal to 1000000000",
        ),
        (_domain(controller={"kind": "mpc", "horizon_s": 1e308}), "horizon_s", "less than"),
        (
            _domain(controller={"kind": "mpc-slsqp", "solve_time_limit_s": 1e308}),
            "solve_time_limit_s",
            "less than",
        ),
        (_domain(controller={"kind": "dps", "loop_s": 1e308}), "loop_s", "less than"),
    ],
    ids=["warmup", "hinted-warmup", "memory", "z", "mean-prompt", "horizon", "solve", "dps-loop"],
)
def test_a_controller_value_past_its_range_is_one_line(
    data: dict[str, object], path: str, reason: str
) -> None:
    # warmup_s = 1e308 was a traceback (OverflowError counting periods); uncertainty_z or
    # mean_prompt_tokens = 1e308 passed and the warm-up decision raised.
    with pytest.raises(ConfigError) as info:
        parse_config(data, "gpugov.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"gpugov.toml: domains[0].controller.{path}: ")
    assert reason in lines[0]


@pytest.mark.parametrize(
    ("data", "path", "reason"),
    [
        (_domain(stale_after_s=1e308), "domains[0].stale_after_s", "less than or equal to 600"),
        (_domain(engine={"timeout_s": 1e-300}), "domains[0].engine.timeout_s", "0.01"),
        (
            {"daemon": {"actuator": {"timeout_s": 1e-300}}, **MINIMAL},
            "daemon.actuator.timeout_s",
            "0.01",
        ),
        (_domain(mean_output_tokens=1e308), "domains[0].mean_output_tokens", "less than"),
        (_domain(ttft_slo_s=1e308), "domains[0].ttft_slo_s", "less than"),
    ],
    ids=["stale", "engine-timeout", "actuator-timeout", "mean-output", "ttft-slo"],
)
def test_a_daemon_value_past_its_range_is_one_line(
    data: dict[str, object], path: str, reason: str
) -> None:
    # stale_after_s = 1e308 meant a fail-safe that never engages; timeout_s = 1e-300 a
    # scrape that always times out.
    with pytest.raises(ConfigError) as info:
        parse_config(data, "gpugov.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpugov.toml: {path}: ")
    assert reason in lines[0]


@pytest.mark.parametrize("kind", sorted(controller_kinds()))
def test_every_controller_kind_is_left_out_of_the_error_path(kind: str) -> None:
    # "mpc-slsqp" was missing: its errors named controller.mpc-slsqp.horizon_s.
    with pytest.raises(ConfigError) as info:
        parse_config(_domain(controller={"kind": kind, "no_such_key": 1}), "gpugov.toml")
    assert "gpugov.toml: domains[0].controller.no_such_key: unknown key" in str(info.value)
    assert f".{kind}." not in str(info.value)


def test_the_controller_kinds_are_the_documented_ones() -> None:
    assert {"max", "fixed", "mpc", "mpc-slsqp", "mpc-online", "external"} <= controller_kinds()


def test_relative_paths_are_taken_from_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Prometheus reads its rule files: a config checked beside it and run by systemd
    (working directory /) names the same files. Absolute paths and bundled profile names
    stay as written; a `~` path is the home's."""
    folder = tmp_path / "etc"
    folder.mkdir()
    config = folder / "config.toml"
    config.write_text(
        """
[daemon]
backend = "zeusd"
record = "record.jsonl"
state_dir = "/var/lib/gpugov"
[daemon.zeusd]
socket = "run/zeusd.sock"
token_file = "~/zeusd.token"
[[domains]]
name = "a"
gpus = [0]
power_budget_file = "budget/limit"
controller = { kind = "mpc-online", prior_profile = "profiles/mine.json", state_dir = "state" }
[[domains]]
name = "b"
gpus = [1]
controller = { kind = "mpc", profile = "h100-sxm-llama3-8b" }
"""
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    loaded = load_config("etc/config.toml")
    assert loaded.daemon.record == folder / "record.jsonl"
    assert loaded.daemon.state_dir == Path("/var/lib/gpugov")
    assert loaded.daemon.zeusd is not None
    assert loaded.daemon.zeusd.socket == folder / "run" / "zeusd.sock"
    assert loaded.daemon.zeusd.token_file == tmp_path / "home" / "zeusd.token"
    first, second = loaded.domains
    assert first.power_budget_file == folder / "budget" / "limit"
    assert first.controller.prior_profile == str(folder / "profiles" / "mine.json")  # type: ignore[union-attr]
    assert first.controller.state_dir == folder / "state"  # type: ignore[union-attr]
    assert second.controller.profile == "h100-sxm-llama3-8b"  # type: ignore[union-attr]


def test_a_home_path_in_the_file_is_the_homes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~/...` names a file in the home, as a shell takes it: it was kept as written and
    read as a folder named `~` in the working directory (under systemd, `/~/...`), where
    the daemon made its state directory and `check-config` looked for the record's."""
    home = tmp_path / "home"
    config = tmp_path / "config.toml"
    config.write_text(
        """
[daemon]
record = "~/record.jsonl"
state_dir = "~/state"
[[domains]]
name = "a"
gpus = [0]
power_budget_file = "~/budget"
controller = { kind = "mpc-online", prior_profile = "~/mine.json", state_dir = "~/learned" }
"""
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    loaded = load_config(config)
    assert loaded.daemon.record == home / "record.jsonl"
    assert loaded.daemon.state_dir == home / "state"
    domain = loaded.domains[0]
    assert domain.power_budget_file == home / "budget"
    assert domain.controller.prior_profile == str(home / "mine.json")  # type: ignore[union-attr]
    assert domain.controller.state_dir == home / "learned"  # type: ignore[union-attr]


def test_a_home_of_no_user_is_refused(tmp_path: Path) -> None:
    """`~nobody-here/...` (no such user) names no home: one line naming the key, where it
    was read as a folder `~nobody-here` in the working directory."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[daemon]\nstate_dir = "~gpugov-no-such-user/state"\n[[domains]]\nname = "a"\ngpus = [0]\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert str(info.value) == (
        f"{config}: daemon.state_dir: '~gpugov-no-such-user/state' names the home of no user "
        "on this machine; write the full path"
    )


def test_a_spec_takes_its_files_from_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--controller open-loop:~/plan.json`, `mpc:~/p.json`: no shell expands a `~` after
    the colon, and the file in the home was "not found"."""
    from gpugov.daemon.controller_spec import parse_controller_spec
    from gpugov.plant.profile_files import bundled_profile_dir

    for name in ("mine.json", "mine.csv"):
        (tmp_path / name).write_bytes(
            (bundled_profile_dir() / f"h100-sxm-llama3-8b{name[4:]}").read_bytes()
        )
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = parse_controller_spec("open-loop:~/plan.json")
    assert spec.plan == tmp_path / "plan.json"  # type: ignore[union-attr]
    mine = str(tmp_path / "mine.json")
    for kind in ("mpc", "mpc-slsqp", "power-profile"):
        assert parse_controller_spec(f"{kind}:~/mine.json").profile == mine  # type: ignore[union-attr]
    for text in ("mpc-online:~/mine.json", "mpc-online:profile=~/mine.json"):
        assert parse_controller_spec(text).prior_profile == mine  # type: ignore[union-attr]


def test_an_emulated_gpu_named_by_uuid_is_refused_naming_the_field() -> None:
    """The emulator's GPUs answer to their index only: a UUID passed check-config
    --offline, and run stopped at its start in a line that named no file or field."""
    data = {
        "daemon": {"backend": "emulated", "emulator": "http://127.0.0.1:8000"},
        "domains": [{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [1, "GPU-1234"]}],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data, "gpugov.toml")
    assert str(info.value) == (
        "gpugov.toml: domains[1].gpus: 'GPU-1234': backend = \"emulated\" names a "
        "GPU by its index (0, 1, ...), as gpugov emulate lists them"
    )
    data["daemon"] = {"backend": "nvml"}
    assert parse_config(data).domains[1].gpus == (1, "GPU-1234")


@pytest.mark.parametrize(
    ("controller", "said"),
    [
        ({}, "domains[0].controller.kind: missing: name the controller, one of agft, "),
        (
            {"kind": "mpc-onlin"},
            "domains[0].controller.kind: unknown controller 'mpc-onlin' (did you mean "
            "'mpc-online'?); one of agft, ",
        ),
    ],
)
def test_a_missing_or_mistyped_controller_kind_is_named_in_the_files_words(
    controller: dict[str, str], said: str
) -> None:
    """pydantic's own lines named its machinery: "Unable to extract tag using discriminator
    'kind'", "Input tag 'mpc-onlin' found using 'kind' does not match any of the expected
    tags"."""
    with pytest.raises(ConfigError) as info:
        parse_config(_domain(controller=controller), "gpugov.toml")
    assert str(info.value).startswith(f"gpugov.toml: {said}"), str(info.value)
    assert "max, mpc, mpc-online" in str(info.value) and "tag" not in str(info.value)


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1:9400", "http://127.0.0.1:9400/metrics"),
        ("127.0.0.1:9400", "http://localhost:9400/metrics"),
        ("0.0.0.0:9401", "http://127.0.0.1:9401/metrics"),
        ("[::1]:80", "http://[::1]/metrics"),
    ],
)
def test_an_engine_url_that_is_the_daemons_own_metrics_is_refused(address: str, url: str) -> None:
    """A copied address: check-config said OK, and the domain sat at its fail-safe, every
    scrape of its own exporter finding no engine gauges ("wrong engine kind")."""
    data = {"daemon": {"metrics_address": address}, **_domain(engine={"url": url})}
    with pytest.raises(ConfigError) as info:
        parse_config(data, "gpugov.toml")
    assert str(info.value) == (
        f"gpugov.toml: domains[0].engine.url ({url}) is this daemon's own metrics "
        f"endpoint (daemon.metrics_address = {address}); give the serving engine's /metrics URL"
    )
    for mine, other in (
        ("127.0.0.1:9400", "http://127.0.0.1:8000/metrics"),
        ("127.0.0.1:9400", "http://10.0.0.6:9400/metrics"),
        ("0.0.0.0:9400", "http://10.0.0.6:9400/metrics"),  # maybe another host's
        ("[::1]:9400", "http://127.0.0.1:9400/metrics"),  # another address family's socket
    ):
        data = {"daemon": {"metrics_address": mine}, **_domain(engine={"url": other})}
        assert parse_config(data).domains[0].engine.url == other
    assert parse_config({"daemon": {"metrics_address": ""}, **_domain(engine={"url": url})})


def test_an_unset_period_follows_the_controllers() -> None:
    """Unset, ``daemon.period_s`` is mpc-online's 0.25 s when every domain runs it (the
    scrape deadline following), 1 s beside any other controller; a set one is kept."""
    online = {"kind": "mpc-online"}
    config = parse_config(_domain(controller=online))
    assert config.daemon.period_s == 0.25 and config.domains[0].engine.timeout_s == 0.125
    assert config.stale_after_s(config.domains[0]) == 0.75
    mixed = {
        "domains": [
            {"name": "a", "gpus": [0], "controller": online},
            {"name": "b", "gpus": [1], "controller": {"kind": "fixed", "clock_mhz": 1200}},
        ]
    }
    assert parse_config(mixed).daemon.period_s == 1.0
    assert parse_config(_domain()).daemon.period_s == 1.0  # the default controller, max
    kept = parse_config({"daemon": {"period_s": 2.0}, **_domain(controller=online)})
    assert kept.daemon.period_s == 2.0 and kept.domains[0].engine.timeout_s == 0.5


@pytest.mark.parametrize(
    "data",
    [
        _domain(controller={"kind": "mpc-online"}, engine={"timeout_s": 0.5}),
        _domain(controller={"kind": "mpc-online", "horizon_s": 60.0}),
        {
            "daemon": {"backend": "actuator", "actuator": {"timeout_s": 0.25}},  # set so
            **_domain(controller={"kind": "mpc-online"}),
        },
    ],
    ids=["engine-timeout", "long-horizon", "actuator-timeout"],
)
def test_an_unset_period_stays_1_s_where_the_file_needs_longer(data: dict[str, object]) -> None:
    """A file valid at the 1 s default stays valid: mpc-online's 0.25 s is the default only
    where every timing the file sets fits it."""
    assert parse_config(data).daemon.period_s == 1.0
    with pytest.raises(ConfigError, match=r"period_s[ =(]+0\.25 s"):
        daemon = {**data.get("daemon", {}), "period_s": 0.25}  # type: ignore[dict-item]
        parse_config({**data, "daemon": daemon})


@pytest.mark.parametrize(
    "daemon",
    [{"backend": "actuator"}, {"backend": "zeusd", "zeusd": {"socket": "/run/zeusd.sock"}}],
    ids=["actuator", "zeusd"],
)
def test_an_unset_write_timeout_follows_the_period(daemon: dict[str, object]) -> None:
    """A split-mode node's unset request deadline is half the period where that is under
    0.25 s, as the scrape's is: mpc-online runs at its 0.25 s (it was kept at 1 s, and a
    period_s = 0.25 refused for a timeout the file never set)."""
    name = str(daemon["backend"])
    online = _domain(controller={"kind": "mpc-online"})
    config = parse_config({"daemon": daemon, **online})
    assert config.daemon.period_s == 0.25
    assert getattr(config.daemon, name).timeout_s == 0.125
    for period, timeout in ((0.25, 0.125), (0.05, 0.025), (0.8, 0.25)):
        set_period = parse_config({"daemon": {**daemon, "period_s": period}, **online})
        assert getattr(set_period.daemon, name).timeout_s == timeout
    assert getattr(parse_config({"daemon": daemon, **_domain()}).daemon, name).timeout_s == 0.25


def test_an_unset_lease_and_slo_window_follow_a_long_period() -> None:
    """A lease renewed once a tick and an SLO window of twelve ticks: unset, they stretch
    with a long period (3 x and 12 x period_s) instead of refusing a file for a default
    it never set; set too short, they are still refused in one line."""
    online = _domain(
        controller={"kind": "mpc-online"}, ttft_slo_s=1.0, slo_target={"attainment": 0.99}
    )
    for period, lease, window in ((0.25, 3.0, 600.0), (2.0, 6.0, 600.0), (55.0, 165.0, 660.0)):
        config = parse_config({"daemon": {"backend": "actuator", "period_s": period}, **online})
        assert config.daemon.actuator.lease_s == lease
        target = config.domains[0].slo_target
        assert target is not None and target.window_s == window
    with pytest.raises(ConfigError, match=r"actuator.lease_s \(3 s\) must be at least 3 x"):
        parse_config(
            {"daemon": {"backend": "actuator", "period_s": 2.0, "actuator": {"lease_s": 3.0}}}
            | online
        )
    # Built in code (as tests and tools do), an unset window stretches the same way.
    from gpugov.daemon.config import DaemonSection, DomainConfig, SLOTargetConfig

    built = GpugovConfig(
        daemon=DaemonSection(period_s=55.0),
        domains=(
            DomainConfig(
                name="llm", gpus=(0,), ttft_slo_s=1.0, slo_target=SLOTargetConfig(attainment=0.99)
            ),
        ),
    )
    assert built.domains[0].slo_target is not None
    assert built.domains[0].slo_target.window_s == 660.0
    short = _domain(ttft_slo_s=1.0, slo_target={"attainment": 0.99, "window_s": 600.0})
    with pytest.raises(ConfigError, match=r"slo_target.window_s \(600 s\) must be at least"):
        parse_config({"daemon": {"period_s": 55.0}, **short})


def test_an_unset_period_follows_the_controllers_when_built_in_code() -> None:
    """Built from models (as tests and tools do), an unset period is filled the same way."""
    from gpugov.daemon.config import DaemonSection, DomainConfig
    from gpugov.daemon.controller_config import OnlineMPCControllerConfig

    domain = DomainConfig(
        name="llm", gpus=(0,), controller=OnlineMPCControllerConfig(kind="mpc-online")
    )
    config = GpugovConfig(daemon=DaemonSection(dry_run=True), domains=(domain,))
    assert config.daemon.period_s == 0.25 and config.daemon.dry_run
    set_period = GpugovConfig(daemon=DaemonSection(period_s=1.0), domains=(domain,))
    assert set_period.daemon.period_s == 1.0


@pytest.mark.parametrize(
    ("daemon", "field"),
    [
        ({"backend": "actuator", "actuator": {"socket": "/run/" + "a" * 110}}, "actuator"),
        ({"backend": "zeusd", "zeusd": {"socket": "/run/" + "z" * 110}}, "zeusd"),
    ],
)
def test_a_socket_path_too_long_for_a_unix_address_is_refused(
    daemon: dict[str, object], field: str
) -> None:
    """A Unix socket's address holds 107 bytes of path: a longer one passed check-config
    (OK, with a warning that the actuator is unreachable 'until it answers') and run held
    every domain's fail-safe for good. The actuator's own --socket refuses it."""
    with pytest.raises(ConfigError) as raised:
        parse_config({"daemon": daemon, **MINIMAL}, "node.toml")
    lines = str(raised.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"node.toml: daemon.{field}.socket: ")
    assert "at most 107 bytes" in lines[0]
