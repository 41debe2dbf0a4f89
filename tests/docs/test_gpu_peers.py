"""benchmarks/gpu_peers.py --tiny under the Triton interpreter: the plumbing of every contender.

attnhal and SDPA always run; the engines' kernels run when their files are in the peer
cache (``$ATTNHAL_PEER_KERNELS``, or ``.peer-kernels`` at the repository root, filled by
``benchmarks/fetch_peer_kernels.py``), else they must report "not available" with the
reason and the test says they were skipped. Never fetches anything. About 40 s of CPU
(fewer shapes with the peers absent).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo import ROOT

BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
from peer_kernels import PEERS


def _peers_dir() -> Path:
    env = os.environ.get("ATTNHAL_PEER_KERNELS")
    return Path(env) if env else ROOT / ".peer-kernels"


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTNHAL_PLATFORM")}
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_peers.py"), "--tiny", "--json", str(out), *args],
                          check=False, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is present: the run would time, not check")
def test_tiny_run_checks_every_contender_against_fp32(tmp_path: Path) -> None:
    peers_dir = _peers_dir()
    cached = [n for n, spec in PEERS.items() if all((peers_dir / spec.cache_name / f).is_file() for f in spec.files)]
    fewer = [] if cached else ["--shapes", "decode:2x32,tree8:2x32"]  # without peers: attnhal and SDPA on two
    proc, report = _run(tmp_path, "--peers-dir", str(peers_dir), *fewer)
    assert "interpreter: plumbing only, no speed" in proc.stdout
    assert report["timed"] is False and report["dtype"] == "fp32"
    rows = {row["key"]: row["results"] for row in report["rows"]}
    for key, results in rows.items():
        assert results["attnhal"]["status"] == "ok" and results["attnhal"]["err"] < 2e-4, (key, results)
        assert results["attnhal"]["seconds"] is None  # no speed without a device
        sdpa = results["sdpa"]
        assert (sdpa["status"], key.startswith("fp8")) in (("ok", False), ("n/a", True)), (key, sdpa)
    for name in PEERS:
        source = report["peers"][name]
        if name not in cached:
            assert source.startswith(("not available:", "loaded from installed engine")), source
            continue
        assert source.startswith(("loaded from cache ", "loaded from installed engine")), source
        statuses = {key: results[name]["status"] for key, results in rows.items()}
        assert "ok" in statuses.values() and not {"WRONG", "FAILED"} & set(statuses.values()), statuses
    assert rows["tree8:2x32"]["vllm"]["note"].startswith("ran causal") or "vllm" not in cached
    if len(cached) < len(PEERS):
        pytest.skip(f"peer kernels not in {peers_dir}: {', '.join(sorted(set(PEERS) - set(cached)))} "
                    "(run benchmarks/fetch_peer_kernels.py --dir DIR); attnhal and SDPA checked")


def test_bad_input_names_the_flag_and_what_is_allowed(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_peers

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what --tiny sets without a device; restored after
    for args, words in ((["--shapes", "decode:2x100"], "multiple of 16"),
                        (["--shapes", "verify:2x64"], "supported: decode, chain4, tree8, fp8, prefill"),
                        (["--contenders", "attnhal,flashinfer"], "supported: a comma list of attnhal"),
                        (["--launch", "decode"], "supported: KERNEL:ENCODED")):
        assert gpu_peers.main(["--tiny", *args]) == 2, args
        assert words in capsys.readouterr().err, args


def test_ratios_take_the_faster_engine_and_leave_wrong_outputs_out() -> None:
    from peer_table import Result, Row, fp8_speedup, markdown, ratio

    def row(key: str, kv_bytes: int, **seconds: float | str) -> Row:
        r = Row(key, key, "TFLOP/s" if key.startswith("prefill") else "GB/s of K/V", kv_bytes, 1e12)
        for name, s in seconds.items():
            r.results[name] = Result("WRONG", err=1.0) if s == "WRONG" else Result("ok", err=0.0, seconds=float(s))
        return r

    decode = row("decode:256x1024", 2_000_000_000, attnhal=1.0, sglang=2.0, vllm=0.5, sdpa=0.1)
    assert ratio(decode) == (0.5, "vllm")  # SDPA is a baseline, not an engine kernel
    wrong = row("chain4:8x8192", 10**9, attnhal=1.0, sglang=2.0, vllm="WRONG")
    assert ratio(wrong) == (2.0, "sglang")
    assert ratio(row("prefill:1x8192", 10**9, attnhal=2.0, vllm=1.0, sdpa=4.0)) == (2.0, "sdpa")
    assert ratio(row("tree8:8x8192", 10**9, attnhal=1.0, sdpa=1.0)) == (None, "")
    fp8 = row("fp8:256x1024", 1_000_000_000, attnhal=0.5)
    assert fp8_speedup([decode, fp8]) == ("256x1024", 2.0)  # tokens/s: half the time
    table = markdown([decode, wrong], ("attnhal", "sglang", "vllm", "sdpa"), timed=True)
    assert "| decode:256x1024 | GB/s of K/V | 2 | 1 | 4 | 20 | vllm | 0.50x |" in table
    assert "| chain4:8x8192 | GB/s of K/V | 1 | 0 | WRONG (err 1.0e+00) | - | sglang | 2.00x |" in table


def test_warm_up_workers_run_their_share_of_the_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the workers fill Triton's cache before timing; here their command line runs."""
    import gpu_peers

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # each worker switches it on by itself
    args = gpu_peers.parser().parse_args(["--tiny", "--dtype", "fp32", "--contenders", "attnhal",
                                          "--peers-dir", "/nonexistent", "--warm-workers", "2"])
    summary = gpu_peers.warm_up(gpu_peers.parse_shapes("decode:1x32,fp8:1x32"), args)
    assert summary.startswith("warm-up: 2 processes compiled the kernels in") and "rc=" not in summary, summary


def test_the_sweeps_chosen_rows_reach_the_backend_with_their_split_fill() -> None:
    """benchmarks/triton_sweep.py hands its chosen rows to gpu_peers as ``--launch
    KERNEL:ENCODED`` with ``fill_programs`` appended: the row the backend serves carries it
    (the second H200 run lost its table when the split fill was read as a launch option)."""
    from peer_contenders import launch_row

    from attnhal.platform import parse
    from attnhal_triton.launch_table import lookup

    base = lookup("extend_verify", parse("cuda:sm90"), 128, "bfloat16")
    row = launch_row(base, "BLOCK_M=64,BLOCK_N=32,DOT_PRECISION=ieee,num_warps=8,num_stages=3,"
                           "fill_programs=132")
    assert (dict(row.blocks), row.num_warps, row.num_stages, row.fill_programs, dict(row.extra)) == \
        ({"BLOCK_M": 64, "BLOCK_N": 32}, 8, 3, 132, {})
    assert row.kv_splits == base.kv_splits
