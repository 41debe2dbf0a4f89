"""Planted kernel regressions for the K/V traffic tests (interpreter only).

The interpreter runs a kernel's Python source in its module's globals, so replacing a
``@triton.jit`` helper there changes what every later launch of that module runs.
"""

from __future__ import annotations

import pytest
import triton
import triton.language as tl

from attnhal_triton import kernels, mla_kernels, tree_kernels

_REAL_DRAFT_KEYS = tree_kernels._draft_keys


@triton.jit
def _unmasked_draft_keys(Tree, row, tok, m_ok, pos, ok, prefix, lo_q, seen, q_per_row, MASK_WORDS: tl.constexpr,
                         WORDS_P2: tl.constexpr):
    """The tree verify before the fix: the same scores, but every draft key of the row loaded."""
    allowed, _ = _REAL_DRAFT_KEYS(Tree, row, tok, m_ok, pos, ok, prefix, lo_q, seen, q_per_row, MASK_WORDS,
                                  WORDS_P2)
    return allowed, ok


def load_every_draft_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant the old tree-verify load in the GQA extend and the MLA kernels: a block loads
    every draft key of its row, whether or not one of its queries sees it."""
    monkeypatch.setattr(kernels, "_draft_keys", _unmasked_draft_keys)
    monkeypatch.setattr(mla_kernels, "_draft_keys", _unmasked_draft_keys)
