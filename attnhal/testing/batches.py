"""The case builders' former module: everything now lives in :mod:`attnhal.testing.cases`.

Kept so that ``from attnhal.testing.batches import CaseSpec, build_case`` goes on working.
"""

from __future__ import annotations

from attnhal._compat import moved
from attnhal.testing.cases import (
    MAX_EXACT_QK,
    QKV_LAYOUTS,
    TORCH_DTYPES,
    Case,
    CaseRecipe,
    CaseSpec,
    PoolSize,
    attention_config,
    build_case,
    fill_pool,
    make_pool,
    new_qkv,
    pool_size,
    reparent_rows,
    tree_mask,
)

moved("attnhal.testing.batches", "attnhal.testing.cases")

__all__ = [
    "MAX_EXACT_QK",
    "QKV_LAYOUTS",
    "TORCH_DTYPES",
    "Case",
    "CaseRecipe",
    "CaseSpec",
    "PoolSize",
    "attention_config",
    "build_case",
    "fill_pool",
    "make_pool",
    "new_qkv",
    "pool_size",
    "reparent_rows",
    "tree_mask",
]
