"""A recording a newer gpugov wrote (a later format, or a header field this version does
not know) was refused as "not a gpugov-record-v1 header" or a field "not one gpugov
writes", which a newer gpugov does write; the line now says which gpugov wrote it and to
read it with that one. An older or equal version's refusal is as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpugov import __version__
from gpugov.daemon.record import RecordingError
from gpugov.daemon.record_reader import check_header, read_recording

HEADER = {
    "format": "gpugov-record-v1",
    "mode": "simulated",
    "period_s": 1.0,
    "domains": [{"name": "sim", "controller": "max", "supported_clocks_mhz": [345.0, 1980.0]}],
}
TICK = {
    "domain": "sim",
    "observation": {"time_s": 0.0},
}


def _write(tmp_path: Path, header: dict[str, object]) -> Path:
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(TICK) + "\n")
    return path


def test_a_later_format_names_the_gpugov_that_wrote_it(tmp_path: Path) -> None:
    path = _write(tmp_path, {**HEADER, "format": "gpugov-record-v2", "gpugov_version": "0.9.1"})
    with pytest.raises(RecordingError) as caught:
        read_recording(path)
    assert str(caught.value) == (
        f"{path}:1: format 'gpugov-record-v2', written by gpugov 0.9.1; this gpugov "
        f"{__version__} reads gpugov-record-v1: read it with gpugov 0.9.1 or later"
    )


def test_an_unknown_header_field_of_a_newer_gpugov_says_so(tmp_path: Path) -> None:
    header = {**HEADER, "gpugov_version": "0.9.1", "frob": 1}
    with pytest.raises(RecordingError) as caught:
        check_header("run.jsonl", header)
    assert str(caught.value).startswith("run.jsonl:1: header field 'frob' is not one gpugov ")
    assert str(caught.value).endswith(
        f"; the recording was written by gpugov 0.9.1, newer than this {__version__}: read "
        "it with that gpugov"
    )


@pytest.mark.parametrize("version", ["0.0.1", __version__, "not a version", None])
def test_an_unknown_field_of_an_older_or_unknown_version_is_refused_as_before(
    version: str | None,
) -> None:
    header = {**HEADER, "gpugov_version": version, "frob": 1}
    with pytest.raises(RecordingError) as caught:
        check_header("run.jsonl", header)
    assert "newer" not in str(caught.value)
    assert str(caught.value).startswith("run.jsonl:1: header field 'frob' is not one gpugov ")
