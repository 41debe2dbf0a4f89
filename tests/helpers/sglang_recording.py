"""SGLang's executed decisions over the grid, recorded, so that the main suite checks attnhal's
adapter against the engine's own code on machines without SGLang.

The SGLang tier executes every case (``harness.engine_view``) and asserts that this recording is
what SGLang decides today (``test_recording_is_what_sglang_decides``); with
``ATTNHAL_RECORD=1`` it writes the recording instead; ``ATTNHAL_RECORD_TO=FILE`` writes the installed
release's recording to FILE and compares nothing (``tests/engines/newest.py``). The file: a header line (the engine, the
row's columns, the refusals' first lines), then one JSON row per case in grid order.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from repo import ROOT
from sglang_grid import SPEC_PHASES, Case, View

ENGINE = "sglang==0.5.23"
PATH = ROOT / "tests" / "engines" / "recorded" / "sglang-0.5.23.jsonl"
CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))
VIEW_FIELDS = ("accepted", "page_size", "prefill", "decode", "runs", "captured", "why")
_WHY_CHARS = 160
#: Phases as one letter each in a row ("dev": draft decode, draft extend, target verify).
_LETTER = {phase: phase.split("_")[1][0] for phase in SPEC_PHASES}
_PHASE = {letter: phase for phase, letter in _LETTER.items()}


def _letters(phases: frozenset[str]) -> str:
    return "".join(_LETTER[p] for p in SPEC_PHASES if p in phases)


def _why(view: View) -> str:
    return "" if view.accepted else (view.why.splitlines() or [""])[0][:_WHY_CHARS]


def normal(view: View) -> View:
    """What the recording keeps of a view (the comparison's fields and the refusal's first line)."""
    return View(view.accepted, _why(view), page_size=view.page_size, roles=view.roles, runs=view.runs,
                captured=view.captured)


def write(views: Iterable[tuple[Case, View]], path: Path = PATH, engine: str = ENGINE) -> None:
    refusals: dict[str, int] = {}
    rows = []
    for case, view in views:
        why = refusals.setdefault(_why(view), len(refusals)) if not view.accepted else None
        rows.append(json.dumps([getattr(case, f) for f in CASE_FIELDS] + [
            view.accepted, view.page_size, *view.roles, _letters(view.runs), _letters(view.captured), why],
                               separators=(",", ":")))
    header = {"engine": engine, "columns": [*CASE_FIELDS, *VIEW_FIELDS], "refusals": list(refusals)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([json.dumps(header, indent=1), *rows]) + "\n", encoding="utf-8")


def load(path: Path = PATH) -> tuple[str, dict[Case, View]]:
    """The engine the recording was made with, and its view of each case."""
    text = path.read_text(encoding="utf-8")
    header_end = text.index("\n}\n") + 3
    header = json.loads(text[:header_end])
    recorded = {}
    for line in text[header_end:].splitlines():
        row: list[Any] = json.loads(line)
        case = Case(**dict(zip(CASE_FIELDS, row)))
        accepted, page, prefill, decode, runs, captured, why = row[len(CASE_FIELDS):]
        recorded[case] = View(accepted, "" if why is None else header["refusals"][why], page_size=page,
                              roles=(prefill, decode), runs=frozenset(_PHASE[c] for c in runs),
                              captured=frozenset(_PHASE[c] for c in captured))
    return header["engine"], recorded
