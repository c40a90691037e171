"""The daemon's TOML configuration, validated by pydantic v2 (frozen, no unknown keys).

Loaded only by the CLI (:func:`load_config`); everything else takes plain values. An
error names the file, the field path (``domains[0].controller.clock_mhz``) and the
reason, and nothing is applied. ``deploy/gpugov.example.toml`` shows every key. The
controller models (``[domains.controller]``) are in :mod:`daemon.controller_config`.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from gpugov.daemon.addresses import emulator_url, engine_page_url, parse_address, zeusd_url
from gpugov.daemon.config_errors import validation_problems
from gpugov.daemon.config_paths import rebase_relative_paths
from gpugov.daemon.config_types import (
    ClockMHz,
    FrozenModel,
    LoosePath,
    PositiveSeconds,
    Seconds,
    SocketPath,
    TokenCount,
    Watts,
    named_directory,
)
from gpugov.daemon.controller_config import (
    POWER_CAP_KINDS,
    POWER_LIMIT_BACKENDS,
    ControllerConfig,
    MaxControllerConfig,
    OnlineMPCControllerConfig,
)
from gpugov.daemon.errors import ConfigError
from gpugov.daemon.files import resolve_state_dir
from gpugov.daemon.limits import GPU_UUID_PATTERN, MAX_GPU_INDEX, MAX_PERIOD_S, MIN_PERIOD_S
from gpugov.daemon.safety import DEFAULT_DWELL_S, DEFAULT_MIN_RELOCK_INTERVAL_S
from gpugov.plant.input_files import finite_number

if TYPE_CHECKING:
    from gpugov.controllers.budget import SLOTarget

MIN_REQUEST_TIMEOUT_S = 0.01
"""Shortest ``engine.timeout_s``, ``actuator.timeout_s`` and ``zeusd.timeout_s``: a local
scrape or request takes milliseconds, so a shorter deadline fails every one and holds the
domain at its fail-safe."""
MAX_STALE_AFTER_S = 600.0
"""Longest ``stale_after_s``: engine data ten minutes old no longer describes the load,
and a longer age keeps the fail-safe from ever engaging."""
MIN_THERMAL_LIMIT_C = 30.0
"""``thermal_limit_c`` lies above this: the inlet temperature the plant and ``mpc-online``'s
model assume when they know none. An idle GPU is warmer, so a lower limit is exceeded at
every clock."""
MAX_THERMAL_LIMIT_C = 150.0
"""Largest ``thermal_limit_c``: past every GPU's shutdown temperature (about 90-110 C)."""
MAX_ENGINE_PAGE_BYTES = 1024**3
"""Largest ``engine.max_page_bytes`` (1 GiB): the cap exists to refuse a runaway page, and a
vLLM page is about 100 KB."""


def _named_file(value: Any) -> Any:
    # An empty record would read as the working directory ("."), reported as --record .
    if isinstance(value, str) and not value.strip():
        raise ValueError("must name a file, such as /var/log/gpugov/run.jsonl (omit it for none)")
    # Anything but text: pydantic's own line ("Input is not a valid path for <class
    # 'pathlib.Path'>") names a Python class, not what to write.
    if not isinstance(value, str | Path):
        raise ValueError(
            f'must be a file name in quotes, such as "/var/log/gpugov/run.jsonl", got {value!r:.40}'
        )
    return value


def _as_tuple(value: Any) -> Any:
    # TOML arrays arrive as lists; the frozen models hold tuples.
    if isinstance(value, dict):
        raise ValueError("must be an array: write [[domains]] (double brackets), once per domain")
    return tuple(value) if isinstance(value, list) else value


def _gpu_id(value: Any) -> int | str:
    # pynvml passes the index as a C unsigned int: 4294967296 would be GPU 0 by another name.
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GPU_INDEX:
        return value
    if isinstance(value, str) and re.fullmatch(GPU_UUID_PATTERN, value):
        return value
    if isinstance(value, str) and re.fullmatch(_PCI_BUS_ID, value.strip()):
        raise ValueError(
            f"{value!r} is a PCI bus id, which gpus does not take: name the GPU by its NVML "
            "index or UUID (nvidia-smi -L lists both)"
        )
    raise ValueError(
        f"a GPU is an NVML index (0 to {MAX_GPU_INDEX}) or a GPU-/MIG- UUID, got {value!r}"
    )


