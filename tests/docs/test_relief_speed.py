"""benchmarks/relief_speed.py under the Triton interpreter: the plumbing of both ways.

Nothing is relieved under the interpreter (no compiler reports spills), so the command runs
the shipped and the tabled forms and says no form was relieved; with a planted compiler that
spills above a 32-position K/V step, the shipped run launches relieved forms, the tabled run
the rows' own 64-position forms, and both pass the output gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from repo import ROOT

BENCH = ROOT / "benchmarks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is present: the run would time, not check")
def test_tiny_run_gates_both_ways_and_says_nothing_was_relieved(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTNHAL_PLATFORM")}
    out = tmp_path / "relief.json"
    done = subprocess.run([sys.executable, str(BENCH / "relief_speed.py"), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "plumbing only, no speed" in done.stdout and "no form relieved here" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(r["shipped_err"] < 1e-5 and r["tabled_err"] < 1e-5 for r in rows), rows
    assert all(r["shipped_s"] is None and not r["relieved"] for r in rows)


def test_a_planted_spill_is_relieved_when_shipped_and_kept_when_tabled(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(BENCH))
    import relief_speed
    from peer_cases import parse_shapes

    from attnhal_triton import kernels, ops, spill_relief

    steps: list[int] = []

    class Recorded:  # extend_kernel, recording the K/V step of each launch
        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                steps.append(kwargs["BLOCK_N"])
                kernels.extend_kernel[grid](*args, **kwargs)
            return launch

    spilling = lambda kernel, grid, args: lambda c, o: 8 * (c.get("BLOCK_N", 0) > 32)  # noqa: E731
    monkeypatch.setattr(spill_relief, "compiler_spills", spilling)
    monkeypatch.setattr(spill_relief, "RELIEVED", {})
    compiled = SimpleNamespace(INTERPRETED=False, extend_kernel=Recorded(),
                               **{k: getattr(kernels, k) for k in ("decode_partial_kernel", "decode_reduce_kernel")})
    monkeypatch.setattr(ops, "_kernels", lambda: compiled)
    row = relief_speed.measure(parse_shapes("chain4:2x32/g10")[0], torch.float32, timed=False)
    assert row["relieved"] and all("BLOCK_N=32 (row 8 B spilled, launched 0 B)" in r for r in row["relieved"]), row
    assert row["shipped_err"] < 1e-5 and row["tabled_err"] < 1e-5
    assert steps == [32, 64], steps  # shipped (its deciding launch, gated once), tabled (the row's 64)
    assert "not timed" in relief_speed.line(row)
