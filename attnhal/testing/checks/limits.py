"""The speculative limits a graph or multi-step claim declares, and the spec configs they allow."""

from __future__ import annotations

from hypothesis import strategies as st

import attnhal.testing.strategies as hst
from attnhal.capabilities import SpecLimits
from attnhal.phases import Phase
from attnhal.spec import SpecConfig
from attnhal.testing.checks.claims import Claim, ClaimKind
from attnhal.testing.checks.target import Target

__all__ = ["claim_limits", "claim_spec_configs", "multi_step_graph"]


def multi_step_graph(target: Target, claim: Claim) -> bool:
    """Whether ``claim``'s graph holds every forward of a multi-step draft (``graph[draft_decode]``
    of a backend claiming ``multi_step``)."""
    return claim.subject == Phase.DRAFT_DECODE.value and target.caps.multi_step is not None


def claim_limits(target: Target, claim: Claim) -> SpecLimits:
    """The limits ``claim``'s examples are drawn within: ``caps.multi_step`` for ``multi_step``;
    for a graph claim, its phase's graph limits (a multi-step graph: within both)."""
    caps = target.caps
    if claim.kind is ClaimKind.MULTI_STEP:
        return caps.multi_step or SpecLimits()
    return hst.graph_limits(caps, claim.phase, multi_step_graph(target, claim))


def claim_spec_configs(target: Target, claim: Claim) -> st.SearchStrategy[SpecConfig]:
    """The spec configs ``claim`` may run with (empty when none satisfies its limits)."""
    if claim.kind is ClaimKind.MULTI_STEP:
        return hst.spec_configs_for(target.caps, Phase.DRAFT_DECODE, claim_limits(target, claim))
    if claim.phase is Phase.DECODE:
        return st.just(SpecConfig())
    return hst.spec_configs_for(target.caps, claim.phase, claim_limits(target, claim))
