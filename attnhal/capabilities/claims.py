"""Claim values: the records a descriptor's claims are made of.

:class:`SpecLimits` (the speculative limits under which running, capturing or the
multi-step draft holds), :class:`SeqLenFill` with its :class:`FillTerm` (the seq len
written into padded rows of a captured batch) and :class:`Tolerance` (per dtype,
against the reference), with :data:`DEFAULT_TOLERANCES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum
from types import MappingProxyType

from attnhal.bounds import Bound, FloatBound
from attnhal.errors import InvalidValue
from attnhal.phases import Phase, tokens_per_request
from attnhal.reasons import Reason, ReasonCode, reason
from attnhal.spec import DRAFT_TOKENS, NUM_STEPS, TOPK, SpecConfig

__all__ = ["DEFAULT_TOLERANCES", "FILL_BOUND", "LIMIT_BOUNDS", "TOLERANCE_BOUND", "FillTerm", "SeqLenFill", "SpecLimits", "Tolerance"]


@dataclass(frozen=True)
class SpecLimits:
    """Speculative-decoding limits under which a claim (running, graph capture, multi-step) holds.

    ``None`` means unlimited. An empty ``SpecLimits()`` holds whenever the phase runs.
    New limits are new fields here; :meth:`violations` picks them up by name.
    """

    max_topk: int | None = None
    max_num_steps: int | None = None
    max_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        for name, bound in LIMIT_BOUNDS.items():
            if getattr(self, name) is not None:
                bound.check(getattr(self, name))

    def violations(self, spec: SpecConfig, code: ReasonCode, what: str) -> list[Reason]:
        """Reasons ``spec`` breaks these limits; ``what`` names the claim (e.g. "graph draft_extend")."""
        out = []
        for name, limit in vars(self).items():
            if limit is not None:
                value = getattr(spec, _SPEC_FIELD[name])
                if value > limit:
                    out.append(reason(code, name.removeprefix("max_"), value, f"<= {limit} for {what}"))
        return out

    def to_dict(self) -> dict[str, int]:
        """The limits that are set, by field name (a descriptor file's table)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


#: SpecLimits field -> its bound: a limit past the spec config's own bound limits nothing.
LIMIT_BOUNDS = MappingProxyType({
    "max_topk": Bound("max_topk", 1, TOPK.high),
    "max_num_steps": Bound("max_num_steps", 1, NUM_STEPS.high),
    "max_draft_tokens": Bound("max_draft_tokens", 1, DRAFT_TOKENS.high),
})
#: A seq-len fill's ``base`` and ``at_least``: 0 up to a million tokens, past any context a
#: captured batch pads to.
FILL_BOUND = Bound("seq_len_fill", 0, 1 << 20)

#: SpecLimits field -> the SpecConfig field it limits.
_SPEC_FIELD = {"max_topk": "topk", "max_num_steps": "num_steps", "max_draft_tokens": "num_draft_tokens"}


class FillTerm(str, Enum):
    """A spec-config quantity used by a graph seq-len fill rule."""

    NONE = "none"
    NUM_DRAFT_TOKENS = "num_draft_tokens"
    NUM_STEPS = "num_steps"
    TOPK = "topk"
    WIDTH = "width"  # query tokens per request of the phase (tokens_per_request)

    def value_for(self, spec: SpecConfig | None, phase: Phase | None) -> int:
        """This term's value under ``spec`` for ``phase``; 0 without a spec (or a phase, for ``width``)."""
        if spec is None or self is FillTerm.NONE:
            return 0
        if self is FillTerm.WIDTH:
            return tokens_per_request(phase, spec) if phase is not None else 0
        return int(getattr(spec, self.value))


@dataclass(frozen=True)
class SeqLenFill:
    """The seq len written into padded rows of a captured batch.

    ``max(base + plus, at_least + at_least_plus)``: ``plus`` and ``at_least_plus``
    are spec terms (:class:`FillTerm`), e.g. ``max(1, width + 1)`` is
    ``SeqLenFill(1, at_least=1, at_least_plus=FillTerm.WIDTH)``.
    """

    base: int = 1
    plus: FillTerm = FillTerm.NONE
    at_least: int = 0
    at_least_plus: FillTerm = FillTerm.NONE

    def __post_init__(self) -> None:
        FILL_BOUND.check(self.base, "seq_len_fill.base")
        FILL_BOUND.check(self.at_least, "seq_len_fill.at_least")
        object.__setattr__(self, "plus", FillTerm(self.plus))
        object.__setattr__(self, "at_least_plus", FillTerm(self.at_least_plus))

    def value(self, spec: SpecConfig | None, phase: Phase | None = None) -> int:
        """The seq len to write into padded rows of ``phase`` under ``spec``."""
        main = self.base + self.plus.value_for(spec, phase)
        floor = self.at_least + self.at_least_plus.value_for(spec, phase)
        return max(main, floor)

    def __str__(self) -> str:
        text = str(self.base) + (f" + {self.plus.value}" if self.plus is not FillTerm.NONE else "")
        if self.at_least or self.at_least_plus is not FillTerm.NONE:
            floor = " + ".join(s for s in (str(self.at_least) if self.at_least else "",
                                           self.at_least_plus.value if self.at_least_plus is not FillTerm.NONE
                                           else "") if s)
            text = f"max({text}, {floor})"
        return text



@dataclass(frozen=True)
class Tolerance:
    """How far a backend's output may be from the reference: ``|out - ref| <= atol + rtol * |ref|``.

    ``atol`` and ``rtol`` are numbers >= 0 (NaN and negatives are refused: they mean nothing).
    How loose they may be is not the descriptor's to say: the conformance kit holds each dtype
    to a ceiling (``attnhal.testing.checks.tolerances``), and a descriptor file bounds them
    by :data:`TOLERANCE_BOUND`.
    """

    atol: float
    rtol: float

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidValue(name, value, "a number >= 0 (the conformance kit caps it per dtype)")
            object.__setattr__(self, name, float(min(value, math.inf)))  # 10**400 is inf, not an OverflowError


#: A tolerance in a descriptor file: finite, and at most 1 (on unit-scale outputs a
#: tolerance of 1 checks nothing; the kit's ceilings are far tighter).
TOLERANCE_BOUND = FloatBound("tolerance", 0.0, 1.0)


#: The tolerance of each compute dtype unless a descriptor declares its own.
DEFAULT_TOLERANCES = MappingProxyType({
    "float32": Tolerance(1e-4, 1e-4),
    "float16": Tolerance(2e-3, 2e-3),
    "bfloat16": Tolerance(1.6e-2, 1.6e-2),
})
