"""KV pools for cases: how large one must be, an empty one, and random K/V to fill it.

The value draws (:func:`draw_qk`, :func:`draw_v`) are shared with the new tokens' q/k/v
(:func:`~attnhal.testing.cases.new_qkv`), so cached and new K/V have the same magnitudes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from attnhal.backend import KVPool
from attnhal.phases import Phase
from attnhal.platform import Fp8Flavor
from attnhal.testing.cases.recipe import CaseRecipe
from attnhal.testing.oracle import quantize

__all__ = ["PoolSize", "draw_qk", "draw_v", "fill_pool", "make_pool", "pool_size"]


@dataclass(frozen=True)
class PoolSize:
    """What a pool must hold for a set of cases: slots, request rows, context length."""

    num_slots: int
    max_reqs: int
    max_context_len: int

    def union(self, other: PoolSize) -> PoolSize:
        return PoolSize(max(self.num_slots, other.num_slots), max(self.max_reqs, other.max_reqs),
                        max(self.max_context_len, other.max_context_len))


def pool_size(recipe: CaseRecipe, spare: int = 8) -> PoolSize:
    """The smallest pool that holds ``recipe`` (plus ``spare`` context and slots, so that a
    backend reading past a row's end reads stale but valid entries)."""
    seqs, P = recipe.seq_lens(), recipe.page_size
    draft = 0
    if recipe.phase is Phase.DRAFT_DECODE:  # every branch's draft tokens get fresh slots
        draft = recipe.requests * recipe.topk * recipe.required_spec().num_steps
    pages = sum(-(-n // P) for n in seqs) + -(-(draft + spare) // P)
    return PoolSize(num_slots=pages * P, max_reqs=recipe.requests + 1, max_context_len=max(seqs) + spare)


def make_pool(recipe: CaseRecipe, size: PoolSize | None = None, device: str | torch.device = "cpu") -> KVPool:
    """An empty pool shaped for ``recipe`` (heads, head size, dtype, layers) of ``size``.

    ``k``: ``num_layers`` x ``[num_slots + page_size, num_kv_heads, head_size]`` (the padding
    page first), ``v`` the same with ``v_head_size``; fp8 pools get ``k_scale = kv_scale``
    and ``v_scale = 2 kv_scale``.
    """
    size = size or pool_size(recipe)
    pool = KVPool(num_layers=recipe.num_layers, num_slots=size.num_slots, num_kv_heads=recipe.num_kv_heads,
                  head_dim=recipe.head_size, kv_format=recipe.kv_dtype or recipe.dtype,
                  fp8_flavor=Fp8Flavor(recipe.fp8_flavor), max_reqs=size.max_reqs,
                  max_context_len=size.max_context_len, device=device, page_size=recipe.page_size,
                  v_head_dim=recipe.v_head_size)
    if pool.kv_format.scaled:
        pool.k_scale.fill_(recipe.kv_scale)
        pool.v_scale.fill_(2 * recipe.kv_scale)
    return pool


def fill_pool(pool: KVPool, gen: torch.Generator, qk_magnitude: int = 1, v_magnitude: float = 1.0) -> None:
    """Random K/V in every slot of every layer (the padding slot too), in place; K and V
    drawn as :func:`draw_qk` and :func:`draw_v` draw them (see ``CaseRecipe.qk_magnitude``,
    ``v_magnitude``); fp8 caches store them as the oracle quantizes a write (divided by the
    layer's scale, saturated to the format's range)."""
    for caches, scales, draw in ((pool.k, pool.k_scale, partial(draw_qk, magnitude=qk_magnitude)),
                                 (pool.v, pool.v_scale, partial(draw_v, magnitude=v_magnitude))):
        for cache, scale in zip(caches, scales.tolist()):
            values = draw(cache.shape, gen)
            cache.copy_(quantize(values, scale, cache.dtype))


def draw_qk(shape: tuple[int, ...] | torch.Size, gen: torch.Generator, magnitude: int) -> torch.Tensor:
    """float32 ``shape``: unit normal values, or integers in ``[-magnitude, magnitude]`` when ``magnitude > 1``."""
    if magnitude > 1:
        return torch.randint(-magnitude, magnitude + 1, tuple(shape), generator=gen).float()
    return torch.randn(shape, generator=gen)


def draw_v(shape: tuple[int, ...] | torch.Size, gen: torch.Generator, magnitude: float) -> torch.Tensor:
    """float32 ``shape``: unit normal values, or uniform in ``[-magnitude, magnitude]``
    (bounded: near a dtype's range, a normal tail would overflow it)."""
    if magnitude != 1:
        return (torch.rand(shape, generator=gen) * 2 - 1) * magnitude
    return torch.randn(shape, generator=gen)
