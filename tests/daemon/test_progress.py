"""The shared progress reporter: ETA arithmetic, terminal redraws, periodic log lines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.daemon.progress import Progress, clear_interrupt, format_duration, note_interrupt


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.4, "59s"), (73, "1m13s"), (3700, "1h01m"), (-1, "?"), (float("inf"), "?")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_eta_from_the_rate_so_far() -> None:
    clock = FakeClock()
    progress = Progress(100, "simulate", unit="s", stream=io.StringIO(), clock=clock, tty=False)
    clock.now_s = 10.0
    line = progress.line(25, "energy 1.0 kJ")
    assert "25.0% (25/100 s)" in line
    assert "elapsed 10s" in line
    assert "ETA 30s" in line  # 25 units in 10 s: 75 more take 30 s
    assert line.endswith("energy 1.0 kJ")


def test_no_eta_from_the_first_instant_of_a_run() -> None:
    """A run whose first tick reached 0.01 of 599 simulated s in 2 ms showed an ETA of
    3h10m; the ETA waits for a second or a percent of the work."""
    clock = FakeClock()
    progress = Progress(599, "run --simulate", stream=io.StringIO(), clock=clock, tty=False)
    clock.now_s = 0.002
    assert "ETA ?" in progress.line(0.01)
    assert "ETA 0s" in progress.line(6.0)  # a percent done: 593 more at 3,000 a second
    clock.now_s = 1.0
    assert "ETA 59s" in progress.line(10.0)


def test_log_mode_writes_one_line_per_interval_and_a_final_line() -> None:
    clock, stream = FakeClock(), io.StringIO()
    progress = Progress(10, "job", stream=stream, clock=clock, tty=False, log_interval_s=5.0)
    for step in range(1, 11):
        clock.now_s = float(step)
        progress.update(step)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # t=1 (first), t=6 (interval passed), and the closing line
    assert "100.0%" in lines[-1]
    assert "\r" not in stream.getvalue()


def test_terminal_mode_redraws_in_place() -> None:
    clock, stream = FakeClock(), io.StringIO()
    with Progress(4, "job", stream=stream, clock=clock, tty=True, tty_interval_s=0.0) as bar:
        for step in range(1, 5):
            clock.now_s = float(step)
            bar.update(step)
    text = stream.getvalue()
    assert text.count("\r\x1b[2K") == 5  # four updates and the closing redraw
    assert "[####################]" in text
    assert text.endswith("\n")


def test_disabled_progress_writes_nothing() -> None:
    stream = io.StringIO()
    progress = Progress(5, "job", stream=stream, tty=False, enabled=False)
    progress.update(5, force=True)
    progress.close()
    assert stream.getvalue() == ""


def test_a_negative_total_is_refused() -> None:
    with pytest.raises(ValueError, match="-1"):
        Progress(-1, "job")


def test_a_noted_ctrl_c_is_raised_at_the_next_update_once() -> None:
    """A KeyboardInterrupt swallowed where it was raised (a compiled kernel's call back
    into Python) is raised again at the next progress update, even a quiet one's."""
    progress = Progress(10.0, "run", stream=io.StringIO(), clock=FakeClock(), enabled=False)
    note_interrupt()
    try:
        with pytest.raises(KeyboardInterrupt):
            progress.update(1.0)
        progress.update(2.0)  # raised once: handled, not raised again
    finally:
        clear_interrupt()


def test_a_noted_sigterm_is_raised_as_terminated() -> None:
    """A SIGTERM swallowed the same way is raised again as ``Terminated`` (exit 143)."""
    from gpugov.daemon.errors import Terminated

    progress = Progress(10.0, "run", stream=io.StringIO(), clock=FakeClock(), enabled=False)
    note_interrupt(terminated=True)
    try:
        with pytest.raises(Terminated):
            progress.update(1.0)
        assert Terminated.caused(KeyboardInterrupt())
        progress.update(2.0)
    finally:
        clear_interrupt()
        Terminated.forget()


