"""Numba compilation as the controllers use it: machine code cached on disk where it can
be, compiled in memory where it cannot (a read-only install)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from numba import njit

Function = TypeVar("Function", bound=Callable[..., Any])


def jit(function: Function, *, inline: Literal["never", "always"] = "never") -> Function:
    """Compile ``function`` with numba, caching the machine code on disk where numba
    finds a writable cache directory (``NUMBA_CACHE_DIR``, the package's ``__pycache__``
    or the user's cache); where none is writable (a read-only install under a hardened
    unit with no ``NUMBA_CACHE_DIR``), compile in memory on every start instead.
    ``inline="always"`` inlines it into its callers at numba's level."""
    try:
        return cast(Function, njit(cache=True, nogil=True, inline=inline)(function))
    except RuntimeError:
        return cast(Function, njit(cache=False, nogil=True, inline=inline)(function))


def inlined(function: Function) -> Function:
    """:func:`jit` inlined into its callers: a small step whose state then stays in
    registers instead of a call's arguments and returned tuple."""
    return jit(function, inline="always")
