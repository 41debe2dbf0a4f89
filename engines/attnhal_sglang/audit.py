"""SGLang's graph decision next to attnhal's, and the catalogued engine decisions that explain where they differ.

Three steps, pure (nothing of SGLang imported):

- **which catalogued decisions apply** to a configuration: the catalogue lists, per backend,
  the engine decisions of ``docs/catalog.md`` (``D1``..) as notes (``meta.engine_differs``,
  each ending ``docs/catalog.md Dn``); :data:`RULES` restates each entry's condition over the
  roles, the spec, the platform, the model and the page size (:func:`engine_differs`);
- **what a running engine shows of one**: on which phase, in which direction (:data:`SHOWN`,
  :func:`explain`). The catalogue's "late failures" note (aiter's draft extend raising for trees
  at the first forward, not at startup) has no D-entry; it is :data:`LATE_FAILURE`;
- **the audit**: SGLang's side comes in as "which phases ran, which got a graph runner",
  attnhal's as a :class:`~attnhal.planner.GraphPlan`; :func:`audit` pairs them phase by phase,
  a phase where they differ carrying its :class:`Explanation`, if one is catalogued. The
  plugin logs and acts on these records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from attnhal.catalog import load
from attnhal.phases import DraftSteps, Phase
from attnhal.planner import GraphPlan, PhasePlan
from attnhal.platform import Platform, Vendor, as_platform
from attnhal.reasons import Reason, ReasonCode
from attnhal.spec import ModelKind, SpecAlgorithm

if TYPE_CHECKING:
    from attnhal.engines.base import EngineConfig

__all__ = ["DESCRIPTOR_LIMITS", "LATE_FAILURE", "RULES", "SHOWN", "Direction", "EngineDiffers", "Explanation",
           "PhaseAudit", "Verdict", "attnhal_verdict", "audit", "descriptor_limit", "engine_differs", "entry_of",
           "explain"]


# --- which catalogued engine decisions apply to a configuration ------------------------------

_ENTRY = re.compile(r"docs/catalog\.md (D\d+)\s*$")


@dataclass(frozen=True)
class EngineDiffers:
    """One catalogued engine decision that applies to the configuration."""

    entry: str  # "D1": the heading of docs/catalog.md
    backend: str  # "sglang:aiter"
    text: str  # the catalogue's note

    def __str__(self) -> str:
        return f"engine differs ({self.backend}): {self.text}"

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "backend": self.backend, "text": self.text}


def entry_of(note: str) -> str:
    """``"D1"`` from a catalogue note ending ``docs/catalog.md D1``; ``ValueError`` otherwise."""
    found = _ENTRY.search(note)
    if found is None:
        raise ValueError(f"engine_differs={note!r} (supported: a note ending 'docs/catalog.md Dn')")
    return found.group(1)


#: Per vendor, the backend SGLang's draft-extend graph rule reads (eagle_worker_v2.py:546-609): the
#: draft-*decode* backend on HIP (546-565), the draft-extend backend on CUDA (601-609).
_EXTEND_RULE_READS: Mapping[Vendor, str] = {Vendor.HIP: "draft_decode", Vendor.CUDA: "draft_extend"}


def _hip_extend_eager(config: EngineConfig, platform: Platform) -> bool:
    """Where SGLang's rule reads the draft-*decode* backend, draft extend is captured only when
    that is aiter's multi-step one: with a triton or aiter draft extend and no aiter draft decode
    (one step, or another decode backend) it runs eagerly. aiter trees fail at draft extend
    anyway (its ``run_limits``), so they are not this difference."""
    roles, spec = config.roles, config.spec
    extend = roles.get("draft_extend")
    return (_eagle_worker(config) and _EXTEND_RULE_READS.get(platform.vendor) == "draft_decode" and extend in ("aiter", "triton")
            and roles.get("draft_decode") != "aiter" and not (extend == "aiter" and spec.topk > 1))


def _extend_gets_decode_runner(platform: Platform) -> bool:
    from attnhal_sglang.seams import DRAFT_RUNNERS, device_of

    device = device_of(platform)
    return device is not None and DRAFT_RUNNERS["draft_extend"][device] == DRAFT_RUNNERS["draft_decode"][device]


def _eagle_worker(config: EngineConfig) -> bool:
    """eagle_worker_v2 runs the draft (its graph rules D1, D2, D7, D9): draft steps as decodes.
    Multi-layer EAGLE's worker (draft steps as extends) has its own rule, with no vendor list
    (:mod:`attnhal_sglang.multi_layer`)."""
    return config.layout.draft_steps is DraftSteps.DECODE


def _split(config: EngineConfig) -> bool:
    return config.roles.get("prefill") != config.roles.get("decode")


def _tree(config: EngineConfig) -> bool:
    return config.spec.speculative and config.spec.topk > 1


def _page_one(config: EngineConfig, platform: Platform) -> bool:
    return config.context_on(platform).page_size == 1  # the page size SGLang sets on the platform


Rule = Callable[["EngineConfig", Platform], bool]

#: docs/catalog.md entry -> when it applies (the same conditions as the entry's text).
RULES: Mapping[str, Rule] = {
    "D1": lambda c, p: _hip_extend_eager(c, p) and not _split(c) and c.roles.get("draft_extend") == "aiter",
    "D2": lambda c, p: _hip_extend_eager(c, p) and not _split(c) and c.roles.get("draft_extend") == "triton",
    "D7": lambda c, p: _hip_extend_eager(c, p) and _split(c),
    # No multi-step draft backend (the one that refuses trees): one step, NGRAM, or multi-layer EAGLE.
    "D3": lambda c, p: (c.context.model is ModelKind.MLA and _tree(c) and c.roles.get("target_verify") == "flashinfer"
                        and c.roles.get("draft_decode") is None),
    "D4": lambda c, p: _tree(c) and c.roles.get("target_verify") == "dsa" and _page_one(c, p),
    "D6": lambda c, p: (_tree(c) and c.spec.algorithm is SpecAlgorithm.NGRAM
                        and c.roles.get("target_verify") == "torch_native" and _page_one(c, p)),
    # Where SGLang's runner table gives draft extend the draft-decode runner class (MUSA), for a
    # draft extend the CUDA/MUSA allowlist admits (eagle_worker_v2.py:539-544, 567-611): triton.
    "D9": lambda c, p: (_eagle_worker(c) and _extend_gets_decode_runner(p) and c.roles.get("draft_extend") == "triton"
                        and c.spec.algorithm is not SpecAlgorithm.NGRAM),
}


def engine_differs(config: EngineConfig, platform: Platform | str) -> tuple[EngineDiffers, ...]:
    """The catalogued engine decisions that apply to ``config`` on ``platform``, once per entry
    (a split pair's shared entry is said once), in role order. A note whose entry has no rule
    in :data:`RULES` is an error: it could never be said when it applies."""
    where = as_platform(platform)
    out: dict[str, EngineDiffers] = {}
    for name in dict.fromkeys(n for n in config.roles.values() if n is not None):
        for note in load(f"sglang:{name}").meta.get("engine_differs", ()):
            entry = entry_of(note)
            if entry not in RULES:
                raise ValueError(f"engine_differs entry={entry} of sglang:{name} (supported: {', '.join(RULES)})")
            if RULES[entry](config, where):
                out.setdefault(entry, EngineDiffers(entry, f"sglang:{name}", note))
    return tuple(out.values())


# --- what a running engine shows of them: the phase and the direction -------------------------

class Direction(str, Enum):
    """How attnhal's plan differs from what SGLang did for one phase."""

    ATTNHAL_CAPTURES = "attnhal captures, SGLang eager"
    SGLANG_CAPTURES = "SGLang captures, attnhal eager"
    ATTNHAL_INVALID = "SGLang runs it, attnhal: the backend cannot run it"
    RUNS_DIFFER = "one runs the phase, the other does not"
    OTHER_RUNNER = "SGLang captures it with the other phase's graph runner"


#: docs/catalog.md entry -> the phase and the direction it shows in.
SHOWN: Mapping[str, tuple[Phase, Direction]] = {
    "D1": (Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES),
    "D2": (Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES),
    "D7": (Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES),
    "D3": (Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID),
    "D4": (Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID),
    "D6": (Phase.TARGET_VERIFY, Direction.ATTNHAL_INVALID),
    "D9": (Phase.DRAFT_EXTEND, Direction.OTHER_RUNNER),
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


# --- the audit: SGLang's verdict next to attnhal's, phase by phase -----------------------------

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
    engine decisions that apply to the configuration (:func:`engine_differs`).
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