def test_simulate_ends_on_a_ctrl_c_the_run_swallowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C lost inside the run (here noted by the controller, as the CLI's handler
    notes it, with no exception reaching the loop) still ends ``simulate`` with its
    interrupted line and exit 130, and no results file."""
    out = tmp_path / "run.json"
    code = main(
        [
            "simulate",
            "--quiet",
            "--duration",
            "120",
            "--controller",
            "example_outside_governor:make_swallowing",
            "--out",
            str(out),
        ]
    )
    assert code == 130
    assert "gpugov: interrupted at" in capsys.readouterr().err
    assert not out.exists()


def test_a_quiet_start_shows_a_line_only_once_the_command_runs_long() -> None:
    """``quiet_start`` (replay): nothing for a run shorter than the interval, not even a
    final line; a line once an interval has passed, and the final one then."""
    clock, stream = FakeClock(), io.StringIO()
    short = Progress(4.0, "replay", stream=stream, clock=clock, tty=False, quiet_start=True)
    short.update(1.0)
    clock.now_s = 5.0
    short.update(3.0)
    short.close(done=4.0)
    assert stream.getvalue() == ""
    long = Progress(4.0, "replay", stream=stream, clock=clock, tty=False, quiet_start=True)
    clock.now_s = 16.0
    long.update(1.0)
    long.close(done=4.0)
    assert stream.getvalue().count("replay") == 2


def test_quiet_start_s_sets_when_the_first_line_comes() -> None:
    """``quiet_start_s``: no line before that long (on a terminal, whose interval is
    shorter), lines at the interval after it, and nothing at all for a shorter run."""
    clock, stream = FakeClock(), io.StringIO()
    bar = Progress(10.0, "job", stream=stream, clock=clock, tty=True, quiet_start_s=2.0)
    for step in range(1, 5):  # 0.5 s apart: 0.5 to 2.0 s
        clock.now_s = step * 0.5
        bar.update(step)
    assert stream.getvalue().count("\r") == 1  # at 2.0 s only
    short = Progress(10.0, "job", stream=(quiet := io.StringIO()), clock=clock, tty=True,
                     quiet_start_s=2.0)  # fmt: skip
    clock.now_s += 1.9
    short.update(10.0)
    short.close()
    assert quiet.getvalue() == ""
    with pytest.raises(ValueError, match="quiet_start_s"):
        Progress(1.0, "job", quiet_start_s=-1.0)


def _azure_trace(path: Path, rows: int) -> Path:
    """A generated Azure-2024-style trace of ``rows`` rows, 10 ms apart."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens\n"]
    for index in range(rows):
        seconds, centis = divmod(index, 100)
        lines.append(
            f"2024-05-10 {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}."
            f"{centis:02d}0000+00:00,{1 + index % 900},{1 + index % 90}\n"
        )
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_a_long_trace_load_shows_progress_in_mb_with_an_eta(tmp_path: Path) -> None:
    """``trace_progress`` wired to ``load_trace``: a line once the load has taken two
    seconds (a clock that moves a second a reading), in MB of the file, with an ETA, and a
    final 100 % line; the same load on a clock that stands still shows nothing."""
    from gpugov.daemon.cli_support import trace_progress
    from gpugov.plant.workload import load_trace

    path = _azure_trace(tmp_path / "big.csv", 70_000)  # about 3 MB: several reports
    ticks = iter(range(1_000_000))
    stream = io.StringIO()
    with trace_progress(path, stream=stream, clock=lambda: float(next(ticks))) as on_progress:
        loaded, _ = load_trace(path, on_progress=on_progress)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2
    assert all(line.startswith("reading trace big.csv: ") for line in lines)
    assert "ETA" in lines[0] and " MB)" in lines[0]
    size_mb = path.stat().st_size / 1e6
    assert f"100.0% ({size_mb:,.0f}/{size_mb:,.0f} MB)" in lines[-1]
    still = io.StringIO()
    with trace_progress(path, stream=still, clock=lambda: 0.0) as on_progress:
        again, _ = load_trace(path, on_progress=on_progress)
    assert still.getvalue() == ""
    assert again == loaded
    with trace_progress(path, enabled=False) as on_progress:
        assert on_progress is None


def test_ctrl_c_while_a_trace_loads_ends_with_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real SIGINT, delivered while ``simulate`` parses its trace (at its second
    progress report), ends the command with ``gpugov: interrupted`` and exit 130."""
    import os
    import signal

    import gpugov.plant.trace_formats as trace_formats

    monkeypatch.setattr(trace_formats, "_BLOCK_CHARS", 4096)  # many reports, small trace
    reports: list[float] = []
    update = Progress.update

    def interrupting(self: Progress, done: float, detail: str = "", **kwargs: bool) -> None:
        if self.label.startswith("reading trace"):
            reports.append(done)
            if len(reports) == 2:
                os.kill(os.getpid(), signal.SIGINT)
        update(self, done, detail, **kwargs)

    monkeypatch.setattr(Progress, "update", interrupting)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main(["simulate", "--trace", "azure-conv-10min", "--duration", "60"])
    finally:
        signal.signal(signal.SIGINT, previous)
        clear_interrupt()
    err = capsys.readouterr().err
    assert code == 130
    assert len(reports) == 2  # the load stopped there
    assert err.splitlines()[-1] == "gpugov: interrupted"
    assert "Traceback" not in err and "simulate:" not in err
