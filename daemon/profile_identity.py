"""The identity of a GPU that a profile stands for (the emulated node's and the simulated
node's): an NVML UUID derived from the profile's name, its content and the GPU's index.

``mpc-online``'s learned model is keyed on the domain's GPU UUIDs (``docs/online.md``):
the same profile gives the same UUIDs on every start, so a governor restarted against it
restores its model; another profile (another GPU, model or table) gives others, so no
model learned on one is applied to the other.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import numpy as np

from gpugov.plant import PerformanceProfile

GPU_UUID_NAMESPACE = uuid.UUID("9266c913-62e4-45bd-a7ae-2ed8e584cf19")
"""The ``uuid5`` namespace of a profile's GPUs' UUIDs. Fixed for good: changing it
changes every emulated and simulated UUID, and a governor's stored model would no longer
be restored."""


NVML_NAME_MAX_CHARS = 95
"""NVML's device name buffer holds 96 bytes with the terminating NUL."""


def profile_gpu_name(profile: PerformanceProfile) -> str | None:
    """The NVML name of a GPU of ``profile`` (an emulated node's and a simulated node's,
    and a simulated context's): the GPU its manifest states (``gpu``, else ``gpu_kind``),
    on one line and ``NVIDIA``-prefixed as NVML names a board, so ``mpc-online``'s
    GPU-family hint reads it as it reads the real board's name; None when it states
    none."""
    for key in ("gpu", "gpu_kind"):
        value = profile.manifest.get(key)
        if isinstance(value, str) and value.strip():
            text = " ".join(value.split())
            if not text.upper().startswith("NVIDIA "):
                text = f"NVIDIA {text}"
            return text[:NVML_NAME_MAX_CHARS]
    return None


def profile_digest(profile: PerformanceProfile) -> str:
    """What identifies ``profile``'s content: the sha256s of its manifest and CSV files
    when it was loaded from them, else a sha256 of its manifest and tables."""
    if profile.manifest_sha256 and profile.profile_csv_sha256:
        return f"{profile.manifest_sha256}:{profile.profile_csv_sha256}"
    digest = hashlib.sha256()
    digest.update(json.dumps(profile.manifest, sort_keys=True, default=repr).encode())
    for array in (
        profile.clock_mhz,
        profile.prefill_tokens_per_s,
        profile.decode_tokens_per_s,
        profile.prefill_power_w,
        profile.decode_power_w,
        profile.idle_power_w,
    ):
        digest.update(np.ascontiguousarray(array, dtype="<f8").tobytes())
    digest.update(repr((profile.ttft_slo_s, profile.tpot_slo_s)).encode())
    return digest.hexdigest()


def profile_gpu_uuid(profile: PerformanceProfile, gpu: int) -> str:
    """The NVML UUID (``GPU-`` and a UUID's 36 characters) of GPU ``gpu`` of a node of
    ``profile``: a ``uuid5`` of the profile's name, its content (:func:`profile_digest`)
    and the index."""
    return _gpu_uuid(profile.name, profile_digest(profile), gpu)


def profile_gpu_uuids(profile: PerformanceProfile, count: int) -> tuple[str, ...]:
    """:func:`profile_gpu_uuid` of GPUs ``0 .. count - 1``, the profile's digest taken
    once (a sha256 over its tables where it was not read from files)."""
    digest = profile_digest(profile)
    return tuple(_gpu_uuid(profile.name, digest, gpu) for gpu in range(count))


def _gpu_uuid(name: str, digest: str, gpu: int) -> str:
    key = f"{name}\n{digest}\n{gpu}"
    return f"GPU-{uuid.uuid5(GPU_UUID_NAMESPACE, key)}"


__all__ = [
    "GPU_UUID_NAMESPACE",
    "NVML_NAME_MAX_CHARS",
    "profile_digest",
    "profile_gpu_name",
    "profile_gpu_uuid",
    "profile_gpu_uuids",
]
