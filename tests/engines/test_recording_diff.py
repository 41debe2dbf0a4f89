"""The maintainer script's report (tests/engines/newest.py): what changed between a recording and
another release's, printed without the network or the engine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import recording_diff
from repo import ROOT

RECORDED = ROOT / "tests" / "engines" / "recorded" / "sglang-0.5.23.jsonl"


def _split(path: Path) -> tuple[dict, list[list]]:
    text = path.read_text(encoding="utf-8")
    end = text.index("\n}\n") + 3
    return json.loads(text[:end]), [json.loads(line) for line in text[end:].splitlines()]


def _write(path: Path, header: dict, rows: list[list]) -> Path:
    path.write_text("\n".join([json.dumps(header, indent=1), *(json.dumps(r) for r in rows)]) + "\n", encoding="utf-8")
    return path


def _newer(tmp_path: Path) -> tuple[Path, list]:
    """The recording as a made-up 0.5.24 would give it: one capture changed, one refusal lifted,
    one case gone, one new."""
    header, rows = _split(RECORDED)
    columns = header["columns"]
    captured, accepted, why = columns.index("captured"), columns.index("accepted"), len(columns) - 1
    rows = [list(r) for r in rows]
    changed = next(r for r in rows if r[accepted] and r[captured] == "v")
    changed[captured] = "ev"
    lifted = next(r for r in rows if not r[accepted])
    lifted[accepted], lifted[why] = True, None
    gone = rows.pop()
    new = list(rows[0])
    new[columns.index("page_size")] = 4096
    return _write(tmp_path / "sglang-0.5.24.jsonl", {**header, "engine": "sglang==0.5.24"}, [*rows, new]), gone


def test_a_recording_compared_with_itself_changed_nothing() -> None:
    old = recording_diff.load(RECORDED)
    assert len(old.rows) > 2500 and old.keys[0] == "backend" and old.fields[0] == "accepted"
    assert recording_diff.report(old, old)[-1] == "no decision changed"


def test_the_report_counts_and_names_each_change(tmp_path: Path) -> None:
    path, gone = _newer(tmp_path)
    lines = recording_diff.report(recording_diff.load(RECORDED), recording_diff.load(path))
    assert lines[0].startswith("recording: sglang==0.5.23 (") and "-> sglang==0.5.24 (" in lines[0]
    assert lines[1] == "changed: 2 cases (accepted 1, captured 1, why 1)"
    assert lines[2] == "new cases: 1; cases gone: 1"
    assert any(line.startswith("  changed ") and "captured: 'v' -> 'ev'" in line for line in lines)
    assert any("accepted: False -> True; why: '" in line for line in lines)  # the refusal's text, not its index
    assert any(line.startswith("  new ") and "page_size=4096" in line for line in lines)
    assert any(line.startswith("  gone ") and f"platform={gone[1]} model={gone[2]}" in line for line in lines)


def test_newest_script_compares_with_the_recorded_file_and_says_when_there_is_none(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("newest", ROOT / "tests" / "engines" / "newest.py")
    newest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(newest)
    path, _ = _newer(tmp_path)
    changed, lines = newest.compare("sglang", path)
    assert changed and lines[1] == "changed: 2 cases (accepted 1, captured 1, why 1)"
    assert newest.compare("sglang", RECORDED) == (False, newest.compare("sglang", RECORDED)[1])
    assert newest.compare("sglang", tmp_path / "missing.jsonl")[0]
    assert newest.compare("tensorrt_llm", path) == (False, ["no recording of tensorrt_llm in tests/engines/recorded/: "
                                                            "the tier's result only"])
    with pytest.raises(SystemExit):
        newest.main(["nonsense"])


def test_a_file_without_decisions_is_refused_by_field(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.jsonl", {"engine": "x", "columns": ["backend"]}, [["a"]])
    with pytest.raises(ValueError, match="columns="):
        recording_diff.load(bad)
