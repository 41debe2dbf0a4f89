"""The spec configs a graph or multi-step claim allows (its declared limits)."""

from __future__ import annotations

from hypothesis import strategies as st

from attnhal.capabilities import Phase, SpecLimits
from attnhal.plan import SpecConfig
from attnhal.testing import strategies as ast
from attnhal.testing.checks.claims import Claim, ClaimKind
from attnhal.testing.checks.target import Target

def limits_of(target: Target, claim: Claim) -> SpecLimits:
    caps = target.caps
    if claim.kind is ClaimKind.MULTI_STEP:
        return caps.multi_step or SpecLimits()
    return caps.graph_limits(claim.phase) or SpecLimits()


def multi_step_graph(target: Target, claim: Claim) -> bool:
    return claim.subject == Phase.DRAFT_DECODE.value and target.caps.multi_step is not None


def graph_specs(target: Target, claim: Claim) -> st.SearchStrategy[SpecConfig]:
    caps = target.caps
    if claim.kind is ClaimKind.MULTI_STEP:
        return ast.spec_configs_for(caps, Phase.DRAFT_DECODE, limits_of(target, claim))
    if claim.phase is Phase.DECODE:
        return st.just(SpecConfig())
    limits = limits_of(target, claim)
    if multi_step_graph(target, claim):
        limits = ast._tighter(limits, caps.multi_step or SpecLimits())
    return ast.spec_configs_for(caps, claim.phase, limits)

