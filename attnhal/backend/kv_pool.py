"""Paged KV cache at token granularity (page size 1).

Slot 0 and request row 0 are reserved for padding: a captured graph's padded
rows point at request 0 (whose ``req_to_token`` row is all slot 0) and write
their K/V to slot 0, so they never touch a real request's cache.
"""

from __future__ import annotations

import torch

__all__ = ["KVPool", "PADDING_REQ", "PADDING_SLOT"]

PADDING_SLOT = 0
PADDING_REQ = 0


class KVPool:
    """Per-layer K and V buffers plus the request-to-token table.

    Attributes
    ----------
    k, v: per layer, ``[num_slots, num_kv_heads, head_dim]``.
    req_to_token: ``[max_reqs, max_context_len]`` int32: ``req_to_token[r, p]`` is the
        slot holding position ``p`` of request row ``r``.
    """

    def __init__(self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, max_reqs: int, max_context_len: int,
                 device: str | torch.device = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("max_reqs", max_reqs), ("max_context_len", max_context_len)):
            if value < 1:
                raise ValueError(f"{name}={value} (supported: >= 1)")
        shape = (num_slots + 1, num_kv_heads, head_dim)  # +1: the padding slot
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.req_to_token = torch.zeros((max_reqs + 1, max_context_len), dtype=torch.int32, device=device)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.max_context_len = max_context_len
        self._free_slots = list(range(num_slots, 0, -1))
        self._free_reqs = list(range(max_reqs, 0, -1))

    @property
    def num_slots(self) -> int:
        """Usable slots (the padding slot excluded)."""
        return self.k[0].shape[0] - 1

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K/V ``[num_tokens, num_kv_heads, head_dim]`` at slots ``loc`` ``[num_tokens]``."""
        self.k[layer].index_copy_(0, loc, k.to(self.dtype))
        self.v[layer].index_copy_(0, loc, v.to(self.dtype))

    # Host-side bookkeeping for the engine (never called inside a captured region).
    def alloc_slots(self, n: int) -> torch.Tensor:
        """Take ``n`` free slots; returns ``[n]`` int64 on the pool's device."""
        if n > len(self._free_slots):
            raise RuntimeError(f"KV pool out of slots: asked {n}, free {len(self._free_slots)}")
        taken = [self._free_slots.pop() for _ in range(n)]
        return torch.tensor(taken, dtype=torch.int64, device=self.device)

    def free_slots(self, slots: torch.Tensor) -> None:
        self._free_slots.extend(int(s) for s in slots.tolist() if s != PADDING_SLOT)

    def alloc_req(self) -> int:
        if not self._free_reqs:
            raise RuntimeError("KV pool out of request rows")
        return self._free_reqs.pop()

    def free_req(self, row: int) -> None:
        self.req_to_token[row].zero_()
        self._free_reqs.append(row)

    @property
    def free_slot_count(self) -> int:
        return len(self._free_slots)
