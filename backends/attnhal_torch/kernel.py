"""Chunked paged attention in plain torch ops: the compute of the torch backend.

Why this shape. Paged attention with page size 1 is bound by reading K/V from
scattered slots. Gathering a whole context and then calling SDPA reads and
writes it twice and allocates as much (≈ 7.5× slower than contiguous SDPA on
CPU). Here the context is cut into chunks of ``C`` KV columns:

* one ``index_select(out=...)`` per chunk gathers that chunk's K (later V) rows
  for *all* batch rows and KV heads into a small buffer that stays in cache;
* GQA is a batched matmul per (row, KV head) with that head's query heads (and
  all query tokens of the row) stacked as the matrix rows — no K/V repeat;
* scores of a *segment* of chunks stay in one fp32 buffer and are softmaxed
  together (one max / exp / sum per segment, not per chunk); segments are
  merged with the online-softmax rescale, so memory stays bounded for any context;
* everything accumulates in fp32 and writes into preallocated buffers
  (``out=``, in-place ops), so the same code is graph-safe: given static
  buffers and a static column count it does no host sync and no allocation.

The masking lives entirely in a :class:`KVLayout` (built once per batch, shared by
all layers): which slot each KV column reads and which (query, column) pairs
are blocked — with one extra mask per sliding-window size, since engines mix
window and full layers. What differs per layer is a :class:`LayerParams`: scale,
window, soft-cap (applied to each chunk's scores), sinks (one more term in each
softmax denominator, added at the end against the final running max) and the fp8
dequantization scales (applied to each gathered chunk as it is widened to fp32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["KVLayout", "LayerParams", "Workspace", "paged_attention", "segment_chunks"]

# Initial running max: finite, so that a fully blocked segment gives
# exp(-inf - (-1e30)) = 0 instead of exp(-inf - -inf) = nan.
_NEG_BIG = -1e30
# Smallest row sum we divide by: rows that attend nothing come out as 0, not nan.
_TINY = 1e-30


@dataclass
class KVLayout:
    """Which KV columns each query attends, for one batch (shared by all layers).

    Attributes
    ----------
    rows: ``[B, Lp]`` int64, ``slot * num_kv_heads`` of KV column ``p`` of row ``b``
        (the index of the slot's first head in the pool viewed as ``[slots * kv_heads, D]``).
        Columns nobody attends point at the padding slot 0.
    blocked: ``[B, T, Lp]`` bool, True where query token ``t`` of row ``b`` must
        not attend column ``p``.
    chunk: ``C``; ``Lp`` is a multiple of it.
    index: optional ``[Lp / C, B * KV * C]`` int64, the gather rows of every chunk
        (``rows + head`` in ``[b, head, c]`` order), precomputed once per batch so
        that layers do not redo it; without it each chunk computes its own.
    mask_from: chunks before this one are attended by every query (no mask to apply).
    windows: per left-window size ``w``, ``[B, T, Lp]`` bool: ``blocked`` plus the
        columns at key positions ``< p - w`` of query position ``p``.
    """

    rows: torch.Tensor
    blocked: torch.Tensor
    chunk: int
    index: torch.Tensor | None = None
    mask_from: int = 0
    windows: dict[int, torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None) -> tuple[torch.Tensor, int]:
        """The blocked mask of a layer with left window ``window`` and its ``mask_from``."""
        if window is None:
            return self.blocked, self.mask_from
        try:
            return self.windows[window], 0  # a window blocks early chunks too
        except KeyError:
            raise ValueError(f"window={window} (supported: {sorted(self.windows)}, the windows "
                             "of the config the layout was built for)") from None

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])

    @property
    def tokens_per_row(self) -> int:
        return int(self.blocked.shape[1])

    @property
    def num_chunks(self) -> int:
        return int(self.rows.shape[1]) // self.chunk

    def row_slice(self, start: int, stop: int) -> KVLayout:
        """Rows ``start:stop`` (views)."""
        index = None
        if self.index is not None:
            per_row = self.index.shape[1] // self.num_rows
            index = self.index[:, start * per_row:stop * per_row]
        windows = {w: m[start:stop] for w, m in self.windows.items()}
        return KVLayout(self.rows[start:stop], self.blocked[start:stop], self.chunk, index, self.mask_from,
                        windows)


@dataclass(frozen=True)
class LayerParams:
    """What one layer's attention adds to the shared layout.

    Attributes
    ----------
    scale: softmax scale. window: left window (``None``: full attention).
    softcap: logits ``s`` become ``cap * tanh(s / cap)``.
    sinks: ``[H]`` float32 sink logits of the layer's query heads, on the cache's device.
    k_scale, v_scale: 0-dim float32 views of the pool's per-layer scales (fp8 caches only):
        read at every call, so a captured graph follows scales set after capture.
    """

    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


class Workspace:
    """Named scratch buffers reused by every forward and every layer.

    ``take`` hands out views of flat buffers, growing them when needed. A
    frozen workspace (graph mode) never grows: its buffers are the ones the
    captured graphs read, so replacing one would leave a graph on stale memory.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.frozen = False
        self._bufs: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def reserve(self, name: str, numel: int, dtype: torch.dtype) -> None:
        """Make buffer ``name`` hold at least ``numel`` elements of ``dtype``."""
        key = (name, dtype)
        buf = self._bufs.get(key)
        if buf is not None and buf.numel() >= numel:
            return
        if self.frozen:
            have = 0 if buf is None else buf.numel()
            raise RuntimeError(
                f"graph workspace buffer {name!r}: needs {numel} elements, has {have} "
                "(supported: batches within init_graph_state(max_bs, max_num_tokens))")
        self._bufs[key] = torch.empty(numel, dtype=dtype, device=self.device)

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = math.prod(shape)
        self.reserve(name, numel, dtype)
        return self._bufs[(name, dtype)][:numel].view(shape)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs.values())


