# mypy: disable-error-code="no-untyped-def"
"""The Triton kernel of MLA (DeepSeek's absorbed attention) over the paged latent cache.

MLA keeps one KV "head" per position: a latent row of ``D_MAIN = 512`` values plus a rope
part of ``D_TAIL = 64`` (K = the 576-wide row), and V = the latent part. Its q heads (16 with
TP 8 to 128 with TP 1) all read that one stream, so the work of a (row, KV split) is a block
of ``BLOCK_M`` flattened (query token, q head) rows against tiles of ``BLOCK_N`` positions:

* the 576 = 512 + 64 head is two power-of-two tiles (``tl.arange`` needs powers of two):
  the QK dot is ``q[:, :512] @ k[:, :512]^T + q[:, 512:] @ k[:, 512:]^T``;
* each position's row is loaded once per program: ``[BLOCK_N, 512]`` (coalesced, row
  major) and ``[64, BLOCK_N]``; with ``V_IN_K`` (the pool's V is a view of K's first 512
  columns: one latent tensor) the same latent tile is V, so no second load; otherwise V is
  its own ``[BLOCK_N, D_V]`` load of the separate V tensor;
* ``V_TAIL``: V is as wide as K (a 576 head that is not MLA, e.g. GQA with head 576), its
  last 64 columns a second accumulator.

One kernel serves every phase, like the GQA ``extend_kernel`` whose masking rules it
shares (causal ``qpos = min(prefix + i, kv_len - 1)``, the packed tree mask of target
verify, the sliding window, soft-cap, sinks): decode and draft decode are one query token
per row, and draft decode's path (``HAS_EXTRA``: ``num_extra`` slots per row from
``Extra`` after the row's ``SeqLens`` committed positions) is read through the same tile
loop. ``SPLIT``: the KV range of a row is cut into ``NumSplits[r]`` whole-tile chunks
whose (o, lse) partials the GQA ``decode_reduce_kernel`` merges; else Out is written.

Imported lazily by :mod:`attnhal_triton.mla_ops` (``TRITON_INTERPRET=1`` before import to run
on CPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnhal_triton.kernels import _LOG2E, _fp16_pow2, _paged_slots, _row_queries, _tanh
from attnhal_triton.l2_order import HAND, l2_program
from attnhal_triton.tree_kernels import _draft_keys, _seen_words, _tree_depth

__all__ = ["mla_kernel"]


@triton.jit
def _tile(q_main, q_tail, K, V, slot, ok, kv_head, qk_scale, softcap,
          stride_kt, stride_kh, stride_vt, stride_vh,
          D_MAIN: tl.constexpr, D_TAIL: tl.constexpr, V_IN_K: tl.constexpr, V_TAIL: tl.constexpr,
          HAS_SOFTCAP: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Base-2 scores [M, N] of one tile of positions, and its V as (main [N, D_MAIN], tail
    [N, D_TAIL]); the latent tile is read once and serves as V with ``V_IN_K``."""
    offs_main = tl.arange(0, D_MAIN)
    offs_tail = D_MAIN + tl.arange(0, D_TAIL)
    k_row = K + slot * stride_kt + kv_head * stride_kh
    latent = tl.load(k_row[:, None] + offs_main[None, :], mask=ok[:, None], other=0.0)
    rope = tl.load(k_row[None, :] + offs_tail[:, None], mask=ok[None, :], other=0.0)
    if V_IN_K:
        v_main = latent
    else:
        v_row = V + slot * stride_vt + kv_head * stride_vh
        v_main = tl.load(v_row[:, None] + offs_main[None, :], mask=ok[:, None], other=0.0)
    if V_TAIL:
        if V_IN_K:
            v_tail = tl.trans(rope)
        else:
            v_tail = tl.load(v_row[:, None] + offs_tail[None, :], mask=ok[:, None], other=0.0)
    else:
        v_tail = v_main  # unused: no tail accumulator
    if DOT_F32:
        s = tl.dot(q_main.to(tl.float32), tl.trans(latent.to(tl.float32)), input_precision=DOT_PRECISION)
        s = tl.dot(q_tail.to(tl.float32), rope.to(tl.float32), s, input_precision=DOT_PRECISION)
    else:
        s = tl.dot(q_main, tl.trans(latent.to(q_main.dtype)), input_precision=DOT_PRECISION)
        s = tl.dot(q_tail, rope.to(q_tail.dtype), s, input_precision=DOT_PRECISION)
    if HAS_SOFTCAP:
        # qk_scale is sm_scale / cap here and softcap is cap * log2(e) (ops.py).
        s = softcap * _tanh(s * qk_scale)
    else:
        s = s * qk_scale
    return s, v_main.to(q_main.dtype), v_tail.to(q_main.dtype)


