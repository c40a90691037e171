"""The numeric bounds every command, the config and the sweep grid share, so that one
value is accepted or refused the same way wherever it is given."""

from __future__ import annotations

import os

MIN_PERIOD_S = 0.05
"""Shortest control period anywhere: ``daemon.period_s``, every ``--control-period`` and a
sweep grid's ``control_period_s`` (a shorter one only spins the loop; 1e-9 never ends)."""

MAX_PERIOD_S = 60.0
"""Longest control period anywhere (a longer one leaves the clock unwatched too long)."""

MAX_SEED = 2**32 - 1
"""Largest seed (numpy's generators take seeds in ``[0, 2**32)``)."""

MAX_LATENCY_NOISE = 1.0
"""The coefficient of variation of the plant's iteration-time jitter lies below this (the
plant's range is ``[0, 1)``)."""

MAX_EMULATED_GPUS = 64
"""Most GPUs one ``gpugov emulate`` serves (a node has at most 8 or 16)."""

MAX_GPU_INDEX = 1023
"""Largest GPU index a ``--gpus`` list takes (NVML numbers a node's GPUs from 0)."""

MAX_JOBS = 1024
"""Most local worker processes a study command starts."""

MAX_RETRIES = 100
"""Most retries of a study cell whose worker died."""

MAX_CONCURRENCY = 100_000
"""Most requests ``gpugov load`` keeps in flight."""

MAX_COUNT = 1_000_000_000
"""Largest generic count (a list length, a stride, a token count)."""

MAX_SECONDS = 10.0 * 365 * 86_400
"""Largest duration in seconds a flag takes (ten years; larger is a typo)."""

MAX_SPEED = 1e6
"""Largest pace of a simulated or emulated run (plant seconds per wall second)."""

MAX_LOAD_SCALE = 1e6
"""Largest arrival-rate multiplier."""

MAX_CLOCK_MHZ = 100_000.0
"""Largest clock in MHz a flag takes (no GPU is within an order of magnitude of it). The
same number as :data:`gpugov.plant.profile_files.MAX_CLOCK_MHZ` (a test holds them equal),
stated here too because the privileged actuator imports this module and nothing of the
plant."""

MAX_POWER_W = 1_000_000.0
"""Largest power in watts the config and a ``--controller`` spec take (a domain's budget, a
cap): the largest NVLink domain, 72 GPUs of 1.4 kW each, draws about 100 kW, so a larger
number is a typo."""

MAX_SOCKET_PATH_BYTES = 107
"""The longest path a Unix socket's address holds (``sun_path`` less its NUL): the
actuator's ``--socket`` and a config's ``daemon.actuator.socket`` and ``daemon.zeusd.socket``."""


def socket_path_too_long(path: str) -> str | None:
    """Why ``path`` cannot be a Unix socket's address (longer than
    :data:`MAX_SOCKET_PATH_BYTES`: connecting fails with ``AF_UNIX path too long``), or
    None."""
    size = len(os.fsencode(path))
    if size <= MAX_SOCKET_PATH_BYTES:
        return None
    return (
        f"a Unix socket's path holds at most {MAX_SOCKET_PATH_BYTES} bytes, got {size} "
        f"({path!r:.60}...)"
    )


GPU_UUID_PATTERN = r"(GPU|MIG)-[0-9A-Za-z/-]{1,120}"
"""A GPU or MIG UUID as NVML prints it (``GPU-8f2e...``, ``MIG-GPU-8f2e.../1/0``): a name
with a space, an escape or nothing after the prefix names no GPU."""

__all__ = [
    "GPU_UUID_PATTERN",
    "MAX_CLOCK_MHZ",
    "MAX_CONCURRENCY",
    "MAX_COUNT",
    "MAX_EMULATED_GPUS",
    "MAX_GPU_INDEX",
    "MAX_JOBS",
    "MAX_LATENCY_NOISE",
    "MAX_LOAD_SCALE",
    "MAX_PERIOD_S",
    "MAX_POWER_W",
    "MAX_RETRIES",
    "MAX_SECONDS",
    "MAX_SEED",
    "MAX_SOCKET_PATH_BYTES",
    "MAX_SPEED",
    "MIN_PERIOD_S",
    "socket_path_too_long",
]
