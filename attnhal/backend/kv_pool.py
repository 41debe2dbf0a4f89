"""Paged KV cache: flat slot storage plus a per-request page table.

Layout (the contract every backend reads):

* ``k[layer]``, ``v[layer]``: ``[num_pages_total * page_size, num_kv_heads, head_dim]``,
  indexed by *slot*. Page ``p`` owns slots ``p * page_size .. (p + 1) * page_size - 1``.
* ``req_to_page``: ``[max_reqs + 1, max_pages_per_req]`` int32; token position ``pos`` of
  request row ``r`` lives in slot
  ``req_to_page[r, pos // page_size] * page_size + pos % page_size``.
  With ``page_size == 1`` a page is a slot and ``req_to_page`` is the token table.

Page 0 (slots ``0 .. page_size - 1``) and request row 0 are reserved for padding: a
captured graph's padded rows point at request 0 (whose row is all page 0) and write their
K/V to slot 0, so they never touch a real request's cache.
"""

from __future__ import annotations

import torch

__all__ = ["KVPool", "PADDING_PAGE", "PADDING_REQ", "PADDING_SLOT", "slot_of"]

PADDING_SLOT = 0
PADDING_PAGE = 0
PADDING_REQ = 0


def slot_of(req_to_page: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
            page_size: int) -> torch.Tensor:
    """KV slots of token ``positions`` of request ``rows`` (broadcast together), int64."""
    pages = req_to_page[rows, torch.div(positions, page_size, rounding_mode="floor")].long()
    return pages * page_size + positions % page_size


class KVPool:
    """Per-layer K and V buffers plus the request-to-page table.

    Attributes
    ----------
    k, v: per layer, ``[num_slots + page_size, num_kv_heads, head_dim]`` (the padding page first).
    req_to_page: ``[max_reqs + 1, ceil(max_context_len / page_size)]`` int32.
    page_size: tokens per page.
    """

    def __init__(self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, max_reqs: int, max_context_len: int, page_size: int = 1,
                 device: str | torch.device = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("max_reqs", max_reqs), ("max_context_len", max_context_len),
                            ("page_size", page_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} (supported: an int >= 1)")
        if num_slots % page_size:
            raise ValueError(f"num_slots={num_slots} (supported: a multiple of page_size={page_size})")
        shape = (num_slots + page_size, num_kv_heads, head_dim)  # + the padding page
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        pages_per_req = -(-max_context_len // page_size)
        self.req_to_page = torch.zeros((max_reqs + 1, pages_per_req), dtype=torch.int32, device=device)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device, self.page_size = dtype, torch.device(device), page_size
        self.max_context_len = max_context_len
        num_pages = num_slots // page_size
        self._free_pages = list(range(num_pages, 0, -1))
        self._free_reqs = list(range(max_reqs, 0, -1))

    @property
    def req_to_token(self) -> torch.Tensor:
        """The token table ``[max_reqs + 1, max_context_len]``: ``req_to_page`` when ``page_size == 1``."""
        if self.page_size != 1:
            raise AttributeError(f"req_to_token exists for page_size=1 only (page_size={self.page_size}); "
                                 "read req_to_page")
        return self.req_to_page

    @property
    def num_slots(self) -> int:
        """Usable slots (the padding page excluded)."""
        return self.k[0].shape[0] - self.page_size

    def slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """KV slots of token ``positions`` of request ``rows``; see :func:`slot_of`."""
        return slot_of(self.req_to_page, rows, positions, self.page_size)

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K/V ``[num_tokens, num_kv_heads, head_dim]`` at slots ``loc`` ``[num_tokens]``."""
        self.k[layer].index_copy_(0, loc, k.to(self.dtype))
        self.v[layer].index_copy_(0, loc, v.to(self.dtype))

    # Host-side bookkeeping for the engine (never called inside a captured region).
    def alloc_pages(self, n: int) -> torch.Tensor:
        """Take ``n`` free pages; returns ``[n]`` int64 page ids on the pool's device."""
        if n > len(self._free_pages):
            raise RuntimeError(f"KV pool out of pages: asked {n}, free {len(self._free_pages)}")
        taken = [self._free_pages.pop() for _ in range(n)]
        return torch.tensor(taken, dtype=torch.int64, device=self.device)

    def free_pages(self, pages: torch.Tensor) -> None:
        self._free_pages.extend(int(p) for p in pages.tolist() if p != PADDING_PAGE)

    def alloc_slots(self, n: int) -> torch.Tensor:
        """Take ``n`` free slots (``page_size == 1`` pools: a slot is a page)."""
        self._require_token_pages("alloc_slots")
        return self.alloc_pages(n)

    def free_slots(self, slots: torch.Tensor) -> None:
        self._require_token_pages("free_slots")
        self.free_pages(slots)

    def alloc_req(self) -> int:
        if not self._free_reqs:
            raise RuntimeError("KV pool out of request rows")
        return self._free_reqs.pop()

    def free_req(self, row: int) -> None:
        self.req_to_page[row].zero_()
        self._free_reqs.append(row)

    @property
    def free_page_count(self) -> int:
        return len(self._free_pages)

    @property
    def free_slot_count(self) -> int:
        return len(self._free_pages) * self.page_size

    def _require_token_pages(self, what: str) -> None:
        if self.page_size != 1:
            raise RuntimeError(f"{what} needs page_size=1 (page_size={self.page_size}); use alloc_pages/free_pages")
