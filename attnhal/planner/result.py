"""The planner's output: per phase, does it run, is it captured, on which backend, and why not."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from attnhal.phases import DEFAULT_LAYOUT, Phase, StepLayout
from attnhal.planner.policy import GraphPolicy
from attnhal.reasons import Reason, ReasonCode
from attnhal.spec import RequestContext, SpecConfig

__all__ = ["GraphPlan", "PhasePlan"]


@dataclass(frozen=True)
class PhasePlan:
    """The decision for one phase. ``reasons`` say why it does not run or is not captured.

    ``role`` names the role whose backend was read; ``capture_sizes`` and
    ``seq_len_fill`` are set for a captured phase; ``variants`` lists the notes of
    the backend's conditional claims that applied; ``graph`` names the
    :class:`~attnhal.phases.GraphGroup` the phase runs in: captured in one graph with the
    group's other running phases, or none of them is (``None``: its own graph, if captured).
    """

    runs: bool
    capture: bool
    backend: str | None
    reasons: tuple[Reason, ...] = ()
    #: The phase runs but its backend cannot run it: the plan is invalid.
    blocking: bool = False
    role: str | None = None
    capture_sizes: tuple[int, ...] = ()
    seq_len_fill: int | None = None
    variants: tuple[str, ...] = ()
    graph: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """This decision as JSON-ready values (reasons as ``{code, message}``)."""
        return {"runs": self.runs, "capture": self.capture, "backend": self.backend,
                "reasons": [r.to_dict() for r in self.reasons], "role": self.role,
                "capture_sizes": list(self.capture_sizes), "seq_len_fill": self.seq_len_fill,
                "variants": list(self.variants), "graph": self.graph}


@dataclass(frozen=True)
class GraphPlan:
    """Per phase: does it run, is it captured, which backend, and why not.

    With adaptive step counts (``GraphPolicy.step_counts``), ``adaptive`` holds
    the plan at each other step count; the plan is valid only if all are.
    ``unfit_steps`` holds the step counts the spec config cannot take at all (a
    tree whose ``num_draft_tokens`` exceeds ``draft_tree_tokens(num_steps, topk)``), each with
    its ``step_count`` reason; any makes the plan invalid. ``layout`` is the engine's
    :class:`~attnhal.phases.StepLayout` the plan was made for (draft steps as decodes or
    extends; the phases captured as one graph: :attr:`graph_groups`).
    """

    platform: str
    spec: SpecConfig
    policy: GraphPolicy
    phases: Mapping[Phase, PhasePlan] = field(default_factory=dict)
    context: RequestContext = RequestContext()
    adaptive: Mapping[int, GraphPlan] = field(default_factory=dict)
    unfit_steps: Mapping[int, Reason] = field(default_factory=dict)
    layout: StepLayout = DEFAULT_LAYOUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "phases", MappingProxyType(dict(self.phases)))
        object.__setattr__(self, "adaptive", MappingProxyType(dict(self.adaptive)))
        object.__setattr__(self, "unfit_steps", MappingProxyType(dict(self.unfit_steps)))

    def __getitem__(self, phase: Phase | str) -> PhasePlan:
        return self.phases[Phase(phase)]

    def __iter__(self) -> Iterator[Phase]:
        return iter(self.phases)

    @property
    def valid(self) -> bool:
        """False if a phase that runs has no backend able to run it (at any planned step count),
        or if a planned step count does not fit the spec config."""
        return (not self.unfit_steps and not any(p.blocking for p in self.phases.values())
                and all(a.valid for a in self.adaptive.values()))

    @property
    def captured(self) -> tuple[Phase, ...]:
        """The phases captured as graphs, in phase order."""
        return tuple(p for p, d in self.phases.items() if d.capture)

    @property
    def graph_groups(self) -> dict[str, tuple[Phase, ...]]:
        """Each graph group of the layout -> its phases that run, in phase order; the group's
        one answer is on each of them (all captured in one graph, or none)."""
        return {g.name: tuple(p for p, d in self.phases.items() if p in g.phases and d.runs)
                for g in self.layout.graph_groups}

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        """The policy's capture sizes; each captured phase captures its own
        ``PhasePlan.capture_sizes`` (a subset, with ``GraphPolicy.max_tokens``)."""
        return self.policy.capture_sizes()

    def captured_steps(self, phase: Phase | str) -> tuple[int, ...]:
        """The step counts (this plan's and the adaptive ones) at which ``phase`` is captured."""
        plans = {self.spec.num_steps: self, **self.adaptive}
        return tuple(sorted(n for n, p in plans.items() if p[phase].capture))

    def with_capture_failure(self, phase: Phase, why: str) -> GraphPlan:
        """This plan with ``phase`` falling back to eager because its capture failed (with the
        other phases of its graph group: they were to be captured in the same graph)."""
        graph = self.phases[phase].graph
        failed = {p for p, d in self.phases.items() if p is phase or (graph is not None and d.graph == graph)}
        return replace(self, phases={p: replace(d, capture=False, reasons=(*d.reasons, Reason(ReasonCode.CAPTURE_FAILED, why)))
                                     if p in failed else d for p, d in self.phases.items()})

    def to_dict(self) -> dict[str, Any]:
        """This plan as JSON-ready values: validity, each phase, the context given and the adaptive steps."""
        out: dict[str, Any] = {"platform": self.platform, "valid": self.valid,
                               "phases": {p.value: d.to_dict() for p, d in self.phases.items()},
                               "layout": self.layout.to_dict()}
        given = {k: getattr(v, "value", v) for k, v in vars(self.context).items() if v is not None}
        if given:
            out["context"] = given
        if self.adaptive or self.unfit_steps:
            steps: dict[int, dict[str, Any]] = {
                n: {"valid": p.valid, "captured": [ph.value for ph in p.captured]} for n, p in self.adaptive.items()}
            steps.update({n: {"valid": False, "captured": [], "reasons": [r.to_dict()]}
                          for n, r in self.unfit_steps.items()})
            out["adaptive"] = {str(n): steps[n] for n in sorted(steps)}
        return out
