"""The attention phases of speculative decoding: which run, and how wide each is.

A step of speculative decoding runs up to five attention phases (:class:`Phase`).
Which of them run is data: :data:`ALGORITHM_PHASES` per algorithm, less
draft_decode when ``num_steps == 1`` or when the engine runs its draft steps as extends
(:func:`phases_run`, :func:`not_run_reason`; the engine's :class:`StepLayout`).
How many query tokens a phase has is :func:`tokens_per_request` (per request) and
:func:`tokens_per_row` (per batch row); they differ for draft_decode only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Protocol

from attnhal.errors import InvalidValue
from attnhal.reasons import Reason, ReasonCode, fmt_set, reason
from attnhal.spec import SpecAlgorithm, SpecConfig

__all__ = [
    "ALGORITHM_PHASES",
    "DEFAULT_LAYOUT",
    "GRAPH_PHASES",
    "DraftSteps",
    "Feature",
    "GraphGroup",
    "Phase",
    "SpecWidths",
    "StepLayout",
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


class DraftSteps(str, Enum):
    """How an engine runs the draft steps of one speculative step.

    - ``decode``: EAGLE's loop: draft_extend gives the first draft token, then ``num_steps - 1``
      draft_decode forwards of ``topk`` rows per request give the others.
    - ``extend``: each draft step is an extend over the accepted chain (one draft layer per step,
      SGLang's multi-layer EAGLE): draft_extend runs ``num_steps`` times and there is no draft_decode.
    """

    DECODE = "decode"
    EXTEND = "extend"


_EXTEND_STEPS = reason(ReasonCode.PHASE_NOT_RUN, "draft_steps", DraftSteps.EXTEND,
                       "draft_decode runs when draft steps are decodes; here each draft step is a draft_extend")


@dataclass(frozen=True)
class GraphGroup:
    """Phases an engine captures as ONE graph: a fused draft loop (``{draft_extend, draft_decode}``),
    or the draft and the verify in one graph (``{draft_extend, draft_decode, target_verify}``,
    TensorRT-LLM's one-model drafter).

    The planner gives the group one answer (:func:`attnhal.planner.plan`): its running phases are
    captured together, at the batch sizes all of them capture, or none of them is. Each phase's
    own decision still reads that phase's own backend; the group only joins them.
    """

    name: str  # how plans name the graph ("draft_and_verify")
    phases: frozenset[Phase]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidValue("graph_groups.name", self.name, "a non-empty name")
        if isinstance(self.phases, (str, Phase)):
            raise TypeError(f"phases={self.phases!r} (supported: a collection of phases)")
        phases = frozenset(_phase(p) for p in self.phases)
        bad = sorted(p.value for p in phases - frozenset(GRAPH_PHASES))
        if bad or len(phases) < 2:
            raise InvalidValue(f"graph_groups.{self.name}", sorted(p.value for p in phases),
                               f"2 or more of {', '.join(p.value for p in GRAPH_PHASES)}")
        object.__setattr__(self, "phases", phases)


@dataclass(frozen=True)
class StepLayout:
    """How an engine's worker lays out the phases of one speculative step: the form of its draft
    steps (:class:`DraftSteps`) and the phases it captures as one graph (:class:`GraphGroup`).

    The default is EAGLE's layout: draft steps are decodes and each phase has its own graph.
    An engine adapter states its worker's layout as this record (``EngineConfig.layout``); the
    planner reads it as data, never per engine.
    """

    draft_steps: DraftSteps = DraftSteps.DECODE
    graph_groups: tuple[GraphGroup, ...] = ()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "draft_steps", DraftSteps(self.draft_steps))
        except ValueError:
            raise InvalidValue("draft_steps", self.draft_steps, ", ".join(d.value for d in DraftSteps)) from None
        groups = tuple(self.graph_groups)
        for group in groups:
            if not isinstance(group, GraphGroup):
                raise TypeError(f"graph_groups={group!r} (supported: GraphGroup records)")
        seen: set[Phase] = set()
        for group in groups:
            if group.phases & seen or sum(g.name == group.name for g in groups) > 1:
                raise InvalidValue(f"graph_groups.{group.name}", sorted(p.value for p in group.phases),
                                   "groups with distinct names and no phase in two groups")
            seen |= group.phases
        object.__setattr__(self, "graph_groups", groups)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: ``{"draft_steps": ..., "graph_groups": {name: [phases in phase order]}}``."""
        return {"draft_steps": self.draft_steps.value,
                "graph_groups": {g.name: [p.value for p in Phase if p in g.phases] for g in self.graph_groups}}


#: EAGLE's layout: draft steps as decodes, one graph per phase.
DEFAULT_LAYOUT = StepLayout()


def _phase(value: object) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        raise InvalidValue("phase", value, ", ".join(p.value for p in Phase)) from None


def draft_decode_runs(num_steps: int) -> bool:
    """Whether ``num_steps`` draft steps run a draft-decode forward: ``num_steps > 1`` (the first
    draft token comes from draft_extend). The one place this rule is written: the planner's
    "not run" reason and the role rule's "engines build a draft backend" both read it."""
    return num_steps > 1


def not_run_reason(phase: Phase, spec: SpecConfig, layout: StepLayout = DEFAULT_LAYOUT) -> Reason | None:
    """None if ``phase`` runs under ``spec`` and ``layout``, else the ``phase_not_run`` reason it does not.

    The rule: the phases of :data:`ALGORITHM_PHASES` for ``spec.algorithm``, except
    draft_decode when ``num_steps == 1`` (the first draft token comes from draft_extend) or
    when ``layout`` runs the draft steps as extends.
    """
    not_in_algorithm = _NOT_IN_ALGORITHM.get((phase, spec.algorithm))
    if not_in_algorithm is not None:
        return not_in_algorithm
    if phase is Phase.DRAFT_DECODE and layout.draft_steps is DraftSteps.EXTEND:
        return _EXTEND_STEPS
    if phase is Phase.DRAFT_DECODE and not draft_decode_runs(spec.num_steps):
        return _ONE_STEP
    return None


def phases_run(spec: SpecConfig, layout: StepLayout = DEFAULT_LAYOUT) -> frozenset[Phase]:
    """The phases that run under ``spec`` and ``layout`` (those :func:`not_run_reason` has no reason against)."""
    return frozenset(p for p in ALGORITHM_PHASES[spec.algorithm] if not_run_reason(p, spec, layout) is None)


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
