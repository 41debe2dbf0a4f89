"""Planted kernel regressions for the K/V traffic tests (interpreter only).

The interpreter runs a kernel's Python source in its module's globals, so replacing a
``@triton.jit`` helper there changes what every later launch of that module runs.
"""

from __future__ import annotations

import pytest
import triton
import triton.language as tl

from attnhal_triton import kernels, tree_kernels


@triton.jit
def _every_draft_key(seen, j, WORDS_P2: tl.constexpr):
    """The tree verify before the fix: every draft key of the row loaded (same scores)."""
    return j >= 0


def load_every_draft_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant the old tree-verify load in the GQA extend and the MLA kernels: a block loads
    every draft key of its row, whether or not one of its queries sees it."""
    monkeypatch.setattr(kernels, "_seen_keys", _every_draft_key)
    monkeypatch.setattr(tree_kernels, "_seen_keys", _every_draft_key)
