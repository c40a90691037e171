"""Benchmarks: the simulator's and the daemon's speed, and the controller scoreboard.

Each module runs as a script (``python bench/NAME.py``) and writes a JSON result; the
scoreboard (:mod:`bench.controllers`) is also ``gpugov bench controllers``, which is why
this folder installs as a package.
"""
