"""Deterministic builders of valid forwards: a :class:`CaseRecipe` in, a :class:`Case` out.

A :class:`CaseRecipe` (:mod:`.recipe`) is a small frozen record of everything that
defines one attention forward. :func:`build_case` (:mod:`.build`) turns it into tensors
following the per-phase layout of :mod:`attnhal.backend.batch`, in a pool sized and
filled by :mod:`.pools`.

The hypothesis strategies of :mod:`attnhal.testing.strategies` draw recipes, so a shrunk
counterexample prints as one readable record that :func:`build_case` rebuilds exactly.
"""

from __future__ import annotations

from attnhal.testing.cases.build import Case, attention_config, build_case, new_qkv, reparent_rows, tree_mask
from attnhal.testing.cases.pools import PoolSize, draw_qk, draw_v, fill_pool, make_pool, pool_size
from attnhal.testing.cases.recipe import MAX_EXACT_QK, QKV_LAYOUTS, TORCH_DTYPES, CaseRecipe

__all__ = [
    "MAX_EXACT_QK",
    "QKV_LAYOUTS",
    "TORCH_DTYPES",
    "Case",
    "CaseRecipe",
    "PoolSize",
    "attention_config",
    "build_case",
    "draw_qk",
    "draw_v",
    "fill_pool",
    "make_pool",
    "new_qkv",
    "pool_size",
    "reparent_rows",
    "tree_mask",
]
