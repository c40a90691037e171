"""Text from outside the daemon (an engine's labels, NVML's GPU names, a stored model's
key) never forges or breaks a log or output line: it comes out escaped, one line, and
bounded (``daemon.errors.printable``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import MetricsServer, fixture_text, node_commands_on, sigterm_once_open
from fake_pynvml import FakeNvml

import gpugov.daemon.node_cli as node_cli
from gpugov.daemon.errors import LINE_CHARS, printable
from gpugov.daemon.exposition import MAX_LINE_CHARS
from gpugov.daemon.log_lines import LineFormatter

FORGED = "evil\n2026-12-06 01:00:00 INFO gpugov: clocks reset\r\x1b[2J\x00"
"""A label value that, written raw, would end the line, start a forged log line, clear
the terminal and carry a NUL."""
HUGE = "x" * 100_000
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
"""A control character other than the newline that ends a line (and a tab)."""


def _label(value: str) -> str:
    """``value`` as a label value in Prometheus text (its escapes for ``\\``, ``"``, LF)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _forged_page(name: str) -> str:
    """A vLLM page whose running gauge's ``model_name`` is ``name`` and impossible (-1),
    so the scrape's refusal quotes the label."""
    return (
        fixture_text("vllm_v1_real.txt")
        + f'vllm:num_requests_running{{model_name="{_label(name)}"}} -1\n'
    )


def _assert_safe(text: str) -> None:
    """Every line of ``text`` is bounded and has no control character; none is the
    forged one; the forged text is there, escaped."""
    assert text
    for line in text.splitlines():
        assert not RAW.search(line), line[:200]
        assert len(line) <= LINE_CHARS, len(line)
        assert not line.startswith("2026-12-06 01:00:00")
    # Escaped as Python writes it, or as a page's quoted series (a carriage return as
    # \x0d, the label's own escapes kept: daemon.engines).
    assert any(
        f"\\n2026-12-06 01:00:00 INFO gpugov: clocks reset{cr}\\x1b[2J\\x00" in text
        for cr in ("\\r", "\\x0d")
    )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return node_commands_on(monkeypatch, FakeNvml(2))


@pytest.fixture
def daemon_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Put back the root logger's level after a command's ``setup_logging`` set it."""
    level = logging.root.level
    yield
    logging.root.setLevel(level)


def _without_pytests_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root logger without pytest's handlers (they are added as the test starts), so
    a command's ``setup_logging`` installs the daemon's own stderr handler."""
    monkeypatch.setattr(logging.root, "handlers", [])


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("x" * LINE_CHARS, "x" * LINE_CHARS),  # at the bound: as it is
        ("\n" * 100, "\\n" * 100),  # escaped, still within it
    ],
)
def test_printable_keeps_what_fits(text: str, shown: str) -> None:
    assert printable(text) == shown


@pytest.mark.parametrize(
    "text",
    [HUGE, "\x1b" * 5_000, "\n" * (LINE_CHARS - 1), FORGED * 3_000, "\U000e0001" * 3_000],
)
def test_printable_bounds_long_text_keeping_both_ends(text: str) -> None:
    """A 100 kB label was printed whole; now the line keeps its start and end, says how
    many characters it left out, and never cuts an escape in two."""
    shown = printable(text)
    assert len(shown) <= LINE_CHARS
    assert not RAW.search(shown) and "\n" not in shown
    found = re.fullmatch(r"(.*)\.\.\.\[(\d+) characters left out\]\.\.\.(.*)", shown)
    assert found is not None
    head, left_out, tail = found.groups()
    # These texts hold no backslash of their own, so the escapes read back exactly.
    start, end = (part.encode().decode("unicode_escape") for part in (head, tail))
    assert len(start) > 100 and len(end) > 100
    assert text.startswith(start) and text.endswith(end)
    assert len(start) + int(left_out) + len(end) == len(text)


