"""The example engine's request bookkeeping: KV rows, the pages each request owns, admission.

A request owns whole KV pages: the pages of rejected draft tokens stay its own and are
reused by its next step, so what a request holds (``target_cap``/``draft_cap``, in
positions) can run ahead of what it has committed (``target_len``/``draft_len``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnhal.backend import KVPool

__all__ = ["Request", "admit", "append_slots", "free_row"]


@dataclass
class Request:
    """One request of a ``generate`` call."""

    tokens: list[int]  # prompt + generated
    prompt_len: int
    target_row: int
    draft_row: int = 0
    target_len: int = 0  # tokens in the target's KV cache
    draft_len: int = 0  # tokens in the draft's KV cache
    # Positions whose pages the request owns (pages outlive rejected drafts: reused next step).
    target_cap: int = 0
    draft_cap: int = 0
    index: int = 0  # position in the generate call's prompts

    def owned(self) -> tuple[int, int]:
        """(target, draft) positions whose KV pages the request holds now."""
        return self.target_cap, self.draft_cap


def _pages(positions: int, pool: KVPool) -> int:
    return -(-positions // pool.page_size)


def admit(reqs: Sequence[Request], pools: Sequence[KVPool], end: Callable[[Request], tuple[int, int]],
          stopped: dict[int, str]) -> list[Request]:
    """The requests of ``reqs`` whose next step fits ``pools`` (target, then draft), in order;
    each other one stops, with why in ``stopped[index]``.

    ``end(r)`` is the (target, draft) positions ``r`` may hold during its next step. Checked
    before the step allocates anything, so a full pool never leaves a step half-done: every
    token committed so far stays in the result.
    """
    free = [pool.free_page_count for pool in pools]
    admitted = []
    for r in reqs:
        ends = end(r)
        needs = [max(0, _pages(e, pool) - _pages(o, pool)) for pool, e, o in zip(pools, ends, r.owned())]
        why = [f"context={name}: {e} positions (supported: <= max_context_len={pool.max_context_len})"
               for name, pool, e in zip(("target", "draft"), pools, ends) if e > pool.max_context_len]
        why += [f"kv_pool={name}: a step needs {n} pages, {left} free (supported: a step that fits; "
                "raise max_requests or max_context_len)"
                for name, n, left in zip(("target", "draft"), needs, free) if n > left]
        if why:
            stopped[r.index] = why[0]
            continue
        free = [left - n for left, n in zip(free, needs)]
        admitted.append(r)
    return admitted


def append_slots(pool: KVPool, row: int, start: int, count: int, cap: int,
                 device: torch.device) -> tuple[torch.Tensor, int]:
    """Slots of positions ``start .. start + count - 1`` of ``row``, taking pages up to them
    (the row owns pages for ``cap`` positions); returns the slots and the new cap."""
    have, need = _pages(cap, pool), _pages(start + count, pool)
    if need > have:
        pool.req_to_page[row, have:need] = pool.alloc_pages(need - have).to(torch.int32)
    positions = torch.arange(start, start + count, device=device)
    return pool.slots(torch.full_like(positions, row), positions), max(cap, need * pool.page_size)


def free_row(pool: KVPool, row: int, cap: int) -> None:
    """Give back ``row`` and the pages it owns (``cap`` positions)."""
    pool.free_pages(pool.req_to_page[row, : _pages(cap, pool)].long())
    pool.free_req(row)
