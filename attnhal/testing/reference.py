"""An obviously correct fp64 attention, written from the masking table of :mod:`attnhal.backend.batch`.

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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import torch

from attnhal.backend import PADDING_REQ, ForwardBatch, KVPool
from attnhal.capabilities import Phase

__all__ = ["attended_slots", "query_tokens", "real_tokens", "reference_attention", "reference_forward"]


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


def attended_slots(batch: ForwardBatch, req_to_token: torch.Tensor, r: int, i: int) -> list[int]:
    """The KV slots query ``i`` of row ``r`` attends, in position order (the table above)."""
    req, seq = int(batch.req_pool_indices[r]), int(batch.seq_lens[r])
    row: list[int] = req_to_token[req].tolist()
    phase = batch.phase
    if phase is Phase.DECODE:
        return row[:seq]
    if phase in (Phase.PREFILL, Phase.DRAFT_EXTEND):
        if batch.extend_lens is None:
            raise ValueError(f"extend_lens=None (supported: a [bs] tensor for {phase.value})")
        prefix = seq - int(batch.extend_lens[r])
        last = prefix + i if phase is Phase.PREFILL else min(prefix + i, seq - 1)
        return row[:last + 1]
    spec = batch._spec()
    if phase is Phase.TARGET_VERIFY:
        T = spec.num_draft_tokens
        prefix = seq - T
        mask = spec.custom_mask
        drafts = [j for j in range(T) if (bool(mask[r, i, j]) if mask is not None else j <= i)]
        return row[:prefix] + [row[prefix + j] for j in drafts]
    if spec.draft_path is None:
        raise ValueError("spec.draft_path=None (supported: [rows, num_steps] slots for draft_decode)")
    return row[:seq] + [int(s) for s in spec.draft_path[r, :spec.draft_step + 1].tolist()]


def reference_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: ForwardBatch, req_to_token: torch.Tensor, scale: float) -> torch.Tensor:
    """fp64 attention of every query token over the slots it attends.

    Parameters
    ----------
    q: ``[num_tokens, H, D]``.
    k_cache, v_cache: ``[slots, KV, D]``, already holding the new tokens' K/V.
    batch, req_to_token: the forward's metadata and the pool's table.
    scale: softmax scale.

    Returns ``[num_tokens, H, D]`` float64 on the CPU. Query head ``h`` reads KV head
    ``h // (H // KV)`` (GQA groups of consecutive query heads); a token that attends
    nothing gets zeros.
    """
    N, H, D = q.shape
    KV = k_cache.shape[1]
    with _one_thread():
        q64 = q.detach().cpu().double().view(N, KV, H // KV, D)  # query heads grouped per KV head
        k_cache, v_cache = k_cache.detach().cpu(), v_cache.detach().cpu()
        host = batch_to_cpu(batch)
        table = req_to_token.cpu()
        out = torch.zeros(N, H, D, dtype=torch.float64)
        for r, i, tok in query_tokens(host):
            slots = torch.tensor(attended_slots(host, table, r, i), dtype=torch.int64)
            if not len(slots):
                continue
            keys, values = k_cache[slots].double(), v_cache[slots].double()  # [n, KV, D]
            probs = torch.softmax(torch.einsum("nkd,kgd->kgn", keys, q64[tok]) * scale, dim=-1)
            out[tok] = torch.einsum("kgn,nkd->kgd", probs, values).reshape(H, D)
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
                      batch: ForwardBatch, pool: KVPool, scale: float) -> torch.Tensor:
    """What ``AttentionBackend.forward(q, k, v, layer, batch)`` must return, without touching
    ``pool``: the new K/V (rounded to the pool's dtype) go into a copy of the layer first.

    ``q``: ``[num_tokens, H, D]``; ``k``, ``v``: ``[num_tokens, KV, D]`` or None (already in
    the pool). Returns ``[num_tokens, H, D]`` float64 on the CPU.
    """
    k_cache, v_cache = pool.k[layer].clone(), pool.v[layer].clone()
    if k is not None and v is not None:
        k_cache.index_copy_(0, batch.out_cache_loc, k.to(pool.dtype))
        v_cache.index_copy_(0, batch.out_cache_loc, v.to(pool.dtype))
    return reference_attention(q, k_cache, v_cache, batch, pool.req_to_token, scale)


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
