# mypy: disable-error-code="no-untyped-def"
"""Triton attention kernels over a paged KV cache (untyped: triton infers the signatures).

Imported lazily (first forward, or the compile check). ``TRITON_INTERPRET=1`` must be set
before this import for the kernels to run on CPU (triton reads it at decoration).

Kernels
-------
``decode_partial_kernel``
    split-KV stage 1 of ``decode`` and ``draft_decode``. Grid ``(rows, num_kv_heads *
    head_blocks, max_splits)``: one program per row, KV head (its query heads padded to
    ``BLOCK_H >= 16`` for ``tl.dot``) and KV split. Row ``r`` uses ``NumSplits[r]`` splits;
    programs past that count do nothing. Writes normalised partials and base-2 log-sum-exps.
``decode_reduce_kernel``
    stage 2 of decode and of the split extend: merges the non-empty splits of one
    (row, query head) with their log-sum-exp (and the head's sink logit).
``extend_kernel``
    ``prefill``, ``target_verify`` and ``draft_extend``. Grid ``(m_blocks, rows,
    num_kv_heads * splits)``: one program per block of ``BLOCK_M`` flattened (query token,
    query head of the group) pairs, row, KV head and KV split (m-blocks on axis 0, whose
    limit is 2**31 - 1). ``SPLIT``: (o, lse) partials for the reduce; else the output.

Softmax arithmetic is fp32 in base 2 (scores pre-multiplied by ``sm_scale * log2(e)``; with
a soft-cap, ``cap * tanh(s / cap)`` first). Masked scores are ``-inf``; a row with nothing to
attend yields 0, never NaN (padded graph rows may have any length). Sliding window: a query
at KV position ``qpos`` attends positions ``>= qpos - window`` (``window < 0``: none).

``DOT_F32``: fp32 dot operands, for bf16 under the interpreter only (it computes bf16
``tl.dot`` on raw bit patterns, triton-lang/triton#11584). ``DOT_PRECISION`` (``"ieee"``)
keeps fp32 inputs from tf32. ``KV_SCALED``: an fp8 cache read as ``stored * scale``: the
stored values, exact in fp16, enter the dots; the scales multiply the fp32 scores (K) and
the accumulator (V); q is never pre-scaled into a narrow type (``_kv_scaled``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from attnhal_triton.l2_order import HAND, l2_program
from attnhal_triton.tree_kernels import _draft_allowed, _seen_keys, _seen_words, _tree_depth

__all__ = ["INTERPRETED", "decode_partial_kernel", "extend_kernel", "decode_reduce_kernel"]

_LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _tanh(x):
    # Vendor-neutral (no libdevice): tanh(x) = 1 - 2 / (e^(2x) + 1); exp2 overflow gives +-1.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


@triton.jit
def _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One KV block of the online softmax: ``s`` [M, N] base-2 scores, ``v`` [N, D]."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all -inf row so far: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        pv = tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _paged_slots(req_row, pos, ok, PAGE_SIZE: tl.constexpr):
    """KV slots of positions ``pos`` [N] of the row whose page-table row is ``req_row``."""
    page = tl.load(req_row + pos // PAGE_SIZE, mask=ok, other=0).to(tl.int64)
    return page * PAGE_SIZE + pos % PAGE_SIZE


@triton.jit
def _scores_and_values(q, K, V, slot, ok, kv_head, qk_scale, softcap,
                       stride_kt, stride_kh, stride_vt, stride_vh,
                       HEAD_DIM: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                       DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Base-2 scores ``q @ k^T * qk_scale`` [M, N] (fp32, masked-out ones not yet -inf)
    and ``v`` [N, D]. V loads before the QK dot so both loads
    overlap it; K and V are cast to q's dtype (a cast, not a mixed dot): fp8 values are exact
    in fp16/bf16, their scales applied outside the loop (``_kv_scaled``)."""
    offs_d = tl.arange(0, HEAD_DIM)
    v = tl.load(V + slot[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                mask=ok[:, None], other=0.0)
    k = tl.load(K + slot[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
                mask=ok[None, :], other=0.0)
    if DOT_F32:
        s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision=DOT_PRECISION)
    else:
        s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION)
    if HAS_SOFTCAP:  # qk_scale is sm_scale / cap here, softcap cap * log2(e) (ops.py)
        s = softcap * _tanh(s * qk_scale)
    else:
        s = s * qk_scale
    return s, v.to(q.dtype)


