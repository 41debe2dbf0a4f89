"""The graph report both engine plugins log at server start and ``attnhal plan --engine`` prints:
one table, a row per phase — the capture sizes, captured or eager, the backend, why (with the
catalogue entry), and the flag that would change it — and the strict modes' refusal.

Engine-neutral: each engine's package turns its decisions into :class:`GraphRow`s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnhal.errors import AttnhalError

if TYPE_CHECKING:
    from attnhal.planner import GraphPlan

__all__ = ["CAPTURED_GRAPHS", "GraphRow", "StrictRefusal", "format_report", "outcome_differs", "plan_verdict_rows",
           "sizes_text"]

_COLUMNS = ("phase", "capture sizes", "graph", "backend", "why", "to change it")


#: The ``graph`` values of a row whose attention runs inside a captured graph: SGLang's word, vLLM's
#: modes with full graphs (piecewise graphs leave attention outside the graph).
CAPTURED_GRAPHS = frozenset({"captured", "full", "full_decode_only", "full_and_piecewise"})


class StrictRefusal(AttnhalError, RuntimeError):
    """Strict mode (``ATTNHAL_SGLANG_GRAPHS=strict``, ``ATTNHAL_VLLM=strict``): a phase attnhal plans
    as captured would run eagerly, so the server does not start. The message names the phase,
    the catalogue entry and the flag that changes it."""


@dataclass(frozen=True)
class GraphRow:
    """One phase of what the engine will do: the one record ``attnhal plan --engine``'s report,
    its JSON (``engine_outcome``) and the plugins' start-up log are rendered from.

    ``graph``: ``captured``, ``eager``, ``not run``, ``cannot run`` (SGLang) or vLLM's graph
    (``full``, ``piecewise``, ``none``, ``refused``); ``by``: whose decision it is (``SGLang``: its
    own rule, seen by the plugin or catalogued; ``attnhal's plan``; empty where ``graph`` is the
    engine's resolved mode); ``why``: the reason or catalogue entry (``-``: nothing to explain);
    ``change``: the flag or variable that would change it (``-``: none; for SGLang's eager
    decisions ``ATTNHAL_SGLANG_GRAPHS=enforce``, under which attnhal's plugin captures the phase);
    ``capture_sizes``: the batch sizes captured, where known before launch (``sizes`` says them short).
    """

    phase: str
    sizes: str
    graph: str
    backend: str
    why: str = "-"
    change: str = "-"
    by: str = ""
    capture_sizes: tuple[int, ...] = ()

    @property
    def captured(self) -> bool:
        """Whether the phase's attention runs inside a captured graph (:data:`CAPTURED_GRAPHS`)."""
        return self.graph in CAPTURED_GRAPHS

    def cells(self) -> tuple[str, ...]:
        graph = f"{self.graph} ({self.by})" if self.by else self.graph
        return (self.phase, self.sizes, graph, self.backend, self.why, self.change)

    def to_dict(self) -> dict[str, object]:
        """The row as JSON: the same fields the table shows, ``-`` as ``null``, and ``captured``."""
        def value(text: str) -> str | None:
            return None if text == "-" else text
        return {"phase": self.phase, "graph": self.graph, "captured": self.captured, "decided_by": self.by or None,
                "capture_sizes": list(self.capture_sizes), "sizes": value(self.sizes),
                "backend": value(self.backend), "why": value(self.why), "to_change": value(self.change)}


def outcome_differs(rows: Iterable[GraphRow], plan: GraphPlan) -> list[GraphRow]:
    """The rows where what the engine will do is not attnhal's recommendation (``plan``): a phase
    of the plan that runs, captured by one and not the other. Rows that are the plan's own verdict
    (``by`` attnhal's plan), rows of no plan phase (vLLM's ``prefill+decode``, ``all``) and phases
    the plan cannot run (the plan is invalid: a negative answer of its own) are not differences."""
    phases = {phase.value: decision for phase, decision in plan.phases.items()}
    out = []
    for row in rows:
        decision = phases.get(row.phase)
        if row.by == "attnhal's plan" or decision is None or not decision.runs or decision.blocking:
            continue
        if row.captured != decision.capture:
            out.append(row)
    return out


def plan_verdict_rows(plan: GraphPlan) -> list[GraphRow]:
    """attnhal's plan as report rows (by ``attnhal's plan``): for an engine whose adapter knows no
    decision of its own beyond the plan."""
    rows = []
    for phase, decision in plan.phases.items():
        graph = ("not run" if not decision.runs else "cannot run" if decision.blocking else
                 "captured" if decision.capture else "eager")
        sizes = tuple(decision.capture_sizes) if decision.capture else ()
        why = str(decision.reasons[0]) if decision.reasons and not decision.capture else "-"
        rows.append(GraphRow(phase.value, sizes_text(sizes), graph, decision.backend or "-", why,
                             by="attnhal's plan", capture_sizes=sizes))
    return rows


def sizes_text(sizes: Sequence[int]) -> str:
    """Capture batch sizes, short: ``1..32 (20 sizes)``; ``-`` for none."""
    if not sizes:
        return "-"
    if len(sizes) == 1:
        return str(sizes[0])
    return f"{min(sizes)}..{max(sizes)} ({len(sizes)} sizes)"


def format_report(title: str, rows: Iterable[GraphRow]) -> str:
    """The report: a title line, then an aligned table with a header (no trailing spaces)."""
    table = [_COLUMNS, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS) - 1)]
    text = [title]
    for line in table:
        text.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1])
    return "\n".join(text)
