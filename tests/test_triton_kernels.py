"""Triton backend numerics, custom ops and graph claims, run by the Triton interpreter on CPU.

Every phase is compared with a float64 reference written from the masking table
in :mod:`attnhal.backend.batch`, extended with the issue-12 features (page size > 1,
fp8 caches read as stored * scale, sliding window with tree-verify depths, logit
soft-cap, sinks) and checked for the issue-16 split machinery (per-request split
counts, skipped and empty splits, split counts under graph replay). bf16 runs the kernels' ``DOT_F32`` path (the
interpreter's bf16 ``tl.dot`` is broken, triton-lang/triton#11584): the native bf16
dot is compiled by the compile check but not run here.

``ATTNHAL_TRITON_EXAMPLES`` raises the hypothesis example count per phase. The
interpreter runs every program of a grid, idle split programs included, so CI runs the
numerics on the interpreter's launch row (at most 4 splits) and keeps the simulated
targets' rows (16-32 splits) for the tests about them; ``ATTNHAL_SLOW=1`` runs the
numerics on those rows too.
"""

import dataclasses
import os

# Before triton or any kernel module is imported: triton reads it at decoration time.
os.environ["TRITON_INTERPRET"] = "1"

from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

from attnhal.backend import (  # noqa: E402
    AttentionConfig, ForwardBatch, KVPool, SpecInfo, UnsupportedFeature, kv_storage_dtype)
from attnhal.capabilities import Phase  # noqa: E402
from attnhal.plan import SpecConfig  # noqa: E402
from attnhal.platform import Platform, parse  # noqa: E402
from attnhal.testing.batches import build_case, tree_mask  # noqa: E402
from attnhal.testing.reference import reference_attention  # noqa: E402
from attnhal_triton import TritonBackend, ops  # noqa: E402

