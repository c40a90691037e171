"""Two real ``gpugov run`` processes on one node's GPUs, each with its own state
directory: the second stops in one line before any write, naming the GPU and the first
one's pid (``daemon.gpu_hold``); once the first has stopped, a start takes the GPUs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness import LOCKED_MHZ, Daemon, Engine, Node, assert_clean, config_text, last_line

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's"
)


def test_a_second_governor_with_its_own_state_directory_stops_before_any_write(
    tmp_path: Path,
) -> None:
    engine = Engine("ok")
    node = Node(tmp_path, 2)
    config = tmp_path / "gpugov.toml"
    config.write_text(config_text(engine.url, gpus=(0, 1)))
    other_state = tmp_path / "other-state"
    other_state.mkdir()
    other = {"STATE_DIRECTORY": str(other_state)}
    first = Daemon(node, ["run", "--config", str(config)])
    try:
        first.start().wait_locked(LOCKED_MHZ)
        writes = len(node.writes())
        second = Daemon(node, ["run", "--config", str(config)], name="second", env=other)
        assert second.start().wait(60.0) == 2, second.stderr
        assert first.process is not None
        line = last_line(second)
        assert line.startswith(
            "gpugov: error: domain 'llm': gpus: GPU 0 (GPU-fake-0000) is held by another "
            f"gpugov on this node (pid {first.process.pid} ("
        ), second.stderr
        assert "two governors would fight over its clocks" in line
        assert_clean(second)
        # Nothing was written: the first one's locks stand.
        assert len(node.writes()) == writes, node.writes()[writes:]
        assert node.locked() == [[LOCKED_MHZ, LOCKED_MHZ]] * 2
        assert first.process.poll() is None
        assert first.stop() == 0, first.stderr
        assert_clean(first)
        third = Daemon(node, ["run", "--config", str(config)], name="third", env=other)
        try:
            third.start().wait_locked(LOCKED_MHZ)
        finally:
            assert third.stop() == 0, third.stderr
    finally:
        first.stop()
        engine.close()
