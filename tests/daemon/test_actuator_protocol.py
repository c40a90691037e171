"""The split mode's protocol number: a governor meeting an actuator of another protocol
(one side upgraded, not the other) takes no write to it and says so in one line; it
wrote to it as if they spoke the same protocol (the hello's ``protocol`` was not read)."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpugov.daemon.actuator_client import ActuatorClient, ActuatorUnavailable
from gpugov.daemon.actuator_server import PROTOCOL
from gpugov.daemon.config import DaemonSection
from gpugov.daemon.node_support import write_path_status


class _OtherActuator:
    """A socket that answers every request as an actuator of protocol ``spoken`` would
    answer a hello; it keeps the requests it got."""

    def __init__(self, path: Path, spoken: Any, **fields: Any) -> None:
        self.requests: list[dict[str, Any]] = []
        self._fields = fields
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(4)
        self._listener.settimeout(0.1)
        self._spoken = spoken
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                peer, _ = self._listener.accept()
            except TimeoutError:
                continue
            with peer, peer.makefile("rwb") as stream:
                for line in stream:
                    self.requests.append(json.loads(line))
                    answer = {"ok": True, "lease_s": 5.0, "gpus": [{"gpu": "0"}], **self._fields}
                    if self._spoken is not None:
                        answer["protocol"] = self._spoken
                    stream.write(json.dumps(answer).encode() + b"\n")
                    stream.flush()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gpugov-", dir="/tmp") as folder:
        yield Path(folder) / "a.sock"


@pytest.mark.parametrize("spoken", [PROTOCOL + 1, None, "1"])
def test_an_actuator_of_another_protocol_takes_no_write_and_is_one_line(
    socket_path: Path, spoken: Any
) -> None:
    other = _OtherActuator(socket_path, spoken)
    client = ActuatorClient(str(socket_path), timeout_s=2.0)
    try:
        with pytest.raises(ActuatorUnavailable) as raised:
            client.request({"op": "lock", "gpu": "0", "min_mhz": 1410, "max_mhz": 1410})
        line = str(raised.value)
        assert line == (
            f"actuator at {socket_path} speaks protocol {spoken!r}, this gpugov speaks "
            f"{PROTOCOL}: run the same gpugov version as governor and actuator (upgrade both)"
        )
        assert [r["op"] for r in other.requests] == ["hello"]  # the lock was never sent
        assert client.check() == line  # the loop's write path problem: the same line
        ok, why = write_path_status(
            DaemonSection.model_validate(
                {"backend": "actuator", "actuator": {"socket": str(socket_path)}}
            )
        )
        assert not ok and why == line
    finally:
        client.close()
        other.stop()


def test_an_actuator_of_this_protocol_is_written_to(socket_path: Path) -> None:
    other = _OtherActuator(socket_path, PROTOCOL)
    client = ActuatorClient(str(socket_path), timeout_s=2.0)
    try:
        client.request({"op": "held"})
        assert [r["op"] for r in other.requests] == ["hello", "held"]
    finally:
        client.close()
        other.stop()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lease_s", "3"),
        ("lease_s", None),
        ("lease_s", -1),
        ("lease_s", 0),
        ("lease_s", float("inf")),
        ("lease_s", float("nan")),
        ("lease_s", True),
        ("gpus", 5),
        ("gpus", "0,1"),
    ],
)
def test_a_hello_answer_that_is_not_the_protocols_is_one_line_not_a_traceback(
    socket_path: Path, field: str, value: Any
) -> None:
    """A hello answered with a lease that is no positive number of seconds, or GPUs that
    are no list (another program on the socket, a corrupted answer): the actuator is not
    taken to answer, in one line, as for another protocol. Read as they came, they ended
    the write path in a ValueError or TypeError (a traceback out of the loop's tick)."""
    other = _OtherActuator(socket_path, PROTOCOL, **{field: value})
    client = ActuatorClient(str(socket_path), timeout_s=2.0)
    try:
        with pytest.raises(ActuatorUnavailable) as raised:
            client.request({"op": "held"})
        line = str(raised.value)
        assert line.startswith(f"actuator at {socket_path}: its hello answer's {field} is ")
        assert "\n" not in line
        assert [r["op"] for r in other.requests] == ["hello"]
        assert client.check() == line
    finally:
        client.close()
        other.stop()


class _RawAnswers:
    """A socket that answers each connection's first request line with ``answer``."""

    def __init__(self, path: Path, answer: bytes) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(4)
        self._listener.settimeout(0.1)
        self._answer = answer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                peer, _ = self._listener.accept()
            except TimeoutError:
                continue
            with peer:
                peer.settimeout(2.0)
                try:
                    peer.recv(4096)
                    peer.sendall(self._answer)
                    peer.recv(4096)  # until the peer closes
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


DEEP = b"[" * 20_000 + b"\n"
"""A line of JSON nested deeper than Python's parser recurses (no answer of the protocol's)."""


def test_an_answer_nested_too_deep_is_an_actuator_not_answering_not_a_traceback(
    socket_path: Path,
) -> None:
    """An answer line of JSON nested deeper than the parser recurses (another program on
    the socket, a corrupted answer) ended the governor's write path, and the liveness
    probe, in a RecursionError traceback; it is an actuator not answering, in one line,
    as an answer that is no JSON is."""
    from gpugov.daemon.actuator_client import probe_actuator

    other = _RawAnswers(socket_path, DEEP)
    client = ActuatorClient(str(socket_path), timeout_s=2.0)
    try:
        with pytest.raises(ActuatorUnavailable, match="answer is not JSON"):
            client.request({"op": "held"})
        problem = client.check()
        assert problem is not None and "answer is not JSON" in problem
        assert probe_actuator(str(socket_path), 2.0) == (
            "answered something else than the actuator protocol"
        )
    finally:
        client.close()
        other.stop()


def test_the_probe_reads_a_bounded_answer(socket_path: Path) -> None:
    """``--probe`` read whatever the socket sent until a line break or its timeout: a
    program there that streams bytes with no line break (a Unix socket carries gigabytes
    a second) grew the probe's memory for the whole timeout, and the verdict was 'no
    answer'. An answer past the client's bound (64 KiB) is no answer of the protocol's,
    said at once, as the governor's client says it."""
    from gpugov.daemon.actuator_client import probe_actuator

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(1)
    done = threading.Event()
    sent = [0]

    def stream() -> None:
        peer, _ = listener.accept()
        with peer:
            while not done.is_set():  # bytes and never a line break, until the probe goes
                try:
                    sent[0] += peer.send(b"x" * 65536)
                except OSError:
                    return

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        assert probe_actuator(str(socket_path), 30.0) == (
            "answered something else than the actuator protocol"
        )
    finally:
        done.set()
        thread.join(10)
        listener.close()
