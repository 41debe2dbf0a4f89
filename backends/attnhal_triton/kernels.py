# mypy: disable-error-code="no-untyped-def"
# (Triton kernels take untyped tensors/pointers; their types live in the signatures triton infers.)
"""Triton attention kernels over a paged (page size 1) KV cache.

Imported lazily (first forward, or the compile check): importing this module
imports triton. ``TRITON_INTERPRET=1`` must be set before this import for the
kernels to run on CPU, since triton reads it when ``@triton.jit`` decorates.

Kernels
-------
``decode_partial_kernel``
    split-KV stage 1 of ``decode`` and ``draft_decode``. Grid
    ``(rows, num_kv_heads * head_blocks, num_splits)``: one program per row, KV
    head (all of its query heads, padded to ``BLOCK_H >= 16`` so ``tl.dot`` applies)
    and KV split. Writes the split's normalised partial output and its base-2
    log-sum-exp.
``decode_reduce_kernel``
    stage 2: merges the splits of one (row, query head) with their log-sum-exp.
``extend_kernel``
    ``prefill``, ``target_verify`` and ``draft_extend``. Grid
    ``(rows, num_kv_heads, m_blocks)``: one program per row, KV head and block of
    ``BLOCK_M`` flattened (query token, query head of the group) pairs, so short
    speculative rows still fill a ``tl.dot`` tile.

All softmax arithmetic is fp32 in base 2 (scores are pre-multiplied by
``sm_scale * log2(e)``). Masked scores are ``-inf``; a row with nothing to attend
yields 0, never NaN (padded graph rows may have any length).

``DOT_F32`` casts the dot operands to fp32: the interpreter computes bf16 ``tl.dot``
on raw bit patterns (triton-lang/triton#11584), so bf16 runs through this path
under the interpreter only. ``tl.dot`` uses ``input_precision="ieee"`` so that
fp32 inputs are not rounded to tf32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton.runtime.interpreter import InterpretedFunction

__all__ = ["INTERPRETED", "decode_partial_kernel", "decode_reduce_kernel", "extend_kernel"]


@triton.jit
def _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One KV block of the online softmax: ``s`` [M, N] base-2 scores, ``v`` [N, D]."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with every score -inf so far keeps m = -inf; subtract 0 instead to avoid NaN.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
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
def _load_kv(q, K, V, req_row, pos, ok, kv_head, qk_scale,
             stride_kt, stride_kh, stride_vt, stride_vh,
             HEAD_DIM: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Gather K/V of positions ``pos`` [N] through ``req_row`` (a req_to_token row pointer).

    Returns base-2 scores ``q @ k^T`` [M, N] (fp32; masked-out positions not yet -inf)
    and ``v`` [N, D].
    """
    offs_d = tl.arange(0, HEAD_DIM)
    slot = tl.load(req_row + pos, mask=ok, other=0).to(tl.int64)
    k = tl.load(K + slot[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
                mask=ok[None, :], other=0.0)
    if DOT_F32:
        s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision=DOT_PRECISION)
    else:
        s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION)
    # K and V in q's dtype: a cache of another dtype costs a cast, not a mixed dot.
    v = tl.load(V + slot[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                mask=ok[:, None], other=0.0).to(q.dtype)
    return s * qk_scale, v


@triton.jit
def decode_partial_kernel(
    Q, K, V, MidO, MidLse, ReqToToken, ReqIdx, SeqLens, Extra,
    qk_scale, num_extra, num_splits,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    stride_req, stride_extra,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Stage 1: partial attention of one (row, KV head, head block, split).

    Q ``[rows, Hq, D]``; K, V ``[slots, Hkv, D]``; MidO ``[rows, Hq, S, D]`` fp32;
    MidLse ``[rows, Hq, S]`` fp32 (base 2); ReqToToken ``[reqs, ctx]``; ReqIdx, SeqLens
    ``[rows]``; Extra ``[rows, >= num_extra]`` slots attended after the prefix
    (``draft_decode``'s draft path; ``num_extra == 0`` for ``decode``).
    """
    row = tl.program_id(0).to(tl.int64)
    head_blocks: tl.constexpr = (GROUP + BLOCK_H - 1) // BLOCK_H
    kv_head = tl.program_id(1) // head_blocks
    split = tl.program_id(2)

    req_row = ReqToToken + tl.load(ReqIdx + row).to(tl.int64) * stride_req
    prefix_len = tl.load(SeqLens + row)
    total = prefix_len + num_extra
    # Split lengths are whole KV blocks, so short rows leave trailing splits empty
    # instead of running many partial blocks.
    chunk = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, total)
    prefix_end = tl.minimum(end, prefix_len)

    offs_g = (tl.program_id(1) % head_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    # The committed prefix, gathered through req_to_token.
    for n0 in range(start, prefix_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < prefix_end
        s, v = _load_kv(q, K, V, req_row, pos, ok, kv_head, qk_scale,
                        stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM, DOT_F32, DOT_PRECISION)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)
    # Extra slots (draft path) of the split's part of [prefix_len, total): at most
    # one short block, gathered through the row's Extra.
    extra_row = Extra + row * stride_extra - prefix_len
    for n0 in range(tl.maximum(start, prefix_len), end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < end
        s, v = _load_kv(q, K, V, extra_row, pos, ok, kv_head, qk_scale,
                        stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM, DOT_F32, DOT_PRECISION)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o_ptrs = MidO + row * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(o_ptrs, acc / l_safe[:, None], mask=head_ok[:, None])
    # An empty split stores lse = -inf, which stage 2 weighs as 0.
    tl.store(MidLse + row * stride_lb + heads * stride_lh + split, m_i + tl.log2(l_safe),
             mask=head_ok)


@triton.jit
def decode_reduce_kernel(
    MidO, MidLse, Out, num_splits,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_outt, stride_outh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Stage 2: Out ``[rows, Hq, D]`` = splits of MidO merged by their log-sum-exp."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < num_splits
    lse = tl.load(MidLse + row * stride_lb + head * stride_lh + offs_s, mask=s_ok,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))
    o = tl.load(MidO + row * stride_ob + head * stride_oh + offs_s[:, None] * stride_os
                + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(Out + row * stride_outt + head * stride_outh + offs_d,
             out.to(Out.dtype.element_ty))


@triton.jit
def _row_queries(row, QoIndptr, ExtLens, q_per_row, PACKED: tl.constexpr,
                 HAS_EXT_LENS: tl.constexpr):
    """(first query token, query tokens, new tokens) of ``row``."""
    if PACKED:
        q_start = tl.load(QoIndptr + row).to(tl.int64)
        n_q = tl.load(QoIndptr + row + 1) - tl.load(QoIndptr + row)
    else:
        q_start = row * q_per_row
        n_q = q_per_row + tl.zeros([], tl.int32)
    if HAS_EXT_LENS:
        ext = tl.load(ExtLens + row)
    else:
        ext = n_q
    return q_start, n_q, ext


@triton.jit
def extend_kernel(
    Q, K, V, Out, ReqToToken, ReqIdx, SeqLens, QoIndptr, ExtLens, Mask,
    qk_scale, q_per_row,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_outt, stride_outh, stride_req,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PACKED: tl.constexpr, HAS_EXT_LENS: tl.constexpr, USE_MASK: tl.constexpr,
    DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Extend attention of one (row, KV head, block of flattened query rows).

    Q, Out ``[tokens, Hq, D]``; K, V ``[slots, Hkv, D]``. Row ``r``'s queries are
    tokens ``QoIndptr[r]..QoIndptr[r+1]`` (``PACKED``) or ``r*T..r*T+T`` with
    ``T = q_per_row``. New tokens ``ext`` are ``ExtLens[r]`` (``HAS_EXT_LENS``) or the
    query count; ``prefix = SeqLens[r] - ext``. Query ``i`` attends positions
    ``p <= min(prefix + i, SeqLens[r] - 1)``, or with ``USE_MASK``: ``p < prefix``
    and draft ``j = p - prefix`` where ``Mask[r, i, j]`` (uint8 ``[rows, T, T]``).
    """
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    m_block = tl.program_id(2)

    req_row = ReqToToken + tl.load(ReqIdx + row).to(tl.int64) * stride_req
    kv_len = tl.load(SeqLens + row)
    q_start, n_q, ext = _row_queries(row, QoIndptr, ExtLens, q_per_row, PACKED, HAS_EXT_LENS)
    prefix = kv_len - ext

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = offs_m // GROUP
    m_ok = tok < n_q
    heads = kv_head * GROUP + offs_m % GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + tok) * stride_qt + heads * stride_qh
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :], mask=m_ok[:, None], other=0.0)

    # KV ranges this block needs: [0, shared) seen by every query, [shared, hi) masked
    # per query; both empty when the block holds no query of this row.
    has_rows = m_block * BLOCK_M // GROUP < n_q
    last_tok = tl.minimum(((m_block + 1) * BLOCK_M - 1) // GROUP, n_q - 1)
    if USE_MASK:
        hi = kv_len
    else:
        hi = tl.minimum(prefix + last_tok + 1, kv_len)
    hi = tl.where(has_rows, hi, 0)
    shared = tl.minimum(tl.maximum(prefix, 0), hi)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(0, shared, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < shared
        s, v = _load_kv(q, K, V, req_row, pos, ok, kv_head, qk_scale,
                        stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM, DOT_F32, DOT_PRECISION)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)

    limit = tl.minimum(prefix + tok, kv_len - 1)
    mask_rows = Mask + row * q_per_row * q_per_row + tok * q_per_row - prefix
    for n0 in range(shared, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < hi
        s, v = _load_kv(q, K, V, req_row, pos, ok, kv_head, qk_scale,
                        stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM, DOT_F32, DOT_PRECISION)
        if USE_MASK:
            # Positions from ``shared`` on are draft tokens j = pos - prefix in [0, T).
            bits = tl.load(mask_rows[:, None] + pos[None, :], mask=m_ok[:, None] & ok[None, :],
                           other=0)
            allowed = bits != 0
        else:
            allowed = (pos[None, :] <= limit[:, None]) & ok[None, :]
        s = tl.where(allowed, s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, DOT_F32, DOT_PRECISION)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out_rows = (q_start + tok) * stride_outt + heads * stride_outh
    tl.store(Out + out_rows[:, None] + offs_d[None, :],
             (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=m_ok[:, None])


#: True when the kernels above run in the Triton interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED: bool = isinstance(extend_kernel, InterpretedFunction)
