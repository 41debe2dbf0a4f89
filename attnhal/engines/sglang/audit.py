"""SGLang's graph decision next to attnhal's plan, phase by phase: the records the plugin logs and acts on.

Pure: SGLang's side comes in as "which phases ran, which got a graph runner", attnhal's as a
:class:`~attnhal.planner.GraphPlan`. :func:`audit` pairs them; a phase where they differ
carries the :class:`~attnhal.engines.sglang.discrepancies.Explanation` of it, if one is
catalogued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from attnhal.engines.sglang.differs import EngineDiffers
from attnhal.engines.sglang.discrepancies import Direction, Explanation, explain
from attnhal.phases import Phase
from attnhal.planner import GraphPlan, PhasePlan
from attnhal.reasons import Reason, ReasonCode

__all__ = ["DESCRIPTOR_LIMITS", "PhaseAudit", "Verdict", "audit", "attnhal_verdict", "descriptor_limit"]

#: Reason codes that come from the backend's descriptor (its graph claims and their limits),
#: as opposed to the policy or the platform: where these say "eager", ``enforce`` does not capture.
DESCRIPTOR_LIMITS = frozenset({ReasonCode.GRAPH_UNSUPPORTED, ReasonCode.GRAPH_LIMIT})


class Verdict(str, Enum):
    """One side's decision for one phase."""

    CAPTURED = "captured"
    EAGER = "eager"
    NOT_RUN = "not run"
    INVALID = "cannot run"  # attnhal only: the phase's backend cannot run it (the plan is invalid)


def attnhal_verdict(decision: PhasePlan) -> Verdict:
    if not decision.runs:
        return Verdict.NOT_RUN
    if decision.blocking:
        return Verdict.INVALID
    return Verdict.CAPTURED if decision.capture else Verdict.EAGER


def descriptor_limit(decision: PhasePlan) -> bool:
    """The phase runs and is not captured because of what its backend's descriptor says."""
    return (decision.runs and not decision.blocking and not decision.capture
            and any(r.code in DESCRIPTOR_LIMITS for r in decision.reasons))


def _direction(sglang: Verdict, attnhal: Verdict) -> Direction | None:
    if sglang is attnhal:
        return None
    if Verdict.NOT_RUN in (sglang, attnhal):
        return Direction.RUNS_DIFFER
    if attnhal is Verdict.INVALID:
        return Direction.ATTNHAL_INVALID
    return Direction.ATTNHAL_CAPTURES if attnhal is Verdict.CAPTURED else Direction.SGLANG_CAPTURES


@dataclass(frozen=True)
class PhaseAudit:
    """One phase: SGLang's decision, attnhal's, attnhal's reasons, and the entry explaining a difference."""

    phase: Phase
    sglang: Verdict
    attnhal: Verdict
    backend: str | None  # the descriptor attnhal read ("sglang:aiter")
    reasons: tuple[Reason, ...] = ()
    direction: Direction | None = None
    entry: Explanation | None = None

    @property
    def differs(self) -> bool:
        return self.direction is not None

    def line(self) -> str:
        """The log line: ``draft_extend: SGLang eager, attnhal captured (sglang:aiter); differs: ...``."""
        why = "; ".join(str(r) for r in self.reasons)
        read = ", ".join(part for part in (self.backend, why) if part)
        text = f"{self.phase.value}: SGLang {self.sglang.value}, attnhal {self.attnhal.value}"
        text += f" ({read})" if read else ""
        if not self.differs:
            return text + "; agree"
        return text + f"; differs: {self.entry}" if self.entry else text + "; differs: not catalogued"


def audit(plan: GraphPlan, sglang: Mapping[Phase, Verdict], *, names: Mapping[Phase, str | None],
          applicable: Iterable[EngineDiffers] = ()) -> tuple[PhaseAudit, ...]:
    """Pair SGLang's verdict for each phase in ``sglang`` with ``plan``'s.

    ``names``: the SGLang backend name running each phase; ``applicable``: the catalogued
    engine decisions that apply to the configuration (``differs.engine_differs``).
    """
    entries = tuple(applicable)
    out = []
    for phase, theirs in sglang.items():
        decision = plan[phase]
        ours = attnhal_verdict(decision)
        direction = _direction(theirs, ours)
        entry = None
        if direction is not None:
            entry = explain(phase, direction, entries, names.get(phase), plan.spec.topk)
        reasons = () if ours is Verdict.CAPTURED else decision.reasons
        out.append(PhaseAudit(phase, theirs, ours, decision.backend, reasons, direction, entry))
    return tuple(out)