EXAMPLES = int(os.environ.get("ATTNHAL_TRITON_EXAMPLES", "3"))
SLOW = bool(os.environ.get("ATTNHAL_SLOW"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The interpreter row plus rows of real archs (their block sizes and split counts
# exercise the kernels' masking differently); launch options are ignored here. The real
# rows launch 16-32 split programs per row, idle ones included: ATTNHAL_SLOW only.
PLATFORMS = ("cpu", "cuda:sm90", "hip:gfx942") if SLOW else ("cpu",)


# --- cases -------------------------------------------------------------------------

@dataclass
class Case:
    """One batch of one phase over a shared pool, plus what the reference needs."""

    backend: TritonBackend
    batch: ForwardBatch
    q: torch.Tensor
    rows: list[int]  # pool request row of each batch row
    attended: list[list[list[int]]]  # [row][query][slot]: KV slots query attends, by the table


@dataclass(frozen=True)
class Shape:
    phase: Phase
    num_kv_heads: int
    group: int
    head_size: int
    dtype_index: int
    platform: str
    lens: tuple[int, ...]  # prefix length per row
    news: tuple[int, ...]  # new tokens per row (prefill, draft_extend) / unused
    tokens: int  # T of target_verify / draft_extend, num_steps of draft_decode
    tree: bool  # target_verify with a tree mask; draft_decode step = tokens - 1 if set
    seed: int
    page_size: int = 1
    window: int | None = None  # left window (FlashAttention's window_size[0])
    softcap: float | None = None
    sinks: bool = False
    kv_dtype: str | None = None  # "fp8_e4m3" (the platform's flavour) / "fp8_e5m2"; None: dtype

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_index]

    def storage(self, platform: Platform) -> torch.dtype:
        if self.kv_dtype is None:
            return self.dtype
        return kv_storage_dtype(self.kv_dtype, platform.fp8_flavor)


#: fp8 dequantisation scales of the test pools (K, V): not 1, so a kernel that skips them fails.
FP8_SCALES = (0.5, 2.0)


def _new_pool(shape: Shape, platform: Platform, slots: int, context: int,
              gen: torch.Generator) -> KVPool:
    p = shape.page_size
    pool = KVPool(num_layers=1, num_slots=-(-slots // p) * p, num_kv_heads=shape.num_kv_heads,
                  head_dim=shape.head_size, dtype=shape.storage(platform), max_reqs=2 * len(shape.lens),
                  max_context_len=context, page_size=p)
    for buf in (pool.k[0], pool.v[0]):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))
    if pool.is_fp8:
        pool.k_scale[0], pool.v_scale[0] = FP8_SCALES
    return pool


def build(shape: Shape, platform: Platform | None = None, pool: KVPool | None = None,
          gen: torch.Generator | None = None) -> Case:
    """A batch of ``shape.phase`` with random K/V in shuffled pages of ``pool``."""
    gen = gen or torch.Generator().manual_seed(shape.seed)
    platform = platform or parse(shape.platform)
    bs, hkv, d, p = len(shape.lens), shape.num_kv_heads, shape.head_size, shape.page_size
    hq = hkv * shape.group
    per_row = [_kv_len(shape, r) for r in range(bs)]
    extra = shape.tokens if shape.phase is Phase.DRAFT_DECODE else 0
    if pool is None:
        # Room for a second batch of similar size (graph tests replay on one).
        need = 2 * (sum(-(-n // p) * p for n in per_row) + bs * extra + bs * p)
        pool = _new_pool(shape, platform, max(need, 600), max(*per_row, 300), gen)
    used = set(pool.req_to_page.flatten().tolist())
    pages = [g for g in (torch.randperm(pool.num_slots // p, generator=gen) + 1).tolist()
             if g not in used]
    rows = [pool.alloc_req() for _ in range(bs)]
    for r, n in zip(rows, per_row):
        k = -(-n // p)
        pool.req_to_page[r, :k] = torch.tensor(pages[:k], dtype=torch.int32)
        pages = pages[k:]
    free = [g * p + o for g in pages for o in range(p)]  # slots of untouched pages
    sinks = torch.randn((1, hq), generator=gen) if shape.sinks else None
    cfg = AttentionConfig(hq, hkv, d, shape.dtype, sliding_window=shape.window,
                          logit_softcap=shape.softcap, sinks=sinks)
    backend = TritonBackend(cfg, pool, platform=platform)
    batch, attended = _batch(shape, pool, rows, per_row, free, gen)
    q = torch.randn((batch.num_tokens, hq, d), generator=gen).to(shape.dtype)
    return Case(backend, batch, q, rows, attended)


def _kv_len(shape: Shape, r: int) -> int:
    """KV length after this forward: the seq_len of row ``r``."""
    phase, prefix = shape.phase, shape.lens[r]
    if phase in (Phase.PREFILL, Phase.DRAFT_EXTEND):
        return prefix + shape.news[r]
    if phase is Phase.TARGET_VERIFY:
        return prefix + shape.tokens
    return prefix


def _batch(shape: Shape, pool: KVPool, rows: list[int], per_row: list[int], free: list[int],
           gen: torch.Generator) -> tuple[ForwardBatch, list[list[list[int]]]]:
    """The ForwardBatch of ``shape`` and, per row and query, the slots the table allows."""
    phase, bs, t = shape.phase, len(rows), shape.tokens
    seq = torch.tensor(per_row, dtype=torch.int32)
    req = torch.tensor(rows, dtype=torch.int64)
    slots = [pool.slots(torch.tensor(row), torch.arange(n)).tolist() for row, n in zip(rows, per_row)]
    spec, ext, locs = None, None, []
    attended: list[list[list[int]]] = []
    if phase is Phase.DECODE:
        attended = [[s] for s in slots]
        locs = [s[-1] for s in slots]
    elif phase is Phase.PREFILL:
        ext = list(shape.news[:bs])
        for s, e in zip(slots, ext):
            prefix = len(s) - e
            attended.append([s[: prefix + i + 1] for i in range(e)])
            locs += s[prefix:]
    elif phase is Phase.DRAFT_EXTEND:
        ext = list(shape.news[:bs])
        for s, e in zip(slots, ext):
            prefix = len(s) - e
            attended.append([s[: min(prefix + i, len(s) - 1) + 1] for i in range(t)])
            locs += s[prefix:] + [0] * (t - e)  # padding tokens write to the padding slot
        spec = SpecInfo(draft_extend_len=t)
    elif phase is Phase.TARGET_VERIFY:
        mask = None
        if shape.tree:
            parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]
            mask = torch.stack([tree_mask(parents) for _ in range(bs)])
        for r, s in enumerate(slots):
            prefix = len(s) - t
            allow = mask[r] if mask is not None else torch.ones(t, t, dtype=torch.bool).tril()
            attended.append([s[:prefix] + [s[prefix + j] for j in range(t) if allow[i, j]]
                             for i in range(t)])
            locs += s[prefix:]
        spec = SpecInfo(topk=2 if shape.tree else 1, num_draft_tokens=t, custom_mask=mask)
    elif phase is Phase.DRAFT_DECODE:
        step = t - 1 if shape.tree else int(torch.randint(0, t, (1,), generator=gen))
        path = torch.tensor(free[: bs * t], dtype=torch.int64).view(bs, t)
        attended = [[s + path[r, : step + 1].tolist()] for r, s in enumerate(slots)]
        locs = path[:, step].tolist()
        spec = SpecInfo(draft_path=path, draft_step=step)
    batch = ForwardBatch(
        phase=phase, req_pool_indices=req, seq_lens=seq,
        out_cache_loc=torch.tensor(locs, dtype=torch.int64),
        extend_lens=torch.tensor(ext, dtype=torch.int32) if ext is not None else None,
        extend_lens_cpu=ext if phase is Phase.PREFILL else None, spec=spec)
    return batch, attended


def reference(case: Case) -> torch.Tensor:
    """Float64 attention over exactly the slots the masking table allows.

    A query's attended slots are in KV-position order (prefix, then its draft
    ancestors, which sit at consecutive depths), so a key's position is its index in
    the list and the query's is the last index: the window keeps the last ``w + 1``.
    Soft-cap on the scaled logits; a sink is one more softmax column with no value.
    """
    pool, cfg = case.backend.pool, case.backend.config
    k, v = (t.double() for t in pool.dequantized(0))
    q = case.q.double()
    out = torch.zeros_like(q)
    window = cfg.window(0)
    token = 0
    for queries in case.attended:
        for slots in queries:
            if window is not None:
                slots = slots[max(0, len(slots) - 1 - window):]
            idx = torch.tensor(slots, dtype=torch.int64)
            kk = k[idx].repeat_interleave(cfg.group_size, 1)  # [n, Hq, D]
            vv = v[idx].repeat_interleave(cfg.group_size, 1)
            s = torch.einsum("hd,nhd->hn", q[token], kk) * cfg.sm_scale
            if cfg.logit_softcap is not None:
                s = cfg.logit_softcap * torch.tanh(s / cfg.logit_softcap)
            if cfg.sinks is not None:
                s = torch.cat([s, cfg.sinks[0].double()[:, None]], 1)
            out[token] = torch.einsum("hn,nhd->hd", s.softmax(-1)[:, :len(slots)], vv)
            token += 1
    return out


def run(case: Case) -> torch.Tensor:
    case.backend.init_forward_metadata(case.batch)
    return case.backend.forward(case.q, None, None, 0, case.batch)


def assert_close(case: Case, got: torch.Tensor, want: torch.Tensor,
                 valid: torch.Tensor | None = None) -> None:
    tol = case.backend.capabilities.tolerance(str(got.dtype).removeprefix("torch."))
    assert torch.isfinite(got).all()
    got, want = got.double(), want.double()
    if valid is not None:
        got, want = got[valid], want[valid]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


# --- strategies --------------------------------------------------------------------

_HEADS = st.sampled_from([(1, 1), (2, 4), (1, 8), (2, 1), (1, 20)])  # (kv heads, group)


@st.composite
def shapes(draw: st.DrawFn, phase: Phase, max_len: int = 200) -> Shape:
    bs = draw(st.integers(1, 4))
    hkv, group = draw(_HEADS)
    tokens = draw(st.integers(2, 6))
    first = 0 if phase in (Phase.PREFILL, Phase.TARGET_VERIFY) else 1
    lens = tuple(draw(st.lists(st.integers(first, max_len), min_size=bs, max_size=bs)))
    news_max = tokens if phase is Phase.DRAFT_EXTEND else 70
    news = tuple(draw(st.lists(st.integers(1, news_max), min_size=bs, max_size=bs)))
    return Shape(phase, hkv, group, draw(st.sampled_from([16, 32, 64])),
                 draw(st.integers(0, 2)), draw(st.sampled_from(PLATFORMS)), lens, news, tokens,
                 draw(st.booleans()), draw(st.integers(0, 2**16)))


def _valid_rows(case: Case) -> torch.Tensor | None:
    """draft_extend's padding queries (``i >= extend_lens``) are ignored by the caller."""
    batch = case.batch
    if batch.phase is not Phase.DRAFT_EXTEND:
        return None
    assert batch.extend_lens is not None and batch.spec is not None
    t = batch.spec.draft_extend_len
    return (torch.arange(t)[None, :] < batch.extend_lens[:, None]).flatten()


def _check(shape: Shape) -> None:
    case = build(shape)
    got = run(case)
    assert got.shape == case.q.shape and got.dtype == case.q.dtype
    # All rows, draft_extend's padding queries too: the table defines what they attend.
    assert_close(case, got, reference(case).to(got.dtype))


# --- numerics per phase ------------------------------------------------------------

@SETTINGS
@given(shapes(Phase.DECODE, max_len=256))
def test_decode_matches_reference(shape: Shape) -> None:
    _check(shape)


@SETTINGS
@given(shapes(Phase.DRAFT_DECODE))
def test_draft_decode_matches_reference(shape: Shape) -> None:
    _check(shape)


@SETTINGS
@given(shapes(Phase.PREFILL, max_len=150))
def test_prefill_matches_reference(shape: Shape) -> None:
    _check(shape)


@SETTINGS
@given(shapes(Phase.TARGET_VERIFY))
def test_target_verify_matches_reference(shape: Shape) -> None:
    _check(shape)


@SETTINGS
@given(shapes(Phase.DRAFT_EXTEND))
def test_draft_extend_matches_reference(shape: Shape) -> None:
    _check(shape)


def _fixed(phase: Phase, **kw: object) -> Shape:
    base: dict[str, object] = dict(phase=phase, num_kv_heads=2, group=4, head_size=32, dtype_index=0,
                                   platform="cpu", lens=(70, 5), news=(3, 2), tokens=4, tree=True,
                                   seed=7)
    base.update(kw)
    return Shape(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype_index", [0, 1, 2], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("phase", list(Phase), ids=[p.value for p in Phase])
def test_every_phase_every_dtype(phase: Phase, dtype_index: int) -> None:
    """Deterministic coverage of each (phase, dtype) pair whatever hypothesis draws."""
    _check(_fixed(phase, dtype_index=dtype_index))


@pytest.mark.parametrize("head_size", [128, 256])
def test_large_head_sizes(head_size: int) -> None:
    for phase in (Phase.DECODE, Phase.TARGET_VERIFY):
        _check(_fixed(phase, head_size=head_size, lens=(40,), news=(1,), dtype_index=1))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_kv_cache_dtype_differs_from_query_dtype(phase: Phase) -> None:
    """An fp32 cache with fp16 queries: K/V are cast to the query's dtype in the kernel."""
    case = build(_fixed(phase, dtype_index=0))
    cfg = case.backend.config
    half = AttentionConfig(cfg.num_q_heads, cfg.num_kv_heads, cfg.head_size, torch.float16)
    case = Case(TritonBackend(half, case.backend.pool, platform=parse("cpu")), case.batch,
                case.q.half(), case.rows, case.attended)
    got = run(case)
    assert got.dtype == torch.float16
    assert_close(case, got, reference(case).to(got.dtype))


def test_fallback_row_runs() -> None:
    """An unknown arch's fallback blocks (BLOCK_N 32, 8 splits) give the same answers."""
    with pytest.warns(UserWarning, match="gfx1100"):
        for phase in (Phase.DECODE, Phase.PREFILL):
            _check(_fixed(phase, platform="hip:gfx1100"))


# --- issue 12 features: page size, fp8, window, soft-cap, sinks ----------------------

#: Each feature alone on every phase (interpreter row), then all of them at once with an
#: fp8 cache on simulated targets (their real rows: block sizes, split counts).
FEATURES = {
    "page16": dict(page_size=16),
    "window2": dict(window=2, lens=(70, 5)),  # smaller than the tree depth: masks draft keys too
    "softcap": dict(softcap=3.0),
    "sinks": dict(sinks=True),
    # e5m2 has no flavour, so the fast interpreter row serves it; e4m3 below.
    "all_fp8_e5m2": dict(page_size=64, window=40, softcap=5.0, sinks=True, kv_dtype="fp8_e5m2"),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("phase", list(Phase), ids=[p.value for p in Phase])
def test_features_every_phase(phase: Phase, feature: str) -> None:
    _check(_fixed(phase, **FEATURES[feature]))  # type: ignore[arg-type]


@pytest.mark.parametrize("platform,kv_dtype,phase", [
    ("hip:gfx942", "fp8_e4m3", Phase.DECODE),  # e4m3fnuz
    ("hip:gfx942", "fp8_e4m3", Phase.TARGET_VERIFY),
    ("cuda:sm90", "fp8_e4m3", Phase.DRAFT_EXTEND),  # e4m3fn
])
def test_fp8_cache_in_each_flavour(platform: str, kv_dtype: str, phase: Phase) -> None:
    """fp16 queries over an fp8 cache read as stored * scale (scales 0.5 / 2.0), in the
    target's fp8 flavour; launched with the interpreter's row (the target's own row with
    ATTNHAL_SLOW: fp8 under its many idle split programs costs 3-15 s a case)."""
    target = parse(platform)
    rows = target if SLOW else dataclasses.replace(parse("cpu"), fp8_flavor=target.fp8_flavor)
    shape = _fixed(phase, platform=platform, kv_dtype=kv_dtype, dtype_index=1, lens=(40, 9))
    case = build(shape, platform=rows)
    assert case.backend.pool.dtype == shape.storage(target)
    got = run(case)
    assert_close(case, got, reference(case).to(got.dtype))


def test_fp8_pool_of_the_other_flavour_is_refused() -> None:
    pool = KVPool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=32, dtype=torch.float8_e4m3fnuz,
                  max_reqs=2, max_context_len=16)
    with pytest.raises(ValueError, match="kv_dtype=fp8_e4m3 stored as e4m3fnuz"):
        TritonBackend(AttentionConfig(4, 1, 32, torch.float16), pool, platform=parse("cuda:sm90"))


def test_unclaimed_feature_is_refused_not_ignored() -> None:
    """MLA (v head size != qk head size) is not implemented: construction fails naming it."""
    pool = KVPool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=64, dtype=torch.float16,
                  max_reqs=2, max_context_len=16)
    # The contract refuses what the descriptor does not claim, before the backend's checks.
    with pytest.raises(UnsupportedFeature, match="feature=mla"):
        TritonBackend(AttentionConfig(4, 1, 64, torch.float16, v_head_size=32), pool,
                      platform=parse("cuda:sm90"))


def test_tree_mask_packs_into_int32_words() -> None:
    """40 draft tokens: two mask words per query (bit 31 included, two's complement),
    then the token's depth; packing again into the same buffers (graph replay) gives
    the fresh result."""
    from attnhal_triton.tree_mask import bit_weights, new_tree, pack_tree

    gen = torch.Generator().manual_seed(0)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, 40)]
    mask = torch.stack([tree_mask(parents), torch.ones(40, 40, dtype=torch.bool).tril()])
    tree = new_tree(mask)
    assert tree is not None and tree.shape == (2, 40, 3) and tree.dtype == torch.int32
    unpacked = (tree[..., :2].long().unsqueeze(-1) >> torch.arange(32)) & 1
    assert torch.equal(unpacked.flatten(-2)[..., :40].bool(), mask)
    assert tree[1, :, 2].tolist() == list(range(40))
    assert tree[0, :, 2].tolist() == (mask[0].sum(-1) - 1).tolist()
    out = torch.zeros(2, 40, 3, dtype=torch.int32)
    bits = torch.zeros(2, 40, 64, dtype=torch.int32)
    for m in (mask.flip(0), mask):
        pack_tree(m, out, bits, bit_weights(m.device))
    assert torch.equal(out, tree)


def test_empty_and_unused_splits_are_skipped() -> None:
    """A 200-token and a 10-token row on the interpreter row (split_len 64, at most 4
    splits): 4 and 1 splits; the short row's unused splits are never written, the long
    row's last split is empty by block rounding and stores only lse = -inf."""
    case = build(_fixed(Phase.DECODE, lens=(200, 10), group=1))
    be = case.backend
    be.init_forward_metadata(case.batch)
    meta = be._meta
    assert meta is not None and meta.mid_o is not None and meta.mid_lse is not None
    assert meta.num_splits is not None and meta.num_splits.tolist() == [4, 1]
    meta.mid_o.fill_(float("nan"))
    meta.mid_lse.fill_(float("nan"))
    got = be.forward(case.q, None, None, 0, case.batch)
    assert_close(case, got, reference(case).to(got.dtype))
    lse = meta.mid_lse
    assert lse[1, :, 1:].isnan().all()  # splits past the row's count: untouched
    assert not lse[1, :, 0].isnan().any() and not lse[0].isnan().any()
    # 200 positions in chunks of ceil(200 / 4) -> 64: splits 0-3 hold 64, 64, 64, 8.
    assert not meta.mid_o[0].isnan().any()


def test_split_counts_follow_new_lengths_at_replay() -> None:
    """Graph safety of the per-request split counts: captured with short rows (1 split),
    replayed with long rows (4 splits) under the CPU emulator; equal to the reference."""
    graphs = pytest.importorskip("attnhal.graphs")
    for phase in (Phase.DECODE, Phase.TARGET_VERIFY):
        case_a = build(_fixed(phase, lens=(5, 20), seed=1))
        case_b = build(_fixed(phase, lens=(250, 130), seed=2), pool=case_a.backend.pool,
                       gen=torch.Generator().manual_seed(2))
        backend = case_a.backend
        static, q = _static_copy(case_a.batch), case_a.q.clone()
        backend.init_graph_state(max_bs=2, max_num_tokens=8)
        backend.init_capture_metadata(static)
        meta = backend._meta
        assert meta is not None and meta.num_splits is not None
        assert meta.num_splits.tolist() == [1, 1]
        graph = graphs.EmulatedGraph()
        out = graph.capture(lambda: backend.forward(q, None, None, 0, static))
        assert_close(case_a, out, reference(case_a).to(out.dtype))
        _load(static, case_b.batch)
        q.copy_(case_b.q)
        assert _replay_metadata_allocations(backend, static) == []
        assert meta.num_splits.tolist() == [4, 3]
        graph.replay()
        assert graph.replay_allocations == 0
        assert_close(case_b, out, reference(case_b).to(out.dtype))


def test_rows_with_nothing_to_attend_give_zero_not_nan() -> None:
    """Padded graph rows may carry any seq len (the contract forbids 0 only for real
    rows): the kernels turn an empty row into zeros, never NaN — every split empty."""
    for phase in (Phase.DECODE, Phase.TARGET_VERIFY):
        case = build(_fixed(phase, lens=(130, 70)))
        launches = _launches(case)
        meta = case.backend._meta
        assert meta is not None and meta.num_splits is not None
        assert meta.num_splits.tolist() == [3, 2]  # ceil(seq_len / 64) on the cpu row
        meta.seq_lens.zero_()  # after sizing the splits: every split of every row is empty
        for op, args, kwargs in launches:
            op(*args, **kwargs)
        out = launches[-1][1][0]
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("phase", list(Phase), ids=[p.value for p in Phase])
def test_matches_project_reference(phase: Phase, seed: int) -> None:
    """Second oracle: the conformance kit's batches (:func:`~attnhal.testing.batches.build_case`:
    stale req_to_token tails, scattered slots, zero-length prefills, draft trees, shared draft
    ancestors) from ``tests/reference.py``'s seeded specs, and the package's fp64 reference,
    with K/V written by forward."""
    reference_mod = pytest.importorskip("reference")
    tree = SpecConfig.eagle(3, topk=2, num_draft_tokens=5)
    spec = tree if phase in (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY) else None
    case = build_case(reference_mod.random_spec(
        phase, seed, requests=3, spec=spec, draft_step=seed % 3, num_q_heads=8, num_kv_heads=2, head_size=32,
        dtype=str(DTYPES[seed]).removeprefix("torch.")))
    backend = TritonBackend(case.config, case.pool, platform=parse(PLATFORMS[seed % len(PLATFORMS)]))
    want = reference_mod.expected(case)
    backend.init_forward_metadata(case.batch)
    got = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    tol = backend.capabilities.tolerance(str(got.dtype).removeprefix("torch."))
    torch.testing.assert_close(got.double(), want, atol=tol.atol, rtol=tol.rtol)


def test_agrees_with_torch_backend_when_present() -> None:
    torch_backend = pytest.importorskip("attnhal_torch")
    if not hasattr(torch_backend, "TorchBackend"):
        pytest.skip("attnhal_torch.TorchBackend not written yet")
    for phase in Phase:
        case = build(_fixed(phase))
        other = torch_backend.TorchBackend(case.backend.config, case.backend.pool)
        other.init_forward_metadata(case.batch)
        want = other.forward(case.q, None, None, 0, case.batch)
        assert_close(case, run(case), want, _valid_rows(case))


# --- custom ops ----------------------------------------------------------------------

def _launches(case: Case) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """(op, args, kwargs) of every launch ``case``'s forward makes, recorded (and run)."""
    recorded: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    saved = {name: getattr(ops, name) for name in ("decode_partial", "decode_reduce", "extend")}

    def recorder(op: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            recorded.append((op, args, kwargs))
            op(*args, **kwargs)
        return call

    try:
        for name, op in saved.items():
            setattr(ops, name, recorder(op))
        run(case)
    finally:
        for name, op in saved.items():
            setattr(ops, name, op)
    return recorded


@pytest.mark.parametrize("phase", [Phase.DRAFT_DECODE, Phase.PREFILL, Phase.TARGET_VERIFY],
                         ids=lambda p: p.value)
def test_opcheck(phase: Phase) -> None:
    """Schema, fake and dispatch of each custom op (decode_partial, decode_reduce, extend)."""
    case = build(_fixed(phase, lens=(20, 3), news=(2, 1), tokens=3, num_kv_heads=1))
    for op, args, kwargs in _launches(case):
        torch.library.opcheck(op, args, kwargs)


# --- graph claims: capture and replay under the CPU emulator -------------------------

def _static_copy(batch: ForwardBatch) -> ForwardBatch:
    """A batch whose tensors are fresh static buffers holding ``batch``'s values."""
    spec = batch.spec
    if spec is not None:
        spec = SpecInfo(spec.topk, spec.num_draft_tokens, spec.draft_extend_len,
                        _clone(spec.custom_mask), _clone(spec.draft_path), spec.draft_step)
    return ForwardBatch(batch.phase, batch.req_pool_indices.clone(), batch.seq_lens.clone(),
                        batch.out_cache_loc.clone(), _clone(batch.extend_lens), None, None, spec)


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _load(static: ForwardBatch, batch: ForwardBatch) -> None:
    """What a graph runner does before replay: copy new values into the static tensors."""
    pairs = [(static.req_pool_indices, batch.req_pool_indices), (static.seq_lens, batch.seq_lens),
             (static.out_cache_loc, batch.out_cache_loc), (static.extend_lens, batch.extend_lens)]
    if static.spec is not None and batch.spec is not None:
        pairs += [(static.spec.custom_mask, batch.spec.custom_mask),
                  (static.spec.draft_path, batch.spec.draft_path)]
    for dst, src in pairs:
        if dst is not None and src is not None:
            dst.copy_(src)


def _replay_metadata_allocations(backend: TritonBackend, batch: ForwardBatch) -> list[str]:
    """Run ``init_replay_metadata`` recorded by the emulator, as the conformance kit
    watches it; returns the ops that allocated (a replay must only write into buffers)."""
    from attnhal.graphs import EmulatedGraph
    from attnhal.graphs.emulator import OpKind

    recorder = EmulatedGraph()
    recorder.capture(lambda: backend.init_replay_metadata(batch))
    return sorted({op.name for op in recorder.recorded_ops
                   if op.kind is OpKind.ALLOC or (op.kind is OpKind.FUNCTIONAL and op.fresh)})


GRAPH_PHASES = sorted(TritonBackend.capabilities.graph, key=lambda p: p.value)


#: Every captured phase on the interpreter row; one on a real row (16 splits, the fixed
#: maximum of the static partials, mostly idle programs) unless ATTNHAL_SLOW runs them all.
GRAPH_CASES = ([(p, r) for p in GRAPH_PHASES for r in ("cpu", "cuda:sm90", "hip:gfx90a")] if SLOW else
               [(p, "cpu") for p in GRAPH_PHASES] + [(Phase.TARGET_VERIFY, "cuda:sm90")])


@pytest.mark.parametrize("phase,platform", GRAPH_CASES, ids=lambda v: getattr(v, "value", v))
def test_graph_claims_hold_under_emulator(phase: Phase, platform: str) -> None:
    """Capture on one batch, replay on another of the same shape: equals eager, no allocation."""
    graphs = pytest.importorskip("attnhal.graphs")
    first = _fixed(phase, platform=platform, lens=(33, 90, 2), news=(4, 1, 3), seed=1)
    second = _fixed(phase, platform=platform, lens=(120, 1, 64), news=(2, 4, 1), seed=2)
    case_a = build(first)
    case_b = build(second, pool=case_a.backend.pool, gen=torch.Generator().manual_seed(2))
    backend = case_a.backend
    want_a, want_b = run(case_a), run(case_b)

    static, q = _static_copy(case_a.batch), case_a.q.clone()
    kv = [buf[static.out_cache_loc].clone() for buf in (backend.pool.k[0], backend.pool.v[0])]
    backend.init_graph_state(max_bs=4, max_num_tokens=4 * 8)
    backend.init_capture_metadata(static)
    graph = graphs.EmulatedGraph()
    out = graph.capture(lambda: backend.forward(q, kv[0], kv[1], 0, static))
    valid_a, valid_b = _valid_rows(case_a), _valid_rows(case_b)
    assert_close(case_a, out, want_a, valid_a)

    _load(static, case_b.batch)
    q.copy_(case_b.q)
    for dst, buf in zip(kv, (backend.pool.k[0], backend.pool.v[0])):
        dst.copy_(buf[case_b.batch.out_cache_loc])
    assert _replay_metadata_allocations(backend, static) == []
    graph.replay()
    assert graph.replay_allocations == 0
    assert_close(case_b, out, want_b, valid_b)
    launches = [op.name for op in graph.recorded_ops if op.name.startswith("attnhal_triton::")]
    first = "decode_partial" if phase in (Phase.DECODE, Phase.DRAFT_DECODE) else "extend"
    # Captured phases all split the KV range: partials, then the reduce.
    assert launches == [f"attnhal_triton::{first}", "attnhal_triton::decode_reduce"]


@pytest.mark.parametrize("platform", ["cpu", "cuda:sm80"] if SLOW else ["cpu"])
def test_multi_step_draft_in_one_graph(platform: str) -> None:
    """``multi_step`` claim: attnhal's generic MultiStepDraft over TritonBackend, all steps in
    one emulated graph; the draft path is re-parented in place between steps inside the
    graph, and rewritten again before a replay. Every step matches the fp64 reference."""
    graphs = pytest.importorskip("attnhal.graphs")
    reference_mod = pytest.importorskip("reference")
    from attnhal.backend import MultiStepDraft

    steps, topk = 3, 2
    spec = SpecConfig.eagle(num_steps=steps, topk=topk, num_draft_tokens=4)
    case = build_case(reference_mod.random_spec(Phase.DRAFT_DECODE, 5, spec=spec, prefix_lens=[70, 9],
                                                num_q_heads=8, num_kv_heads=2, head_size=32))
    draft = MultiStepDraft(TritonBackend, case.config, case.pool, spec, platform=parse(platform))
    batch = _static_copy(case.batch)
    assert batch.spec is not None and batch.spec.draft_path is not None
    path, rows = batch.spec.draft_path, batch.batch_size
    reparented = path[:, 0].flip(0).clone()  # branches swap their first ancestor
    qs = [torch.randn(rows, 8, 32) for _ in range(draft.num_forwards)]
    draft.init_graph_state(max_bs=rows, max_num_tokens=rows)
    draft.init_capture_metadata(batch)

    def run_steps() -> list[torch.Tensor]:
        outs = []
        for s, step_batch in enumerate(draft.step_batches(batch)):
            if s == 1:
                path[:, 0].copy_(reparented)
            outs.append(draft.backend(s).forward(qs[s], None, None, 0, step_batch))
        return outs

    def expected(first: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for s in range(draft.num_forwards):
            eager = _static_copy(batch)
            assert eager.spec is not None and eager.spec.draft_path is not None
            eager.spec.draft_step = s
            eager.spec.draft_path[:, 0] = first if s == 0 else reparented
            out.append(reference_attention(
                qs[s], case.pool.k[0], case.pool.v[0], eager, case.pool.req_to_token,
                case.config.sm_scale))
        return out

    original = path[:, 0].clone()
    graph = graphs.EmulatedGraph()
    outs = graph.capture(run_steps)
    for got, want in zip(outs, expected(original)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)

    # Replay with new queries and a new path: every step sees the current values.
    path[:, 0].copy_(original)
    path[:, 1:].copy_(path[:, 1:].flip(0))
    for q in qs:
        q.copy_(torch.randn(q.shape))
    draft.init_replay_metadata(batch)
    graph.replay()
    assert graph.replay_allocations == 0
    for got, want in zip(outs, expected(original)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_spec_phase_forward_makes_no_host_sync() -> None:
    """Capturing the forward of each spec phase raises nothing (the emulator refuses syncs),
    even when the batch was prepared by ``init_forward_metadata`` (eager metadata)."""
    graphs = pytest.importorskip("attnhal.graphs")
    for phase in GRAPH_PHASES:
        case = build(_fixed(phase))
        case.backend.init_forward_metadata(case.batch)
        graphs.EmulatedGraph().capture(
            lambda: case.backend.forward(case.q, None, None, 0, case.batch))


@pytest.mark.parametrize("phase", GRAPH_PHASES, ids=lambda p: p.value)
def test_graph_runner_pads_and_replays(phase: Phase) -> None:
    """The whole path an engine takes: plan -> GraphRunner captures at sizes 2 and 4, pads
    smaller batches with the descriptor's fill value, replays; equal to the fp64 reference."""
    graphs = pytest.importorskip("attnhal.graphs")
    reference_mod = pytest.importorskip("reference")
    from attnhal.backend import MultiStepDraft
    from attnhal.plan import GraphPolicy, PhaseBackends, plan

    spec = SpecConfig() if phase is Phase.DECODE else SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
    # Plan and graphs for a simulated MI200; launch rows of the interpreter (fewer splits,
    # so the interpreted grid stays small: the real rows run in the tests above).
    platform, rows_of = parse("hip:gfx90a"), parse("cpu")
    f32 = torch.float32
    pool = KVPool(num_layers=1, num_slots=600, num_kv_heads=2, head_dim=32, dtype=f32, max_reqs=8,
                  max_context_len=60)
    cfg = AttentionConfig(8, 2, 32)
    kw = dict(num_q_heads=8, num_kv_heads=2, head_size=32, spec=None if phase is Phase.DECODE else spec)
    q_in = ("token", (8, 32), f32)
    if phase is Phase.DRAFT_DECODE:
        draft = MultiStepDraft(TritonBackend, cfg, pool, spec, platform=rows_of)
        step = graphs.PhaseStep(
            metadata=draft, inputs={"q": q_in}, rows_per_request=spec.topk,
            forward=lambda b, x: tuple(draft.backend(s).forward(x["q"], None, None, 0, sb)
                                       for s, sb in enumerate(draft.step_batches(b))))
    else:
        backend = TritonBackend(cfg, pool, platform=rows_of)
        kv_in = ("token", (2, 32), f32)
        step = graphs.PhaseStep(metadata=backend, inputs={"q": q_in, "k": kv_in, "v": kv_in},
                                forward=lambda b, x: backend.forward(x["q"], x["k"], x["v"], 0, b))
    the_plan = plan(spec, platform, PhaseBackends.same(TritonBackend.capabilities, spec),
                    GraphPolicy(batch_sizes=(2, 4)))
    runner = graphs.GraphRunner(the_plan, platform, {phase: step})
    assert runner.captured_sizes(phase) == (2, 4), runner.plan[phase].reasons
    for seed, bs in ((1, 3), (2, 1)):
        case = build_case(reference_mod.random_spec(phase, seed, requests=bs, **kw), pool=pool)
        if phase is Phase.DRAFT_DECODE:
            outs = runner.run(phase, case.batch, {"q": case.q})
            wants = []
            for s in range(draft.num_forwards):
                assert case.batch.spec is not None
                at_step = _static_copy(case.batch)
                at_step.spec.draft_step = s  # type: ignore[union-attr]
                wants.append(reference_attention(
                    case.q, pool.k[0], pool.v[0], at_step, pool.req_to_token, cfg.sm_scale))
        else:
            outs = (runner.run(phase, case.batch, {"q": case.q, "k": case.k, "v": case.v}),)
            wants = [reference_mod.expected(case)]
        for got, want in zip(outs, wants, strict=True):
            torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    stats = runner.summary()[phase]
    assert stats.replays == 2 and stats.replay_allocations == 0 and stats.failure is None