_PCI_BUS_ID = r"(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
"""A PCI bus id as nvidia-smi and NVML print it (``00000000:18:00.0``, ``0000:18:00.0``)."""

GpuId = Annotated[int | str, PlainValidator(_gpu_id)]


def short_of(value: float, bound: float) -> bool:
    """Whether ``value`` is below ``bound``, a multiple of the period, by more than the
    multiplication's rounding: 3 x 0.1 s is 0.30000000000000004, and a lease of 0.3 s
    was refused as shorter than the 0.3 s it names."""
    return value < bound * (1.0 - 1e-12)


MIN_STALE_PERIODS = 1.5
"""``stale_after_s`` must be at least this many control periods."""
SLO_WINDOW_PERIODS = 12.0
"""``slo_target.window_s`` must be at least this many control periods."""
DEFAULT_SLO_WINDOW_S = 600.0
"""An unset ``slo_target.window_s`` is ``max(600 s, 12 x daemon.period_s)``."""
MAX_HORIZON_STEPS = 120
"""An MPC's ``horizon_s`` spans at most this many control periods: its plan is built and
searched every period, and must fit in it (10-20 is the useful range)."""
DEFAULT_ENGINE_TIMEOUT_S = 0.5
ENGINE_TIMEOUT_PERIOD_SHARE = 0.5
"""An unset ``engine.timeout_s`` is ``min(0.5 s, 0.5 x daemon.period_s)``."""


ONLINE_PERIOD_S = 0.25
"""``mpc-online``'s period when none is set: a node's ``daemon.period_s`` when every
domain runs it, and a simulated run's ``--control-period`` (docs/online.md)."""
DEFAULT_PERIOD_S = 1.0
"""Every other controller's period when none is set."""


def default_control_period(kind: str) -> float:
    """The period a controller of ``kind`` runs at when none is set:
    :data:`ONLINE_PERIOD_S` for ``mpc-online``, :data:`DEFAULT_PERIOD_S` for the others."""
    return ONLINE_PERIOD_S if kind == "mpc-online" else DEFAULT_PERIOD_S


def _controller_kind(domain: Any) -> Any:
    """The controller kind a domain (a TOML table or a :class:`DomainConfig`) names;
    "max" (the default controller) when it names none, None when unreadable."""
    if isinstance(domain, DomainConfig):
        return domain.controller.kind
    if not isinstance(domain, dict):
        return None
    controller = domain.get("controller", {"kind": "max"})
    if isinstance(controller, dict):
        return controller.get("kind")
    return getattr(controller, "kind", None)


def default_daemon_period(domains: Any) -> float:
    """``daemon.period_s`` when the file sets none: :data:`ONLINE_PERIOD_S` when every
    domain runs ``mpc-online`` (it learns and reacts per tick), else
    :data:`DEFAULT_PERIOD_S` (a mixed node keeps 1 s, and is warned at check time)."""
    kinds = (
        [_controller_kind(domain) for domain in domains]
        if isinstance(domains, list | tuple)
        else []
    )
    if kinds and all(kind == "mpc-online" for kind in kinds):
        return ONLINE_PERIOD_S
    return DEFAULT_PERIOD_S


DEFAULT_WRITE_TIMEOUT_S = 0.25
"""An unset ``actuator.timeout_s`` or ``zeusd.timeout_s`` is ``min(0.25 s, 0.5 x
daemon.period_s)``."""


DEFAULT_LEASE_S = 3.0
"""An unset ``actuator.lease_s`` is ``max(3 s, 3 x daemon.period_s)``: a lease renewed once
a tick."""


def default_write_timeout_s(period_s: float) -> float:
    """One clock write request's deadline (the actuator's, zeusd's) when the config sets
    none: 0.25 s, or half the period when that is shorter, so a split-mode node runs
    ``mpc-online`` at its 0.25 s period."""
    return min(DEFAULT_WRITE_TIMEOUT_S, ENGINE_TIMEOUT_PERIOD_SHARE * period_s)


