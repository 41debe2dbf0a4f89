"""The cpu backend beyond the conformance kit: page sizes > 1, split counts, the op's
schema and fake, bad configs, and what happens when the kernel cannot be built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnhal.backend import ForwardBatch, KVPool
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.registry import default_registry
from attnhal.testing.cases import Case, CaseRecipe, build_case
from attnhal.testing.checks import canonical_cases
from attnhal.testing.oracle import real_tokens, reference_forward
from attnhal_cpu import CAPABILITIES, CpuBackend
from repo import ROOT

UNAVAILABLE = CpuBackend.runtime_reasons(parse("cpu"))
needs_kernel = pytest.mark.skipif(bool(UNAVAILABLE), reason=f"cpu kernel unavailable: {UNAVAILABLE}")


def _max_error(out: torch.Tensor, want: torch.Tensor, batch: ForwardBatch) -> float:
    """Largest ``|out - want| / (1 + |want|)`` over the real query tokens."""
    tokens = real_tokens(batch)
    got, ref = out.detach().double()[tokens], want.double()[tokens]
    return float(((got - ref).abs() / (1 + ref.abs())).max()) if tokens else 0.0


def _paged_copy(case: Case, page: int, seed: int) -> tuple[KVPool, ForwardBatch]:
    """The same K/V and batch in a pool of page size ``page`` whose pages are shuffled.

    Every slot the batch reads or writes (table positions below each row's length, the
    new tokens' slots, draft paths) moves to its place in the paged pool; the returned
    batch names the new slots.
    """
    old, batch = case.pool, case.batch
    rows = old.req_to_page.shape[0] - 1
    per_req = -(-old.max_context_len // page)
    spare = -(-old.num_slots // page)  # pages for slots outside the tables (draft paths)
    total = rows * per_req + spare
    pool = KVPool(num_layers=old.num_layers, num_slots=total * page, num_kv_heads=old.num_kv_heads,
                  head_dim=old.head_dim, dtype=old.dtype, max_reqs=rows, max_context_len=old.max_context_len,
                  page_size=page)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)) + 1
    pool.req_to_page[1:] = order[:rows * per_req].view(rows, per_req).to(torch.int32)
    spare_slots = [int(p) * page + i for p in order[rows * per_req:].tolist() for i in range(page)]
    free = iter(spare_slots)
    mapping = {0: 0}
    for req, length in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        if req:
            for pos in range(length):
                mapping[int(old.req_to_page[req, pos])] = int(pool.slots(torch.tensor(req), torch.tensor(pos)))
    spec = batch.spec
    path = spec.draft_path if spec is not None else None
    for s in batch.out_cache_loc.tolist() + (path.flatten().tolist() if path is not None else []):
        if s not in mapping:
            mapping[s] = next(free)
    src = torch.tensor(list(mapping), dtype=torch.int64)
    dst = torch.tensor(list(mapping.values()), dtype=torch.int64)
    for layer in range(old.num_layers):
        pool.k[layer][dst] = old.k[layer][src]
        pool.v[layer][dst] = old.v[layer][src]

    def remap(t: torch.Tensor) -> torch.Tensor:
        return torch.tensor([mapping[s] for s in t.flatten().tolist()], dtype=t.dtype).view(t.shape)

    new_spec = None
    if spec is not None:
        new_spec = type(spec)(**{**spec.__dict__, "draft_path": remap(path) if path is not None else None})
    new = ForwardBatch(batch.phase, batch.req_pool_indices, batch.seq_lens, remap(batch.out_cache_loc),
                       batch.extend_lens, batch.extend_lens_cpu, batch.seq_lens_cpu, new_spec)
    return pool, new


@needs_kernel
@pytest.mark.parametrize("page", sorted(CAPABILITIES.page_sizes))
@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_claimed_page_size_matches_the_reference(page: int, phase: Phase, dtype: str) -> None:
    spec = canonical_cases(CAPABILITIES, phase, dtype, 64)[0]
    case = build_case(spec)
    want = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
    pool, batch = _paged_copy(case, page, seed=page)
    backend = CpuBackend(case.config, pool)
    backend.init_forward_metadata(batch)
    out = backend.forward(case.q, case.k, case.v, case.layer, batch)
    tol = CAPABILITIES.tolerance(dtype)
    assert _max_error(out, want, batch) <= max(tol.atol, tol.rtol)
    real = batch.out_cache_loc != 0  # padding tokens all write the padding slot
    assert torch.equal(pool.k[case.layer][batch.out_cache_loc[real]], case.k[real].to(pool.dtype))


@needs_kernel
@pytest.mark.parametrize("splits", [1, 2, 3, 7])
def test_split_count_changes_nothing_but_rounding(splits: int) -> None:
    spec = CaseRecipe(Phase.DECODE, num_q_heads=16, num_kv_heads=2, head_size=128, prefix_lens=(700, 41, 0, 300),
                    slot_seed=3, seed=5)
    case = build_case(spec)
    want = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
    backend = CpuBackend(case.config, case.pool, num_splits=splits)
    backend.init_forward_metadata(case.batch)
    out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    assert _max_error(out, want, case.batch) < 2e-6


@needs_kernel
@pytest.mark.parametrize("group", [1, 3, 16])
def test_gqa_groups_and_long_rows(group: int) -> None:
    spec = CaseRecipe(Phase.TARGET_VERIFY, num_q_heads=2 * group, num_kv_heads=2, head_size=96,
                    prefix_lens=(520, 9), spec=canonical_cases(CAPABILITIES, Phase.TARGET_VERIFY, "float32", 64)[0].spec,
                    tree_parents=((-1, 0, 0, 1), (-1, 0, 1, 2)), slot_seed=1, seed=2)
    case = build_case(spec)
    want = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
    backend = CpuBackend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    assert _max_error(backend.forward(case.q, case.k, case.v, case.layer, case.batch), want, case.batch) < 2e-6


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256, 72, 68, 36])
def test_every_head_size_and_loop_tail(dtype: torch.dtype, head_size: int) -> None:
    """The op at every claimed head size, and at sizes that reach each tail of the inner loops
    (72: a lone W-chunk after the 2W pairs with AVX2, 68 and 36: scalar tails), against fp64
    over the same paged K/V; bf16 keeps q and the accumulators in its even/odd pair order."""
    from attnhal_cpu.ops import attend_op

    gen = torch.Generator().manual_seed(head_size)
    rows, kv, group, page, length = 3, 2, 4, 16, 100
    pages = rows * (length // page + 1)
    k = torch.randn(pages * page, kv, head_size, generator=gen).to(dtype)
    v = torch.randn(pages * page, kv, head_size, generator=gen).to(dtype)
    table = torch.randperm(pages, generator=gen).to(torch.int32).view(rows, -1).contiguous()
    q = torch.randn(rows, kv * group, head_size, generator=gen).to(dtype)
    seq = torch.tensor([length, 1, 37], dtype=torch.int32)
    out, splits = torch.empty_like(q), 2
    mid_o, mid_lse = torch.empty(rows * kv * group * splits * head_size), torch.empty(rows * kv * group * splits)
    scale = head_size ** -0.5
    attend_op()(out, mid_o, mid_lse, q, k, v, table, torch.arange(rows), seq, None, None, None, 0, 1, page,
                scale, splits)
    for r in range(rows):
        pos = torch.arange(int(seq[r]))
        slots = table[r].long()[pos // page] * page + pos % page
        keys = k[slots].double().repeat_interleave(group, dim=1)    # [len, Hq, D]
        vals = v[slots].double().repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,thd->ht", q[r].double(), keys) * scale, dim=-1)
        want = torch.einsum("ht,thd->hd", weights, vals)
        bound = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
        assert torch.allclose(out[r].double(), want, atol=bound, rtol=bound), (r, (out[r].double() - want).abs().max())


@needs_kernel
def test_op_schema_and_fake() -> None:
    from attnhal_cpu.ops import attend_op

    op = attend_op()
    schema = str(op.default._schema)
    assert "Tensor(a!) out" in schema and "Tensor(b!) mid_o" in schema and "Tensor(c!) mid_lse" in schema
    case = build_case(CaseRecipe(Phase.DECODE, num_q_heads=4, num_kv_heads=2, head_size=64, prefix_lens=(5, 9)))
    pool, q = case.pool, case.q
    out = torch.empty_like(q)
    mid_o, mid_lse = torch.zeros(2 * 4 * 2 * 64), torch.zeros(2 * 4 * 2)
    args = (out, mid_o, mid_lse, q, pool.k[0], pool.v[0], pool.req_to_page, case.batch.req_pool_indices,
            case.batch.seq_lens, None, None, None, 0, 1, 1, 0.125, 2)
    torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


@needs_kernel
def test_bad_config_names_the_field() -> None:
    case = build_case(CaseRecipe(Phase.DECODE, num_q_heads=4, num_kv_heads=2, head_size=16))
    with pytest.raises(ValueError, match=r"head_size=16 \(supported: \{64, 80, 96, 128, 256\}\)"):
        CpuBackend(case.config, case.pool)
    spec = canonical_cases(CAPABILITIES, Phase.DECODE, "float32", 64)[0]
    case = build_case(spec)
    with pytest.raises(ValueError, match=r"num_splits=0 \(supported"):
        CpuBackend(case.config, case.pool, num_splits=0)


def test_import_is_light() -> None:
    code = "import sys, attnhal_cpu; assert 'torch' not in sys.modules, 'torch imported'; print(attnhal_cpu.CAPABILITIES.name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "cpu", out.stderr


@needs_kernel
def test_selected_by_default_on_cpu_and_build_info() -> None:
    assert default_registry().select(parse("cpu")).name == "cpu"
    info = CpuBackend.build_info()
    assert info is not None and "attnhal_cpu_" in info and "tile" in info


def test_failed_build_leaves_the_backend_unavailable_and_torch_serves(tmp_path: Path) -> None:
    """No compiler (CXX points nowhere, empty build cache): unavailable with the build
    error, `attnhal info` says so, the registry picks torch, construction refuses."""
    code = """
import json, torch
from attnhal.backend import AttentionConfig, KVPool
from attnhal.platform import parse
from attnhal.registry import default_registry
from attnhal_cpu import CpuBackend
from attnhal_cpu.ops import NativeUnavailable
cpu = parse("cpu")
entry = default_registry().get("cpu")
reasons = [str(r) for r in entry.reasons(__import__("attnhal").capabilities.AttentionRequest(), cpu)]
chosen = default_registry().select(cpu).name
pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=64, dtype=torch.float32, max_reqs=1,
              max_context_len=8)
