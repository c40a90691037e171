"""The gpugov daemon: NVML sampling, engine metrics, clock actuation, safety, export, CLI."""

__version__ = "0.1.0"
