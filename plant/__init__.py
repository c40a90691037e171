"""The simulated serving plant: profiles, power/thermal model, workloads, schedulers,
and the iteration-level simulator (names follow the seed's ``inference_serving``)."""

from gpugov.plant.closed_loop import ControllerError, simulate
from gpugov.plant.disaggregated import DisaggregatedResult, simulate_disaggregated
from gpugov.plant.disaggregated_layout import DisaggregatedPlant, PoolSpec
from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import PerformanceProfile, ProfileError
from gpugov.plant.profile_files import list_bundled_profiles, load_profile
from gpugov.plant.result import ServingMetrics, ServingResult
from gpugov.plant.scheduler import (
    CHUNKED_PREFILL_LABEL,
    ChunkedPrefillScheduler,
    DecodePriorityScheduler,
    PrefillPriorityScheduler,
    chunked_prefill_scheduler,
    decode_priority_scheduler,
    prefill_priority_scheduler,
)
from gpugov.plant.simulator import PlantSimulation
from gpugov.plant.synthetic_workloads import bursty_workload, poisson_workload
from gpugov.plant.types import (
    ClockController,
    IterationPlan,
    MPCDiagnostics,
    PowerCapping,
    Request,
    RequestRecord,
    Scheduler,
    SchedulerView,
    ServingObservation,
)
from gpugov.plant.workload import (
    DEFAULT_TRACE,
    TraceError,
    load_trace,
    workload_checksum,
)

__all__ = [
    "CHUNKED_PREFILL_LABEL",
    "DEFAULT_TRACE",
    "ChunkedPrefillScheduler",
    "ClockController",
    "ControllerError",
    "DecodePriorityScheduler",
    "DisaggregatedPlant",
    "DisaggregatedResult",
    "IterationPlan",
    "MPCDiagnostics",
    "PerformanceProfile",
    "PlantSimulation",
    "PoolSpec",
    "PowerCapping",
    "PrefillPriorityScheduler",
    "ProfileError",
    "Request",
    "RequestRecord",
    "Scheduler",
    "SchedulerView",
    "ServingMetrics",
    "ServingObservation",
    "ServingPlant",
    "ServingResult",
    "TraceError",
    "bursty_workload",
    "chunked_prefill_scheduler",
    "decode_priority_scheduler",
    "list_bundled_profiles",
    "load_profile",
    "load_trace",
    "poisson_workload",
    "prefill_priority_scheduler",
    "simulate",
    "simulate_disaggregated",
    "workload_checksum",
]
