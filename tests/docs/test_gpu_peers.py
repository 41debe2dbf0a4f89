"""benchmarks/gpu_peers.py --tiny under the Triton interpreter: the plumbing of every contender.

attnhal and SDPA always run; the engines' kernels run when their files are in the peer
cache (``$ATTNHAL_PEER_KERNELS``, or ``.peer-kernels`` at the repository root, filled by
``benchmarks/fetch_peer_kernels.py``), else they must report "not available" with the
reason and the test says they were skipped. Never fetches anything. About 40 s of CPU
(fewer shapes with the peers absent). Where an engine tier venv is built, its engine's
kernels run too: SGLang's imported there, vLLM's copied from there into a peer cache.
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
                          check=False, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
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
        assert results["attnhal"]["status"] == "ok" and results["attnhal"]["err"] < 1e-4, (key, results)
        assert results["attnhal"]["seconds"] is None  # no speed without a device
        sdpa = results["sdpa"]
        served = not key.startswith("fp8") and "ragged" not in key  # contiguous SDPA: uniform, 16-bit/fp32
        assert (sdpa["status"], served) in (("ok", True), ("n/a", False)), (key, sdpa)
        if served:  # its own choice and each backend forced: those this CPU lacks are n/a, none FAILED
            assert sdpa["settings"] == 4 and "FAILED" not in sdpa["note"], (key, sdpa)
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is present: the run would time, not check")
def test_tiny_mla_rows_check_attnhal_and_sdpa_against_fp32(tmp_path: Path) -> None:
    """The MLA rows at interpreter sizes (decode at 16 and 128 heads, the 1+3 and 1+7 chains):
    attnhal's MLA path over the latent pool and SDPA over contiguous copies (V = the latent's
    first 512), each gated; the unit is the latent's bytes. About 15 s of CPU."""
    from peer_cases import TINY_MLA_SHAPES

    keys = [s.key for s in TINY_MLA_SHAPES]
    proc, report = _run(tmp_path, "--contenders", "attnhal,sdpa", "--peers-dir", "/nonexistent",
                        "--shapes", ",".join(keys))
    assert [row["key"] for row in report["rows"]] == keys
    for row in report["rows"]:
        assert row["unit"] == "GB/s of latent" and row["kv_bytes"] == 2 * 64 * 576 * 4, row  # fp32, read once
        attnhal, sdpa = row["results"]["attnhal"], row["results"]["sdpa"]
        assert attnhal["status"] == "ok" and attnhal["err"] < 1e-5, (row["key"], attnhal)
        assert sdpa["status"] == "ok" and sdpa["err"] < 1e-5 and sdpa["settings"] == 4, (row["key"], sdpa)
        assert ("masked" in sdpa["note"]) == row["key"].startswith(("mla4:", "mla8:")), sdpa  # verify: causal mask


