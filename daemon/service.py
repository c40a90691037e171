"""Assembling runs: real domains from a config, or one simulated domain from the plant.

Constructors below take plain values; only :func:`domains_from_config` reads the config
object, the way STYLE.md asks (the CLI loads it, this turns it into parts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from gpugov.controllers.mpc import expected_output_tokens_forecast
from gpugov.daemon.actuator import ClockActuator, LockMode
from gpugov.daemon.backend import DryRunBackend, GpuBackend
from gpugov.daemon.config import ControllerConfig, GpugovConfig, MPCControllerConfig
from gpugov.daemon.decide import build_controller, mpc_controller, with_safety
from gpugov.daemon.engines import ScrapedSource
from gpugov.daemon.loop import Domain, FailsafeMode
from gpugov.daemon.nvidia_smi import NvidiaSmiBackend
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.observer import DomainObserver
from gpugov.daemon.simulated import SimulatedBackend, SimulatedNode, SimulatedSource
from gpugov.plant import PlantSimulation, ServingPlant, ServingResult
from gpugov.plant.types import Request

log = logging.getLogger(__name__)


def open_backend(
    gpu: int | str,
    kind: str = "nvml",
    *,
    dry_run: bool = False,
    nvml: ModuleType | None = None,
) -> GpuBackend:
    """One GPU's backend (``nvml`` or ``nvidia-smi``), wrapped for a dry run if asked.

    Raises:
        GpuUnavailable: no driver, library or GPU.
    """
    backend: GpuBackend = (
        NvidiaSmiBackend(gpu) if kind == "nvidia-smi" else NvmlBackend(gpu, nvml=nvml)
    )
    return DryRunBackend(backend) if dry_run else backend


@dataclass
class Assembled:
    """Domains ready to run and what must be closed afterwards."""

    domains: list[Domain]
    backends: list[GpuBackend] = field(default_factory=list)
    sources: list[ScrapedSource] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Close every backend (NVML references) and engine connection."""
        for backend in self.backends:
            backend.close()
        for source in self.sources:
            source.close()


def build_domain(
    name: str,
    backends: Sequence[GpuBackend],
    source: Any,
    controller_spec: ControllerConfig,
    *,
    period_s: float,
    stale_after_s: float,
    failsafe: FailsafeMode = "max",
    lock_mode: LockMode = "pin",
    floor_mhz: float | None = None,
    dwell_s: float = 1.0,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    thermal_limit_c: float | None = None,
    mean_prompt_tokens: float = 512.0,
    mean_output_tokens: float = 256.0,
    controller: Any = None,
) -> Domain:
    """Observer + safety-wrapped controller + actuator for one domain.

    ``controller`` overrides the one built from ``controller_spec`` (simulated MPC).

    Raises:
        NotSupported: a GPU lists no supported clocks.
        ControllerError: the controller cannot be built.
    """
    observer = DomainObserver(
        backends,
        source,
        stale_after_s=stale_after_s,
        ttft_slo_s=ttft_slo_s,
        tpot_slo_s=tpot_slo_s,
        thermal_limit_c=thermal_limit_c,
        mean_prompt_tokens=mean_prompt_tokens,
        mean_output_tokens=mean_output_tokens,
    )
    clocks = observer.supported_clocks_mhz()
    inner = (
        controller
        if controller is not None
        else build_controller(controller_spec, period_s=period_s)
    )
    wrapped = with_safety(inner, clocks, floor_mhz=floor_mhz, dwell_s=dwell_s)
    actuator = ClockActuator(backends, domain=name, lock_mode=lock_mode)
    return Domain(name, observer, wrapped, actuator, failsafe=failsafe)


def _domain_header(domain: Domain, config_fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": domain.name,
        "controller": domain.label,
        "gpus": [b.label for b in domain.observer.backends],
        "supported_clocks_mhz": list(domain.observer.supported_clocks_mhz()),
        **config_fields,
    }


def domains_from_config(
    config: GpugovConfig, *, dry_run: bool = False, nvml: ModuleType | None = None
) -> Assembled:
    """Open every domain's GPUs and engine source and build its controller.

    Raises:
        GpuUnavailable, NotSupported, ControllerError: nothing is left open.
    """
    dry_run = dry_run or config.daemon.dry_run
    assembled = Assembled(domains=[])
    try:
        for spec in config.domains:
            backends = [
                open_backend(gpu, config.daemon.backend, dry_run=dry_run, nvml=nvml)
                for gpu in spec.gpus
            ]
            assembled.backends.extend(backends)
            source = ScrapedSource(
                spec.engine.url, spec.engine.kind, timeout_s=spec.engine.timeout_s
            )
            domain = build_domain(
                spec.name,
                backends,
                source,
                spec.controller,
                period_s=config.daemon.period_s,
                stale_after_s=config.stale_after_s(spec),
                failsafe=spec.failsafe,
                lock_mode=spec.lock_mode,
                floor_mhz=spec.safety.floor_mhz,
                dwell_s=spec.safety.dwell_s,
                ttft_slo_s=spec.ttft_slo_s,
                tpot_slo_s=spec.tpot_slo_s,
                thermal_limit_c=spec.thermal_limit_c,
                mean_prompt_tokens=spec.mean_prompt_tokens,
                mean_output_tokens=spec.mean_output_tokens,
            )
            assembled.domains.append(domain)
    except BaseException:
        assembled.close()
        raise
    assembled.header = {
        "mode": "node",
        "period_s": config.daemon.period_s,
        "dry_run": dry_run,
        "domains": [
            _domain_header(
                domain,
                {
                    "engine_url": spec.engine.url,
                    "safety": spec.safety.model_dump(),
                    "controller_config": spec.controller.model_dump(mode="json"),
                },
            )
            for domain, spec in zip(assembled.domains, config.domains, strict=True)
        ],
    }
    return assembled


