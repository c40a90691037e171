"""Hosts, ``HOST:PORT`` addresses and the http URLs a config or a flag gives: why a host
can be named by no resolver (:func:`host_name_problem`), an address parsed
(:func:`parse_address`), and the config's checks of an engine's metrics page, zeusd's address
and ``gpugov emulate``'s (each refusing what would fail at every request, in one line)."""

from __future__ import annotations

import ipaddress
import urllib.parse


def host_name_problem(host: str) -> str | None:
    """Why ``host`` (a URL's or an address's host, without brackets) can name no host, or
    None: a control character in it (a NUL), or a non-ASCII name IDNA cannot encode (an
    empty label, one over 63 characters).
    The socket's bind raised TypeError on it (a traceback from ``check-config`` and
    ``run``), and a scrape of it failed every tick."""
    if any(ord(character) < 32 or ord(character) == 127 for character in host):
        # A NUL raised TypeError at the bind as well; the others no resolver takes.
        return f"{host[:60]!r} is no host name (it holds a control character)"
    if host.isascii():
        return None  # the resolver says what is wrong with an ASCII name
    try:
        host.encode("idna")
    except UnicodeError as error:
        reason = str(error).rpartition("(")[2].rstrip(")").removeprefix("UnicodeError: ")
        return f"{host[:60]!r} is no host name ({reason or error})"
    return None


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) to ``(host, port)``.

    Raises:
        ValueError: not HOST:PORT, the port is outside 0-65535, or the host is written as
            an IP address that is none (``999.1.1.1``, ``[::g]``).
    """
    host, sep, port = value.rpartition(":")
    # ASCII digits alone: int() reads ٩٤٠٠ as 9400, and a superscript passes isdigit().
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT such as 127.0.0.1:9400, got {value!r}")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (
        host.startswith("[") != host.endswith("]")
        or (":" in bare and bare == host)  # an IPv6 host needs its brackets
        or any(character.isspace() or character in "[]" for character in bare)
    ):
        raise ValueError(f"must be HOST:PORT such as 127.0.0.1:9400 or [::1]:9400, got {value!r}")
    # A host written as an address must be one (999.1.1.1 was refused only at the bind,
    # after the GPUs were opened); a name is resolved when the socket is bound.
    try:
        if host.startswith("["):
            ipaddress.IPv6Address(bare)
        elif bare and all(part.isdigit() for part in bare.split(".")):
            ipaddress.IPv4Address(bare)
    except ValueError:
        raise ValueError(f"names no IP address: {bare!r} in {value!r}") from None
    problem = host_name_problem(bare)
    if problem is not None:
        raise ValueError(f"{problem} in {value!r}")
    return bare or "127.0.0.1", int(port)


def engine_page_url(value: str) -> str:
    """An engine's metrics page (``engine.url``), returned as given.

    Raises:
        ValueError: not an http(s) URL of a host that can be named, with a port in 1-65535,
            or one that holds spaces, control characters or credentials.
    """
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    if any(character.isspace() or ord(character) < 32 for character in value):
        # http.client refuses it at every scrape: the node sat at the fail-safe.
        raise ValueError(f"cannot hold spaces or control characters, got {value!r}")
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError as error:  # a malformed IPv6 host
        raise ValueError(f"is not a URL ({error}): {value!r}") from None
    _named_host(parts, value, "http://127.0.0.1:8000/metrics")
    if "@" in parts.netloc:
        # Dropped from every request: each scrape of an engine behind authentication
        # answered 401, and the node sat at the fail-safe. Not echoed: a password.
        raise ValueError(
            "cannot hold credentials (USER:PASSWORD@ before the host): gpugov sends "
            "none, and would show them in its log lines; give it a metrics URL that "
            f"needs none, such as {parts.scheme}://{parts.netloc.rpartition('@')[2]}"
            f"{parts.path or '/metrics'}"
        )
    try:
        port = parts.port  # urllib checks the range when the port is read
    except ValueError:
        raise ValueError(f"has a port outside 0-65535 or not a number: {value!r}") from None
    _not_port_zero(port, value)
    return value


def zeusd_url(value: str | None) -> str | None:
    """zeusd's TCP address (``daemon.zeusd.url``, ``http://HOST:PORT``), returned as given.

    Raises:
        ValueError: not http://HOST:PORT of a host that can be named, or at port 0.
    """
    if value is not None:
        parts = urllib.parse.urlsplit(value)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise ValueError(
                f"must be http://HOST:PORT, such as http://127.0.0.1:4938, got {value!r}"
            )
        _not_port_zero(port, value)
        problem = host_name_problem(parts.hostname)
        if problem is not None:
            raise ValueError(f"{problem}: {value!r}")
    return value


def emulator_url(value: str | None) -> str | None:
    """``gpugov emulate``'s address (``daemon.emulator``), returned as given.

    Raises:
        ValueError: not an http:// URL of a host that can be named, or at port 0.
    """
    if value is None:
        return value
    example = "http://127.0.0.1:8000"
    if not value.startswith("http://"):
        raise ValueError(f"must be an http:// URL such as {example}, got {value!r}")
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port  # raises on a port out of range
    except ValueError as error:
        raise ValueError(f"must be an http:// URL such as {example}: {error}") from None
    _named_host(parts, value, example)
    _not_port_zero(port, value)
    return value


def _named_host(parts: urllib.parse.SplitResult, value: str, example: str) -> None:
    """Refuse a URL that names no host, or one no request can reach by its name."""
    if not parts.hostname:
        raise ValueError(f"must name a host, such as {example}, got {value!r}")
    problem = host_name_problem(parts.hostname)
    if problem is not None:
        raise ValueError(f"{problem}: {value!r}")


def _not_port_zero(port: int | None, value: str) -> None:
    """Refuse a URL at port 0, which no request reaches (a server asked for port 0 listens
    on a free port the system picks): every scrape or write to it failed, the engine's
    domain held at its fail-safe, where ``--engine-url`` refused it."""
    if port == 0:
        raise ValueError(f"has port 0, which no request reaches: {value!r}")


__all__ = ["emulator_url", "engine_page_url", "host_name_problem", "parse_address", "zeusd_url"]
