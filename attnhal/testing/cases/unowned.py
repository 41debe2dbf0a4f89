"""Memory no request of the batch wrote: what the kit leaves in it (``CaseRecipe.unowned``).

Engines allocate their K/V pools with ``torch.empty`` (an fp8 pool holds NaN byte
patterns), leave the tail of a request's last page unwritten, keep freed pages full of old
requests' data and pad their page tables with ``-1`` or leave them uninitialised. A kernel
that loads a whole tile and masks after the dot (``NaN * 0 = NaN``), or dereferences a
page-table entry past the row's end, is right on a clean pool and wrong in a server. So
every pool the kit builds fills what the batch does not own:

=========== =========================================== ===========================================
``unowned`` K/V slots the batch does not own                 page-table entries past a row's end
=========== =========================================== ===========================================
``"nan"``   NaN, +inf and -inf in turn, per slot (fp8:   pages no request of the batch owns (an earlier
            NaN bytes; e5m2 also its infinities)         request's, freed): they hold NaN too
``"pad"``   the same                                     ``-1``
``"stale"`` finite values of the pool's draw (another    out-of-range pages (past the pool, up to
            request's data)                              ``2^31 - 1``)
=========== =========================================== ===========================================

What a batch owns: every slot of every position ``< seq_len`` of its rows (the new tokens
included), ``out_cache_loc``, every slot of ``draft_path``, and the padding page (page 0:
padded rows of a captured graph read it and padding tokens write it, with finite values).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from attnhal.backend import PADDING_PAGE, KVPool

__all__ = ["UNOWNED", "spoil_unowned"]

#: What the kit leaves in memory the batch does not own (see the module docs).
UNOWNED = ("nan", "pad", "stale")
#: The largest int32: an uninitialised table entry may hold anything up to it.
_INT32_MAX = 2**31 - 1


def spoil_unowned(pool: KVPool, owned: Iterable[int], rows: dict[int, int], mode: str, seed: int) -> None:
    """Fill what the batch does not own, in place.

    ``owned``: the slots the batch owns (the padding page is added); ``rows``: per request
    row of the batch, its KV length (its table entries past ``ceil(length / page_size)``
    become slack); ``mode``: one of :data:`UNOWNED`; ``seed``: the pages put in the slack.
    """
    if mode not in UNOWNED:
        raise ValueError(f"unowned={mode!r} (supported: {', '.join(UNOWNED)})")
    P = pool.page_size
    table = pool.req_to_page
    slack = torch.zeros(table.shape, dtype=torch.bool)
    for req, length in rows.items():
        slack[req, -(-length // P):] = True
    keep = torch.zeros(pool.k[0].shape[0], dtype=torch.bool)
    keep[PADDING_PAGE * P:(PADDING_PAGE + 1) * P] = True
    keep[torch.tensor(sorted(set(owned)), dtype=torch.int64)] = True
    gen = torch.Generator().manual_seed(seed)
    if mode == "stale":
        pages = torch.randint(pool.num_slots // P + 1, _INT32_MAX, tuple(table.shape), generator=gen,
                              dtype=torch.int32)
    elif mode == "pad":
        pages = torch.full(tuple(table.shape), -1, dtype=torch.int32)
    else:  # pages of which the batch owns no slot (a pool the kit sizes keeps spare ones)
        free = (~keep.view(-1, P).any(1)).nonzero().flatten().to(torch.int32)
        pages = (free[torch.randint(len(free), tuple(table.shape), generator=gen)] if len(free)
                 else torch.full(tuple(table.shape), -1, dtype=torch.int32))
    table.copy_(torch.where(slack, pages, table.cpu()).to(table.device))
    if mode == "stale":
        return  # the pool's own draw stays in every slot
    spoiled = (~keep).nonzero().flatten()
    values = torch.tensor((float("nan"), float("inf"), float("-inf")))[spoiled % 3]
    if not torch.tensor(float("inf")).to(pool.dtype).float().isinf():
        values = torch.full_like(values, float("nan"))  # e4m3 has no infinity (it would saturate): NaN bytes
    for cache in (*pool.k, *pool.v):
        fill = values.view(-1, 1, 1).expand(-1, *cache.shape[1:]).to(cache.dtype)
        _put(cache, spoiled.to(cache.device), fill.to(cache.device))


def _put(cache: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    if cache.dtype.itemsize == 1:  # no fp8 index_copy on every device: move the bytes
        cache.view(torch.uint8).index_copy_(0, index, values.view(torch.uint8))
    else:
        cache.index_copy_(0, index, values)
