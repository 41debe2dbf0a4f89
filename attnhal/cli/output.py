"""What the commands print: plain-text tables, the plan table, JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from attnhal.phases import DraftSteps
from attnhal.planner import GraphPlan
from attnhal.reasons import ReasonCode

__all__ = ["cell", "format_plan", "invalid_cause", "layout_lines", "one_line", "print_json", "table", "yes_no"]


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def cell(value: object) -> str:
    """A table cell: ``yes``/``no`` for a flag, a comma list (``-`` when empty) for a list."""
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value)


def one_line(text: str) -> str:
    """A multi-line message (a reason list) as one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def invalid_cause(p: GraphPlan) -> str:
    """Why a plan is invalid, in a few words (the reasons are in the table)."""
    if any(d.blocking for d in p.phases.values()):
        return "a phase that runs has no capable backend"
    return "a step count of the adaptive set does not fit"


def _graphs_line(p: GraphPlan) -> str:
    """What the ``graphs:`` line says: disabled by policy, none (a platform without a graph
    API captures nothing, so capture sizes would mislead), or the capture sizes."""
    if not p.policy.enabled:
        return "disabled"
    if any(r.code is ReasonCode.NO_GRAPH_API for d in p.phases.values() for r in d.reasons):
        return f"none (platform {p.platform} has no graph API)"
    return "capture sizes " + ",".join(map(str, p.capture_sizes))


def layout_lines(p: GraphPlan) -> list[str]:
    """The engine's step layout as the plan prints it (nothing for EAGLE's default layout):
    draft steps as extends, and each graph group with its one answer."""
    spec, out = p.spec, []
    if p.layout.draft_steps is DraftSteps.EXTEND and spec.speculative:
        out.append(f"draft steps: extends (draft_extend runs once per draft step, {spec.num_steps} per step of "
                   "speculation; no draft_decode)")
    for name, phases in p.graph_groups.items():
        captured = bool(phases) and all(p.phases[ph].capture for ph in phases)
        listed = ", ".join(ph.value for ph in phases) or "none of its phases runs"
        out.append(f"one graph {name!r}: {listed} -> {'captured together' if captured else 'eager'}")
    return out


def format_plan(p: GraphPlan, verdict: bool = True, context_notes: Mapping[str, str | None] | None = None) -> str:
    """The plan as a table; ``verdict`` adds the closing ``plan: valid|INVALID`` line;
    ``context_notes`` says where a context value came from (``{"page_size": "set by ..."}``).

    This is the table ``attnhal plan`` prints; an engine may print it when it refuses an
    invalid plan (``raise SystemExit(format_plan(graph_plan))``).
    """
    spec = p.spec
    head = f"platform: {p.platform}    speculative: {spec.algorithm.value}"
    if spec.speculative:
        head += f" (num_steps={spec.num_steps}, topk={spec.topk}, num_draft_tokens={spec.num_draft_tokens})"
    graphs = _graphs_line(p)
    said = context_notes or {}
    context = " ".join(f"{k}={getattr(v, 'value', v)}" + (f" ({said[k]})" if said.get(k) else "")
                       for k, v in vars(p.context).items() if v is not None)
    if context:
        head += f"\ncontext: {context}"
    rows = []
    for phase, d in p.phases.items():
        why = "; ".join(str(r) for r in d.reasons) or "-"
        backend = d.backend or "-"
        if d.runs and d.role not in (None, phase.value):
            backend += f" ({d.role} role)"
        rows.append((phase.value, yes_no(d.runs), yes_no(d.capture), backend, why))
    body = table(("phase", "runs", "captured", "backend", "reasons"), rows)
    notes = sorted({n for d in p.phases.values() if d.runs for n in d.variants})
    text = f"{head}\ngraphs: {graphs}\n{body}" + "".join(f"\nconditional claim applied: {n}" for n in notes)
    text += "".join(f"\n{line}" for line in layout_lines(p))
    for n, sub in sorted(p.adaptive.items()):
        captured = ", ".join(ph.value for ph in sub.captured) or "none"
        text += f"\nadaptive num_steps={n}: {'valid' if sub.valid else 'INVALID'}; captured: {captured}"
    for n, unfit in sorted(p.unfit_steps.items()):
        text += f"\nadaptive num_steps={n}: INVALID; {unfit}"
    if verdict:
        text += "\nplan: valid" if p.valid else f"\nplan: INVALID ({invalid_cause(p)})"
    return text
