"""The gpugov daemon: NVML sampling, engine metrics, clock actuation, safety, export, node CLI."""
