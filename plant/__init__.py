"""The simulated serving plant: profiles, power/thermal model, workloads, schedulers,
and the iteration-level simulator (names follow the seed's ``inference_serving``)."""

from plant.plant import ServingPlant
from plant.profile import (
    PerformanceProfile,
    ProfileError,
    list_bundled_profiles,
    load_profile,
)
from plant.result import ServingMetrics, ServingResult
from plant.scheduler import (
    CHUNKED_PREFILL_LABEL,
    ChunkedPrefillScheduler,
    DecodePriorityScheduler,
    PrefillPriorityScheduler,
    chunked_prefill_scheduler,
    decode_priority_scheduler,
    prefill_priority_scheduler,
)
from plant.simulator import ControllerError, PlantSimulation, simulate
from plant.types import (
    ClockController,
    IterationPlan,
    MPCDiagnostics,
    Request,
    RequestRecord,
    Scheduler,
    SchedulerView,
    ServingObservation,
)

__all__ = [
    "CHUNKED_PREFILL_LABEL",
    "ChunkedPrefillScheduler",
    "ClockController",
    "ControllerError",
    "DecodePriorityScheduler",
    "IterationPlan",
    "MPCDiagnostics",
    "PerformanceProfile",
    "PlantSimulation",
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
    "chunked_prefill_scheduler",
    "decode_priority_scheduler",
    "list_bundled_profiles",
    "load_profile",
    "prefill_priority_scheduler",
    "simulate",
]
