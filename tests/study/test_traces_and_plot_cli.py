"""``gpugov traces`` and ``gpugov plot`` (and the matplotlib-missing line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.daemon.record import read_recording
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


def test_plot_writes_a_png_of_a_recording(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rec.png"
    assert main(["plot", str(recording), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert capsys.readouterr().out.strip() == f"wrote {out}"


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


@pytest.mark.parametrize("damage", ["null-tick", "string-observation", "hot", "huge-power"])
def test_plot_names_a_tick_of_the_wrong_shape(
    recording: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each raised a TypeError, ValueError, AttributeError or OverflowError traceback.
    lines = recording.read_text().splitlines()
    row = json.loads(lines[2])
    if damage == "null-tick":
        lines[2] = "null"
    else:
        if damage == "string-observation":
            row["observation"] = "x"
        elif damage == "hot":
            row["observation"]["temperature_c"] = "hot"
        else:
            row["observation"]["power_w"] = 10**400
        lines[2] = json.dumps(row)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    assert main(["plot", str(damaged), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a tick line is not a recording's" in err[0]


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
