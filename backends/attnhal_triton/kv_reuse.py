"""Which K/V reads of a launch repeat, and how far apart its programs make the repeats, in the
order a GPU dispatches them.

A program that cannot hold every q head of a row reads the row once per block of heads (MLA
at 128 heads: the fp32 accumulator of 128 heads x 512 is 256 KiB, an H100 SM's whole register
file; docs/triton_mla.md). Whether a repeat costs memory bandwidth depends on when it comes:
the blocks of one (row, KV head, split) that are dispatched together read each tile at about
the same time, so the second read finds it in the cache. From the addresses every program of
a launch loaded (:func:`attnhal_triton.kv_traffic.kv_loads` with ``per_program``):

* ``logical``: every live lane of every load (what the caches serve);
* ``unique``: the union of all programs' addresses (what memory serves when every repeat of
  the launch hits the cache);
* ``windowed``: the sum over windows — the programs sharing ``(y, z)`` of the grid, i.e. the
  head blocks of one (row, KV head, split) — of each window's union (what memory serves when
  only a window's programs share the cache);
* ``distance``: the largest gap, in dispatch order, between two programs that load the same
  address (0: no address is read by two programs).

Dispatch order is the linear block id, x fastest (``x + X * (y + Y * z)``): CUDA's and HIP's
block/workgroup numbering, which the hardware dispatchers hand out in order in practice (not
a guarantee of either programming guide). On CDNA3/4 consecutive workgroups go to different
XCDs, each with its own L2; there a repeat within the distance meets in the shared Infinity
Cache, not L2.

This module imports neither torch nor triton (numpy only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Reuse", "dispatch_rank", "reuse"]


def dispatch_rank(grid: Sequence[int], program: Sequence[int]) -> int:
    """The linear id of ``program`` ``(x, y, z)`` in ``grid`` ``(X, Y, Z)``: x fastest."""
    x, y, z = program
    return x + grid[0] * (y + grid[1] * z)


@dataclass(frozen=True)
class Reuse:
    """One launch's K/V bytes: every load, the union, and the largest dispatch distance of a
    repeat (programs)."""

    logical: int
    unique: int
    distance: int
    windowed: int = 0


def reuse(grid: Sequence[int], reads: Mapping[tuple[int, int, int], Iterable[np.ndarray]],
          element_sizes: Iterable[int]) -> Reuse:
    """:class:`Reuse` of a launch over ``grid`` from ``reads``: per program ``(x, y, z)`` the
    byte addresses of the elements each of its loads read (``element_sizes``: one size)."""
    sizes = set(element_sizes)
    if len(sizes) > 1:
        raise ValueError(f"element_sizes={sorted(sizes)} (supported: one size per launch)")
    size = sizes.pop() if sizes else 0
    logical, addresses, ranks = 0, [], []
    windows: dict[tuple[int, int], list[np.ndarray]] = {}
    for program, loads in reads.items():
        mine = np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in loads] or [np.zeros(0, np.int64)])
        logical += mine.size
        mine = np.unique(mine)
        addresses.append(mine)
        ranks.append(np.full(mine.size, dispatch_rank(grid, program), dtype=np.int64))
        windows.setdefault((program[1], program[2]), []).append(mine)
    windowed = sum(np.unique(np.concatenate(w)).size for w in windows.values()) * size
    if not addresses or not sum(a.size for a in addresses):
        return Reuse(logical * size, 0, 0, 0)
    address, rank = np.concatenate(addresses), np.concatenate(ranks)
    order = np.lexsort((rank, address))
    address, rank = address[order], rank[order]
    starts = np.flatnonzero(np.r_[True, address[1:] != address[:-1]])
    spread = np.maximum.reduceat(rank, starts) - np.minimum.reduceat(rank, starts)
    return Reuse(logical * size, starts.size * size, int(spread.max()), windowed)
