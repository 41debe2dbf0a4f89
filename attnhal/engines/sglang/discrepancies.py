"""Which catalogued engine decision (``docs/catalog.md``) explains a difference between SGLang
0.5.23's graph decision and attnhal's plan, for one phase.

Whether an entry applies to a configuration is :func:`attnhal.engines.sglang.differs.engine_differs`
(one rule per entry, over the roles, spec, platform, model and page size). This module adds
what a running engine shows of it: on which phase, in which direction (:data:`SHOWN`). The
catalogue's "late failures" note (aiter's draft extend raising for trees at the first
forward, not at startup) has no D-entry; it is :data:`LATE_FAILURE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from attnhal.engines.sglang.differs import EngineDiffers
from attnhal.phases import Phase

__all__ = ["LATE_FAILURE", "SHOWN", "Direction", "Explanation", "explain"]


class Direction(str, Enum):
    """How attnhal's plan differs from what SGLang did for one phase."""

    ATTNHAL_CAPTURES = "attnhal captures, SGLang eager"
    SGLANG_CAPTURES = "SGLang captures, attnhal eager"
    ATTNHAL_INVALID = "SGLang runs it, attnhal: the backend cannot run it"
    RUNS_DIFFER = "one runs the phase, the other does not"


#: docs/catalog.md entry -> the phase and the direction it shows in.
SHOWN: Mapping[str, tuple[Phase, Direction]] = {
    "D1": (Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES),
    "D2": (Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES),
    "D7": (Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES),
    "D3": (Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID),
    "D4": (Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID),
    "D6": (Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID),
}


@dataclass(frozen=True)
class Explanation:
    """The catalogued reason for a difference: its entry, the backend whose note it is, the note."""

    entry: str  # "D1" | "late failures"
    backend: str  # "sglang:aiter"
    text: str

    def __str__(self) -> str:
        where = "docs/catalog.md" + (f" {self.entry}" if self.entry.startswith("D") else ", Late failures")
        note = self.text.removesuffix(f" - docs/catalog.md {self.entry}")
        return f"{where} ({self.backend}): {note}"


#: aiter's draft extend takes chains only; SGLang finds out at the first draft extend (docs/catalog.md).
LATE_FAILURE = Explanation("late failures", "sglang:aiter",
                           "aiter's draft extend raises for topk > 1 at the first draft extend, not at startup")


def explain(phase: Phase, direction: Direction, applicable: Iterable[EngineDiffers],
            backend: str | None = None, topk: int = 1) -> Explanation | None:
    """The catalogued explanation of ``phase`` differing in ``direction``, among the entries that
    apply to the configuration (``applicable``); ``None``: not catalogued."""
    for found in applicable:
        if SHOWN.get(found.entry) == (phase, direction):
            return Explanation(found.entry, found.backend, found.text)
    if (phase, direction, backend) == (Phase.DRAFT_EXTEND, Direction.ATTNHAL_INVALID, "aiter") and topk > 1:
        return LATE_FAILURE
    return None
