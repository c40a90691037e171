"""Pool roles of disaggregated serving: what a prefill or a decode domain is judged on.

A domain's role (``docs/disaggregated.md``) comes from its config, else from the labels
its engine's page carries (:func:`daemon.engine_pools.page_role`), else it is ``colocated``.
A prefill domain is judged on TTFT (its queue and prompt backlog), a decode domain on
TPOT (its running batch and context): :class:`RoleView` shows the controller the
observation as its role sees it, and :func:`role_weights` switches the MPC cost term of
the objective the role is not judged on off.
"""

from __future__ import annotations

import dataclasses
import logging

from gpugov.controllers.contract import ControllerWrapper
from gpugov.plant.types import ClockController, ServingObservation

log = logging.getLogger(__name__)

ROLES = ("prefill", "decode", "colocated")
COLOCATED = "colocated"
OBJECTIVES: dict[str, tuple[str, ...]] = {
    "prefill": ("ttft",),
    "decode": ("tpot",),
    "colocated": ("ttft", "tpot"),
}
"""The latency objectives each role is judged on."""


def check_role(role: str) -> str:
    """``role`` when it is one of :data:`ROLES`.

    Raises:
        ValueError: one line naming the role and the accepted ones.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def resolve_role(configured: str | None, labelled: str | None, domain: str) -> str:
    """The domain's role: the configured one, else the one the engine's labels state,
    else ``colocated``. A configured role the labels contradict wins, with one log line."""
    if configured is not None:
        if labelled is not None and labelled != configured:
            log.warning(
                "domain %s: role = %r in the config, but the engine's labels say %r; "
                "the config wins",
                domain,
                configured,
                labelled,
            )
        return check_role(configured)
    return check_role(labelled) if labelled is not None else COLOCATED


def role_view(observation: ServingObservation, role: str) -> ServingObservation:
    """``observation`` as a ``role`` domain is judged on it.

    A prefill domain is judged on TTFT: the TPOT it measures (its requests end after one
    token) and its TPOT attainment counters are hidden. A decode domain is judged on
    TPOT: its TTFT (the other pool's prefill and the KV transfer) and TTFT counters are
    hidden, and it has no prompt backlog of its own (a waiting request's KV cache is
    computed by the prefill pool), in any estimate: the backlog, its tail and the busiest
    engine's are 0 (an unknown one stays None). The SLO values stay (``mpc-online``
    sizes its model with both); a colocated observation is only stamped with its role.
    """
    if role == "prefill":
        return dataclasses.replace(
            observation,
            role=role,
            tpot_recent_s=None,
            tpot_count_total=None,
            tpot_within_slo_total=None,
        )
    if role == "decode":
        return dataclasses.replace(
            observation,
            role=role,
            prefill_remaining_tokens=0.0,
            prefill_tail_tokens=None if observation.prefill_tail_tokens is None else 0.0,
            busiest_prefill_tokens=None if observation.busiest_prefill_tokens is None else 0.0,
            ttft_recent_s=None,
            ttft_recent_prompt_tokens=None,
            ttft_count_total=None,
            ttft_within_slo_total=None,
        )
    return observation if observation.role == role else dataclasses.replace(observation, role=role)


class RoleView(ControllerWrapper):
    """Shows the inner controller each observation as its domain's role sees it
    (:func:`role_view`); in the chain between the safety layers and the algorithm."""

    def __init__(self, inner: ClockController, role: str) -> None:
        super().__init__(inner)
        self.role = check_role(role)

    def __call__(self, observation: ServingObservation) -> float:
        return self.inner(role_view(observation, self.role))


def role_weights(role: str) -> object | None:
    """The MPC cost weights of ``role``: the seed's weights with the TPOT term off for a
    prefill domain and the TTFT term off for a decode domain; None (the controller's
    own) for a colocated one."""
    from gpugov.controllers.mpc.model import MPCWeights

    if role == "prefill":
        return MPCWeights(tpot=0.0)
    if role == "decode":
        return MPCWeights(ttft=0.0)
    return None
