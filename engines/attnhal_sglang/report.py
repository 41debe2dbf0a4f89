"""SGLang's graph report: :mod:`attnhal.engines.report`'s table for one EAGLE server, and strict mode.

The plugin builds it from SGLang's own decisions for the draft worker's phases
(:func:`~attnhal_sglang.audit.audit` rows) and attnhal's plan for the rest;
``attnhal plan --engine sglang`` builds it before launch from the plan and the catalogued
engine decisions that apply (``docs/catalog.md`` D-entries: where SGLang is known to leave a
phase eager that its backend can capture).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from attnhal.engines.report import GraphRow, StrictRefusal, format_report, sizes_text
from attnhal_sglang.audit import PhaseAudit, Verdict, attnhal_verdict
from attnhal_sglang.audit import SHOWN, Direction, EngineDiffers, Explanation
from attnhal_sglang.env import DRAFT_EXTEND_GRAPH_OFF
from attnhal.phases import Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhasePlan
from attnhal.reasons import ReasonCode

__all__ = ["ENFORCE", "TITLE", "plan_report", "plan_rows", "refuse_eager", "server_report", "server_rows"]

TITLE = "attnhal graph report"
#: What turns on a phase SGLang leaves eager where its backend can capture it.
ENFORCE = "ATTNHAL_SGLANG_GRAPHS=enforce"


def _change(phase: Phase, decision: PhasePlan, policy: GraphPolicy) -> str:
    """The switch that would capture a phase attnhal's plan leaves eager (``-``: none is a flag)."""
    if not any(reason.code is ReasonCode.GRAPHS_DISABLED for reason in decision.reasons):
        return "-"
    if not policy.enabled:
        return "drop --disable-cuda-graph / --disable-decode-cuda-graph"
    return f"unset {DRAFT_EXTEND_GRAPH_OFF}" if phase is Phase.DRAFT_EXTEND else "-"


def _row(phase: Phase, plan: GraphPlan, graph: Verdict, entry: Explanation | None, seen: bool) -> GraphRow:
    decision = plan[phase]
    captured = graph is Verdict.CAPTURED
    sizes = sizes_text(decision.capture_sizes) if captured else "-"
    known = tuple(decision.capture_sizes) if captured else ()
    source = "SGLang" if seen else "attnhal's plan"
    backend = decision.backend or "-"
    if entry is not None:
        return GraphRow(phase.value, sizes, graph.value, backend, str(entry), ENFORCE, "SGLang", known)
    if captured or graph is Verdict.NOT_RUN and not decision.reasons:
        return GraphRow(phase.value, sizes, graph.value, backend, by=source, capture_sizes=known)
    why = str(decision.reasons[0]) if decision.reasons else "-"
    change = _change(phase, decision, plan.policy)
    return GraphRow(phase.value, sizes, graph.value, backend, why, change, source, known)


def server_rows(plan: GraphPlan, rows: Sequence[PhaseAudit]) -> list[GraphRow]:
    """At start-up: SGLang's decision for the audited phases, attnhal's plan for the others."""
    seen = {row.phase: row for row in rows}
    out = []
    for phase, decision in plan.phases.items():
        row = seen.get(phase)
        graph = row.sglang if row is not None else attnhal_verdict(decision)
        entry = row.entry if row is not None and row.direction is Direction.ATTNHAL_CAPTURES else None
        out.append(_row(phase, plan, graph, entry, row is not None))
    return out


def server_report(head: str, plan: GraphPlan, rows: Sequence[PhaseAudit]) -> str:
    """The start-up report the plugin logs: :func:`server_rows` as a table."""
    return format_report(f"{TITLE}: {head}", server_rows(plan, rows))


def plan_rows(plan: GraphPlan, applicable: Iterable[EngineDiffers]) -> list[GraphRow]:
    """Before launch: attnhal's plan, with the phases a catalogued SGLang decision leaves eager
    (``by`` SGLang, ``change`` the switch under which attnhal's plugin captures them)."""
    eager: Mapping[Phase, Explanation] = {
        SHOWN[d.entry][0]: Explanation(d.entry, d.backend, d.text) for d in applicable
        if d.entry in SHOWN and SHOWN[d.entry][1] is Direction.ATTNHAL_CAPTURES}
    out = []
    for phase, decision in plan.phases.items():
        ours = attnhal_verdict(decision)
        if phase in eager and ours is Verdict.CAPTURED:
            out.append(_row(phase, plan, Verdict.EAGER, eager[phase], True))
        else:
            out.append(_row(phase, plan, ours, None, False))
    return out


def plan_report(plan: GraphPlan, applicable: Iterable[EngineDiffers], head: str) -> str:
    """The report before launch: :func:`plan_rows` as a table."""
    return format_report(f"{TITLE}: {head}", plan_rows(plan, applicable))


def refuse_eager(head: str, rows: Sequence[PhaseAudit]) -> None:
    """Strict mode: raise :class:`StrictRefusal` where a phase attnhal plans captured runs eagerly."""
    eager = [row for row in rows if row.direction is Direction.ATTNHAL_CAPTURES]
    if eager:
        said = "; ".join(f"{row.phase.value}: attnhal plans it captured, SGLang runs it eagerly"
                         f" ({row.entry or 'not catalogued'})" for row in eager)
        raise StrictRefusal(f"ATTNHAL_SGLANG_GRAPHS=strict refuses to start {head}: {said}; {ENFORCE} "
                            "captures it with SGLang's own runner, ATTNHAL_SGLANG_GRAPHS=audit starts as SGLang "
                            "decided")
