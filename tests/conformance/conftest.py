"""Fixtures for the conformance suites: the daemon tests' fakes are importable here too."""

from __future__ import annotations

import sys
from pathlib import Path

DAEMON_TESTS = Path(__file__).resolve().parents[1] / "daemon"
if str(DAEMON_TESTS) not in sys.path:  # fake_pynvml, fake_nvidia_smi
    sys.path.insert(0, str(DAEMON_TESTS))