def segment_chunks(num_chunks: int, query_rows: int, chunk: int, budget_bytes: int) -> int:
    """Chunks per softmax segment: as many as fit ``budget_bytes`` of fp32 scores.

    ``query_rows`` = query tokens × query heads of the call.
    """
    per_chunk = query_rows * chunk * 4
    return max(1, min(num_chunks, budget_bytes // max(per_chunk, 1)))


@dataclass
class _Bufs:
    """The scratch views one call uses (see :func:`_take`)."""

    qs: torch.Tensor  # [B*KV, T*G, D] fp32, scaled queries grouped per KV head
    idx: torch.Tensor  # [B, KV, C] int64, rows of the pool viewed [slots*KV, D]
    kv: torch.Tensor  # [B*KV*C * max(D, Dv)] flat, cache dtype (uint8 bytes for fp8), one gathered chunk
    kv32: torch.Tensor  # same in fp32 (the same tensor when the cache is fp32)
    scores: torch.Tensor  # [S, B*KV, T*G, C] fp32, one segment of chunks
    m: torch.Tensor  # [1, B*KV, T*G, 1] running max
    m_seg: torch.Tensor  # [1, B*KV, T*G, 1] segment max / new max
    alpha: torch.Tensor  # [1, B*KV, T*G, 1] rescale of earlier segments
    l: torch.Tensor  # [1, B*KV, T*G, 1] running sum
    l_seg: torch.Tensor  # [1, B*KV, T*G, 1]
    acc: torch.Tensor  # [B*KV, T*G, Dv] fp32 output accumulator
    heads: torch.Tensor  # [1, KV, 1] int64, 0..KV-1


def _gather_dtype(cache_dtype: torch.dtype) -> torch.dtype:
    """fp8 rows are gathered as bytes: index_select has no fp8 kernel on every device."""
    return torch.uint8 if cache_dtype.itemsize == 1 else cache_dtype


def _take(ws: Workspace, B: int, T: int, H: int, KV: int, D: int, Dv: int, C: int, seg: int,
          cache_dtype: torch.dtype) -> _Bufs:
    f32, G = torch.float32, H // KV
    gathered = (B * KV * C * max(D, Dv),)
    kv = ws.take("kv", gathered, _gather_dtype(cache_dtype))
    kv32 = kv if cache_dtype == f32 else ws.take("kv32", gathered, f32)
    stat = (1, B * KV, T * G, 1)
    heads = ws.take("heads", (1, KV, 1), torch.int64)
    return _Bufs(
        qs=ws.take("qs", (B * KV, T * G, D), f32),
        idx=ws.take("idx", (B, KV, C), torch.int64),
        kv=kv, kv32=kv32,
        scores=ws.take("scores", (seg, B * KV, T * G, C), f32),
        m=ws.take("m", stat, f32), m_seg=ws.take("m_seg", stat, f32),
        alpha=ws.take("alpha", stat, f32), l=ws.take("l", stat, f32),
        l_seg=ws.take("l_seg", stat, f32),
        acc=ws.take("acc", (B * KV, T * G, Dv), f32),
        heads=heads,
    )


def reserve_graph_workspace(ws: Workspace, *, max_rows: int, max_tokens: int, num_q_heads: int,
                            num_kv_heads: int, head_size: int, v_head_size: int, chunk: int,
                            budget_bytes: int, cache_dtype: torch.dtype) -> None:
    """Size ``ws`` for any call of up to ``max_rows`` rows and ``max_tokens`` query tokens."""
    f32, H, D, Dv = torch.float32, num_q_heads, head_size, v_head_size
    gathered = max_rows * num_kv_heads * chunk * max(D, Dv)
    ws.reserve("kv", gathered, _gather_dtype(cache_dtype))
    if cache_dtype != f32:
        ws.reserve("kv32", gathered, f32)
    ws.reserve("qs", max_tokens * H * D, f32)
    ws.reserve("acc", max_tokens * H * Dv, f32)
    ws.reserve("idx", max_rows * num_kv_heads * chunk, torch.int64)
    ws.reserve("heads", num_kv_heads, torch.int64)
    for name in ("m", "m_seg", "alpha", "l", "l_seg"):
        ws.reserve(name, max_tokens * H, f32)
    ws.reserve("scores", max(budget_bytes // 4, max_tokens * H * chunk), f32)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    layout: KVLayout, params: LayerParams, ws: Workspace, budget_bytes: int,
                    out: torch.Tensor) -> None:
    """Attention of ``B`` rows × ``T`` query tokens over the KV columns of ``layout``.

    Parameters
    ----------
    q: ``[B * T, H, D]`` (row-major: the ``T`` tokens of row 0 first), any float dtype.
    k_cache: ``[num_slots, KV, D]``, v_cache: ``[num_slots, KV, Dv]``, one layer of the pool.
    layout: the columns and masks (``B`` rows, ``T`` tokens per row).
    params: the layer's scale, window, soft-cap, sinks, fp8 scales.
    out: ``[B * T, H, Dv]``, written in place (its dtype: usually ``q``'s).
    """
    B, T, C = layout.num_rows, layout.tokens_per_row, layout.chunk
    _, H, D = q.shape
    KV, Dv = k_cache.shape[1], v_cache.shape[2]
    G, nch = H // KV, layout.num_chunks
    blocked, mask_from = layout.mask(params.window)
    seg = segment_chunks(nch, B * T * H, C, budget_bytes)
    b = _take(ws, B, T, H, KV, D, Dv, C, seg, k_cache.dtype)
    # [B*T, H, D] -> [B, KV, T, G, D]: the G query heads of each KV head, all tokens.
    b.qs.view(B, KV, T, G, D).copy_(q.reshape(B, T, KV, G, D).permute(0, 2, 1, 3, 4))
    b.qs.mul_(params.scale)
    gather = _Gather(layout, b, k_cache, v_cache, params)
    for s0 in range(0, nch, seg):
        n = min(seg, nch - s0)
        scores = b.scores[:n]
        per_chunk = scores.unbind(0)
        for c in range(n):
            torch.bmm(b.qs, gather.keys(s0 + c), out=per_chunk[c])
        if params.softcap is not None:
            scores.div_(params.softcap).tanh_().mul_(params.softcap)
        if s0 + n > mask_from:
            _mask(scores, blocked, C, max(s0, mask_from), s0, n, B, KV, T, G)
        _softmax_segment(scores, b, first=s0 == 0)
        for c in range(n):
            values = gather.values(s0 + c)
            if s0 == 0 and c == 0:
                torch.bmm(per_chunk[0], values, out=b.acc)
            else:
                b.acc.baddbmm_(per_chunk[c], values)
    if params.sinks is not None:
        _add_sinks(params.sinks, b, B, KV, T, G)
    torch.clamp_min(b.l, _TINY, out=b.l)
    b.acc.div_(b.l[0])
    out.view(B, T, KV, G, Dv).copy_(b.acc.view(B, KV, T, G, Dv).permute(0, 2, 1, 3, 4))


def _add_sinks(sinks: torch.Tensor, b: _Bufs, B: int, KV: int, T: int, G: int) -> None:
    """Each head's denominator gains ``exp(sink - m)`` (``m``: the final running max).

    A row that attended nothing has ``m = -1e30``: the term overflows to inf and the
    output is 0, as the sink carries no value.
    """
    term = b.alpha.view(B, KV, T, G)
    torch.sub(sinks.view(1, KV, 1, G), b.m.view(B, KV, T, G), out=term)
    term.exp_()
    b.l.add_(b.alpha)


class _Gather:
    """Gathers chunk ``c`` of K or V (all rows, all KV heads) into the chunk buffer.

    Views are made once per call, not per chunk: at a few microseconds each
    they would cost as much as the small matmuls they feed.
    """

    def __init__(self, layout: KVLayout, b: _Bufs, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 params: LayerParams) -> None:
        B, C = layout.num_rows, layout.chunk
        KV, D, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[2]
        self.b = b
        raw = _gather_dtype(k_cache.dtype)
        self.k_rows, self.v_rows = k_cache.view(raw).view(-1, D), v_cache.view(raw).view(-1, Dv)
        n = B * KV * C
        # K and V chunks take turns in one buffer (D and Dv differ for MLA).
        self.k_raw, self.v_raw = b.kv[:n * D].view(n, D), b.kv[:n * Dv].view(n, Dv)
        self.k_wide, self.v_wide = b.kv32[:n * D].view(n, D), b.kv32[:n * Dv].view(n, Dv)
        self.matrix_t = self.k_wide.view(B * KV, C, D).transpose(1, 2)
        self.matrix_v = self.v_wide.view(B * KV, C, Dv)
        self.cache_dtype = k_cache.dtype
        self.convert = b.kv32 is not b.kv
        self.k_scale, self.v_scale = params.k_scale, params.v_scale
        if layout.index is not None:
            self.index: tuple[torch.Tensor, ...] | None = layout.index.unbind(0)
        else:
            # Compute each chunk's gather rows from layout.rows (big graph layouts).
            self.index = None
            torch.arange(KV, out=b.heads.view(KV))
            self.cols = layout.rows.view(B, layout.num_chunks, 1, C)
            self.idx_flat = b.idx.view(-1)

    def _chunk(self, rows: torch.Tensor, c: int, raw: torch.Tensor, wide: torch.Tensor,
               scale: torch.Tensor | None) -> None:
        if self.index is not None:
            idx = self.index[c]
        else:
            b = self.b
            torch.add(self.cols[:, c].expand_as(b.idx), b.heads, out=b.idx)
            idx = self.idx_flat
        torch.index_select(rows, 0, idx, out=raw)
        if self.convert:
            wide.copy_(raw.view(self.cache_dtype))
        if scale is not None:
            wide.mul_(scale)

    def keys(self, c: int) -> torch.Tensor:
        """``[B*KV, D, C]``: chunk ``c`` of K, transposed for ``q @ K^T``."""
        self._chunk(self.k_rows, c, self.k_raw, self.k_wide, self.k_scale)
        return self.matrix_t

    def values(self, c: int) -> torch.Tensor:
        """``[B*KV, C, Dv]``: chunk ``c`` of V."""
        self._chunk(self.v_rows, c, self.v_raw, self.v_wide, self.v_scale)
        return self.matrix_v


def _mask(scores: torch.Tensor, blocked: torch.Tensor, C: int, first: int, s0: int, n: int,
          B: int, KV: int, T: int, G: int) -> None:
    """Blocked columns of chunks ``first .. s0+n`` (of the segment ``s0 .. s0+n``) to -inf."""
    k = s0 + n - first
    blocked = blocked[:, :, first * C:(s0 + n) * C]  # [B, T, k*C]
    mask = blocked.view(B, T, k, C).permute(2, 0, 1, 3).view(k, B, 1, T, 1, C)
    scores[first - s0:].view(k, B, KV, T, G, C).masked_fill_(mask, float("-inf"))


def _softmax_segment(scores: torch.Tensor, b: _Bufs, *, first: bool) -> None:
    """Exponentiate one segment's scores against the running max; rescale what came before."""
    torch.amax(scores, dim=(0, 3), keepdim=True, out=b.m_seg)
    if first:
        torch.clamp_min(b.m_seg, _NEG_BIG, out=b.m)
    else:
        torch.maximum(b.m, b.m_seg, out=b.m_seg)
        torch.sub(b.m, b.m_seg, out=b.alpha)
        b.alpha.exp_()
        b.acc.mul_(b.alpha[0])
        b.l.mul_(b.alpha)
        b.m.copy_(b.m_seg)
    scores.sub_(b.m).exp_()
    if first:
        torch.sum(scores, dim=(0, 3), keepdim=True, out=b.l)
    else:
        torch.sum(scores, dim=(0, 3), keepdim=True, out=b.l_seg)
        b.l.add_(b.l_seg)
