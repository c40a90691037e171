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
