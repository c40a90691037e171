"""Peer governors: other projects' clock and power-cap strategies, re-implemented from their
papers and docs so that the scoreboard compares them with gpugov's on the same traces.

Each module cites its source and says what was simplified. Every controller sees only what
a node observes (:class:`~gpugov.plant.types.ServingObservation`: the engine's metrics,
NVML's readings, the supported clocks and the SLOs), never the plant's profile; the
exceptions are the hindsight oracle :mod:`.best_cap` and the vendor-style preset calibration
of :mod:`.power_profile`, which say so. Pure computation, no I/O; ``controllers/`` imports
only ``plant/``.

=================  ================================================================
module             controller
=================  ================================================================
``power_cap``      ``power-cap``: a static power cap (70 % of the board limit)
``best_cap``       ``best-cap``: the best static cap in hindsight (an oracle)
``dps``            ``dps``: a DPS-style cap steered from power telemetry
``power_profile``  ``power-profile``: a static clock ceiling plus cap (a vendor preset)
``default_dvfs``   ``default-dvfs``: the unlocked GPU (boost, idle drop, firmware TDP)
``agft``           ``agft``: AGFT's contextual LinUCB bandit over SM clocks
``pid``            ``pid``: PID on TTFT and TPOT (vllm-ascend's SLA DVFS proposal)
``throttllem``     ``throttllem``: throughput prediction, then the lowest meeting clock
``greenllm``       ``greenllm``: a dual-loop decode controller and a fitted prefill clock
``voltana``        ``voltana``: VoltanaLLM's per-phase rule, the lowest clock meeting the
                   role's SLO on a learned latency table (disaggregated pools)
=================  ================================================================
"""