def test_a_log_record_and_its_traceback_are_one_line() -> None:
    """A record quoting an engine's label, and a traceback whose exception does, are one
    escaped, bounded line."""
    formatter = LineFormatter()
    record = logging.LogRecord("gpugov.x", logging.WARNING, __file__, 1, "%s", (FORGED,), None)
    line = formatter.format(record)
    assert "\n" not in line and line.endswith(printable(FORGED))
    try:
        raise ValueError(FORGED + HUGE)
    except ValueError:
        import sys

        record = logging.LogRecord("gpugov.x", logging.ERROR, __file__, 1, "failed", (), None)
        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert "\n" not in line and not RAW.search(line) and len(line) <= LINE_CHARS
    assert "failed\\nTraceback (most recent call last):\\n" in line
    assert "...[" in line and line.endswith("x")


def test_a_forged_model_name_on_the_engine_page_is_one_escaped_log_line(
    tmp_path: Path,
    fake: FakeNvml,
    metrics_server: MetricsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    daemon_logging: None,
) -> None:
    """``gpugov run`` logs the start's refused scrape, which quotes the page's
    ``model_name``: its newline started a forged log line, its escape cleared the
    terminal. Now stderr holds only the daemon's own lines, the label escaped in one."""
    _without_pytests_handlers(monkeypatch)
    metrics_server.page = _forged_page(FORGED)
    sigterm_once_open(monkeypatch)
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{tmp_path}"\nlog_level = "info"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
    )
    assert node_cli.main(["run", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "no role read from the engine at start" in err
    _assert_safe(err)
    for line in err.splitlines():
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ gpugov", line), line
    # Longer than a log line, shorter than the longest metrics line a page may have
    # (a longer one is refused unparsed, quoting nothing).
    metrics_server.page = _forged_page(HUGE[: MAX_LINE_CHARS - 200])
    _without_pytests_handlers(monkeypatch)  # the first run's handler gone
    assert node_cli.main(["run", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "characters left out" in err
    assert max(map(len, err.splitlines())) <= LINE_CHARS


def test_status_escapes_the_gpus_name_and_the_engines_answer(
    fake: FakeNvml, metrics_server: MetricsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """NVML's name and UUID and the engine's refused page were printed raw by ``gpugov
    status``."""
    fake.gpus[0].name = FORGED
    fake.gpus[1].uuid = "GPU-" + HUGE
    metrics_server.page = _forged_page(FORGED)
    assert node_cli.main(["status", "--engine-url", metrics_server.url]) == 0
    out = capsys.readouterr().out
    _assert_safe(out)
    assert f"GPU 0: {printable(FORGED)} GPU-fake-0000; supported" in out
    assert "characters left out" in out


def test_check_config_escapes_the_gpus_name(
    tmp_path: Path,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """check-config printed NVML's GPU name raw in the domain's GPU line."""
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    fake.gpus[0].name = FORGED
    fake.gpus[1].name = HUGE
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{tmp_path}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0, 1]\nttft_slo_s = 1.0\ntpot_slo_s = 0.05\n'
        '[domains.engine]\nurl = "http://127.0.0.1:9/metrics"\n'
    )
    assert node_cli.main(["check-config", str(config)]) == 0
    out = capsys.readouterr().out
    _assert_safe(out)
    assert "domain llm: GPU 0, 1 (evil\\n2026-12-06" in out and "characters left out" in out


def test_model_show_escapes_the_stored_model_name_the_store_keeps_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The learned model is keyed on the engine's raw ``model_name`` (compared as it
    came); ``gpugov model show`` printed it raw."""
    from dataclasses import replace

    from synthetic import make_plant, poisson_requests

    from gpugov.cli import main
    from gpugov.controllers.online.controller import OnlineMPCController
    from gpugov.daemon.model_store import PersistentOnlineModel
    from gpugov.daemon.stored_model import model_path, read_stored
    from gpugov.plant import chunked_prefill_scheduler, simulate
    from gpugov.plant.types import ServingObservation

    controller = OnlineMPCController(
        mean_prompt_tokens=1100.0, mean_output_tokens=110.0, warmup_s=10.0
    )
    wrapper = PersistentOnlineModel(controller, tmp_path, "llm", ("GPU-" + FORGED,))

    def named(observation: ServingObservation) -> float:
        return wrapper(replace(observation, model_name=FORGED + HUGE))

    simulate(poisson_requests(20.0), make_plant(), chunked_prefill_scheduler, named, 0)
    wrapper.close()
    key = read_stored(model_path(tmp_path, "llm"))["key"]
    assert key == {"gpu_uuids": ["GPU-" + FORGED], "model_name": FORGED + HUGE}
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    _assert_safe(out)
    assert "characters left out" in out


def test_a_warning_of_a_command_without_logging_set_up_is_one_escaped_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commands that set up no logging print a module's warning through Python's
    last-resort handler, which wrote the message raw."""
    from gpugov.cli import main

    assert logging.lastResort is not None
    monkeypatch.setattr(logging.lastResort, "formatter", None)  # put back after
    _without_pytests_handlers(monkeypatch)
    assert main(["profiles", "--json"]) == 0
    capsys.readouterr()
    logging.getLogger("gpugov.daemon.decide").warning("mpc-online prior: GPU %s", FORGED + HUGE)
    err = capsys.readouterr().err
    assert err.startswith("gpugov: warning: mpc-online prior: GPU evil\\n2026")
    prefix = len("gpugov: warning: ")
    assert len(err) <= prefix + LINE_CHARS + 1  # as `warn` bounds its message
    _assert_safe(err[prefix:])


def test_a_logged_error_of_a_command_is_one_error_line_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record at ERROR with an exception, printed through the last-resort handler of a
    command that sets up no logging: the command's error line, the exception's repr on it
    and no traceback."""
    from gpugov.cli import main

    assert logging.lastResort is not None
    monkeypatch.setattr(logging.lastResort, "formatter", None)  # put back after
    _without_pytests_handlers(monkeypatch)
    assert main(["profiles", "--json"]) == 0
    capsys.readouterr()
    try:
        raise ValueError(FORGED)
    except ValueError:
        logging.getLogger("gpugov.daemon.domain").exception("closing failed")
    err = capsys.readouterr().err
    assert err.startswith("gpugov: error: closing failed: ValueError('evil\\n2026")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_empty_values_error_is_bounded_as_every_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A flag given an empty value was refused on a line built apart from
    :func:`~gpugov.daemon.log_lines.command_line`: only the flag's name was bounded, so a
    huge one made a longer line than any other error's. It is the shared builder's."""
    from gpugov.cli import main
    from gpugov.daemon.log_lines import command_line

    flag = "--" + "x" * (2 * LINE_CHARS)
    assert main(["simulate", f"{flag}="]) == 2
    err = capsys.readouterr().err
    assert err == command_line("error", f"argument {flag}: empty value") + "\n"
    assert len(err) <= len("gpugov: error: ") + LINE_CHARS + 1  # as `fail` bounds its message
    assert err.rstrip("\n").endswith(": empty value")


def test_a_simulated_runs_summary_title_is_one_escaped_line() -> None:
    """The summary's title names the profile and the trace by their file names, which
    may hold a newline; it was printed raw above the table."""
    from synthetic import make_plant, poisson_requests

    from gpugov.daemon.cli_support import format_summary
    from gpugov.plant import chunked_prefill_scheduler, simulate

    result = simulate(
        poisson_requests(5.0), make_plant(), chunked_prefill_scheduler, lambda _: 1980.0, 0
    )
    text = format_summary(result.metrics.as_dict(), f"trace {FORGED}.csv")
    assert text.splitlines()[0] == f"trace {printable(FORGED)}.csv"
    _assert_safe(text)
