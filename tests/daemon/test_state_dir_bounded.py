"""A long-running daemon's state directory stays bounded: the models it keeps aside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpugov.daemon.model_store import KEPT_LOOKED_AT, kept_aside, set_aside


@pytest.mark.parametrize("tag", ["other", "corrupt"])
def test_models_kept_aside_are_at_most_the_newest_looked_at(tmp_path: Path, tag: str) -> None:
    """A served model renamed at every deploy (or a file refused again and again) keeps
    one file aside each time: only the newest KEPT_LOOKED_AT stay (the older ones are
    never read again), the one just set aside always among them."""
    path = tmp_path / "online-model-llm.json"
    kept = []
    for index in range(KEPT_LOOKED_AT + 5):
        path.write_text(f"model {index}")
        os.utime(path, (1.8e9 + index, 1.8e9 + index))
        kept.append(set_aside(path, now=lambda index=index: 1.8e9 + 60 * index, tag=tag))
    (tmp_path / "online-model-llm.json").write_text("the state file")
    (tmp_path / "online-model-other.json.other-20270101T000000Z").write_text("another domain's")
    left = sorted(p.name for p in tmp_path.glob(f"online-model-llm.json.{tag}-*"))
    assert left == sorted(p.name for p in kept[-KEPT_LOOKED_AT:])
    assert [p.read_text() for p in kept[-KEPT_LOOKED_AT:]] == [
        f"model {index}" for index in range(5, KEPT_LOOKED_AT + 5)
    ]
    assert (tmp_path / "online-model-llm.json").read_text() == "the state file"
    assert (tmp_path / "online-model-other.json.other-20270101T000000Z").exists()


def test_the_file_just_set_aside_is_kept_even_when_older_than_the_rest(tmp_path: Path) -> None:
    """The file set aside now is kept whatever its time (the line says where it went);
    the oldest of the others goes in its place."""
    path = tmp_path / "online-model-llm.json"
    for index in range(KEPT_LOOKED_AT):
        path.write_text(f"model {index}")
        os.utime(path, (1.8e9 + index, 1.8e9 + index))
        set_aside(path, now=lambda index=index: 1.8e9 + 60 * index, tag="other")
    path.write_text("an old model")
    os.utime(path, (1.0e9, 1.0e9))
    target = set_aside(path, now=lambda: 1.9e9, tag="other")
    assert target.read_text() == "an old model"
    left = {p.read_text() for p in tmp_path.glob("online-model-llm.json.other-*")}
    assert len(left) == KEPT_LOOKED_AT and "model 0" not in left and "model 1" in left


def test_another_domains_files_that_begin_like_a_kept_name_are_never_pruned(
    tmp_path: Path,
) -> None:
    """A domain named ``llm.json.other-x`` keeps its model in
    ``online-model-llm.json.other-x.json``, which ``llm``'s kept-aside pattern also
    matched: once ``llm`` had kept KEPT_LOOKED_AT models aside, the pruning deleted the
    other domain's live model. Only ``<name>.<tag>-<UTC time>[-count]`` is pruned."""
    neighbour = tmp_path / "online-model-llm.json.other-x.json"
    neighbour.write_text("another domain's live model")
    os.utime(neighbour, (1.0e9, 1.0e9))  # the oldest of all
    path = tmp_path / "online-model-llm.json"
    for index in range(KEPT_LOOKED_AT + 2):
        path.write_text(f"model {index}")
        set_aside(path, now=lambda index=index: 1.8e9 + 60 * index, tag="other")
    assert neighbour.read_text() == "another domain's live model"
    assert len(kept_aside(path, "other")) == KEPT_LOOKED_AT
