"""Calls the daemon cannot bound on its own, bounded as a whole: an engine's name whose
addresses do not answer (``daemon.scrape.connect_any``), the GPUs' reads of one tick, the
start's opening of the configured GPUs and ``gpugov reset-clocks`` (a Kubernetes preStop
hook). Time is a fake clock where the code takes one; where a deadline is a real wait, a
hung call is a fake NVML call blocked on an event the test frees, and the cases assert
what happened, not how long it took."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import gpugov.daemon.scrape as scrape


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _BlackholedSocket:
    """A socket whose connect waits its whole timeout (on the fake clock), then times out:
    an address whose route drops the SYN."""

    made: list[_BlackholedSocket] = []  # noqa: RUF012 - the test's record
    clock: _Clock

    def __init__(self, *_args: Any) -> None:
        self.timeout: float | None = None
        type(self).made.append(self)

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def bind(self, _address: Any) -> None:
        pass

    def connect(self, _address: Any) -> None:
        assert self.timeout is not None and self.timeout > 0
        self.clock.now += self.timeout
        raise TimeoutError("timed out")

    def close(self) -> None:
        pass


def test_connect_any_bounds_all_its_addresses_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each address was given the whole timeout, so a name with three blackholed
    addresses held the scrape (and the loop) for three times its deadline: the exchange's
    timer cannot cut a connect. Now the tries share the one timeout."""
    clock = _Clock()
    _BlackholedSocket.made = []
    _BlackholedSocket.clock = clock
    monkeypatch.setattr(scrape.socket, "socket", _BlackholedSocket)
    addresses = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"192.0.2.{i}", 8000)) for i in (1, 2, 3)
    ]
    with pytest.raises(TimeoutError):
        scrape.connect_any(addresses, ("engine", 8000), 0.5, clock=clock)
    assert clock.now == pytest.approx(0.5)
    assert len(_BlackholedSocket.made) == 1  # the time was spent: the others not tried


def test_connect_any_leaves_the_next_address_what_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An address refused at once leaves the next the whole timeout; one that took part
    of it leaves the rest."""
    clock = _Clock()
    timeouts: list[float | None] = []

    class Refused(_BlackholedSocket):
        def connect(self, address: Any) -> None:
            timeouts.append(self.timeout)
            if address[0] == "192.0.2.1":
                clock.now += 0.2
                raise ConnectionRefusedError("refused")
            if address[0] == "192.0.2.2":
                raise ConnectionRefusedError("refused")

    Refused.clock = clock
    monkeypatch.setattr(scrape.socket, "socket", Refused)
    addresses = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"192.0.2.{i}", 8000)) for i in (1, 2, 3)
    ]
    sock = scrape.connect_any(addresses, ("engine", 8000), 0.5, clock=clock)
    assert isinstance(sock, Refused)
    assert timeouts == pytest.approx([0.5, 0.3, 0.3])


def test_connect_any_without_a_timeout_tries_every_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Refused(_BlackholedSocket):
        def connect(self, _address: Any) -> None:
            assert self.timeout is None
            raise ConnectionRefusedError("refused")

    monkeypatch.setattr(scrape.socket, "socket", Refused)
    Refused.made = []
    addresses = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 1))] * 3
    with pytest.raises(ConnectionRefusedError):
        scrape.connect_any(addresses, ("engine", 1), None)
    assert len(Refused.made) == 3