def _period_taken(value: Any) -> float | None:
    """``daemon.period_s`` as a file (or a model) gives it, when the field takes it (a
    finite number of seconds within the bounds), else None: the defaults filled from the
    period before validation are left out, and the field's validator says what is wrong."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or finite_number(value) is None
        or not MIN_PERIOD_S <= value <= MAX_PERIOD_S
    ):
        return None
    return float(value)


def default_engine_timeout_s(period_s: float) -> float:
    """The scrape deadline when the config sets none: 0.5 s, or half the period when
    that is shorter (``period_s = 0.5`` gives 0.25 s), so a hung engine never stalls
    the loop."""
    return min(DEFAULT_ENGINE_TIMEOUT_S, ENGINE_TIMEOUT_PERIOD_SHARE * period_s)


# ----------------------------------------------------------------------- domain
class EngineConfig(FrozenModel):
    """Where the domain's serving engine publishes its Prometheus metrics."""

    kind: Literal["auto", "vllm", "sglang", "tgi"] = "auto"
    url: str = "http://127.0.0.1:8000/metrics"
    timeout_s: Annotated[
        float, Field(ge=MIN_REQUEST_TIMEOUT_S, le=MAX_PERIOD_S, allow_inf_nan=False)
    ] = DEFAULT_ENGINE_TIMEOUT_S
    """Unset in the file: ``min(0.5, daemon.period_s / 2)`` (:func:`default_engine_timeout_s`);
    at least 10 ms (:data:`MIN_REQUEST_TIMEOUT_S`)."""

    max_page_bytes: Annotated[int, Field(ge=1024, le=MAX_ENGINE_PAGE_BYTES)] = 16 * 1024 * 1024

    _http_url = field_validator("url")(engine_page_url)


SLO_WINDOW_LIMIT_S = 31 * 86_400.0
"""The longest ``slo_target.window_s`` accepted (a month's SLO window)."""


class SLOTargetConfig(FrozenModel):
    """The domain's SLO target (``controllers.budget.SLOTarget``): ``attainment`` of the
    requests meet both latency SLOs (TTFT within ``ttft_slo_s`` plus the per-prompt
    allowance, TPOT within ``tpot_slo_s``) over a rolling ``window_s``. ``mpc`` and
    ``mpc-online`` then spend the misses the target allows (``docs/online.md``)."""

    attainment: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
    window_s: Annotated[float, Field(gt=0, le=SLO_WINDOW_LIMIT_S, allow_inf_nan=False)] = (
        DEFAULT_SLO_WINDOW_S
    )
    """At most 31 days: an SRE's longest SLO window is a month."""

    def target(self) -> SLOTarget:
        """The controllers' :class:`~gpugov.controllers.budget.SLOTarget`."""
        from gpugov.controllers.budget import SLOTarget

        return SLOTarget(attainment=self.attainment, window_s=self.window_s)


class SafetyConfig(FrozenModel):
    """Limits applied to every decision, whatever the controller."""

    floor_mhz: ClockMHz | None = None
    dwell_s: Seconds = DEFAULT_DWELL_S
    min_relock_interval_s: Annotated[float, Field(ge=0.0, le=10.0, allow_inf_nan=False)] = (
        DEFAULT_MIN_RELOCK_INTERVAL_S
    )
    """Least seconds between two clock changes, raises included (NCCL collectives of a
    TP group stall when its clocks change every ~50 ms); a raise waits at most this."""


Role = Literal["prefill", "decode", "colocated"]
"""A domain's pool role in disaggregated serving (``docs/disaggregated.md``): a prefill
pool is judged on TTFT, a decode pool on TPOT, a colocated engine on both."""
ROLES: tuple[str, ...] = ("prefill", "decode", "colocated")


DOMAIN_NAME_PATTERN = r"^[A-Za-z0-9_.:-]+$"
"""A domain's name: what its state files (``online-model-<name>.json``) and labels hold."""
MAX_DOMAIN_NAME_CHARS = 64


