"""benchmarks/triton_sweep.py --tiny under the Triton interpreter: every kernel's candidate rows
reach the backend through ``use_launch_rows`` and agree with the dense fp32 reference (no timing
without a GPU), and the chosen rows encode with their split fill for ``gpu_peers.py --launch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from repo import ROOT

BENCH = ROOT / "benchmarks"


def test_tiny_sweep_checks_every_candidate_against_fp32(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = tmp_path / "sweep.json"
    done = subprocess.run([sys.executable, str(BENCH / "triton_sweep.py"), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())["results"]
    assert len(results) == 4 and all(len(r) == 2 for r in results.values())
    assert all(entry["ok"] for r in results.values() for entry in r.values()), results


def test_chosen_rows_encode_their_split_fill() -> None:
    sys.path.insert(0, str(BENCH))
    from peer_contenders import launch_row
    from triton_sweep import candidates, encoded

    from attnhal.platform import parse
    from attnhal_triton.launch_table import lookup

    sm90 = parse("cuda:sm90")
    chosen = {k: {"cand": candidates(k, tiny=False)[1]} for k in ("decode", "extend_verify")}
    settings = encoded(sm90, 132, chosen)
    assert set(settings) == {"decode", "extend_verify", "extend_draft"}
    row = launch_row(lookup("extend_verify", sm90, 128, "bfloat16"), settings["extend_verify"])
    cand = chosen["extend_verify"]["cand"]
    assert (row.num_warps, row.num_stages, row.fill_programs) == \
        (cand["num_warps"], cand["num_stages"], cand["per_unit"] * 132)
