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
* ``windowed``: the sum over windows — the programs sharing a logical ``(y, z)``, i.e. the
  head blocks of one (row, KV head, split) — of each window's union (what memory serves when
  only a window's programs share the cache);
* ``distance``: the largest gap, in dispatch order, between two programs behind one L2 that
  load the same address (0: no address is read by two of them);
* ``per_domain``: the sum over L2 domains of the union of the addresses their programs load
  (what the L2s fetch from beyond when each keeps what its programs read; ``unique`` with one
  L2).

Dispatch order is the linear block id, x fastest (``x + X * (y + Y * z)``): CUDA's and HIP's
block/workgroup numbering, which the hardware dispatchers hand out in order in practice (not
a guarantee of either programming guide). On CDNA3/4 (MI300X, MI355X) consecutive workgroups
go round-robin to the 8 XCDs, each with its own L2 (AMD's MI300 tuning guides): with
``domains`` > 1 program ``w`` is the ``w // domains``-th behind L2 ``w % domains``, and the
kernel renumbers programs so that each L2 runs whole windows, or hands of up to
:data:`~attnhal_triton.device_fill.L2_DEAL` programs of a wide one (:func:`logical_rank`, the
kernels' ``l2_order.l2_program``). Where two L2s read one address, the repeat meets in the shared
Infinity Cache, not L2.

This module imports neither torch nor triton (numpy only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhal_triton.device_fill import L2_DEAL

__all__ = ["Reuse", "dispatch_rank", "domain_spread", "logical_rank", "reuse"]


def dispatch_rank(grid: Sequence[int], program: Sequence[int]) -> int:
    """The linear id of ``program`` ``(x, y, z)`` in ``grid`` ``(X, Y, Z)``: x fastest."""
    x, y, z = program
    return x + grid[0] * (y + grid[1] * z)


def logical_rank(rank: Any, grid: Sequence[int], domains: int, deal: int = L2_DEAL) -> Any:
    """The logical id (``x + X * (y + Y * z)``) of the program dispatched ``rank``-th (an int or
    an int array) in ``grid`` ``(X, Y, Z)`` when the hardware deals programs round-robin over
    ``domains`` L2s: the logical order is cut in hands of ``min(X, deal)`` programs, dealt
    round-robin (L2 ``d`` runs hands ``d, d + domains, ...``, each in consecutive turns); the
    last ``hands % domains`` hands keep the grid's order (the kernels' ``l2_order.l2_program``)."""
    hand = min(grid[0], deal)
    turn = rank // domains
    dealt = rank < int(np.prod(grid)) // hand // domains * domains * hand
    return np.where(dealt, (rank % domains + domains * (turn // hand)) * hand + turn % hand, rank)


def domain_spread(grid: Sequence[int], domains: int) -> float:
    """L2 domains per window (the ``grid[0]`` programs sharing a logical ``(y, z)``), on
    average, when the launch's programs are renumbered by :func:`logical_rank`: 1.0 when every
    window is dealt whole, more for windows wider than a hand and for the few hands left in the
    grid's order."""
    programs = int(np.prod(grid))
    ranks = np.arange(programs)
    window = logical_rank(ranks, grid, domains) // grid[0]
    return np.unique(window * domains + ranks % domains).size / (programs // grid[0])


@dataclass(frozen=True)
class Reuse:
    """One launch's K/V bytes: every load, the union, the largest dispatch distance of a repeat
    behind one L2 (programs), the sum of the logical windows' unions and of the L2s' unions."""

    logical: int
    unique: int
    distance: int
    windowed: int = 0
    per_domain: int = 0


def _union(parts: Iterable[np.ndarray]) -> int:
    return int(np.unique(np.concatenate(list(parts))).size)


def reuse(grid: Sequence[int], reads: Mapping[tuple[int, int, int], Iterable[np.ndarray]],
          element_sizes: Iterable[int], domains: int = 1) -> Reuse:
    """:class:`Reuse` of a launch over ``grid`` from ``reads``: per program ``(x, y, z)`` the
    byte addresses of the elements each of its loads read (``element_sizes``: one size),
    dispatched round-robin over ``domains`` L2s and renumbered as :func:`logical_rank` says."""
    sizes = set(element_sizes)
    if len(sizes) > 1:
        raise ValueError(f"element_sizes={sorted(sizes)} (supported: one size per launch)")
    size = sizes.pop() if sizes else 0
    logical, addresses, ranks = 0, [], []
    windows: dict[int, list[np.ndarray]] = {}
    behind: dict[int, list[np.ndarray]] = {}
    for program, loads in reads.items():
        mine = np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in loads] or [np.zeros(0, np.int64)])
        logical += mine.size
        mine = np.unique(mine)
        rank = dispatch_rank(grid, program)
        addresses.append(mine)
        ranks.append(np.full(mine.size, rank, dtype=np.int64))
        windows.setdefault(int(logical_rank(rank, grid, domains)) // grid[0], []).append(mine)
        behind.setdefault(rank % domains, []).append(mine)
    if not addresses or not sum(a.size for a in addresses):
        return Reuse(logical * size, 0, 0, 0, 0)
    windowed = sum(_union(w) for w in windows.values()) * size
    per_domain = sum(_union(b) for b in behind.values()) * size
    # repeats behind one L2, in its own dispatch order: sort by (L2, address, order)
    address, at = np.concatenate(addresses), np.concatenate(ranks)
    order = np.lexsort((at // domains, address, at % domains))
    key = (address * domains + at % domains)[order]
    turn = (at // domains)[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    spread = np.maximum.reduceat(turn, starts) - np.minimum.reduceat(turn, starts)
    return Reuse(logical * size, np.unique(address).size * size, int(spread.max()), windowed, per_domain)
