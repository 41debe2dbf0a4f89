"""The tree mask of target verify, packed for the extend kernels: one bit per draft token.

The kernels read one int32 word per 32 draft tokens instead of a byte per token, plus
each draft's depth in the same row of words (see :func:`pack_tree`).
"""

from __future__ import annotations

import torch

__all__ = ["bit_weights", "new_tree", "pack_tree", "word_count"]


def word_count(t: int) -> int:
    """int32 words that hold ``t`` mask bits."""
    return -(-t // 32)


def bit_weights(device: torch.device) -> torch.Tensor:
    """``[32]`` int32 ``1 << k``; bit 31 is int32's sign bit (two's complement words)."""
    return torch.ones(32, dtype=torch.int32, device=device).bitwise_left_shift_(
        torch.arange(32, dtype=torch.int32, device=device))


def new_tree(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Eager batches: the packed tree mask in fresh tensors (see :func:`pack_tree`)."""
    if mask is None:
        return None
    bs, t, _ = mask.shape
    out = torch.empty((bs, t, word_count(t) + 1), dtype=torch.int32, device=mask.device)
    bits = torch.zeros((bs, t, word_count(t) * 32), dtype=torch.int32, device=mask.device)
    return pack_tree(mask, out, bits, bit_weights(mask.device))


def pack_tree(mask: torch.Tensor, out: torch.Tensor, bits: torch.Tensor,
              weights: torch.Tensor) -> torch.Tensor:
    """Tree mask ``[bs, T, T]`` bool -> ``out`` ``[bs, T, W + 1]`` int32, ``W = ceil(T / 32)``.

    Bit ``j % 32`` of word ``j // 32`` of query ``i`` is ``mask[:, i, j]``; word ``W`` is
    draft ``i``'s depth, the number of draft tokens it attends minus one (its KV position
    is ``prefix + depth``). The kernel reads one word per 32 draft tokens instead of a
    byte per token, and one pointer for mask and depths.

    Only in-place and ``out=`` ops, so graph replay allocates nothing: ``bits``
    ``[bs, T, 32 W]`` int32 is scratch whose columns past ``T`` must be zero (they stay
    zero: only the first ``T`` are rewritten), ``weights`` is :func:`bit_weights`.
    """
    bs, t, _ = mask.shape
    words = word_count(t)
    bits[..., :t].copy_(mask)
    weighted = bits.view(bs, t, words, 32).mul_(weights)
    torch.sum(weighted, -1, dtype=torch.int32, out=out[..., :words])  # disjoint bits: sum == OR
    torch.sum(mask, -1, dtype=torch.int32, out=out[..., words]).sub_(1)
    return out
