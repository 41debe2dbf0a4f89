"""The kit's oracle: an obviously correct fp64 attention, written from the masking table of
:mod:`attnhal.backend.batch`.

Correctness over speed: for every query token, :func:`attended_slots` lists the KV
slots it attends, straight from the table, and :func:`reference_attention` runs a
plain softmax over them in float64. The conformance kit compares every backend
against this with the backend's own declared tolerance.

=================  ==========================================================
phase              query ``i`` of row ``r`` attends (positions of its table row)
=================  ==========================================================
``prefill``        ``[0, prefix + i]``, ``prefix = seq_lens - extend_lens``
``decode``         ``[0, seq_lens)``
``target_verify``  ``[0, seq_lens - T)`` plus draft ``j`` where ``custom_mask[r, i, j]``
                   (``j <= i`` without a mask)
``draft_extend``   ``[0, min(prefix + i, seq_lens - 1)]``; ``i >= extend_lens`` are padding
``draft_decode``   ``[0, seq_lens)`` plus slots ``draft_path[r, :draft_step + 1]``
=================  ==========================================================

Features (:class:`LayerFeatures`, from the config): a sliding window drops the keys at
positions ``< p - w`` (query position ``p``, see :func:`attended`); soft-cap maps each
logit ``s`` to ``cap * tanh(s / cap)``; sinks append one logit column per head that
carries no value. Written as a plain softmax over an explicit key list so that the
tests can cross-check it against SDPA with an explicit mask and sink column.

fp8 caches (:func:`quantize`): the new tokens' K/V are stored as ``x / scale`` (in fp32)
**saturated** to the format's largest finite value and rounded to nearest, in every
flavour — e4m3fn at ±448, e4m3fnuz at ±240, e5m2 at ±57344 — never as NaN or inf,
whatever the bare conversion of the flavour does past its range (torch's e4m3fn
conversion saturates, its e4m3fnuz one gives NaN, its e5m2 one inf). Attention reads
``stored * scale`` with the layer's scale at the time of the forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from attnhal.backend import PADDING_REQ, AttentionConfig, ForwardBatch, KVPool
from attnhal.phases import Phase

__all__ = ["LayerFeatures", "attended", "attended_slots", "batch_to_cpu", "quantize", "query_tokens", "real_tokens",
           "reference_attention", "reference_forward", "store"]


def query_tokens(batch: ForwardBatch) -> list[tuple[int, int, int]]:
    """``(row r, query i, index of the token in q)`` for every query token of ``batch``."""
    if batch.phase is Phase.PREFILL:
        if batch.extend_lens is None:
            raise ValueError("extend_lens=None (supported: a [bs] tensor for prefill)")
        out, start = [], 0
        for r, n in enumerate(batch.extend_lens.tolist()):
            out += [(r, i, start + i) for i in range(n)]
            start += n
        return out
    per_row = batch.tokens_per_row or 1
    return [(r, i, r * per_row + i) for r in range(batch.batch_size) for i in range(per_row)]


def real_tokens(batch: ForwardBatch) -> list[int]:
    """Indices of the query tokens whose output the caller reads.

    Leaves out ``draft_extend`` padding tokens (``i >= extend_lens[r]``) and every token of
    a graph runner's padded rows (``req_pool_indices[r] == PADDING_REQ``).
    """
    reqs = batch.req_pool_indices.tolist()
    ext = batch.extend_lens.tolist() if batch.phase is Phase.DRAFT_EXTEND and batch.extend_lens is not None else None
    return [tok for r, i, tok in query_tokens(batch)
            if reqs[r] != PADDING_REQ and (ext is None or i < ext[r])]


def attended_slots(batch: ForwardBatch, table: torch.Tensor, r: int, i: int) -> list[int]:
    """The KV slots query ``i`` of row ``r`` attends, in position order (the table above).

    ``table``: the token table ``[rows, max_context_len]`` (:meth:`KVPool.token_table`).
    """
    return [slot for slot, _ in attended(batch, table, r, i)[0]]


def attended(batch: ForwardBatch, table: torch.Tensor, r: int, i: int) -> tuple[list[tuple[int, int]], int]:
    """``([(slot, key position), ...], query position)`` of query ``i`` of row ``r``.

    Positions follow :class:`~attnhal.backend.AttentionConfig`: a draft token of
    ``target_verify`` sits at ``prefix + depth`` (``depth`` = drafts it attends, itself
    included, minus one), a ``draft_decode`` path token ``j`` at ``seq_lens + j``.
    """
    req, seq = int(batch.req_pool_indices[r]), int(batch.seq_lens[r])
    row: list[int] = table[req].tolist()
    phase = batch.phase
    if phase is Phase.DECODE:
        return list(zip(row[:seq], range(seq))), seq - 1
    if phase in (Phase.PREFILL, Phase.DRAFT_EXTEND):
        if batch.extend_lens is None:
            raise ValueError(f"extend_lens=None (supported: a [bs] tensor for {phase.value})")
        prefix = seq - int(batch.extend_lens[r])
        last = prefix + i if phase is Phase.PREFILL else min(prefix + i, seq - 1)
        return list(zip(row[:last + 1], range(last + 1))), last
    spec = batch._spec()
    if phase is Phase.TARGET_VERIFY:
        T = spec.num_draft_tokens
        prefix = max(seq - T, 0)  # a graph's padded rows may carry seq_lens < T (backends clamp too)
        mask = spec.custom_mask

        def drafts_of(x: int) -> list[int]:
            return [j for j in range(T) if (bool(mask[r, x, j]) if mask is not None else j <= x)]

        keys = list(zip(row[:prefix], range(prefix)))
        keys += [(row[prefix + j], prefix + len(drafts_of(j)) - 1) for j in drafts_of(i)]
        return keys, prefix + len(drafts_of(i)) - 1
    if spec.draft_path is None:
        raise ValueError("spec.draft_path=None (supported: [rows, num_steps] slots for draft_decode)")
    path = [int(s) for s in spec.draft_path[r, :spec.draft_step + 1].tolist()]
    return list(zip(row[:seq], range(seq))) + [(s, seq + j) for j, s in enumerate(path)], seq + spec.draft_step


@dataclass(frozen=True)
class LayerFeatures:
    """The optional features of one layer, as :class:`~attnhal.backend.AttentionConfig` states them.

    window: left window ``w`` (keys at positions ``>= p - w``); softcap: ``cap``;
    sinks: ``[H]`` sink logits of the layer's query heads.
    """

    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None

    @classmethod
    def of(cls, config: AttentionConfig, layer: int) -> LayerFeatures:
        sinks = None if config.sinks is None else config.sinks[layer]
        return cls(config.window(layer), config.logit_softcap, sinks)


def reference_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: ForwardBatch, table: torch.Tensor, scale: float,
                        features: LayerFeatures = LayerFeatures()) -> torch.Tensor:
    """fp64 attention of every query token over the slots it attends.

    Parameters
    ----------
    q: ``[num_tokens, H, D]``.
    k_cache, v_cache: ``[slots, KV, D]`` and ``[slots, KV, Dv]``, already holding the new
        tokens' K/V (dequantized: the values attention reads).
    batch, table: the forward's metadata and the pool's token table
        (:meth:`~attnhal.backend.KVPool.token_table`; ``req_to_page`` when ``page_size == 1``).
    scale: softmax scale. features: window, soft-cap and sinks of the layer.

    Returns ``[num_tokens, H, Dv]`` float64 on the CPU. Query head ``h`` reads KV head
    ``h // (H // KV)`` (GQA groups of consecutive query heads); a token that attends
    nothing gets zeros (with sinks: also zeros, the sink carries no value).
    """
    N, H, D = q.shape
    KV, Dv = k_cache.shape[1], v_cache.shape[2]
    G, w = H // KV, features.window
    with _one_thread():
        q64 = q.detach().cpu().double().view(N, KV, G, D)  # query heads grouped per KV head
        k_cache, v_cache = k_cache.detach().cpu(), v_cache.detach().cpu()
        host = batch_to_cpu(batch)
        table = table.cpu()
        sinks = None if features.sinks is None else features.sinks.detach().cpu().double().view(KV, G, 1)
        out = torch.zeros(N, H, Dv, dtype=torch.float64)
        for r, i, tok in query_tokens(host):
            keys, p = attended(host, table, r, i)
            slots = torch.tensor([slot for slot, pos in keys if w is None or pos >= p - w], dtype=torch.int64)
            if not len(slots):
                continue
            k64, v64 = k_cache[slots].double(), v_cache[slots].double()  # [n, KV, D], [n, KV, Dv]
            logits = torch.einsum("nkd,kgd->kgn", k64, q64[tok]) * scale
            if features.softcap is not None:
                logits = features.softcap * torch.tanh(logits / features.softcap)
            if sinks is not None:  # one more softmax column per head, with no value
                logits = torch.cat([logits, sinks], dim=-1)
            probs = torch.softmax(logits, dim=-1)[..., :len(slots)]
            out[tok] = torch.einsum("kgn,nkd->kgd", probs, v64).reshape(H, Dv)
    return out


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    # Thousands of small ops: intra-op threads only add contention (10x slower on a busy host).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference_forward(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                      batch: ForwardBatch, pool: KVPool, scale: float,
                      config: AttentionConfig | None = None) -> torch.Tensor:
    """What ``AttentionBackend.forward(q, k, v, layer, batch)`` must return, without touching
    ``pool``: the new K/V go into a copy of the pool's layer first (as :func:`store` expects
    them stored: fp8 saturated), attention reads the dequantized cache.

    ``q``: ``[num_tokens, H, D]``; ``k``: ``[num_tokens, KV, D]``, ``v``: ``[num_tokens, KV, Dv]``
    or None (already in the pool). ``config``: the layer's window, soft-cap and sinks
    (``None``: none of them). Returns ``[num_tokens, H, Dv]`` float64 on the CPU.
    """
    copy = pool.layer_copy(layer)
    if k is not None and v is not None:
        store(copy, 0, batch.out_cache_loc, k, v)
    k_cache, v_cache = copy.dequantized(0)
    features = LayerFeatures() if config is None else LayerFeatures.of(config, layer)
    return reference_attention(q, k_cache, v_cache, batch, pool.token_table(), scale, features)


def quantize(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a cache of ``dtype`` stores it: fp8 ``dtype``: ``x / scale`` in fp32, saturated
    to ``±torch.finfo(dtype).max`` (the flavour's range: 448, 240, 57344), then rounded;
    any other dtype: ``x`` converted."""
    if dtype.itemsize != 1:
        return x.to(dtype)
    top = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-top, top).to(dtype)