@triton.jit
def _fp16_pow2(q):
    """The power of two that brings max |q| of the block q [M, D] into [2^13, 2^14): 2^(13 - e)
    for max |q| = 1.x * 2^e, from the exponent bits (exp2 may round). One factor per block,
    not per row: a scalar costs no registers in the KV loop."""
    biased = (tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0).to(tl.int32, bitcast=True) >> 23) & 0xFF
    return (tl.minimum(tl.maximum(267 - biased, 1), 254) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _kv_scaled(q, qk_scale, KScale, VScale, KV_SCALED: tl.constexpr, KV_F16: tl.constexpr):
    """(q, score scale, V's scale): an fp8 cache folds K's scale into the score scale. With
    ``KV_F16`` (fp8 cache, 16-bit q) the dots run in fp16 (the cache widens in one instruction per
    pair, three to bf16): q times ``_fp16_pow2(q)`` (exact, in range), the fp32 scores its inverse."""
    v_scale = 1.0
    if KV_SCALED:
        qk_scale = qk_scale * tl.load(KScale)
        v_scale = tl.load(VScale)
    if KV_F16:
        pow2 = _fp16_pow2(q)
        q = (q.to(tl.float32) * pow2).to(tl.float16)
        qk_scale = qk_scale / pow2
    return q, qk_scale, v_scale


#: Integers the JIT does not specialise (else one kernel per value class: 1, 16k, other); the
#: rest are strides, 16k in every layout: one constexpr set, one kernel (``launch_forms``).
DECODE_RUNTIME_INTS = ("window", "num_extra", "stride_lb", "stride_lh", "stride_req", "stride_extra")
REDUCE_RUNTIME_INTS = ("rows_per_entry", "stride_lb", "stride_lh")
EXTEND_RUNTIME_INTS = ("window", "q_per_row", "max_splits", "stride_req")


@triton.jit(do_not_specialize=DECODE_RUNTIME_INTS)
def decode_partial_kernel(
    Q, K, V, MidO, MidLse, ReqToPage, ReqIdx, SeqLens, NumSplits, Extra, KScale, VScale,
    qk_scale, softcap, window, num_extra, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
    stride_vh, stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_req, stride_extra,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, KV_SCALED: tl.constexpr,
    KV_F16: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Stage 1: partial attention of one (row, KV head, head block, split).

    Q ``[rows, Hq, D]``; K, V ``[slots, Hkv, D]``; MidO ``[rows, Hq, S, D]`` fp32; MidLse
    ``[rows, Hq, S]`` fp32 (base 2); ReqToPage ``[reqs, pages]``; ReqIdx, SeqLens, NumSplits
    ``[rows]``; Extra ``[rows, >= num_extra]`` slots attended after the prefix (draft path)."""
    row = tl.program_id(0).to(tl.int64)
    head_blocks: tl.constexpr = (GROUP + BLOCK_H - 1) // BLOCK_H
    kv_head = tl.program_id(1) // head_blocks
    split = tl.program_id(2)

    n_splits = tl.load(NumSplits + row)
    live = split < n_splits  # programs past the row's split count store nothing
    req_row = ReqToPage + tl.load(ReqIdx + row).to(tl.int64) * stride_req
    prefix_len = tl.load(SeqLens + row)
    total = prefix_len + num_extra
    # The query sits at position total - 1; a window starts its keys at total - 1 - window.
    lo = tl.maximum(tl.where(window >= 0, total - 1 - window, 0), 0)
    # Split lengths are whole KV blocks, so a short row leaves its last splits empty.
    chunk = tl.cdiv(tl.cdiv(total - lo, tl.maximum(n_splits, 1)), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.where(live, tl.minimum(start + chunk, total), start)
    prefix_end = tl.minimum(end, prefix_len)

    offs_g = (tl.program_id(1) % head_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_ok[:, None], other=0.0)
    q, qk_scale, v_scale = _kv_scaled(q, qk_scale, KScale, VScale, KV_SCALED, KV_F16)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    # The committed prefix, through the page table.
    for n0 in range(start, prefix_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < prefix_end
        slot = _paged_slots(req_row, pos, ok, PAGE_SIZE)
        s, v = _scores_and_values(q, K, V, slot, ok, kv_head, qk_scale, softcap,
                                  stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM,
                                  HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)
    # Extra slots (draft path) of the split's part of [prefix_len, total): at most
    # one short block, read straight from the row's Extra.
    extra_row = Extra + row * stride_extra - prefix_len
    for n0 in range(tl.maximum(start, prefix_len), end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < end
        slot = tl.load(extra_row + pos, mask=ok, other=0).to(tl.int64)
        s, v = _scores_and_values(q, K, V, slot, ok, kv_head, qk_scale, softcap,
                                  stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM,
                                  HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)

    # An empty split stores only lse = -inf: the reduce neither weighs nor reads its output
    # (scalar conditions are broadcast to the block: the interpreter rejects 0-d mask terms).
    acc = acc * v_scale
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o_ptrs = MidO + row * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(o_ptrs, acc / l_safe[:, None], mask=(head_ok & (offs_g * 0 + start < end))[:, None])
    tl.store(MidLse + row * stride_lb + heads * stride_lh + split, m_i + tl.log2(l_safe),
             mask=head_ok & (offs_g * 0 + split < n_splits))


@triton.jit(do_not_specialize=REDUCE_RUNTIME_INTS)
def decode_reduce_kernel(
    MidO, MidLse, Out, NumSplits, Sinks, rows_per_entry,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_outt, stride_outh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """Stage 2: Out ``[rows, Hq, D]`` = the non-empty splits of MidO merged by their
    log-sum-exp. Row ``r`` has ``NumSplits[r // rows_per_entry]`` splits; ``Sinks``
    ``[Hq]`` fp32 adds ``exp(sink)`` to each head's denominator."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < tl.load(NumSplits + row // rows_per_entry)
    lse = tl.load(MidLse + row * stride_lb + head * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(Sinks + head) * _LOG2E
        m = tl.maximum(m, sink)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_use)
    filled = s_ok & (lse != float("-inf"))
    o = tl.load(MidO + row * stride_ob + head * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :],
                mask=filled[:, None], other=0.0)
    total = tl.sum(w, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_use)
    out = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(Out + row * stride_outt + head * stride_outh + offs_d, out.to(Out.dtype.element_ty))


@triton.jit
def _row_queries(row, QoIndptr, ExtLens, q_per_row, PACKED: tl.constexpr, HAS_EXT_LENS: tl.constexpr):
    """(first query token, query tokens, new tokens) of ``row``."""
    if PACKED:
        q_start = tl.load(QoIndptr + row).to(tl.int64)
        n_q = tl.load(QoIndptr + row + 1) - tl.load(QoIndptr + row)
    else:
        q_start = row * q_per_row
        n_q = q_per_row + tl.zeros([], tl.int32)
    ext = tl.load(ExtLens + row) if HAS_EXT_LENS else n_q
    return q_start, n_q, ext


@triton.jit(do_not_specialize=EXTEND_RUNTIME_INTS)
def extend_kernel(
    Q, K, V, Out, MidO, MidLse, ReqToPage, ReqIdx, SeqLens, NumSplits, QoIndptr, ExtLens,
    Tree, KScale, VScale, Sinks, qk_scale, softcap, window, q_per_row, max_splits,
    stride_qt, stride_qh, stride_req,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, L2_DOMAINS: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PACKED: tl.constexpr, HAS_EXT_LENS: tl.constexpr,
    USE_MASK: tl.constexpr, MASK_WORDS: tl.constexpr, SPLIT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, KV_SCALED: tl.constexpr,
    KV_F16: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Extend attention of one (block of flattened query rows, row, KV head, split).

    Q, Out ``[tokens, Hq, D]``; K, V ``[slots, Hkv, D]``. Row ``r``'s queries are
    tokens ``QoIndptr[r]..QoIndptr[r+1]`` (``PACKED``) or ``r*T..r*T+T`` with
    ``T = q_per_row``. New tokens ``ext`` are ``ExtLens[r]`` (``HAS_EXT_LENS``) or the
    query count; ``prefix = SeqLens[r] - ext``. Query ``i`` sits at KV position
    ``qpos = min(prefix + i, SeqLens[r] - 1)`` and attends ``p <= qpos``, or with
    ``USE_MASK``: ``p < prefix`` and draft ``j = p - prefix`` where bit ``j % 32`` of
    ``Tree[r, i, j // 32]`` is set (``Tree`` ``[rows, T, MASK_WORDS + 1]`` int32; the last
    word of token ``i`` is its depth); then ``qpos = prefix + depth[i]`` and draft key
    ``j`` sits at ``prefix + depth[j]``. ``SPLIT``: the block's KV range is cut into
    ``NumSplits[r]`` (<= ``max_splits``, the batch's cap) chunks whose (o, lse) partials go
    to MidO ``[tokens, Hq, max_splits, D]`` / MidLse ``[tokens, Hq, max_splits]`` for
    ``decode_reduce_kernel`` (which adds the sinks); otherwise Out is written. The cap is a
    run-time argument (a constexpr would compile one kernel per batch size). Out and the
    partials are contiguous: strides from the constexpr shapes keep scalar registers free
    (the tree form ran out of SGPRs on CDNA). ``L2_DOMAINS``: the L2s the hardware deals
    programs to (:func:`~attnhal_triton.l2_order.l2_program`)."""
    # Contiguous cache [slots, Hkv, D]: a slot's row is Hkv * D elements.
    KV_ROW: tl.constexpr = NUM_Q_HEADS // GROUP * HEAD_DIM
    m_block, row, z = l2_program(L2_DOMAINS, HAND)  # a row's query blocks behind one L2
    row = row.to(tl.int64)
    kv_head = z // max_splits
    split = z % max_splits

    req_row = ReqToPage + tl.load(ReqIdx + row).to(tl.int64) * stride_req
    kv_len = tl.load(SeqLens + row)
    q_start, n_q, ext = _row_queries(row, QoIndptr, ExtLens, q_per_row, PACKED, HAS_EXT_LENS)
    prefix = kv_len - ext

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = offs_m // GROUP
    m_ok = tok < n_q
    heads = kv_head * GROUP + offs_m % GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + tok) * stride_qt + heads * stride_qh
    # Trees of up to 32 tokens load only the draft keys one of the block's queries sees (taken
    # before q); over 32, every draft key (narrowing two words spilled fp32 d256 by 1,984 B).
    seen = 0
    if USE_MASK:
        if MASK_WORDS == 1:
            seen = _seen_words(Tree, row, tok, m_ok, q_per_row, MASK_WORDS, 1)
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    q, qk_scale, v_scale = _kv_scaled(q, qk_scale, KScale, VScale, KV_SCALED, KV_F16)

    # KV ranges this block needs: [lo, shared) seen by every query but for the window,
    # [shared, hi) masked per query; both empty when the block holds no query of this row.
    first_tok = m_block * BLOCK_M // GROUP
    has_rows = first_tok < n_q
    if USE_MASK:
        qpos = prefix + _tree_depth(Tree, row, tok, m_ok, q_per_row, MASK_WORDS)
        hi = kv_len
        seen_by_all = prefix  # draft keys follow the tree
    else:
        qpos = tl.minimum(prefix + tok, kv_len - 1)
        last_tok = tl.minimum(((m_block + 1) * BLOCK_M - 1) // GROUP, n_q - 1)
        hi = tl.minimum(prefix + last_tok + 1, kv_len)
        # Causal: every query of the block sees the positions before its first query, so
        # only the block's diagonal tiles pay for the mask (most of a long prefill).
        seen_by_all = prefix + first_tok
    hi = tl.where(has_rows, hi, 0)
    shared = tl.minimum(tl.maximum(seen_by_all, 0), hi)
    lo_q = tl.where(window >= 0, qpos - window, 0)  # [M] first position each query sees
    lo = tl.minimum(tl.maximum(tl.min(tl.where(m_ok, lo_q, hi), 0), 0), hi)
    if SPLIT:
        n_splits = tl.load(NumSplits + row)
        live = split < n_splits
        chunk = tl.cdiv(tl.cdiv(hi - lo, tl.maximum(n_splits, 1)), BLOCK_N) * BLOCK_N
        s_lo = lo + split * chunk
        s_hi = tl.where(live, tl.minimum(s_lo + chunk, hi), s_lo)
    else:
        s_lo = lo
        s_hi = hi

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(s_lo, tl.minimum(s_hi, shared), BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < shared
        slot = _paged_slots(req_row, pos, ok, PAGE_SIZE)
        s, v = _scores_and_values(q, K, V, slot, ok, kv_head, qk_scale, softcap,
                                  KV_ROW, HEAD_DIM, KV_ROW, HEAD_DIM, HEAD_DIM,
                                  HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
        s = tl.where(ok[None, :] & (pos[None, :] >= lo_q[:, None]), s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)

    for n0 in range(tl.maximum(s_lo, shared), s_hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < s_hi
        if USE_MASK:  # positions from ``shared`` on are draft tokens j = pos - prefix in [0, T)
            if MASK_WORDS == 1:
                ok = ok & _seen_keys(seen, pos - prefix, 1)
        slot = _paged_slots(req_row, pos, ok, PAGE_SIZE)
        s, v = _scores_and_values(q, K, V, slot, ok, kv_head, qk_scale, softcap,
                                  KV_ROW, HEAD_DIM, KV_ROW, HEAD_DIM, HEAD_DIM,
                                  HAS_SOFTCAP, DOT_F32, DOT_PRECISION)
        # The mask after the loads: held across the dots it cost fp32 rows their registers.
        if USE_MASK:
            allowed = _draft_allowed(Tree, row, tok, m_ok, pos, ok, prefix, lo_q, q_per_row, MASK_WORDS)
        else:
            allowed = (pos[None, :] <= qpos[:, None]) & ok[None, :] & (pos[None, :] >= lo_q[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)

    acc = acc * v_scale
    if SPLIT:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        token = q_start + tok
        cell = (token * NUM_Q_HEADS + heads) * max_splits + split  # [M] (token, head, split)
        tl.store(MidO + cell[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None],
                 mask=(m_ok & (tok * 0 + s_lo < s_hi))[:, None])
        tl.store(MidLse + cell, m_i + tl.log2(l_safe), mask=m_ok & (tok * 0 + split < n_splits))
    else:
        if HAS_SINKS:
            # The sink joins the denominator only: exp(sink) with no value.
            sink = tl.load(Sinks + heads) * _LOG2E
            m_new = tl.maximum(m_i, sink)
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha + tl.exp2(sink - m_new)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out_rows = ((q_start + tok) * NUM_Q_HEADS + heads) * HEAD_DIM
        tl.store(Out + out_rows[:, None] + offs_d[None, :],
                 (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=m_ok[:, None])


INTERPRETED: bool = isinstance(extend_kernel, InterpretedFunction)  #: TRITON_INTERPRET=1 at import
