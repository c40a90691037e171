"""CLI speed: start-up CPU of the commands, and `gpugov simulate` per CPU second, whole process.

Runs the real console script in subprocesses and measures each one's CPU (user + system)
with ``resource.getrusage(RUSAGE_CHILDREN)``, so imports, trace loading, the metrics and
the summary all count, not only the simulator loop:

* start-up: ``gpugov --help``, ``gpugov run --help``, ``gpugov status --help``,
  ``gpugov simulate --help`` and, for each node command (run, status, reset-clocks,
  check-config), the import of its module the way ``gpugov.cli.main`` does it;
* simulate: ``gpugov simulate --trace azure-conv`` (the shared Azure conversation hour,
  default controller ``max``); the ratio is simulated seconds over the process's CPU
  seconds. Targets: ``--help`` under 0.5 s CPU, simulate at least 1,500x.

Falls back to the bundled 10-minute slice, and says so, when the shared traces are
absent. Writes ``bench/results/cli_speed.json`` (an ignored folder) and prints a table.

Usage: ``.venv/bin/python bench/cli_speed.py [--repeat N] [--trace NAME] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP_TARGET_CPU_S = 0.5
SIMULATE_TARGET_RATIO = 1500.0
NODE_COMMANDS = ("run", "status", "reset-clocks", "check-config")


def _gpugov() -> list[str]:
    """The console script beside this interpreter, else ``python -m gpugov``."""
    script = Path(sys.executable).with_name("gpugov")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gpugov"]


def child_cpu(command: list[str]) -> tuple[float, float, str]:
    """Run ``command`` once; return (its user+system CPU s, its wall s, its stdout).

    Raises:
        RuntimeError: the command failed (its stderr is quoted).
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stdout


def measure(command: list[str], repeat: int, label: str = "") -> dict[str, object]:
    """Best and median CPU of ``repeat`` runs (best: least disturbed by other load)."""
    runs = [child_cpu(command) for _ in range(max(1, repeat))]
    cpus = [cpu for cpu, _, _ in runs]
    return {
        "command": label or " ".join([Path(command[0]).name, *command[1:]]),
        "cpu_s_best": min(cpus),
        "cpu_s_median": statistics.median(cpus),
        "wall_s_median": statistics.median(wall for _, wall, _ in runs),
        "runs": len(runs),
        "stdout": runs[-1][2],
    }


def import_probe(command: str) -> list[str]:
    """A child that builds ``command``'s parser as ``gpugov.cli.main`` does, nothing more."""
    code = f"import gpugov.cli as c; c.build_parser({command!r})"
    return [sys.executable, "-c", code]


def main() -> int:
    """Run every measurement, print a table and write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (default 3)")
    parser.add_argument("--trace", default="azure-conv", help="trace to simulate")
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "cli_speed.json"), help="JSON output"
    )
    args = parser.parse_args()
    gpugov = _gpugov()

    startup = [
        measure(gpugov + words, args.repeat)
        for words in (["--help"], ["run", "--help"], ["status", "--help"], ["simulate", "--help"])
    ]
    imports = [
        {
            **measure(import_probe(name), args.repeat, f"import path of gpugov {name}"),
            "node_command": name,
        }
        for name in NODE_COMMANDS
    ]
    note = ""
    trace = args.trace
    try:
        simulate = measure([*gpugov, "simulate", "--trace", trace], args.repeat)
    except RuntimeError as error:
        note = f"{trace} unavailable ({error}); used the bundled 10-minute slice instead"
        trace = "azure-conv-10min"
        simulate = measure([*gpugov, "simulate", "--trace", trace], args.repeat)
    found = re.search(r"simulated time\s+([0-9.]+) s", str(simulate["stdout"]))
    if found is None:
        raise SystemExit("bench/cli_speed.py: no 'simulated time' in simulate's summary")
    simulated_s = float(found.group(1))
    for row in (*startup, *imports, simulate):
        row.pop("stdout")
    simulate.update(
        simulated_s=simulated_s,
        ratio_best=simulated_s / float(simulate["cpu_s_best"]),  # type: ignore[arg-type]
        ratio_median=simulated_s / float(simulate["cpu_s_median"]),  # type: ignore[arg-type]
    )
    payload = {
        "benchmark": "cli speed (whole processes, CPU = user + system)",
        "note": note,
        "trace": trace,
        "targets": {"help_cpu_s": HELP_TARGET_CPU_S, "simulate_ratio": SIMULATE_TARGET_RATIO},
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0],
        },
        "startup": startup,
        "node_command_imports": imports,
        "simulate": simulate,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")

    if note:
        print(f"note: {note}")
    print(f"{'command':<52} {'CPU s best':>10} {'median':>8}")
    for row in (*startup, *imports):
        print(f"{row['command'][-52:]:<52} {row['cpu_s_best']:>10.3f} {row['cpu_s_median']:>8.3f}")
    best, median = simulate["cpu_s_best"], simulate["cpu_s_median"]
    print(f"{simulate['command']:<52} {best:>10.3f} {median:>8.3f}")
    print(
        f"simulate: {simulated_s:.1f} simulated s; {simulate['ratio_best']:.0f}x real time per "
        f"CPU second (best of {simulate['runs']}), {simulate['ratio_median']:.0f}x median; "
        f"target {SIMULATE_TARGET_RATIO:g}x"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
