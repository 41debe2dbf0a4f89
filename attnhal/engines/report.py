"""The graph report both engine plugins log at server start and ``attnhal plan --engine`` prints:
one table, a row per phase — the capture sizes, captured or eager, the backend, why (with the
catalogue entry), and the flag that would change it — and the strict modes' refusal.

Engine-neutral: each engine's package turns its decisions into :class:`GraphRow`s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attnhal.errors import AttnhalError

__all__ = ["GraphRow", "StrictRefusal", "format_report", "sizes_text"]

_COLUMNS = ("phase", "capture sizes", "graph", "backend", "why", "to change it")


class StrictRefusal(AttnhalError, RuntimeError):
    """Strict mode (``ATTNHAL_SGLANG_GRAPHS=strict``, ``ATTNHAL_VLLM=strict``): a phase attnhal plans
    as captured would run eagerly, so the server does not start. The message names the phase,
    the catalogue entry and the flag that changes it."""


@dataclass(frozen=True)
class GraphRow:
    """One phase of the report.

    ``graph``: ``captured``, ``eager`` or ``not run`` (the engine's decision where the plugin saw
    it, else attnhal's plan, said in ``why``); ``why``: the reason or catalogue entry (``-``:
    nothing to explain); ``change``: the flag or variable that would change it (``-``: none).
    """

    phase: str
    sizes: str
    graph: str
    backend: str
    why: str = "-"
    change: str = "-"

    def cells(self) -> tuple[str, ...]:
        return (self.phase, self.sizes, self.graph, self.backend, self.why, self.change)


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