@triton.jit
def _step(s, v_main, v_tail, m_i, l_i, acc, acc_tail, V_TAIL: tl.constexpr, DOT_F32: tl.constexpr,
          DOT_PRECISION: tl.constexpr):
    """One tile of the online softmax over both accumulators."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all -inf row: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        acc = tl.dot(p, v_main.to(tl.float32), acc * alpha[:, None], input_precision=DOT_PRECISION)
        if V_TAIL:
            acc_tail = tl.dot(p, v_tail.to(tl.float32), acc_tail * alpha[:, None],
                              input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(p.to(v_main.dtype), v_main, acc * alpha[:, None], input_precision=DOT_PRECISION)
        if V_TAIL:
            acc_tail = tl.dot(p.to(v_tail.dtype), v_tail, acc_tail * alpha[:, None],
                              input_precision=DOT_PRECISION)
    return m_new, l_i, acc, acc_tail


@triton.jit
def _attend(q_main, q_tail, K, V, slot, ok, allowed, kv_head, qk_scale, softcap, m_i, l_i, acc, acc_tail,
            K_ROW: tl.constexpr, D_K: tl.constexpr, V_ROW: tl.constexpr, D_V: tl.constexpr,
            D_MAIN: tl.constexpr, D_TAIL: tl.constexpr, V_IN_K: tl.constexpr, V_TAIL: tl.constexpr,
            HAS_SOFTCAP: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One tile of positions at ``slot`` [N] (loaded where ``ok``), scored where ``allowed``
    [M, N]: the online softmax's new (m, l, acc, acc_tail)."""
    s, v_main, v_tail = _tile(q_main, q_tail, K, V, slot, ok, kv_head, qk_scale, softcap, K_ROW, D_K, V_ROW,
                              D_V, D_MAIN, D_TAIL, V_IN_K, V_TAIL, HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
    s = tl.where(allowed, s, float("-inf"))
    return _step(s, v_main, v_tail, m_i, l_i, acc, acc_tail, V_TAIL, DOT_F32, DOT_PRECISION)


@triton.jit
def _store(Out, MidO, MidLse, Sinks, acc, acc_tail, m_i, l_i, token, heads, m_ok, split, max_splits,
           s_lo, s_hi, n_splits, NUM_Q_HEADS: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
           D_V: tl.constexpr, V_TAIL: tl.constexpr, SPLIT: tl.constexpr, HAS_SINKS: tl.constexpr):
    """The program's (o, lse) partials (``SPLIT``) or its output rows (sinks applied)."""
    offs_main = tl.arange(0, D_MAIN)
    offs_tail = D_MAIN + tl.arange(0, D_TAIL)
    if SPLIT:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        cell = (token * NUM_Q_HEADS + heads) * max_splits + split  # [M] (token, head, split)
        filled = (m_ok & (token * 0 + s_lo < s_hi))[:, None]
        tl.store(MidO + cell[:, None] * D_V + offs_main[None, :], acc / l_safe[:, None], mask=filled)
        if V_TAIL:
            tl.store(MidO + cell[:, None] * D_V + offs_tail[None, :], acc_tail / l_safe[:, None], mask=filled)
        tl.store(MidLse + cell, m_i + tl.log2(l_safe), mask=m_ok & (token * 0 + split < n_splits))
    else:
        if HAS_SINKS:
            # The sink joins the denominator only: exp(sink) with no value.
            sink = tl.load(Sinks + heads, mask=m_ok, other=0.0) * _LOG2E
            m_new = tl.maximum(m_i, sink)
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            acc_tail = acc_tail * alpha[:, None]
            l_i = l_i * alpha + tl.exp2(sink - m_new)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out_rows = (token * NUM_Q_HEADS + heads) * D_V
        tl.store(Out + out_rows[:, None] + offs_main[None, :],
                 (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=m_ok[:, None])
        if V_TAIL:
            tl.store(Out + out_rows[:, None] + offs_tail[None, :],
                     (acc_tail / l_safe[:, None]).to(Out.dtype.element_ty), mask=m_ok[:, None])


#: Integers the JIT does not specialise (see ``kernels.EXTEND_RUNTIME_INTS``).
MLA_RUNTIME_INTS = ("window", "q_per_row", "max_splits", "num_extra", "stride_req", "stride_extra")


@triton.jit(do_not_specialize=MLA_RUNTIME_INTS)
def mla_kernel(
    Q, K, V, Out, MidO, MidLse, ReqToPage, ReqIdx, SeqLens, NumSplits, QoIndptr, ExtLens,
    Tree, Extra, KScale, VScale, Sinks,
    qk_scale, softcap, window, q_per_row, max_splits, num_extra,
    stride_qt, stride_qh, stride_req, stride_extra,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    V_IN_K: tl.constexpr, V_TAIL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    L2_DOMAINS: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PACKED: tl.constexpr, HAS_EXT_LENS: tl.constexpr, HAS_EXTRA: tl.constexpr,
    USE_MASK: tl.constexpr, MASK_WORDS: tl.constexpr, SPLIT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, KV_SCALED: tl.constexpr,
    KV_F16: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """MLA attention of one (block of flattened query rows, row, KV head, split).

    Q ``[tokens, Hq, D_MAIN + D_TAIL]``; K ``[slots, Hkv, D_MAIN + D_TAIL]`` contiguous; V
    ``[slots, Hkv, D_V]`` contiguous with ``D_V = D_MAIN (+ D_TAIL with V_TAIL)`` (ignored with
    ``V_IN_K``); ``Hkv = NUM_Q_HEADS // GROUP``; Out
    ``[tokens, Hq, D_V]``, MidO ``[tokens, Hq, max_splits, D_V]``, MidLse ``[tokens, Hq,
    max_splits]`` contiguous. ``L2_DOMAINS``: the L2s the hardware deals programs to
    (:func:`~attnhal_triton.l2_order.l2_program`). Row ``r``'s queries, prefix, tree and splits as in
    ``kernels.extend_kernel``; with ``HAS_EXTRA`` the row's keys are its ``SeqLens[r]``
    table positions then ``num_extra`` slots ``Extra[r, :num_extra]`` (draft decode's path),
    and its KV length is their sum.
    """
    D_V: tl.constexpr = D_MAIN + D_TAIL * V_TAIL
    # Contiguous caches (a separate V, or V inside K's rows): strides from the constexpr shapes
    # keep scalar registers free (fp32 draft decode ran out of SGPRs on gfx942 with them as arguments).
    D_K: tl.constexpr = D_MAIN + D_TAIL
    K_ROW: tl.constexpr = NUM_Q_HEADS // GROUP * D_K
    V_ROW: tl.constexpr = NUM_Q_HEADS // GROUP * D_V
    m_block, row, z = l2_program(L2_DOMAINS, HAND)
    row = row.to(tl.int64)
    kv_head = z // max_splits
    split = z % max_splits

    req_row = ReqToPage + tl.load(ReqIdx + row).to(tl.int64) * stride_req
    page_len = tl.load(SeqLens + row)
    kv_len = page_len + num_extra
    extra_row = Extra + row * stride_extra
    q_start, n_q, ext = _row_queries(row, QoIndptr, ExtLens, q_per_row, PACKED, HAS_EXT_LENS)
    prefix = kv_len - ext

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = offs_m // GROUP
    m_ok = tok < n_q
    heads = kv_head * GROUP + offs_m % GROUP
    WORDS_P2: tl.constexpr = triton.next_power_of_2(MASK_WORDS)
    if USE_MASK:  # before q: the draft keys one of the block's queries sees
        seen = _seen_words(Tree, row, tok, m_ok, q_per_row, MASK_WORDS, WORDS_P2)
    else:
        seen = 0
    q_rows = Q + (q_start + tok) * stride_qt + heads * stride_qh
    q_main = tl.load(q_rows[:, None] + tl.arange(0, D_MAIN)[None, :], mask=m_ok[:, None], other=0.0)
    q_tail = tl.load(q_rows[:, None] + D_MAIN + tl.arange(0, D_TAIL)[None, :], mask=m_ok[:, None], other=0.0)
    v_scale = 1.0
    if KV_SCALED:  # an fp8 cache: K's scale joins the score scale, V's the accumulator
        qk_scale = qk_scale * tl.load(KScale)
        v_scale = tl.load(VScale)
    if KV_F16:  # dots in fp16 as kernels._kv_scaled; one power of two for both q tiles, whose dots sum
        pow2 = tl.minimum(_fp16_pow2(q_main), _fp16_pow2(q_tail))
        q_main = (q_main.to(tl.float32) * pow2).to(tl.float16)
        q_tail = (q_tail.to(tl.float32) * pow2).to(tl.float16)
        qk_scale = qk_scale / pow2

    # [lo, shared) is seen by every query of the block but for the window; [shared, hi) is
    # masked per query (causal diagonal or the tree's draft keys).
    first_tok = m_block * BLOCK_M // GROUP
    has_rows = first_tok < n_q
    if USE_MASK:
        qpos = prefix + _tree_depth(Tree, row, tok, m_ok, q_per_row, MASK_WORDS)
        hi = kv_len
        seen_by_all = prefix
    else:
        qpos = tl.minimum(prefix + tok, kv_len - 1)
        last_tok = tl.minimum(((m_block + 1) * BLOCK_M - 1) // GROUP, n_q - 1)
        hi = tl.minimum(prefix + last_tok + 1, kv_len)
        seen_by_all = prefix + first_tok
    hi = tl.where(has_rows, hi, 0)
    shared = tl.minimum(tl.maximum(seen_by_all, 0), hi)
    lo_q = tl.where(window >= 0, qpos - window, 0)
    lo = tl.minimum(tl.maximum(tl.min(tl.where(m_ok, lo_q, hi), 0), 0), hi)
    n_splits = 1
    if SPLIT:
        n_splits = tl.load(NumSplits + row)
        chunk = tl.cdiv(tl.cdiv(hi - lo, tl.maximum(n_splits, 1)), BLOCK_N) * BLOCK_N
        s_lo = lo + split * chunk
        s_hi = tl.where(split < n_splits, tl.minimum(s_lo + chunk, hi), s_lo)
    else:
        s_lo = lo
        s_hi = hi

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_MAIN], tl.float32)
    acc_tail = tl.zeros([BLOCK_M, D_TAIL], tl.float32)
    if HAS_EXTRA:
        # Draft decode: one query, which sees its whole row (but the window): the table's
        # positions, then the path's slots, one mask each (fp32 with a separate V ran out of
        # SGPRs on gfx942 with both masks and the diagonal loop).
        table_hi = tl.minimum(s_hi, page_len)
        for n0 in range(s_lo, table_hi, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            ok = pos < table_hi
            slot = _paged_slots(req_row, pos, ok, PAGE_SIZE)
            m_i, l_i, acc, acc_tail = _attend(
                q_main, q_tail, K, V, slot, ok, ok[None, :] & (pos[None, :] >= lo_q[:, None]), kv_head, qk_scale,
                softcap, m_i, l_i, acc, acc_tail, K_ROW, D_K, V_ROW, D_V, D_MAIN, D_TAIL, V_IN_K, V_TAIL,
                HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
        for n0 in range(tl.maximum(s_lo, page_len), s_hi, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            ok = pos < s_hi
            slot = tl.load(extra_row + (pos - page_len), mask=ok, other=0).to(tl.int64)
            m_i, l_i, acc, acc_tail = _attend(
                q_main, q_tail, K, V, slot, ok, ok[None, :] & (pos[None, :] >= lo_q[:, None]), kv_head, qk_scale,
                softcap, m_i, l_i, acc, acc_tail, K_ROW, D_K, V_ROW, D_V, D_MAIN, D_TAIL, V_IN_K, V_TAIL,
                HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
    else:
        for n0 in range(s_lo, tl.minimum(s_hi, shared), BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            ok = pos < shared
            slot = _paged_slots(req_row, pos, ok, PAGE_SIZE)
            m_i, l_i, acc, acc_tail = _attend(
                q_main, q_tail, K, V, slot, ok, ok[None, :] & (pos[None, :] >= lo_q[:, None]), kv_head, qk_scale,
                softcap, m_i, l_i, acc, acc_tail, K_ROW, D_K, V_ROW, D_V, D_MAIN, D_TAIL, V_IN_K, V_TAIL,
                HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
        for n0 in range(tl.maximum(s_lo, shared), s_hi, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            ok = pos < s_hi
            if USE_MASK:  # draft keys: only those some row of the block sees are loaded
                allowed, ok = _draft_keys(Tree, row, tok, m_ok, pos, ok, prefix, lo_q, seen, q_per_row, MASK_WORDS,
                                          WORDS_P2)
            else:
                allowed = (pos[None, :] <= qpos[:, None]) & ok[None, :] & (pos[None, :] >= lo_q[:, None])
            slot = _paged_slots(req_row, pos, ok, PAGE_SIZE)
            m_i, l_i, acc, acc_tail = _attend(
                q_main, q_tail, K, V, slot, ok, allowed, kv_head, qk_scale, softcap, m_i, l_i, acc, acc_tail,
                K_ROW, D_K, V_ROW, D_V, D_MAIN, D_TAIL, V_IN_K, V_TAIL, HAS_SOFTCAP, DOT_F32, DOT_PRECISION)

    _store(Out, MidO, MidLse, Sinks, acc * v_scale, acc_tail * v_scale, m_i, l_i, q_start + tok, heads,
           m_ok, split, max_splits, s_lo, s_hi, n_splits, NUM_Q_HEADS, D_MAIN, D_TAIL, D_V, V_TAIL, SPLIT,
           HAS_SINKS)
