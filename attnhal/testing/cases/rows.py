"""Batches made from another batch's rows: the metamorphic checks' raw material.

A :class:`~attnhal.testing.cases.Case` built once holds a pool and a batch; the functions
here derive other valid forwards over the same pool without rebuilding it, so that one
request's output can be compared wherever it sits:

* :func:`select_rows` — the rows ``rows`` of a case's batch, in that order (a permutation,
  a sub-batch of one row, or no row at all: the empty batch of an idle rank), with their
  query tokens and new K/V;
* :func:`move_requests` — the same requests in other request rows of the pool (the page
  table's rows moved), as when a finished request's row is taken by another request.

Every derived batch attends exactly what the original attended, so the reference of a
row is the same wherever the row sits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from attnhal.backend import ForwardBatch
from attnhal.testing.cases.build import Case
from attnhal.testing.oracle import query_tokens

__all__ = ["move_requests", "row_tokens", "select_rows"]


def row_tokens(batch: ForwardBatch) -> list[list[int]]:
    """Per row of ``batch``, the indices of its query tokens in ``q`` (padding tokens included)."""
    out: list[list[int]] = [[] for _ in range(batch.batch_size)]
    for r, _, token in query_tokens(batch):
        out[r].append(token)
    return out


def select_rows(case: Case, rows: Sequence[int]) -> Case:
    """``case`` with the batch rows ``rows`` in that order (``[]``: an empty batch).

    Row ``j`` of the result is row ``rows[j]`` of ``case``: its request row, lengths, mask,
    draft path, query tokens and new K/V. ``case.row_slots`` follow.
    """
    batch, index = case.batch, list(rows)
    tokens = [t for r in index for t in row_tokens(batch)[r]]
    picked = torch.tensor(index, dtype=torch.int64, device=batch.seq_lens.device)
    toks = torch.tensor(tokens, dtype=torch.int64, device=case.q.device)

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, picked.to(t.device))

    spec = batch.spec
    if spec is not None:
        spec = replace(spec, custom_mask=pick(spec.custom_mask), draft_path=pick(spec.draft_path))
    host = batch.extend_lens_cpu
    new = ForwardBatch(batch.phase, pick(batch.req_pool_indices), pick(batch.seq_lens),  # type: ignore[arg-type]
                       batch.out_cache_loc.index_select(0, toks.to(batch.out_cache_loc.device)),
                       extend_lens=pick(batch.extend_lens),
                       extend_lens_cpu=None if host is None else [host[r] for r in index],
                       seq_lens_cpu=pick(batch.seq_lens_cpu), spec=spec)
    q, k, v = (x.index_select(0, toks) for x in (case.q, case.k, case.v))
    return replace(case, batch=new, q=q, k=k, v=v, row_slots=[case.row_slots[r] for r in index])


def move_requests(case: Case, shift: int = 1) -> Case:
    """``case`` with every request in another row of the page table: the request of row
    ``i`` (of ``n`` used rows) moves to row ``(i + shift) % n``'s place.

    The pool's ``req_to_page`` is rewritten in place (rows not used by the batch keep
    their stale entries); what each batch row attends is unchanged. ``draft_decode``
    branches of one request move together.
    """
    batch, table = case.batch, case.pool.req_to_page
    used = sorted(set(batch.req_pool_indices.tolist()))
    if len(used) < 2:
        return case
    moved = {old: used[(i + shift) % len(used)] for i, old in enumerate(used)}
    rows = table[used].clone()
    for i, old in enumerate(used):
        table[moved[old]].copy_(rows[i])
    reqs = torch.tensor([moved[r] for r in batch.req_pool_indices.tolist()], dtype=batch.req_pool_indices.dtype,
                        device=batch.req_pool_indices.device)
    return replace(case, batch=replace(batch, req_pool_indices=reqs))
