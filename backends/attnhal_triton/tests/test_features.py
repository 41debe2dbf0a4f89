"""Triton backend features and split machinery, run by the Triton interpreter on CPU.

Page size > 1, fp8 caches read as stored * scale (in each target's fp8 flavour), sliding
window with tree-verify depths, logit soft-cap and sinks, each on every phase against the
conformance kit's fp64 oracle, which applies the same features; refusals of what the
descriptor does not claim; the packed tree mask; and the split machinery (per-request
split counts, skipped and empty splits). Cases in ``triton_cases.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from triton_cases import SLOW, assert_close, build, check, expected, record_launches, run, shape

from attnhal.backend import AttentionConfig, KVPool, UnsupportedFeature, kv_storage_dtype
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.testing.cases import tree_mask
from attnhal_triton import TritonBackend
from attnhal_triton.tree_kernels import _seen_keys

#: Each feature alone on every phase (interpreter row), then all of them at once with an
#: fp8 cache on simulated targets (their real rows: block sizes, split counts).
FEATURES: dict[str, dict[str, Any]] = {
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
    check(shape(phase, **FEATURES[feature]))


@pytest.mark.parametrize("platform,kv_dtype,phase", [
    ("hip:gfx942", "fp8_e4m3", Phase.DECODE),  # e4m3fnuz
    ("hip:gfx942", "fp8_e4m3", Phase.TARGET_VERIFY),
    ("cuda:sm90", "fp8_e4m3", Phase.DRAFT_EXTEND),  # e4m3fn
])
def test_fp8_cache_in_each_flavour(platform: str, kv_dtype: str, phase: Phase) -> None:
    """fp16 queries over an fp8 cache read as stored * scale (scales 0.25 / 0.5), in the
    target's fp8 flavour; launched with the interpreter's row (the target's own row with
    ATTNHAL_SLOW: fp8 under its many idle split programs costs 3-15 s a case)."""
    target = parse(platform)
    rows = target if SLOW else dataclasses.replace(parse("cpu"), fp8_flavor=target.fp8_flavor)
    case, backend = build(shape(phase, platform=platform, kv_dtype=kv_dtype, dtype="float16", lens=(40, 9)),
                          rows=rows)
    assert case.pool.dtype == kv_storage_dtype(kv_dtype, target.fp8_flavor)
    assert float(case.pool.k_scale[0]) != 1 and float(case.pool.v_scale[0]) != 1
    assert_close(backend, run(case, backend), expected(case, backend))


def test_fp8_pool_of_the_other_flavour_is_refused() -> None:
    pool = KVPool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=32, dtype=torch.float8_e4m3fnuz,
                  max_reqs=2, max_context_len=16)
    with pytest.raises(ValueError, match="kv_dtype=fp8_e4m3 stored as e4m3fnuz"):
        TritonBackend(AttentionConfig(4, 1, 32, torch.float16), pool, platform=parse("cuda:sm90"))


def test_unserved_mla_shape_is_refused_not_ignored() -> None:
    """A v head size the MLA kernel does not serve (32 under a qk head of 64; it serves 576/512
    and 576/576): construction fails naming both sizes and what is served."""
    pool = KVPool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=64, dtype=torch.float16,
                  max_reqs=2, max_context_len=16)
    # The contract refuses what the descriptor does not claim, before the backend's checks.
    with pytest.raises(UnsupportedFeature, match=r"head_size/v_head_size=64/32 \(supported: 576/512"):
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
    case, be = build(shape(Phase.DECODE, lens=(200, 10), group=1))
    be.init_forward_metadata(case.batch)
    meta = be._meta
    assert meta is not None and meta.mid_o is not None and meta.mid_lse is not None
    assert meta.num_splits is not None and meta.num_splits.tolist() == [4, 1]
    meta.mid_o.fill_(float("nan"))
    meta.mid_lse.fill_(float("nan"))
    got = be.forward(case.q, None, None, 0, case.batch)
    assert_close(be, got, expected(case, be, write=False))
    lse = meta.mid_lse
    assert lse[1, :, 1:].isnan().all()  # splits past the row's count: untouched
    assert not lse[1, :, 0].isnan().any() and not lse[0].isnan().any()
    # 200 positions in chunks of ceil(200 / 4) -> 64: splits 0-3 hold 64, 64, 64, 8.
    assert not meta.mid_o[0].isnan().any()


def test_rows_with_nothing_to_attend_give_zero_not_nan() -> None:
    """Padded graph rows may carry any seq len (the contract forbids 0 only for real
    rows): the kernels turn an empty row into zeros, never NaN — every split empty."""
    for phase in (Phase.DECODE, Phase.TARGET_VERIFY):
        case, backend = build(shape(phase, lens=(130, 70)))
        launches = record_launches(case, backend)
        meta = backend._meta
        assert meta is not None and meta.num_splits is not None
        assert meta.num_splits.tolist() == [3, 2]  # ceil(seq_len / 64) on the cpu row
        meta.seq_lens.zero_()  # after sizing the splits: every split of every row is empty
        for op, args, kwargs in launches:
            op(*args, **kwargs)
        out = launches[-1][1][0]
        assert torch.equal(out, torch.zeros_like(out))


@triton.jit
def _seen_probe(Seen, Out, N: tl.constexpr, W: tl.constexpr):
    seen = tl.load(Seen + tl.arange(0, W))
    j = tl.arange(0, N)
    tl.store(Out + j, _seen_keys(seen, j, W).to(tl.int32))


@pytest.mark.parametrize("words", [1, 2, 4])
def test_seen_keys_reads_bit_j_of_word_j_over_32(words: int) -> None:
    """``tree_kernels._seen_keys``, one word at a time (the [N, words] select it replaced spilled
    3.5 KB a thread in fp32 tree verify on NVIDIA): key ``j`` is seen iff bit ``j % 32`` of
    word ``j // 32`` is set, bit 31 included, for every key of 1, 2 and 4 words."""
    gen = torch.Generator().manual_seed(words)
    seen = torch.randint(-(2 ** 31), 2 ** 31 - 1, (words,), generator=gen, dtype=torch.int64).to(torch.int32)
    seen[0] |= torch.tensor(-(2 ** 31), dtype=torch.int32)  # bit 31
    out = torch.zeros(32 * words, dtype=torch.int32)
    _seen_probe[(1,)](seen, out, 32 * words, words)
    want = [(int(seen[j // 32]) >> (j % 32)) & 1 for j in range(32 * words)]
    assert out.tolist() == want
