"""``daemon.files``' atomic writes: the old file whole or the new one, never a part."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpugov.daemon import files
from gpugov.daemon.files import write_json_atomic, write_text_atomic


def test_a_write_stopped_midway_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.json"
    target.write_text("old\n")

    def stopped(descriptor: int) -> None:  # Ctrl-C after the text, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fsync", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(target, "new\n" * 10_000)
    assert target.read_text() == "old\n"
    assert [path.name for path in tmp_path.iterdir()] == ["out.json"]


def test_permissions_as_a_plain_write_and_a_link_followed(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        fresh = tmp_path / "fresh.txt"
        write_text_atomic(fresh, "a")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o640  # 0o666 less the umask
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o604)
        write_text_atomic(kept, "new")
        assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o604
        state = tmp_path / "state" / "model.json"
        write_json_atomic(state, {"a": 1})
        assert stat.S_IMODE(state.stat().st_mode) == 0o600  # a state file: its owner's
    finally:
        os.umask(umask)
    link = tmp_path / "link.txt"
    link.symlink_to(kept)
    write_text_atomic(link, "through the link")
    assert link.is_symlink() and kept.read_text() == "through the link"


def test_a_missing_directory_is_an_error_not_created(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "missing" / "out.json", "x")
    assert not (tmp_path / "missing").exists()


def test_files_that_belong_together_are_replaced_all_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv, manifest = tmp_path / "p.csv", tmp_path / "p.json"
    csv.write_text("old csv\n")
    manifest.write_text("old manifest\n")
    real_fsync = files.os.fsync
    calls = []

    def full_disk_on_the_second(descriptor: int) -> None:  # the manifest's write fails
        calls.append(descriptor)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_fsync(descriptor)

    monkeypatch.setattr(files.os, "fsync", full_disk_on_the_second)
    with pytest.raises(OSError, match="No space"):
        files.write_files_atomic({csv: "new csv\n", manifest: b"new manifest\n"})
    assert csv.read_text() == "old csv\n" and manifest.read_text() == "old manifest\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["p.csv", "p.json"]
    monkeypatch.setattr(files.os, "fsync", real_fsync)
    files.write_files_atomic({csv: "new csv\n", manifest: b"new manifest\n"})
    assert csv.read_text() == "new csv\n" and manifest.read_text() == "new manifest\n"


def test_bytes_are_written_as_given(tmp_path: Path) -> None:
    target = tmp_path / "plot.png"
    files.write_bytes_atomic(target, b"\x89PNG\r\n\x00")
    files.write_text_atomic(tmp_path / "crlf.csv", "a,b\r\n")
    assert target.read_bytes() == b"\x89PNG\r\n\x00"
    assert (tmp_path / "crlf.csv").read_bytes() == b"a,b\r\n"


def test_a_failed_write_names_the_file_it_was_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(descriptor: int) -> None:  # as a write past a full disk: no file name
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError) as failed:
        write_text_atomic(tmp_path / "summary.md", "x")
    assert failed.value.filename == str(tmp_path / "summary.md")
    assert failed.value.strerror == "No space left on device"


def test_a_symlink_loop_is_an_oserror_naming_the_file(tmp_path: Path) -> None:
    """A target that is a symbolic link loop: Python before 3.13 raised RuntimeError,
    which no writer's caller catches (a daemon whose lock record was such a link ended in
    a traceback at its first lock). It is the OSError a failed write is, naming it."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    link = tmp_path / "locks.json"
    link.symlink_to(tmp_path / "a")
    with pytest.raises(OSError) as failed:
        write_text_atomic(link, "{}")
    assert failed.value.filename == str(link)
    assert "symbolic links" in str(failed.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "locks.json"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (":/x", Path("/x")),
        ("::/var/lib/gpugov:/y", Path("/var/lib/gpugov")),
        (":", None),
        ("", None),
    ],
)
def test_state_directory_skips_empty_entries(
    monkeypatch: pytest.MonkeyPatch, env: str, expected: Path | None
) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", env)
    assert files.resolve_state_dir(None) == expected  # never Path("") (the working directory)
