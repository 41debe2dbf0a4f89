"""Which catalogued discrepancy (``docs/catalog.md``, ``D1``..) explains a difference between
SGLang 0.5.23's graph decision and attnhal's plan, phase by phase.

Each entry says in which direction it differs and, as a predicate on the :class:`Difference`,
for which backends. The predicates need no vendor: in SGLang 0.5.23 these differences arise
only on the platforms the entry names (its CUDA rule captures the same backends), so
a difference of the same shape elsewhere is still the same defect of the rule. A difference
no entry explains is reported as not catalogued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from attnhal.phases import Phase

__all__ = ["DISCREPANCIES", "Difference", "Direction", "Discrepancy", "explain"]


class Direction(str, Enum):
    """How attnhal's plan differs from what SGLang did for one phase."""

    ATTNHAL_CAPTURES = "attnhal captures, SGLang eager"
    SGLANG_CAPTURES = "SGLang captures, attnhal eager"
    ATTNHAL_INVALID = "SGLang runs it, attnhal: the backend cannot run it"
    RUNS_DIFFER = "one runs the phase, the other does not"


@dataclass(frozen=True)
class Difference:
    """One phase on which the two disagree, with what the entries' predicates read."""

    phase: Phase
    direction: Direction
    backend: str | None  # SGLang name of the backend running the phase ("aiter")
    split: bool = False  # prefill and decode roles on different backends
    topk: int = 1
    num_steps: int = 1
    page_size: int = 1
    model: str = "mha"


@dataclass(frozen=True)
class Discrepancy:
    """A catalogued engine discrepancy: its ``docs/catalog.md`` entry and where it shows."""

    entry: str  # "D1"
    title: str
    phase: Phase
    direction: Direction
    applies: Callable[[Difference], bool]

    def explains(self, difference: Difference) -> bool:
        return (difference.phase is self.phase and difference.direction is self.direction
                and self.applies(difference))

    def __str__(self) -> str:
        return f"docs/catalog.md {self.entry}: {self.title}"


DISCREPANCIES: tuple[Discrepancy, ...] = (
    Discrepancy("D7", "HIP, split backends: the draft-extend graph follows the draft-decode backend's class",
                Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES, lambda d: d.split),
    Discrepancy("D1", "HIP: aiter draft extend loses its graph when --speculative-num-steps 1 (the HIP rule "
                "reads the draft-decode backend, which one step does not build)",
                Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES, lambda d: not d.split and d.backend == "aiter"),
    Discrepancy("D2", "HIP: the Triton backend's draft extend is never captured on HIP (always on CUDA)",
                Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES, lambda d: not d.split and d.backend == "triton"),
    Discrepancy("late failures", "aiter's draft extend raises for topk > 1 at the first draft extend, not at "
                "startup",
                Phase.DRAFT_EXTEND, Direction.ATTNHAL_INVALID, lambda d: d.backend == "aiter" and d.topk > 1),
    Discrepancy("D3", "flashinfer with an MLA model: tree verify with one draft step runs without a tree mask",
                Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID,
                lambda d: d.backend == "flashinfer" and d.model == "mla" and d.topk > 1),
    Discrepancy("D4", "dsa: tree verify (topk > 1) at page size 1 is accepted, with no tree-mask path",
                Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID,
                lambda d: d.backend == "dsa" and d.topk > 1 and d.page_size == 1),
)


def explain(difference: Difference,
            entries: tuple[Discrepancy, ...] = DISCREPANCIES) -> Discrepancy | None:
    """The first catalogued entry explaining ``difference``, or ``None`` (not catalogued)."""
    for entry in entries:
        if entry.explains(difference):
            return entry
    return None