class DomainConfig(FrozenModel):
    """GPUs serving one engine: one source, one controller, one clock for all."""

    name: Annotated[str, Field(pattern=DOMAIN_NAME_PATTERN, max_length=MAX_DOMAIN_NAME_CHARS)]
    gpus: Annotated[tuple[GpuId, ...], BeforeValidator(_as_tuple), Field(min_length=1)]
    engine: EngineConfig = EngineConfig()
    controller: ControllerConfig = MaxControllerConfig(kind="max")
    safety: SafetyConfig = SafetyConfig()
    failsafe: Literal["max", "unlock"] = "max"
    external_clock_policy: Literal["reassert", "yield"] = "reassert"
    stale_after_s: (
        Annotated[float, Field(gt=0, le=MAX_STALE_AFTER_S, allow_inf_nan=False)] | None
    ) = None
    """At least 1.5 control periods (:data:`MIN_STALE_PERIODS`) and at most 600 s
    (:data:`MAX_STALE_AFTER_S`), so the fail-safe engages."""
    lock_mode: Literal["pin", "cap"] = "pin"
    ttft_slo_s: PositiveSeconds | None = None
    tpot_slo_s: PositiveSeconds | None = None
    ttft_slo_per_prompt_token_s: Seconds | None = None
    """TTFT SLO allowance per prompt token: a request of ``p`` prompt tokens meets its
    TTFT SLO when ``TTFT <= ttft_slo_s + ttft_slo_per_prompt_token_s * p``."""
    slo_target: SLOTargetConfig | None = None
    thermal_limit_c: (
        Annotated[float, Field(gt=MIN_THERMAL_LIMIT_C, le=MAX_THERMAL_LIMIT_C, allow_inf_nan=False)]
        | None
    ) = None
    """Above 30 C (:data:`MIN_THERMAL_LIMIT_C`), at most 150 C (:data:`MAX_THERMAL_LIMIT_C`)."""
    mean_prompt_tokens: TokenCount = 512.0
    mean_output_tokens: TokenCount = 256.0
    power_budget_w: Watts | None = None
    """The domain's power budget, watts for all its GPUs together (at most a megawatt,
    :data:`~gpugov.daemon.limits.MAX_POWER_W`); the lowest of this,
    ``power_budget_file`` and the GPUs' enforced NVML limits is in force
    (``docs/power-budget.md``)."""
    power_budget_file: LoosePath | None = None
    """A file holding one number of watts (such as a Kubernetes Downward API projection
    of the pod annotation ``dynamo.nvidia.com/gpu-power-limit``), re-read when it changes."""
    power_budget_file_scope: Literal["gpu", "domain"] = "gpu"
    """What the file's number covers: one GPU (the domain's budget is that times its GPU
    count, as Dynamo's annotation is a per-GPU cap) or the whole domain."""

    @field_validator("power_budget_file", mode="before")
    @classmethod
    def _budget_file_named(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must name a file, such as /etc/gpugov/budget/gpu-power-limit")
        return value

    @model_validator(mode="after")
    def _budget_scope_needs_a_file(self) -> DomainConfig:
        if "power_budget_file_scope" in self.model_fields_set and self.power_budget_file is None:
            raise ValueError(
                "power_budget_file_scope needs power_budget_file (the file whose number it scales)"
            )
        return self

    role: Role | None = None
    """The pool role (``prefill``, ``decode`` or ``colocated``); unset: what the engine's
    labels say (SGLang's ``engine_type``, Dynamo's ``dynamo_component``), else
    ``colocated``. A role set here wins over the labels (``docs/disaggregated.md``)."""

    @model_validator(mode="after")
    def _slos_for_the_target(self) -> DomainConfig:
        if self.ttft_slo_per_prompt_token_s is not None and self.ttft_slo_s is None:
            raise ValueError(
                "ttft_slo_per_prompt_token_s needs ttft_slo_s (the flat part of the TTFT SLO)"
            )
        if self.slo_target is not None and self.ttft_slo_s is None and self.tpot_slo_s is None:
            raise ValueError(
                "slo_target needs the SLOs it counts requests against: set ttft_slo_s "
                "and/or tpot_slo_s"
            )
        # A pool is judged on its phase's SLO alone (controllers.budget): the other one
        # gives its target no request to count.
        if self.slo_target is not None and self.role == "prefill" and self.ttft_slo_s is None:
            raise ValueError(
                'slo_target of a prefill pool (role = "prefill") counts its first tokens '
                "against ttft_slo_s alone: set ttft_slo_s"
            )
        if self.slo_target is not None and self.role == "decode" and self.tpot_slo_s is None:
            raise ValueError(
                'slo_target of a decode pool (role = "decode") counts its tokens against '
                "tpot_slo_s alone: set tpot_slo_s"
            )
        return self


class ActuatorBackendConfig(FrozenModel):
    """``backend = "actuator"``: where ``gpugov actuator`` listens and the lease asked of
    it (``docs/actuator.md``). The lease is renewed every tick, so it must span at least
    three control periods; ``timeout_s`` bounds one request and must be shorter than
    the period."""

    socket: SocketPath = Path("/run/gpugov-actuator/actuator.sock")
    lease_s: Annotated[float, Field(ge=0.2, le=600.0, allow_inf_nan=False)] = DEFAULT_LEASE_S
    timeout_s: Annotated[float, Field(ge=MIN_REQUEST_TIMEOUT_S, le=10.0, allow_inf_nan=False)] = (
        DEFAULT_WRITE_TIMEOUT_S
    )


class ZeusdBackendConfig(FrozenModel):
    """``backend = "zeusd"``: zeusd's Unix socket (``socket``) or TCP address (``url``,
    ``http://HOST:PORT``), and a file holding its bearer token when zeusd requires one."""

    socket: SocketPath | None = None
    url: str | None = None
    token_file: LoosePath | None = None
    timeout_s: Annotated[float, Field(ge=MIN_REQUEST_TIMEOUT_S, le=10.0, allow_inf_nan=False)] = (
        DEFAULT_WRITE_TIMEOUT_S
    )

    _http_url = field_validator("url")(zeusd_url)

    @model_validator(mode="after")
    def _one_address(self) -> ZeusdBackendConfig:
        if (self.socket is None) == (self.url is None):
            raise ValueError(
                "set socket (zeusd's Unix socket) or url (http://HOST:PORT), one of them"
            )
        return self


class DaemonSection(FrozenModel):
    """Process-wide settings."""

    period_s: Annotated[float, Field(ge=MIN_PERIOD_S, le=MAX_PERIOD_S, allow_inf_nan=False)] = (
        DEFAULT_PERIOD_S
    )
    """Seconds between ticks; unset, :func:`default_daemon_period` (0.25 s when every
    domain runs ``mpc-online`` and the file's other settings allow it, else 1 s)."""
    metrics_address: str = "127.0.0.1:9400"
    backend: Literal["nvml", "nvidia-smi", "emulated", "actuator", "zeusd"] = "nvml"
    emulator: str | None = None
    actuator: ActuatorBackendConfig = ActuatorBackendConfig()
    zeusd: ZeusdBackendConfig | None = None
    dry_run: bool = False
    record: LoosePath | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    state_dir: LoosePath | None = None
    reconcile: Literal["reset", "adopt"] = "reset"
    max_controller_failures: Annotated[int, Field(ge=1, le=1_000_000)] = 10
    """Controller exceptions in a row a domain survives (fail-safe for each tick) before
    the daemon resets the clocks and exits 1."""

    _state_dir_named = field_validator("state_dir", mode="before")(named_directory)
    _record_named = field_validator("record", mode="before")(_named_file)
    _emulator_url = field_validator("emulator")(emulator_url)

    @field_validator("metrics_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if value:
            parse_address(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _write_timeouts_from_the_period(cls, data: Any) -> Any:
        """Fill an unset ``actuator.timeout_s`` and ``zeusd.timeout_s`` from the period
        (:func:`default_write_timeout_s`); a timeout the file sets is kept (and checked
        against the period below)."""
        if not isinstance(data, dict) or "period_s" not in data:
            return data  # the 1 s default period: the 0.25 s default timeouts
        period = _period_taken(data["period_s"])
        if period is None:
            return data  # the field validators report what is wrong
        timeout = default_write_timeout_s(period)
        filled = dict(data)
        for name in ("actuator", "zeusd"):
            section = data.get(name, {} if name == "actuator" else None)
            if isinstance(section, dict) and "timeout_s" not in section:
                filled[name] = {**section, "timeout_s": timeout}
        actuator = filled.get("actuator")
        if isinstance(actuator, dict) and "lease_s" not in actuator:
            # Renewed once a tick: three periods at least, whatever the period.
            filled["actuator"] = {**actuator, "lease_s": max(DEFAULT_LEASE_S, 3.0 * period)}
        return filled

    @model_validator(mode="after")
    def _write_path_fits_the_period(self) -> DaemonSection:
        if self.backend == "zeusd" and self.zeusd is None:
            raise ValueError('backend = "zeusd" needs a [daemon.zeusd] table with socket or url')
        if self.backend == "actuator" and short_of(self.actuator.lease_s, 3 * self.period_s):
            raise ValueError(
                f"actuator.lease_s ({self.actuator.lease_s:g} s) must be at least 3 x "
                f"period_s ({3 * self.period_s:g} s): the lease is renewed once a tick"
            )
        for name in ("actuator", "zeusd"):
            section = getattr(self, name)
            if self.backend == name and section.timeout_s >= self.period_s:
                raise ValueError(
                    f"{name}.timeout_s ({section.timeout_s:g} s) must be shorter than "
                    f"period_s ({self.period_s:g} s), or a slow {name} stalls the loop"
                )
        return self

    @model_validator(mode="after")
    def _emulator_for_emulated(self) -> DaemonSection:
        if self.backend == "emulated" and not self.emulator:
            raise ValueError(
                'backend = "emulated" needs emulator = "http://127.0.0.1:8000" '
                "(the address of gpugov emulate)"
            )
        return self


def own_metrics_engine(address: str, domains: Sequence[DomainConfig]) -> int | None:
    """The index of the first domain whose ``engine.url`` is the daemon's own ``/metrics``
    served at ``address`` (``daemon.metrics_address`` or ``run --metrics-address``), or
    None: such a domain scrapes no engine gauges and sits at its fail-safe. The same host,
    ``localhost`` for a loopback one, or loopback for one that listens on every address
    (another host's is not known to be this); ``""``, ``none`` or a malformed address
    (refused on its own) serve nothing here."""
    if not address or address.lower() == "none":
        return None
    from gpugov.daemon.cli_types import is_loopback

    try:
        host, port = parse_address(address)
    except ValueError:
        return None
    for index, domain in enumerate(domains):
        parts = urllib.parse.urlsplit(domain.engine.url)
        engine_port = parts.port or (443 if parts.scheme == "https" else 80)
        engine_host = (parts.hostname or "").lower()
        same_host = engine_host == host.lower() or (
            is_loopback(engine_host)
            and (host in ("0.0.0.0", "::") or "localhost" in (engine_host, host.lower()))
        )
        if engine_port == port and same_host:
            return index
    return None


def _engine_with_timeout(engine: Any, timeout_s: float) -> Any:
    """``engine`` (a TOML table or an :class:`EngineConfig`) with ``timeout_s`` set to
    ``timeout_s`` when it sets none; anything else unchanged (validation reports it)."""
    if isinstance(engine, dict) and "timeout_s" not in engine:
        return {**engine, "timeout_s": timeout_s}
    if isinstance(engine, EngineConfig) and "timeout_s" not in engine.model_fields_set:
        return engine.model_copy(update={"timeout_s": timeout_s})
    return engine


class GpugovConfig(FrozenModel):
    """The whole file: ``[daemon]`` and one ``[[domains]]`` table per control domain."""

    daemon: DaemonSection = DaemonSection()
    domains: Annotated[tuple[DomainConfig, ...], BeforeValidator(_as_tuple), Field(min_length=1)]

    @classmethod
    def _with_default_period(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with an unset ``daemon.period_s`` set to :func:`default_daemon_period`
        when that is shorter than the 1 s default and the file validates with it; else
        unchanged, so a file valid at 1 s stays valid (an ``engine.timeout_s = 0.5`` set
        beside mpc-online keeps 1 s, and ``check-config`` warns of the period)."""
        daemon = data.get("daemon", {})
        if isinstance(daemon, DaemonSection):
            daemon = {name: getattr(daemon, name) for name in daemon.model_fields_set}
        if not isinstance(daemon, dict) or "period_s" in daemon:
            return data
        period = default_daemon_period(data.get("domains"))
        if period == DEFAULT_PERIOD_S:
            return data
        trial = {**data, "daemon": {**daemon, "period_s": period}}
        try:
            cls.model_validate(trial)
        except ValidationError:
            return data  # valid at 1 s or not at all: the 1 s validation says which
        return trial

    @model_validator(mode="before")
    @classmethod
    def _engine_timeouts_from_the_period(cls, data: Any) -> Any:
        """Fill each domain's unset ``engine.timeout_s`` from the period
        (:func:`default_engine_timeout_s`); a timeout the file sets is kept (and checked
        against the period below)."""
        if not isinstance(data, dict):
            return data
        data = cls._with_default_period(data)
        daemon = data.get("daemon", {})
        period = daemon.period_s if isinstance(daemon, DaemonSection) else None
        if isinstance(daemon, dict):
            period = daemon.get("period_s", DaemonSection.model_fields["period_s"].default)
        domains = data.get("domains")
        taken = _period_taken(period)
        if taken is None or not isinstance(domains, list | tuple):
            return data  # the field validators report what is wrong
        timeout = default_engine_timeout_s(taken)
        window = max(DEFAULT_SLO_WINDOW_S, SLO_WINDOW_PERIODS * taken)
        filled: list[Any] = []
        for domain in domains:
            if isinstance(domain, dict):
                engine = _engine_with_timeout(domain.get("engine", {}), timeout)
                domain = {**domain, "engine": engine}
                target = domain.get("slo_target")
                if isinstance(target, dict) and "window_s" not in target:
                    # At least twelve periods, whatever the period.
                    domain["slo_target"] = {**target, "window_s": window}
            elif isinstance(domain, DomainConfig):
                engine = _engine_with_timeout(domain.engine, timeout)
                update: dict[str, Any] = {"engine": engine}
                built = domain.slo_target
                if built is not None and "window_s" not in built.model_fields_set:
                    update["slo_target"] = built.model_copy(update={"window_s": window})
                domain = domain.model_copy(update=update)
            filled.append(domain)
        return {**data, "domains": filled}

    @model_validator(mode="after")
    def _domains_are_disjoint(self) -> GpugovConfig:
        names: dict[str, int] = {}
        gpus: dict[str, str] = {}
        for index, domain in enumerate(self.domains):
            if domain.name in names:
                raise ValueError(
                    f"domains[{index}].name: {domain.name!r} is domains[{names[domain.name]}]'s "
                    "name too; give each domain its own"
                )
            names[domain.name] = index
            for gpu in domain.gpus:
                key = str(gpu)
                if gpus.get(key) == domain.name:
                    raise ValueError(
                        f"domains[{index}].gpus: GPU {key} is listed twice in domain "
                        f"{domain.name!r}; list each GPU once"
                    )
                if key in gpus:
                    raise ValueError(
                        f"domains[{index}].gpus: GPU {key} is in domains {gpus[key]!r} and "
                        f"{domain.name!r}; a GPU belongs to one domain"
                    )
                gpus[key] = domain.name
        return self

    @model_validator(mode="after")
    def _engines_are_not_the_exporter(self) -> GpugovConfig:
        """An engine URL that is this daemon's own ``/metrics`` page (a copied address):
        ``check-config`` said OK, and every scrape found no engine gauges, so the domain
        sat at its fail-safe under a "wrong engine kind" warning."""
        address = self.daemon.metrics_address
        found = own_metrics_engine(address, self.domains)
        if found is not None:
            raise ValueError(
                f"domains[{found}].engine.url ({self.domains[found].engine.url}) is this "
                f"daemon's own metrics endpoint (daemon.metrics_address = {address}); give "
                "the serving engine's /metrics URL"
            )
        return self

    @model_validator(mode="after")
    def _emulated_gpus_are_indices(self) -> GpugovConfig:
        """The emulator's GPUs answer to their index only: a UUID passed ``check-config
        --offline`` and stopped ``run`` at its start."""
        if self.daemon.backend != "emulated":
            return self
        for index, domain in enumerate(self.domains):
            named = [gpu for gpu in domain.gpus if isinstance(gpu, str)]
            if named:
                raise ValueError(
                    f'domains[{index}].gpus: {named[0]!r}: backend = "emulated" names a GPU '
                    "by its index (0, 1, ...), as gpugov emulate lists them"
                )
        return self

    @model_validator(mode="after")
    def _caps_have_a_power_limit_backend(self) -> GpugovConfig:
        backend = self.daemon.backend
        if backend in POWER_LIMIT_BACKENDS:
            return self
        for index, domain in enumerate(self.domains):
            kind = domain.controller.kind
            if kind in POWER_CAP_KINDS:
                why = (
                    "the split mode's privileged side only locks and resets clocks"
                    if backend in ("actuator", "zeusd")
                    else "it locks clocks only"
                )
                raise ValueError(
                    f"domains[{index}].controller: {kind!r} sets a GPU power limit, which "
                    f'backend = "{backend}" cannot set ({why}); run it with backend = '
                    '"nvml" (as root or with CAP_SYS_ADMIN), or choose a clock-only controller'
                )
        return self

    @model_validator(mode="after")
    def _timeouts_fit_the_period(self) -> GpugovConfig:
        period = self.daemon.period_s
        for index, domain in enumerate(self.domains):
            if domain.engine.timeout_s >= period:
                raise ValueError(
                    f"domains[{index}].engine.timeout_s ({domain.engine.timeout_s:g} s) must be "
                    f"shorter than daemon.period_s ({period:g} s), or a hung engine stalls the "
                    f"loop; leave it unset for {default_engine_timeout_s(period):g} s"
                )
            target = domain.slo_target
            if target is not None and short_of(target.window_s, SLO_WINDOW_PERIODS * period):
                raise ValueError(
                    f"domains[{index}].slo_target.window_s ({target.window_s:g} s) must be at "
                    f"least {SLO_WINDOW_PERIODS:g} x daemon.period_s "
                    f"({SLO_WINDOW_PERIODS * period:g} s): the attainment loop's short window "
                    "is a twelfth of it and must hold a control period"
                )
            horizon = getattr(domain.controller, "horizon_s", None)
            if horizon is not None and math.ceil(horizon / period) > MAX_HORIZON_STEPS:
                raise ValueError(
                    f"domains[{index}].controller.horizon_s ({horizon:g} s) must span at most "
                    f"{MAX_HORIZON_STEPS} control periods ({MAX_HORIZON_STEPS * period:g} s at "
                    f"daemon.period_s = {period:g} s): the plan is searched every period"
                )
            deadline = getattr(domain.controller, "decision_timeout_s", None)
            if deadline is not None and deadline > period:
                raise ValueError(
                    f"domains[{index}].controller.decision_timeout_s ({deadline:g} s) must be at "
                    f"most daemon.period_s ({period:g} s), or a hung controller stalls the loop "
                    "past a tick; leave it unset for the period"
                )
            stale = domain.stale_after_s
            if stale is not None and short_of(stale, MIN_STALE_PERIODS * period):
                raise ValueError(
                    f"domains[{index}].stale_after_s ({stale:g} s) must be at least "
                    f"{MIN_STALE_PERIODS:g} x daemon.period_s ({MIN_STALE_PERIODS * period:g} s): "
                    "data is at least one period old at every tick, so a shorter age "
                    "would hold the domain in fail-safe"
                )
        return self

    def stale_after_s(self, domain: DomainConfig) -> float:
        """The domain's stale age: its own, else three control periods."""
        return domain.stale_after_s or 3.0 * self.daemon.period_s


def parse_config(data: dict[str, Any], source: str = "<config>") -> GpugovConfig:
    """Validate an already-parsed TOML document.

    Raises:
        ConfigError: every problem, one per line, naming ``source`` and the field path.
    """
    try:
        return GpugovConfig.model_validate(data)
    except ValidationError as error:
        problems = validation_problems(error, source)
        raise ConfigError("\n".join(problems), problems=problems) from error


def controller_state_dir(
    spec: ControllerConfig, daemon_state_dir: Path | str | None
) -> Path | None:
    """Where a learner keeps its model: the spec's ``state_dir``, else the daemon's, else
    systemd's ``$STATE_DIRECTORY``; None for a controller that learns nothing. (A
    simulated run's domain is ``sim``, so its file never replaces a node domain's.) The
    daemon and ``gpugov model`` read it here, so both find the same file."""
    if not isinstance(spec, OnlineMPCControllerConfig):
        return None
    if spec.state_dir is not None:
        return Path(spec.state_dir)
    return resolve_state_dir(daemon_state_dir)


def load_config(path: str | Path) -> GpugovConfig:
    """Read and validate a TOML config file; relative paths in it are taken from the
    file's folder (:func:`rebase_relative_paths`).

    Raises:
        ConfigError: unreadable file, TOML syntax error, or invalid values.
    """
    from gpugov.plant.input_files import InputFileError, loads_toml, read_input_text

    source = Path(path)
    try:
        text = read_input_text(source, "config")
    except InputFileError as error:
        raise ConfigError(str(error)) from error
    try:
        data = loads_toml(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from error
    base = Path(os.path.abspath(source)).parent
    return parse_config(rebase_relative_paths(data, base), str(source))
