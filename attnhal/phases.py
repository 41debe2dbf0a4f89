"""The attention phases of speculative decoding: which run, and how wide each is.

A step of speculative decoding runs up to five attention phases (:class:`Phase`).
Which of them run is data: :data:`ALGORITHM_PHASES` per algorithm, less
draft_decode when ``num_steps == 1`` (:func:`phases_run`, :func:`not_run_reason`).
How many query tokens a phase has is :func:`tokens_per_request` (per request) and
:func:`tokens_per_row` (per batch row); they differ for draft_decode only.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Protocol

from attnhal.reasons import Reason, ReasonCode, fmt_set, reason
from attnhal.spec import SpecAlgorithm, SpecConfig

__all__ = [
    "ALGORITHM_PHASES",
    "GRAPH_PHASES",
    "Feature",
    "Phase",
    "SpecWidths",
    "draft_decode_runs",
    "not_run_reason",
    "phases_run",
    "tokens_per_request",
    "tokens_per_row",
]


class Phase(str, Enum):
    """The attention phases of one speculative-decoding step (see ``docs/architecture.md``, Phases)."""

    PREFILL = "prefill"
    DECODE = "decode"
    DRAFT_DECODE = "draft_decode"
    DRAFT_EXTEND = "draft_extend"
    TARGET_VERIFY = "target_verify"


#: Phases a graph may be captured for; prefill has a variable token count.
GRAPH_PHASES = (Phase.DECODE, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)


class Feature(str, Enum):
    """Optional attention features: a backend claims them, a request or a phase may need them."""

    CUSTOM_MASK = "custom_mask"  # tree mask for target_verify with topk > 1
    SLIDING_WINDOW = "sliding_window"
    LOGIT_SOFTCAP = "logit_softcap"
    SINKS = "sinks"
    MLA = "mla"  # kept for old files: implies model kind "mla" in ``models``


_SPEC_PHASES = frozenset((Phase.PREFILL, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE, Phase.TARGET_VERIFY))

#: The phases each algorithm runs (draft_decode besides only when num_steps > 1).
#: A new algorithm is a new row, never a new branch in the planner.
ALGORITHM_PHASES: Mapping[SpecAlgorithm, frozenset[Phase]] = MappingProxyType({
    SpecAlgorithm.NONE: frozenset((Phase.PREFILL, Phase.DECODE)),
    SpecAlgorithm.EAGLE: _SPEC_PHASES,
    SpecAlgorithm.EAGLE3: _SPEC_PHASES,
    SpecAlgorithm.MTP: _SPEC_PHASES,
    SpecAlgorithm.STANDALONE: _SPEC_PHASES,
    SpecAlgorithm.NGRAM: frozenset((Phase.PREFILL, Phase.TARGET_VERIFY)),
})

# The fixed reasons, built once rather than on every plan.
_NOT_IN_ALGORITHM = {(phase, algorithm): reason(
    ReasonCode.PHASE_NOT_RUN, "algorithm", algorithm, f"{phase.value} runs with algorithm in "
    f"{fmt_set(a for a, phases in ALGORITHM_PHASES.items() if phase in phases)}")
    for phase in Phase for algorithm in SpecAlgorithm if phase not in ALGORITHM_PHASES[algorithm]}
_ONE_STEP = reason(ReasonCode.PHASE_NOT_RUN, "num_steps", 1,
                   "draft_decode runs when num_steps > 1; the first draft token comes from draft_extend")


def draft_decode_runs(num_steps: int) -> bool:
    """Whether ``num_steps`` draft steps run a draft-decode forward: ``num_steps > 1`` (the first
    draft token comes from draft_extend). The one place this rule is written: the planner's
    "not run" reason and the role rule's "engines build a draft backend" both read it."""
    return num_steps > 1


def not_run_reason(phase: Phase, spec: SpecConfig) -> Reason | None:
    """None if ``phase`` runs under ``spec``, else the ``phase_not_run`` reason it does not.

    The rule: the phases of :data:`ALGORITHM_PHASES` for ``spec.algorithm``, except
    draft_decode when ``num_steps == 1`` (the first draft token comes from draft_extend).
    """
    not_in_algorithm = _NOT_IN_ALGORITHM.get((phase, spec.algorithm))
    if not_in_algorithm is not None:
        return not_in_algorithm
    if phase is Phase.DRAFT_DECODE and not draft_decode_runs(spec.num_steps):
        return _ONE_STEP
    return None


def phases_run(spec: SpecConfig) -> frozenset[Phase]:
    """The phases that run under ``spec`` (those :func:`not_run_reason` has no reason against)."""
    return frozenset(p for p in ALGORITHM_PHASES[spec.algorithm] if not_run_reason(p, spec) is None)


def tokens_per_request(phase: Phase, spec: SpecConfig) -> int:
    """Query tokens per request of ``phase`` under ``spec`` (the phase's *width*); prefill: 0 (variable).

    draft_decode has ``topk`` tokens per request, one per branch; see :func:`tokens_per_row`.
    """
    return {Phase.PREFILL: 0, Phase.DECODE: 1, Phase.DRAFT_DECODE: spec.topk,
            Phase.DRAFT_EXTEND: spec.draft_extend_len, Phase.TARGET_VERIFY: spec.num_draft_tokens}[phase]


class SpecWidths(Protocol):
    """The speculative quantities that size a batch row: a :class:`~attnhal.spec.SpecConfig`,
    or a batch's :class:`~attnhal.backend.SpecInfo` (which carries its own padded widths)."""

    @property
    def num_draft_tokens(self) -> int:
        """Query tokens per row of target_verify."""
        ...

    @property
    def draft_extend_len(self) -> int:
        """Query tokens per row of draft_extend (the accepted tokens, padded)."""
        ...


def tokens_per_row(phase: Phase, spec: SpecWidths | None) -> int | None:
    """Query tokens per batch row of ``phase``; None for prefill (rows of variable length).

    A row is one request, except in draft_decode, where each of the ``topk`` branches
    of a request is its own row of one token. So draft_decode has 1 token per row but
    ``topk`` per request (:func:`tokens_per_request`); the two agree on every other
    phase. decode and draft_decode do not read ``spec``; target_verify
    (``num_draft_tokens``) and draft_extend (``draft_extend_len``) need it.
    """
    if phase is Phase.PREFILL:
        return None
    if phase is Phase.DECODE or phase is Phase.DRAFT_DECODE:
        return 1
    if spec is None:
        raise ValueError(f"spec=None (supported: a SpecConfig or SpecInfo for phase={phase.value})")
    return spec.num_draft_tokens if phase is Phase.TARGET_VERIFY else spec.draft_extend_len