def store(pool: KVPool, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write the new tokens' ``k``/``v`` at slots ``loc`` of ``layer`` as the oracle expects them
    stored (:func:`quantize` with the layer's scales): what a forward must leave in the cache."""
    for cache, x, scale in ((pool.k[layer], k, pool.k_scale[layer]), (pool.v[layer], v, pool.v_scale[layer])):
        stored = quantize(x, scale, cache.dtype)
        if cache.dtype.itemsize == 1:  # no fp8 index_copy on every device: move the bytes
            cache.view(torch.uint8).index_copy_(0, loc, stored.view(torch.uint8))
        else:
            cache.index_copy_(0, loc, stored)


def batch_to_cpu(batch: ForwardBatch) -> ForwardBatch:
    """``batch`` with its tensors on the CPU (the same object when they already are)."""
    if batch.req_pool_indices.device.type == "cpu":
        return batch
    def cpu(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.cpu()

    spec = batch.spec and replace(batch.spec, custom_mask=cpu(batch.spec.custom_mask),
                                  draft_path=cpu(batch.spec.draft_path))
    return replace(batch, req_pool_indices=batch.req_pool_indices.cpu(), seq_lens=batch.seq_lens.cpu(),
                   out_cache_loc=batch.out_cache_loc.cpu(), extend_lens=cpu(batch.extend_lens), spec=spec)