# --------------------------------------------------------------------- simulated
@dataclass
class SimulatedRun:
    """One simulated domain and the plant behind it."""

    node: SimulatedNode
    domain: Domain
    horizon_s: float
    header: dict[str, Any]
    result: ServingResult | None = None

    def before_tick(self, now_s: float, step: int) -> bool:
        """Advance the plant to ``now_s``; True (stop) when the run is over.

        Mirrors :func:`plant.simulate`: stop once every request finished, or past the
        horizon; the result is frozen here, before the actuator's reset on exit.
        """
        over = now_s > self.horizon_s + 1e-12
        self.node.advance(self.horizon_s if over else now_s)
        if over or (self.node.done and step > 0):
            self.finish()
            return True
        return False

    def finish(self) -> ServingResult:
        """Freeze the plant's result (idempotent)."""
        if self.result is None:
            self.result = self.node.simulation.result(
                controller_name=self.domain.label, scheduler_name=""
            )
        return self.result


def simulated_run(
    workload: Sequence[Request],
    plant: ServingPlant,
    controller_spec: ControllerConfig,
    clock: Callable[[], float],
    *,
    period_s: float = 1.0,
    dwell_s: float = 1.0,
    floor_mhz: float | None = None,
    seed: int = 0,
    horizon_s: float | None = None,
    header: dict[str, Any] | None = None,
) -> SimulatedRun:
    """A simulated node with one domain on the plant's ``tensor_parallel`` simulated GPUs.

    The MPC controller plans on the run's own plant, with the declared forecasts the
    config gives or, by default, the workload's mean prompt and output lengths (fixed
    before the run, as ``gpugov simulate`` does).
    """
    if not workload:
        raise ValueError("the simulated workload has no requests")
    simulation = PlantSimulation(workload, plant, seed=seed)
    last_arrival = workload[-1].arrival_time_s
    horizon = last_arrival + plant.drain_timeout_s if horizon_s is None else float(horizon_s)
    node = SimulatedNode(simulation, clock, horizon_s=horizon)
    gpus = plant.tensor_parallel
    backends = [SimulatedBackend(node, label=str(i), share=1.0 / gpus) for i in range(gpus)]
    controller = None
    if isinstance(controller_spec, MPCControllerConfig):
        # Record the forecasts the MPC really uses, so a replay rebuilds the same MPC.
        controller_spec = with_workload_forecasts(controller_spec, workload)
        controller = mpc_controller(controller_spec, plant, period_s)
    domain = build_domain(
        "sim",
        backends,
        SimulatedSource(node),
        controller_spec,
        period_s=period_s,
        stale_after_s=3.0 * period_s,
        floor_mhz=floor_mhz,
        dwell_s=dwell_s,
        thermal_limit_c=plant.thermal_limit_c,
        controller=controller,
    )
    full_header = {
        "mode": "simulated",
        "period_s": period_s,
        "domains": [
            _domain_header(
                domain,
                {
                    "safety": {"floor_mhz": floor_mhz, "dwell_s": dwell_s},
                    "controller_config": controller_spec.model_dump(mode="json"),
                },
            )
        ],
        **(header or {}),
    }
    return SimulatedRun(node=node, domain=domain, horizon_s=horizon, header=full_header)


def with_workload_forecasts(
    spec: MPCControllerConfig, workload: Sequence[Request]
) -> MPCControllerConfig:
    """``spec`` with the forecasts it leaves open declared from ``workload``, fixed before
    the run: the mean prompt and output lengths (as the seed's experiment declares them)
    and the 95th-percentile prompt the iteration model's TTFT proxy charges a new request
    (a mean prompt underestimates TTFT tails on long-prompt traces)."""
    prompts = np.array([r.prompt_tokens for r in workload], dtype=float)
    declared = {
        "mean_prompt_tokens": float(prompts.mean()),
        "mean_output_tokens": expected_output_tokens_forecast(workload),
        "ttft_prompt_tokens": float(np.percentile(prompts, 95)),
    }
    update = {key: value for key, value in declared.items() if getattr(spec, key) is None}
    return spec.model_copy(update=update)


def simulated_mpc(
    spec: MPCControllerConfig, plant: ServingPlant, workload: Sequence[Request], period_s: float
) -> Any:
    """The MPC on the run's own plant, with forecasts declared from the workload unless
    the config gives them (:func:`with_workload_forecasts`)."""
    return mpc_controller(with_workload_forecasts(spec, workload), plant, period_s)


__all__ = [
    "Assembled",
    "SimulatedRun",
    "build_domain",
    "domains_from_config",
    "open_backend",
    "simulated_run",
]
