"""Every difference between SGLang's executed decisions and attnhal, and what explains it.

A rule names a cause, says which cases show it (a predicate on the case: the flags, the
platform, the model) and which difference labels it explains (a pattern). Two kinds:

- ``CATALOGUED``: an engine discrepancy of ``docs/catalog.md`` (``D1``..), or a catalogued
  engine behaviour ("late failures"). SGLang's code decides differently from the backend's
  ability; attnhal keeps the ability. These tests pass.
- ``ADAPTER``: a defect of attnhal's SGLang adapter (``attnhal_sglang``) to fix. Its
  cases are strict xfails: when the adapter is fixed, the difference is gone and the test
  fails until the rule is removed.

The test asserts both ways: every observed label is explained by a rule that applies to the
case, and every rule that applies to the case explains at least one observed label.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from sglang_grid import Case, View, differences


@dataclass(frozen=True)
class Rule:
    cause: str  # "D1" | "late failures" | "adapter: ..."
    applies: Callable[[Case], bool]
    labels: str  # regular expression over difference labels

    def explains(self, label: str) -> bool:
        return re.fullmatch(self.labels, label) is not None

    @property
    def adapter(self) -> bool:
        return self.cause.startswith("adapter:")


def _eagle(case: Case) -> bool:
    return case.algorithm not in ("NGRAM", None)


def _ngram(case: Case) -> bool:
    return case.algorithm == "NGRAM"


def _decode(case: Case) -> str:
    return case.decode_backend or case.backend


def _extend(case: Case) -> str:
    """The backend of draft extend: prefill's unless --speculative-attention-mode decode."""
    return _decode(case) if case.attention_mode == "decode" else case.backend


def _tree(case: Case) -> bool:
    return case.topk > 1


def _hip_extend_eager(case: Case) -> bool:
    """SGLang's HIP rule leaves draft extend eager unless the draft-DECODE backend is aiter's
    multi-step one (none for one step); attnhal captures it where the extend backend can."""
    return (case.vendor == "hip" and _eagle(case) and _extend(case) in ("aiter", "triton")
            and not (_decode(case) == "aiter" and case.num_steps > 1)
            and not (_extend(case) == "aiter" and _tree(case)))


def _aiter_late_failure(case: Case) -> bool:
    return _eagle(case) and _extend(case) == "aiter" and _tree(case) and case.page_size is None


EAGER_EXTEND = r"draft_extend: attnhal captures, engine eager"
RUNS_INVALID = r"engine runs, attnhal invalid"

RULES: tuple[Rule, ...] = (
    Rule("D1", lambda c: _hip_extend_eager(c) and c.decode_backend is None and c.backend == "aiter", EAGER_EXTEND),
    Rule("D2", lambda c: _hip_extend_eager(c) and c.decode_backend is None and c.backend == "triton", EAGER_EXTEND),
    Rule("D7", lambda c: _hip_extend_eager(c) and c.decode_backend is not None, EAGER_EXTEND),
    Rule("late failures", _aiter_late_failure, RUNS_INVALID),
    Rule("D3", lambda c: c.backend == "flashinfer" and c.model == "mla" and _tree(c)
         and (c.num_steps == 1 or _ngram(c)), RUNS_INVALID),
    Rule("D4", lambda c: c.backend == "dsa" and _tree(c) and c.page_size is None, RUNS_INVALID),
    Rule("D6", lambda c: c.backend == "torch_native" and _ngram(c) and _tree(c) and c.page_size is None,
         RUNS_INVALID),
)


def rules_for(case: Case) -> tuple[Rule, ...]:
    return tuple(rule for rule in RULES if rule.applies(case))


def as_resolved(case: Case, engine: View) -> Case:
    """``case`` with the backend SGLang picked where the flags name none (its resolved prefill
    backend): the rules' conditions are about the backend that runs, whoever chose it."""
    if case.backend is None and engine.roles[0] is not None:
        return dataclasses.replace(case, backend=engine.roles[0])
    return case


def check(case: Case, engine: View, attnhal: View) -> tuple[str, ...]:
    """Asserts that every difference between the two views is explained by a rule that applies
    to ``case`` and that every such rule explains one; returns the adapter rules' causes (the
    differences still to fix in attnhal's adapter)."""
    observed = differences(engine, attnhal)
    rules = rules_for(as_resolved(case, engine))
    unexplained = [label for label in observed if not any(r.explains(label) for r in rules)]
    context = f"\n  case: {case}\n  SGLang: {engine}\n  attnhal: {attnhal}\n  rules: {[r.cause for r in rules]}"
    assert not unexplained, f"differences no rule of sglang_expected.py explains: {unexplained}{context}"
    gone = [r.cause for r in rules if not any(r.explains(label) for label in observed)]
    assert not gone, (f"rules that apply to this case explain no difference (fixed? remove or narrow the "
                      f"rule in sglang_expected.py, and its entry in docs/catalog.md): {gone}{context}")
    return tuple(r.cause for r in rules if r.adapter)
