"""``gpugov traces`` and ``gpugov plot`` (and the matplotlib-missing line)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpugov.cli import main
from gpugov.daemon.limits import MAX_CLOCK_MHZ
from gpugov.daemon.record_reader import read_recording
from gpugov.study.plot_cli import MIN_SLO_S, PLOT_LIMIT
from gpugov.study.plots import series_from_recording

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "run.jsonl"
    argv = [
        "run",
        "--simulate",
        "--virtual",
        "--duration",
        "30",
        "--controller",
        "mpc",
        "--metrics-address",
        "none",
        "--record",
        str(path),
        "--quiet",
    ]
    assert main(argv) == 0
    return path


def test_traces_lists_every_name_where_it_resolves_and_whether_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUGOV_TRACES_DIR", str(tmp_path))
    (tmp_path / "mooncake_conversation_trace.jsonl").write_text("{}\n")
    assert main(["traces", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["azure-conv-10min"]["kind"] == "bundled" and rows["azure-conv-10min"]["present"]
    assert rows["mooncake"] == {
        "name": "mooncake",
        "kind": "shared",
        "present": True,
        "path": str(tmp_path / "mooncake_conversation_trace.jsonl"),
    }
    assert rows["azure-conv"]["present"] is False
    assert main(["traces"]) == 0
    out = capsys.readouterr().out
    assert f"azure-conv         shared   no       {tmp_path}" in out
    assert f"looked up in {tmp_path}" in out


@pytest.mark.parametrize(
    ("kind", "what"),
    [("missing", "does not exist"), ("file", "is a file, not a directory"), ("dir", None)],
)
def test_traces_warns_once_of_a_traces_dir_that_is_no_directory(
    kind: str,
    what: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Every shared trace was listed as absent, with nothing saying why.
    directory = tmp_path / "traces"
    if kind == "file":
        directory.write_text("not a folder\n")
    elif kind == "dir":
        directory.mkdir()
    monkeypatch.setenv("GPUGOV_TRACES_DIR", str(directory))
    for argv in (["traces"], ["traces", "--json"]):
        assert main(argv) == 0
        captured = capsys.readouterr()
        err = captured.err.splitlines()
        if what is None:
            assert err == []
        else:
            assert err == [
                f"gpugov: warning: $GPUGOV_TRACES_DIR is set to {directory}, which {what}: no "
                "shared trace is found there; point it at the directory holding the shared "
                "traces"
            ]
    json.loads(captured.out)  # the listing itself is unchanged


def test_plot_writes_a_png_of_a_recording(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rec.png"
    assert main(["plot", str(recording), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert capsys.readouterr().out.strip() == f"wrote {out}"


def test_a_plot_is_written_whole_in_the_format_its_name_says(
    recording: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plot was saved in place: a save stopped midway (a full disk, Ctrl-C) left a broken
    image where the earlier one was. It is drawn in memory and renamed into place."""
    from gpugov.daemon import files

    out = tmp_path / "rec.svg"
    assert main(["plot", str(recording), "--out", str(out)]) == 0
    earlier = out.read_bytes()
    assert b"<svg" in earlier[:1000]  # the format from the name, not the temporary's

    def full(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    assert main(["plot", str(recording), "--out", str(out)]) == 1
    assert out.read_bytes() == earlier
    assert [path.name for path in tmp_path.iterdir()] == ["rec.svg"]


def test_recording_series_line_up_requested_and_realised(recording: Path) -> None:
    _, rows = read_recording(recording)
    series = series_from_recording(rows)
    assert len(series.time_s) == len(rows)
    # The realised clock of a tick is the one reported at the next tick.
    assert series.realized_clock_mhz[0] == rows[1]["observation"]["realized_clock_mhz"]
    assert series.realized_clock_mhz[-1] is None
    assert series.ttft_slo_s == rows[-1]["observation"]["ttft_slo_s"]
    assert series.thermal_limit_c == rows[-1]["observation"]["thermal_limit_c"]
    assert len(series.ttft_points[0]) > 0
    assert list(series.power_cap_w) == [None] * len(rows)  # mpc sets no power cap


def test_plot_draws_the_power_limit_gpugov_set(tmp_path: Path) -> None:
    """A cap kind's recording carries the limit gpugov held per tick; the plot reads it."""
    path = tmp_path / "cap.jsonl"
    argv = ["run", "--simulate", "--virtual", "--duration", "20", "--controller"]
    argv += ["power-cap:300", "--metrics-address", "none", "--record", str(path), "--quiet"]
    assert main(argv) == 0
    _, rows = read_recording(path)
    series = series_from_recording(rows)
    assert set(series.power_cap_w) == {300.0}
    assert main(["plot", str(path), "--out", str(tmp_path / "cap.png")]) == 0
    assert (tmp_path / "cap.png").read_bytes().startswith(PNG_MAGIC)


def test_plot_bad_input_is_one_line(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_recording = tmp_path / "x.jsonl"
    not_a_recording.write_text('{"a": 1}\n')
    assert main(["plot", str(not_a_recording)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpugov: error: {not_a_recording}:1: not a gpugov-record-v1 header"]
    assert main(["plot", str(recording), "--domain", "nosuch"]) == 2
    assert "--domain nosuch: not in" in capsys.readouterr().err
    assert main(["plot", str(recording), "--out", str(tmp_path / "no" / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_plot_keeps_every_domain_beside_out_and_never_overwrites_the_recording(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A domain's name is the recording's text: "a/b" raised a traceback (no such folder)
    and "../x" would have written above --out; a recording named rec.png was replaced."""
    lines = recording.read_text().splitlines()
    header = json.loads(lines[0])
    (domain,) = header["domains"]
    names = ["a/b", "../x"]
    header["domains"] = [{**domain, "name": name} for name in names]
    ticks = [json.loads(line) for line in lines[1:]]
    body = [json.dumps({**tick, "domain": name}) for tick in ticks for name in names]
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join([json.dumps(header), *body]) + "\n")
    out = tmp_path / "out" / "two.png"
    out.parent.mkdir()
    assert main(["plot", str(two), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["two-_x.png", "two-a_b.png"]
    capsys.readouterr()
    named_png = tmp_path / "rec.png"
    named_png.write_bytes(recording.read_bytes())
    assert main(["plot", str(named_png)]) == 2
    assert "is the recording" in capsys.readouterr().err
    assert named_png.read_bytes() == recording.read_bytes()


def _plot_refuses(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *named: str
) -> str:
    """Plot ``path``: exit 2, one ``gpugov: error:`` line naming each of ``named``, no PNG."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    assert main(["plot", str(path), "--out", str(out / "x.png")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpugov: error: "), err
    for text in named:
        assert text in err[0], err
    assert list(out.iterdir()) == [] and "wrote" not in captured.out
    return err[0]


def _both_refuse(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *named: str
) -> None:
    """Plot and replay ``path``: each exits 2 with the same one line naming ``named``."""
    said = _plot_refuses(path, tmp_path, capsys, *named)
    assert main(["replay", str(path), "--controller", "max"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [said] and "replayed" not in captured.out


def _damaged(recording: Path, tmp_path: Path, line: int, edit: Callable[[dict], None]) -> Path:
    """A copy of ``recording`` with ``edit`` applied to line ``line`` (1: the header),
    ``"@NaN"`` and the like in a string value written as the bare JSON token."""
    lines = recording.read_text().splitlines()
    data = json.loads(lines[line - 1])
    edit(data)
    text = json.dumps(data)
    for token in ("NaN", "Infinity", "-Infinity", "true", "null", "1e308"):
        text = text.replace(f'"@{token}"', token)
    lines[line - 1] = text
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    return damaged


def _set(*keys: str, value: Any) -> Callable[[dict], None]:
    """An edit setting the field at ``keys`` (nested) to ``value``."""

    def edit(data: dict) -> None:
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value

    return edit


TICK_DAMAGE = {
    # Each passed silently and wrote a PNG.
    "time NaN": (_set("observation", "time_s", value="@NaN"), "time_s"),
    "time Infinity": (_set("observation", "time_s", value="@Infinity"), "time_s"),
    "time true": (_set("observation", "time_s", value="@true"), "field time_s"),
    "time going back": (_set("observation", "time_s", value=-5.0), "observation.time_s"),
    "power NaN": (_set("observation", "power_w", value="@NaN"), "observation.power_w"),
    "power Infinity": (_set("observation", "power_w", value="@Infinity"), "observation.power_w"),
    "temperature Infinity": (
        _set("observation", "temperature_c", value="@Infinity"),
        "observation.temperature_c",
    ),
    "observation null": (_set("observation", value="@null"), "an observation is"),
    "observation empty": (_set("observation", value={}), "field time_s is missing"),
    "unknown key": (_set("observation", "boost_mhz", value=1.0), "unknown field 'boost_mhz'"),
    # Huge finite values printed matplotlib RuntimeWarnings (some then exit 2, some exit 0).
    "requested 1e308": (_set("requested_mhz", value="@1e308"), "requested_mhz"),
    "cap 1e308": (_set("power_cap_w", value="@1e308"), "power_cap_w"),
    "cap text": (_set("power_cap_w", value="lots"), "power_cap_w"),
    "power 1e308": (_set("observation", "power_w", value="@1e308"), "observation.power_w"),
    "power limit 1e308": (
        _set("observation", "power_limit_w", value="@1e308"),
        "observation.power_limit_w",
    ),
    "ttft 1e308": (
        _set("observation", "ttft_recent_s", value="@1e308"),
        "observation.ttft_recent_s",
    ),
    "time 1e308": (_set("observation", "time_s", value="@1e308"), "observation.time_s"),
    "tiny SLO": (_set("observation", "ttft_slo_s", value=1e-300), "observation.ttft_slo_s"),
    # Each raised a TypeError, ValueError, AttributeError or OverflowError traceback.
    "string observation": (_set("observation", value="x"), "an observation is"),
    "hot": (_set("observation", "temperature_c", value="hot"), "field temperature_c"),
    "huge integer power": (_set("observation", "power_w", value=10**400), "field power_w"),
}


@pytest.mark.parametrize("damage", sorted(TICK_DAMAGE))
def test_plot_names_the_field_of_a_bad_tick(
    recording: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad tick is one line naming its line and field, before any PNG."""
    edit, field = TICK_DAMAGE[damage]
    damaged = _damaged(recording, tmp_path, 3, edit)
    _plot_refuses(damaged, tmp_path, capsys, f"{damaged}:3: ", field)


SHARED_TICK_DAMAGE = {
    # Replay took each of these (plot refused some); the two now share one check.
    "requested negative": (_set("requested_mhz", value=-1980.0), "requested_mhz"),
    "power NaN": (_set("observation", "power_w", value="@NaN"), "observation.power_w"),
    "power Infinity": (_set("observation", "power_w", value="@Infinity"), "observation.power_w"),
    "power negative": (_set("observation", "power_w", value=-500.0), "observation.power_w"),
    "temperature NaN": (
        _set("observation", "temperature_c", value="@NaN"),
        "observation.temperature_c",
    ),
    "tick time NaN": (_set("time_s", value="@NaN"), "time_s must be a finite number"),
    "tick time going back": (_set("time_s", value=-100.0), "time_s -100 is before"),
    "ttft SLO negative": (_set("observation", "ttft_slo_s", value=-1.0), "observation.ttft_slo_s"),
    "KV capacity 0": (
        _set("observation", "kv_capacity_tokens", value=0.0),
        "observation.kv_capacity_tokens must be a positive number",
    ),
    "realized clock 1e999": (
        _set("observation", "realized_clock_mhz", value="@Infinity"),
        "observation.realized_clock_mhz",
    ),
    "realized clock 1e308": (
        _set("observation", "realized_clock_mhz", value="@1e308"),
        "observation.realized_clock_mhz must be at most 100000 MHz",
    ),
    # Replay took these (its power cap line then read "mean recorded (as applied) inf W").
    "decision 1e308": (_set("decision_mhz", value="@1e308"), "decision_mhz must be at most"),
    "applied 1e12": (_set("applied_mhz", value=1e12), "applied_mhz must be at most 100000 MHz"),
    "cap 1e308": (_set("power_cap_w", value="@1e308"), "power_cap_w must be at most 1e+06 W"),
}


def test_a_recording_without_ticks_is_refused_by_replay_as_by_plot(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Replay said "replayed 0 decisions" and exited 0.
    header_only = tmp_path / "header.jsonl"
    header_only.write_text(recording.read_text().splitlines()[0] + "\n")
    _both_refuse(header_only, tmp_path, capsys, f"{header_only}: no tick lines")


def test_plot_names_a_tick_that_is_not_an_object(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tick line of JSON null raised a traceback."""
    lines = recording.read_text().splitlines()
    lines[2] = "null"
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    _plot_refuses(damaged, tmp_path, capsys, f"{damaged}:3: a tick is a JSON object")


HEADER_DAMAGE = {
    "no domains": (_set("domains", value=[]), "header domains"),
    "mode 5": (_set("mode", value=5), "header mode must be one of node, simulated"),
    "controller [1]": (
        lambda header: header["domains"][0].update(controller=[1]),
        "header domains[0].controller must be text",
    ),
    "period x": (_set("period_s", value="x"), "header period_s must be a positive number"),
    # mpc-online's replay ended at line 2 in an OverflowError on a period of 1e300.
    "period 1e300": (
        _set("period_s", value=1e300),
        "header period_s must be from 0.05 to 60 s (the config's daemon.period_s bounds), "
        "got 1e+300",
    ),
    "period 0.001": (_set("period_s", value=0.001), "header period_s must be from 0.05 to 60 s"),
    # What replay refuses of a header, plot refuses too (each was plotted).
    "name twice": (
        lambda header: header["domains"].append(dict(header["domains"][0])),
        "header domains[1] names domain 'sim' again (domains[0])",
    ),
    # Replay printed the name as it was: a newline split its report's line in two, an
    # escape sequence drove the terminal.
    "name with control characters": (
        lambda header: header["domains"][0].update(name="a\x1b[31m\nb"),
        "header domains[0].name must be printable text (no control characters), got "
        "'a\\x1b[31m\\nb'",
    ),
    "no clocks": (
        lambda header: header["domains"][0].update(supported_clocks_mhz=[]),
        "domain 'sim' has no supported clocks in the header",
    ),
    # Replay took each of these; plot and replay now share one check of the header.
    "mode quantum": (_set("mode", value="quantum"), "header mode must be one of"),
    "version 5": (_set("gpugov_version", value=5), "header gpugov_version must be text"),
    "unknown key": (_set("frob", value=1), "header field 'frob' is not one gpugov writes"),
    "clocks reversed": (
        lambda header: header["domains"][0].update(
            supported_clocks_mhz=header["domains"][0]["supported_clocks_mhz"][::-1]
        ),
        "header domains[0].supported_clocks_mhz must be ascending",
    ),
}


DAMAGE = {
    **{f"header: {name}": (1, *damage) for name, damage in HEADER_DAMAGE.items()},
    **{f"tick: {name}": (3, *damage) for name, damage in SHARED_TICK_DAMAGE.items()},
}
"""Each damage with the line it is made on (1: the header, 3: a tick)."""


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_plot_and_replay_name_the_field_of_a_bad_line_in_the_same_words(
    recording: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header field of the wrong kind (each plotted silently) is one line at line 1, a
    bad tick one at its own line; replay, which took most of them, refuses each in the
    same words (one check of the recording)."""
    line, edit, field = DAMAGE[damage]
    damaged = _damaged(recording, tmp_path, line, edit)
    _both_refuse(damaged, tmp_path, capsys, f"{damaged}:{line}: ", field)


def _two_domains(recording: Path, second_ticks: bool = True) -> list[str]:
    """The recording's lines as domains "a" and "b" (b's ticks after a's at each step)."""
    lines = recording.read_text().splitlines()
    header = json.loads(lines[0])
    (domain,) = header["domains"]
    header["domains"] = [{**domain, "name": "a"}, {**domain, "name": "b"}]
    body = []
    for line in lines[1:]:
        tick = json.loads(line)
        body.append(json.dumps({**tick, "domain": "a"}))
        if second_ticks:
            body.append(json.dumps({**tick, "domain": "b"}))
    return [json.dumps(header), *body]


def test_plot_checks_every_domain_before_writing_any_png(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad tick of the second domain failed after the first domain's PNG was written."""
    lines = _two_domains(recording)
    bad = json.loads(lines[-1])
    assert bad["domain"] == "b"
    bad["observation"]["power_w"] = "hot"
    lines[-1] = json.dumps(bad)
    damaged = tmp_path / "two.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    _plot_refuses(damaged, tmp_path, capsys, f"{damaged}:{len(lines)}: ", "field power_w")
    # So is a domain with no ticks at all: "a" is not drawn first.
    empty = tmp_path / "empty-b.jsonl"
    empty.write_text("\n".join(_two_domains(recording, second_ticks=False)) + "\n")
    _plot_refuses(empty, tmp_path, capsys, "domain 'b' has no tick lines")


def test_plot_draws_values_at_its_limit_without_a_warning(
    recording: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    recwarn: pytest.WarningsRecorder,
) -> None:
    """Values at ``PLOT_LIMIT`` (and an SLO at ``MIN_SLO_S``) draw cleanly: the bound keeps
    matplotlib's axis arithmetic from overflowing into RuntimeWarning lines."""
    lines = recording.read_text().splitlines()
    body = []
    for index, line in enumerate(lines[1:]):
        tick = json.loads(line)
        big = -PLOT_LIMIT if index % 2 else PLOT_LIMIT
        observation = tick["observation"]
        # Each at its bound: the plot's, or the physical one replay and plot share (a
        # power at least 0, a clock above 0 and at most MAX_CLOCK_MHZ).
        clock = MAX_CLOCK_MHZ if index % 2 else 1e-3
        observation.update(realized_clock_mhz=clock, temperature_c=big)
        observation.update(power_w=abs(big) if index % 2 else 0.0, power_limit_w=PLOT_LIMIT)
        observation.update(ttft_recent_s=PLOT_LIMIT, ttft_slo_s=MIN_SLO_S)
        observation.update(time_s=PLOT_LIMIT - 1000 + index, waiting_requests=int(PLOT_LIMIT))
        tick["requested_mhz"] = clock
        body.append(json.dumps(tick))
    extreme = tmp_path / "extreme.jsonl"
    extreme.write_text("\n".join([lines[0], *body]) + "\n")
    out = tmp_path / "extreme.png"
    assert main(["plot", str(extreme), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert capsys.readouterr().err == ""
    assert [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)] == []


@pytest.mark.parametrize(
    "argv",
    [["plot", "RECORDING"], ["simulate", "--duration", "5", "--plot", "OUT/x.png"]],
)
def test_missing_matplotlib_is_one_line(
    argv: list[str],
    recording: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    argv = [a.replace("RECORDING", str(recording)).replace("OUT", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("gpugov: error: ")
    assert "needs matplotlib" in lines[0]
    assert lines[0].endswith("pip install 'gpugov[plots]'")
    assert not (tmp_path / "x.png").exists()
    if argv[0] == "plot":  # docs/commands.md quotes it word for word
        docs = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
        assert lines[0] in " ".join(docs.read_text().split())


REAL = Path(__file__).resolve().parents[1] / "daemon" / "fixtures" / "h200_dryrun_reactive.jsonl"


def test_old_recording_names_read_as_todays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recording from before the rename says ``reactive_governor``: replay and plot
    show ``reactive``, and the real H200 recording plots (realised under the cap)."""
    assert main(["replay", str(REAL), "--controller", "reactive"]) == 0
    assert "decisions of 'reactive' through 'reactive'" in capsys.readouterr().out
    out = tmp_path / "h200.png"
    assert main(["plot", str(REAL), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    ("out", "said"),
    [("no/x.png", "does not exist"), ("x.txt", "not an image format"), ("d.png", "a directory")],
)
def test_plot_refuses_its_out_before_reading_the_recording(
    recording: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    out: str,
    said: str,
) -> None:
    """--out was checked only after the whole recording was read and checked (a minute for
    a day's recording): a missing folder or a .txt name is refused before any reading."""
    from gpugov.daemon import record_reader

    def unread(*args: object, **kwargs: object) -> None:
        raise AssertionError("the recording was read")

    monkeypatch.setattr(record_reader, "read_recording", unread)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.png").mkdir()
    assert main(["plot", str(recording), "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpugov: error: --out ") and said in err[0], err


def test_plot_shows_progress_with_an_eta_once_it_takes_a_while(
    recording: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A day's recording is a minute of checking and drawing, which went without a word: a
    line of the ticks checked and drawn, with an ETA, once it takes a while (here at once);
    a short plot shows none."""
    from gpugov.study import plot_cli

    ticks = len(read_recording(recording)[1])
    monkeypatch.setattr(plot_cli, "PROGRESS_AFTER_S", 3600.0)
    assert main(["plot", str(recording), "--out", str(tmp_path / "quiet.png")]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(plot_cli, "PROGRESS_AFTER_S", 0.0)
    assert main(["plot", str(recording), "--out", str(tmp_path / "shown.png")]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("plot: ") and f"(1/{2 * ticks:,} ticks)" in lines[0]
    assert "ETA" in lines[0]
    assert lines[-1].startswith(f"plot: 100.0% ({2 * ticks:,}/{2 * ticks:,} ticks), elapsed ")
    assert len(set(lines)) == len(lines)


def test_replay_counts_the_ticks_it_checks_before_those_it_replays(
    recording: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checking a day's recording took half a minute before replay's first progress line;
    its line counts the ticks checked and then those replayed, and ends at 100 %."""
    from gpugov.daemon import replay

    ticks = len(read_recording(recording)[1])
    monkeypatch.setattr(replay, "PROGRESS_AFTER_S", 0.0)
    assert main(["replay", str(recording), "--controller", "max"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("replay:")]
    assert f"(1/{2 * ticks:,} ticks)" in lines[0] and "ETA" in lines[0], lines
    assert lines[-1].startswith(f"replay: 100.0% ({2 * ticks:,}/{2 * ticks:,} ticks), "), lines
