"""Offline study commands: simulate, experiments, the controller scoreboard (and, above the
node's code, everything that never runs on a node). ``gpugov.study`` may import
``gpugov.daemon``; the daemon never imports this package."""