try:
    CpuBackend(AttentionConfig(1, 1, 64), pool)
    refused = ""
except NativeUnavailable as exc:
    refused = str(exc)
print(json.dumps({"reasons": reasons, "chosen": chosen, "refused": refused}))
"""
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "ATTNHAL_CPU_BUILD_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(data["reasons"]) == 1 and "[runtime] native_build=attnhal_cpu_" in data["reasons"][0], data
    assert "failed" in data["reasons"][0] and "no-such-compiler" in data["reasons"][0], data
    assert data["chosen"] == "torch"
    assert "kernel unavailable" in data["refused"]
    info = subprocess.run([sys.executable, "-c", "from attnhal.cli import main; main(['info', '--build'])"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    line = next(ln for ln in info.stdout.splitlines() if ln.startswith("cpu "))
    assert "unavailable" in line and "native_build=" in line, info.stdout
    assert "build failed" in info.stdout


@needs_kernel
def test_decode_benchmark_quick_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CI smoke run of benchmarks/decode_cpu.py: every contender runs (or says why not)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("decode_cpu", ROOT / "benchmarks" / "decode_cpu.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["decode_cpu"] = bench  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    plot = importlib.util.find_spec("matplotlib") is not None
    args = ["--quick", "--page-sizes", "1", "16"] + (["--plot", str(tmp_path / "sweep.png")] if plot else [])
    bench.main(args)
    out = capsys.readouterr().out
    from attnhal_cpu.build import native_build

    cpu = "cpu " + native_build().name.removeprefix("attnhal_cpu_")  # quick: the host's build only
    assert f"\n{cpu}: {native_build().name}, parameters {native_build().params} (" in out, out
    assert f"the backend runs: fp32 caches on {native_build().runs('fp32')[0]}; bf16/fp16 caches on " in out, out
    for name in ("sdpa gqa", "sdpa folded", f"{cpu} p1", f"{cpu} p16", "torch p1", "torch p16", "read bw",
                 "load average after"):
        assert name in out
    assert "n/a" not in out  # both backends claim page sizes 1 and 16
    assert "(baseline)" in out
    if plot:
        assert (tmp_path / "sweep.png").stat().st_size > 0
