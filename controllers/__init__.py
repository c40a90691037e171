"""Clock controllers and the scheduling MDP methods; pure computation, no I/O."""

from controllers.baseline import (
    FixedClockController,
    ReactiveGovernor,
    SampleAndHoldController,
    fixed_clock_controller,
    maximum_clock_controller,
    reactive_clock_controller,
    sample_and_hold_clock_controller,
)

__all__ = [
    "FixedClockController",
    "ReactiveGovernor",
    "SampleAndHoldController",
    "fixed_clock_controller",
    "maximum_clock_controller",
    "reactive_clock_controller",
    "sample_and_hold_clock_controller",
]
