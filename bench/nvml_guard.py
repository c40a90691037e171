"""Run a ``gpugov`` command with every NVML setter refused and recorded.

For checks on a GPU that must not be changed (a shared node, a lent machine): each
``pynvml`` function that writes to the GPU (``nvmlDeviceSet*``, ``nvmlDeviceReset*``,
``nvmlDeviceClear*``, ``nvmlSet*``) is replaced, before gpugov is imported, by one that
appends a JSON line naming it to ``--log`` and raises NVML's NO_PERMISSION, so the GPU is
left as it was whatever the command tries. A dry run must leave the log empty.

    python bench/nvml_guard.py --log setters.jsonl -- run --config node.toml --dry-run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WRITE_PREFIXES = ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceClear", "nvmlSet")


def guard(log: Path) -> list[str]:
    """Replace every NVML setter of ``pynvml`` by a refusal that logs to ``log``; the
    names replaced."""
    import pynvml

    def refusal(name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            with log.open("a", encoding="utf-8") as stream:
                stream.write(json.dumps({"time": time.time(), "function": name}) + "\n")
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

        return refuse

    names = sorted(
        name
        for name in dir(pynvml)
        if name.startswith(WRITE_PREFIXES) and callable(getattr(pynvml, name))
    )
    for name in names:
        setattr(pynvml, name, refusal(name))
    return names


def main(argv: list[str] | None = None) -> int:
    """Install the guard, then run the gpugov command line given after ``--``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--log", required=True, help="JSON lines of refused setter calls")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then gpugov's arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    log = Path(args.log)
    log.touch()
    names = guard(log)
    print(f"nvml_guard: {len(names)} NVML setters refused", file=sys.stderr)
    from gpugov.cli import main as gpugov_main

    return int(gpugov_main(command) or 0)


if __name__ == "__main__":
    sys.exit(main())