def test_bad_input_names_the_flag_and_what_is_allowed(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_peers

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what --tiny sets without a device; restored after
    for args, words in ((["--shapes", "decode:2x100"], "multiple of 16"),
                        (["--shapes", "verify:2x64"], "supported: decode, chain4, tree8, fp8, prefill"),
                        (["--shapes", "decode:2x64/g17"], "supported: /g1../g16, /d64, /d128, /d256"),
                        (["--shapes", "decode:1x64/ragged"], "ragged with bs >= 2"),
                        (["--shapes", "decode:2x64/x"], "KIND:BSxCTX[/gG][/dD][/ragged]"),
                        (["--shapes", "mla:2x64/g4"], "MLA kinds: KIND:BSxCTX[/hH][/ragged]"),
                        (["--shapes", "decode:2x64/h16"], "MLA kinds: KIND:BSxCTX[/hH][/ragged]"),
                        (["--shapes", "mla8:2x64/h8"], "supported: MLA heads /h16, /h32, /h64, /h128"),
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

    decode = row("decode:256x1024", 2_000_000_000, attnhal=1.0, sglang=2.0, vllm=0.5, sdpa=4.0)
    assert ratio(decode) == (0.5, "vllm")
    wrong = row("chain4:8x8192", 10**9, attnhal=1.0, sglang=2.0, vllm="WRONG")
    assert ratio(wrong) == (2.0, "sglang")
    assert ratio(row("prefill:1x8192", 10**9, attnhal=2.0, vllm=1.0, sdpa=4.0)) == (0.5, "vllm")
    # SDPA is a contender like any other: the ratio is to the fastest of the row, never a chosen one.
    assert ratio(row("decode:1x32768", 10**9, attnhal=1.0, sglang=2.0, sdpa=0.5)) == (0.5, "sdpa")
    assert ratio(row("tree8:8x8192", 10**9, attnhal=1.0)) == (None, "")
    fp8 = row("fp8:256x1024", 1_000_000_000, attnhal=0.5)
    assert fp8_speedup([decode, fp8]) == ("256x1024", 2.0)  # tokens/s: half the time
    swept = row("decode:8x8192", 10**9, attnhal=1.0, sglang=0.5)
    swept.results["sglang"].setting, swept.results["sglang"].default_seconds = "max_kv_splits 32", 2.0
    table = markdown([decode, wrong, swept], ("attnhal", "sglang", "vllm", "sdpa"), timed=True)
    assert "| decode:256x1024 | GB/s of K/V | 2 | 1 | 4 | 0 | vllm | 0.50x |" in table
    assert "| chain4:8x8192 | GB/s of K/V | 1 | 0 | WRONG (err 1.0e+00) | - | sglang | 2.00x |" in table
    # A swept contender shows its best setting and its default's speed beside it.
    assert "| decode:8x8192 | GB/s of K/V | 1 | 2 [max_kv_splits 32; default 0] | - | - | sglang | 0.50x |" in table


def test_warm_up_workers_run_their_share_of_the_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the workers fill Triton's cache before timing; here their command line runs."""
    import gpu_peers

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # each worker switches it on by itself
    args = gpu_peers.parser().parse_args(["--tiny", "--dtype", "fp32", "--contenders", "attnhal",
                                          "--peers-dir", "/nonexistent", "--warm-workers", "2"])
    summary = gpu_peers.warm_up(gpu_peers.parse_shapes("decode:1x32,fp8:1x32"), args)
    assert summary.startswith("warm-up: 2 processes compiled the kernels in") and "rc=" not in summary, summary


def test_the_session_halves_partition_the_table_and_the_budget_stops_starting_shapes(tmp_path: Path) -> None:
    """gpu_session.sh runs ``--shapes core``, ``rest`` or ``mla`` (together: the default table,
    once each); past ``--budget-s`` no shape starts, and the ones left are listed NOT RUN."""
    import gpu_peers
    from peer_cases import DEFAULT_SHAPES, SHAPE_SETS

    core, rest, mla = (gpu_peers.parse_shapes(name) for name in ("core", "rest", "mla"))
    assert sorted(core + rest + mla, key=DEFAULT_SHAPES.index) == list(DEFAULT_SHAPES)
    assert len(set(core + rest + mla)) == len(DEFAULT_SHAPES)
    assert len(SHAPE_SETS["core"]) == 15 and len(rest) == 14
    # The MLA table: decode and both chains, 128 and 16 heads, 1 x 32k .. 256 x 1k.
    assert {s.key for s in mla} == {f"{k}:{size}{h}" for k in ("mla", "mla4", "mla8") for h in ("/h128", "")
                                    for size in ("1x32768", "16x4096", "64x2048", "256x1024")}
    assert gpu_peers.within_budget(None, 1e9, 0.0, 0) and gpu_peers.within_budget(100, 50, 80, 2)
    assert not gpu_peers.within_budget(100, 70, 80, 2)  # 70 s + a mean shape of 40 s > 100 s
    proc, report = _run(tmp_path, "--shapes", "decode:2x32,tree8:2x32", "--contenders", "attnhal",
                        "--peers-dir", "/nonexistent", "--budget-s", "0")
    assert report["rows"] == [] and report["not_run"] == ["decode:2x32", "tree8:2x32"]
    assert "NOT RUN (the --budget-s 0 s was spent): decode:2x32, tree8:2x32" in proc.stdout


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


def _small(shape: "object") -> "object":
    """A default shape's kind, group, head and raggedness at a size this CPU builds quickly."""
    from dataclasses import replace
    s = shape
    return replace(s, bs=min(s.bs, 4), ctx=min(s.ctx, 1024 if s.kind == "prefill" else 2048))


def test_the_gate_fails_a_kernel_that_reads_seven_eighths_of_the_kv_at_every_shape() -> None:
    """A planted kernel attending only the first 7/8 of each row's context (prefill: of its
    keys) against a correct one rounded to the query dtype: the per-row relative gate fails
    the planted one at every default shape (kind, group, head, ragged, the MLA rows' 16 and
    128 heads over one latent head; sizes cut for this CPU) and at the issue's 1 x 32,768 cells
    (GQA and MLA at 128 heads), where the former absolute gate (3e-2) passed it."""
    from peer_cases import DEFAULT_SHAPES, MLA_KINDS, Shape, build_case, reference
    from peer_gate import gate_limit, row_relative_error

    shapes = list(dict.fromkeys(_small(s) for s in DEFAULT_SHAPES)) + [Shape("decode", 1, 32768),
                                                                        Shape("mla", 1, 32768, group=128)]
    assert {(s.kind, s.group) for s in shapes if s.mla} == {(k, h) for k in MLA_KINDS for h in (16, 128)}
    for shape in shapes:
        dtype = torch.bfloat16
        case = build_case(shape, dtype, torch.device("cpu"))
        want = reference(case)
        correct = want.to(dtype)
        planted = reference(case, kv_fraction=7 / 8).to(dtype)
        limit = gate_limit(dtype, shape.fp8)
        assert row_relative_error(correct, want) <= limit, shape.key
        assert row_relative_error(planted, want) > 2 * limit, (shape.key, row_relative_error(planted, want))
        if shape.key == "decode:1x32768":
            assert float((planted.float() - want).abs().max()) <= 3e-2  # what the old gate let through


def _tier_pythons(engine: str) -> list[Path]:
    """The pythons of the complete engine tier venvs (``tests/engines/setup.sh``) built for ``engine``."""
    root = Path(os.environ.get("ATTNHAL_ENGINE_ENVS") or Path.home() / ".cache" / "attnhal" / "engine-envs")
    return [p.parent / "bin" / "python" for p in sorted(root.glob(f"{engine}-*/attnhal-engine-env.stamp"))]


def _tier_python(engine: str) -> Path | None:
    built = _tier_pythons(engine)
    return built[-1] if built else None


def _run_in_sglang_tier(tmp_path: Path, contenders: str, shapes: str) -> dict:
    """``gpu_peers.py --tiny`` run by the SGLang tier venv's python (SGLang imported from its
    install there) over ``shapes``; its JSON report. Skips where no such venv is built."""
    python = _tier_python("sglang")
    if python is None:
        pytest.skip("no SGLang tier venv built (tests/engines/setup.sh sglang)")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTNHAL_PLATFORM")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "backends")])
    out = tmp_path / "peers.json"
    proc = subprocess.run([str(python), str(BENCH / "gpu_peers.py"), "--tiny", "--json", str(out), "--contenders",
                           contenders, "--shapes", shapes], check=False, env=env, capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["peers"]["sglang"].startswith("loaded from installed engine sglang 0.5.23"), report["peers"]
    return report


def test_sglang_kernels_from_their_tier_venv_run_every_setting(tmp_path: Path) -> None:
    """SGLang's own decode kernel, imported from the SGLang tier venv (its installed 0.5.23),
    under the interpreter: at its default split cap and the 5 other swept ones, each gated (its
    verify kernel: from the cache below, as a lent machine runs it). (vLLM's cannot run from its
    tier venv: without a GPU driver vLLM swaps ``triton`` for a placeholder; it runs from the
    peer cache.) About 20 s of CPU."""
    report = _run_in_sglang_tier(tmp_path, "attnhal,sglang", "decode:2x32")
    decode = report["rows"][0]["results"]["sglang"]
    assert decode["status"] == "ok" and decode["settings"] == 6, decode


def test_sglang_mla_kernels_from_their_tier_venv_run_every_setting(tmp_path: Path) -> None:
    """SGLang 0.5.23's MLA path from its tier venv under the interpreter: ``decode_attention_fwd``
    with ``has_mla`` over the latent cache (k_buffer 576, v_buffer its first 512) at 16 and 128
    heads, its default split cap and the swept ones, and its verify kernel (extend + custom
    mask) over the 1+7 chain, each gated against fp32. About a minute of CPU."""
    report = _run_in_sglang_tier(tmp_path, "sglang", "mla:2x64,mla:2x64/h128,mla8:2x64")
    decode16, decode128, chain = (row["results"]["sglang"] for row in report["rows"])
    for decode in (decode16, decode128):  # its flag's 8 (no device: no core count), then 1 and 2
        assert decode["status"] == "ok" and decode["settings"] == 3 and decode["err"] < 1e-5, decode
        assert decode["note"].startswith("max_kv_splits 8"), decode
    assert chain["status"] == "ok" and "custom mask" in chain["note"] and chain["err"] < 1e-5, chain


def _peer_copy(engine: str, peers: Path) -> Path | None:
    """``engine``'s kernel files copied into the cache ``peers`` from the first tier venv holding
    the pinned version (the python copied from), or None where none is built."""
    for python in _tier_pythons(engine):  # vLLM's 0.33 and 0.34 tiers: the copy refuses another version
        proc = subprocess.run([sys.executable, str(BENCH / "fetch_peer_kernels.py"), "--dir", str(peers),
                               "--peers", engine, "--from-python", str(python)],
                              check=False, capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            return python
        assert f"is installed there (supported: {engine} " + PEERS[engine].version in proc.stderr, proc.stderr
    return None


def test_sglang_verify_kernels_copied_from_its_tier_venv_run_from_the_cache(tmp_path: Path) -> None:
    """What a lent GPU machine runs (no SGLang installed there, benchmarks/device_prep.sh): SGLang's
    kernel files copied offline from its tier venv, loaded from that copy with the stand-ins, and
    its verify kernel (extend + custom mask) over the GQA 8-token tree and the MLA 1+3 chain, gated
    against fp32 under the interpreter."""
    peers = tmp_path / "peers"
    if _peer_copy("sglang", peers) is None:
        pytest.skip(f"no SGLang {PEERS['sglang'].version} tier venv built (tests/engines/setup.sh sglang)")
    manifest = (peers / PEERS["sglang"].cache_name / "WHEEL.txt").read_text()
    assert manifest.count("  sglang/") == len(PEERS["sglang"].files) == 4  # decode, extend and their two helpers
    proc, report = _run(tmp_path, "--peers-dir", str(peers), "--contenders", "sglang",
                        "--shapes", "tree8:2x32,mla4:2x64")
    assert report["peers"]["sglang"].startswith("loaded from cache "), report["peers"]
    for row in report["rows"]:
        sglang = row["results"]["sglang"]
        assert sglang["status"] == "ok" and "custom mask" in sglang["note"] and sglang["err"] < 1e-5, (row["key"], sglang)


def test_vllm_mla_kernel_copied_from_its_tier_venv_runs_every_setting(tmp_path: Path) -> None:
    """vLLM 0.33's TRITON_MLA kernel (``triton_decode_attention.py``), copied offline from its
    tier venv, under the interpreter: decode at 16 and 128 heads and the 1+3 chain flattened
    to one decode row per query token with causal per-row lengths (``forward_mqa``), its own
    split count and the swept one, each gated. About 20 s of CPU."""
    peers = tmp_path / "peers"
    if _peer_copy("vllm", peers) is None:
        pytest.skip(f"no vLLM {PEERS['vllm'].version} tier venv built (tests/engines/setup.sh vllm)")
    proc, report = _run(tmp_path, "--peers-dir", str(peers), "--contenders", "vllm",
                        "--shapes", "mla:2x64,mla:2x64/h128,mla4:2x64")
    assert report["peers"]["vllm"].startswith("loaded from cache "), report["peers"]
    for row in report["rows"]:  # ctx 64: its own 1 split, and 2 (the sweep stops at 32 positions a split)
        vllm = row["results"]["vllm"]
        assert vllm["status"] == "ok" and vllm["settings"] == 2 and vllm["err"] < 1e-5, (row["key"], vllm)
        assert vllm["note"].startswith("causal multi-token decode" if row["key"].startswith("mla4") else
                                       "num_kv_splits 1"), vllm


def test_vllm_kernels_copied_from_their_tier_venv_run_every_setting(tmp_path: Path) -> None:
    """vLLM 0.33's own kernel files, copied offline from a vLLM tier venv
    (``fetch_peer_kernels.py --from-python``: located, not imported), run under the interpreter
    from that copy: decode and the 8-token tree (which vLLM runs as a causal chain: its Triton
    backend has no tree mask), every swept setting, each gated. About a minute of CPU."""
    peers = tmp_path / "peers"
    copied = _peer_copy("vllm", peers)
    if copied is None:
        pytest.skip(f"no vLLM {PEERS['vllm'].version} tier venv built (tests/engines/setup.sh vllm)")
    manifest = (peers / PEERS["vllm"].cache_name / "WHEEL.txt").read_text()
    assert manifest.startswith(f"installed vllm {PEERS['vllm'].version} at ")
    assert manifest.count("  vllm/") == len(PEERS["vllm"].files) == 3  # TRITON_ATTN's two, TRITON_MLA's one
    # The tree at one row: 35 s of interpreter time against 61 s at two (decode keeps two rows).
    proc, report = _run(tmp_path, "--peers-dir", str(peers), "--contenders", "attnhal,vllm",
                        "--shapes", "decode:2x32,tree8:1x32")
    assert report["peers"]["vllm"].startswith("loaded from cache "), report["peers"]
    decode, tree = (row["results"]["vllm"] for row in report["rows"])
    assert decode["status"] == "ok" and decode["settings"] > 1 and decode["err"] < 1e-4, decode
    assert tree["status"] == "ok" and tree["note"].startswith("ran causal"), tree


def test_fetch_from_python_names_what_is_missing(tmp_path: Path) -> None:
    """--from-python with an interpreter that lacks the engine: exit 2, the engine and the
    interpreter named, nothing written."""
    proc = subprocess.run([sys.executable, str(BENCH / "fetch_peer_kernels.py"), "--dir", str(tmp_path),
                           "--peers", "sglang", "--from-python", sys.executable],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"--from-python {sys.executable}: sglang is not installed there" in proc.stderr
    assert not any(tmp_path.iterdir())
