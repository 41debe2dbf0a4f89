"""What changed between two recordings of an engine's executed decisions (``tests/engines/recorded/``).

A recording is a JSON header (``engine``, ``columns``, ``refusals``) followed by one JSON row per
case (``sglang_recording.write``). A case is keyed by the columns before ``accepted`` (what was
asked); the rest is what the engine decided, a refusal as its index into ``refusals``. Nothing
here imports an engine: ``tests/engines/newest.py`` prints :func:`report` after running a tier
on an engine's newest release, and ``tests/engines/test_recording_diff.py`` checks it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Recording", "load", "report"]


@dataclass(frozen=True)
class Recording:
    engine: str  # "sglang==0.5.23"
    keys: tuple[str, ...]  # the columns that name a case
    fields: tuple[str, ...]  # the columns the engine decided
    rows: dict[tuple[Any, ...], tuple[Any, ...]]  # case -> decision (refusals as text)


def load(path: Path) -> Recording:
    """A recording file, its refusals resolved to their text."""
    text = path.read_text(encoding="utf-8")
    end = text.index("\n}\n") + 3
    header = json.loads(text[:end])
    columns = header["columns"]
    if "accepted" not in columns:
        raise ValueError(f"{path}: columns={columns!r} (supported: a header whose columns include 'accepted')")
    split = columns.index("accepted")
    refusals = header.get("refusals", [])
    rows = {}
    for line in text[end:].splitlines():
        row = json.loads(line)
        decision = list(row[split:])
        if columns[-1] == "why" and decision[-1] is not None:
            decision[-1] = refusals[decision[-1]]
        rows[tuple(row[:split])] = tuple(decision)
    return Recording(header["engine"], tuple(columns[:split]), tuple(columns[split:]), rows)


def _case(keys: tuple[str, ...], case: tuple[Any, ...]) -> str:
    return " ".join(f"{k}={v}" for k, v in zip(keys, case) if v is not None)


def report(old: Recording, new: Recording, shown: int = 20) -> list[str]:
    """The changes from ``old`` to ``new``: counts, then up to ``shown`` cases of each kind."""
    if old.keys != new.keys or old.fields != new.fields:
        return [f"columns differ: {old.engine} {[*old.keys, *old.fields]} vs {new.engine} {[*new.keys, *new.fields]}"]
    changed = {case: (old.rows[case], row) for case, row in new.rows.items()
               if case in old.rows and old.rows[case] != row}
    added = [case for case in new.rows if case not in old.rows]
    gone = [case for case in old.rows if case not in new.rows]
    by_field: Counter[str] = Counter(f for before, after in changed.values()
                                     for f, a, b in zip(new.fields, before, after) if a != b)
    lines = [f"recording: {old.engine} ({len(old.rows)} cases) -> {new.engine} ({len(new.rows)} cases)",
             f"changed: {len(changed)} cases" + (f" ({', '.join(f'{f} {n}' for f, n in sorted(by_field.items()))})"
                                                  if by_field else ""),
             f"new cases: {len(added)}; cases gone: {len(gone)}"]
    for case, (before, after) in list(changed.items())[:shown]:
        diffs = "; ".join(f"{f}: {a!r} -> {b!r}" for f, a, b in zip(new.fields, before, after) if a != b)
        lines.append(f"  changed {_case(new.keys, case)}: {diffs}")
    lines += [f"  new {_case(new.keys, case)}" for case in added[:shown]]
    lines += [f"  gone {_case(old.keys, case)}" for case in gone[:shown]]
    if not (changed or added or gone):
        lines.append("no decision changed")
    return lines
