# mypy: disable-error-code="no-untyped-def"
"""The draft-token tree of target verify, inside the Triton kernels (GQA ``extend_kernel`` and
``mla_kernel``): each query's packed mask words and depth (``Tree [rows, T, MASK_WORDS + 1]``
int32, the layout of :mod:`attnhal_triton.tree_mask`), and which draft keys a block of queries
loads. Imported by the kernel modules (``TRITON_INTERPRET=1`` before import to run on CPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__: list[str] = []


@triton.jit
def _tree_depth(Tree, row, tok, ok, q_per_row, MASK_WORDS: tl.constexpr):
    """Depths of draft tokens ``tok``: the word after each token's mask words."""
    return tl.load(Tree + (row * q_per_row + tok) * (MASK_WORDS + 1) + MASK_WORDS, mask=ok, other=0)


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _seen_words(Tree, row, tok, m_ok, q_per_row, MASK_WORDS: tl.constexpr, WORDS_P2: tl.constexpr):
    """[WORDS_P2] the OR of the mask words of the block's queries ``tok``: the draft keys one of
    them sees. Once per program, before the KV loop (a reduction over the block's rows inside
    it cost MLA's fp8 tree verify 16 bytes of spill on sm90)."""
    w = tl.arange(0, WORDS_P2)
    words = tl.load(Tree + ((row * q_per_row + tok) * (MASK_WORDS + 1))[:, None] + w[None, :],
                    mask=m_ok[:, None] & (w[None, :] < MASK_WORDS), other=0)
    return tl.reduce(words, 0, _or)


@triton.jit
def _seen_keys(seen, j, WORDS_P2: tl.constexpr):
    """[N] whether draft keys ``j`` are set in ``seen`` (:func:`_seen_words`): the K/V loads
    take it, so a block holding fewer tokens than the tree (a large group) loads its queries'
    ancestors, not every draft key of the row."""
    # One word at a time into an [N] vector: an [N, WORDS_P2] select spilled 3.5 KB a thread in fp32
    # tree verify with two words on cuda:80/90/100 (MLA), and 24 bytes in fp8 at 16 heads on cuda:90.
    mine = j * 0
    for w in tl.static_range(WORDS_P2):
        word = tl.sum(tl.where(tl.arange(0, WORDS_P2) == w, seen, 0), 0)
        mine = tl.where(j // 32 == w, word, mine)
    return ((mine >> (j % 32)) & 1) != 0


@triton.jit
def _draft_allowed(Tree, row, tok, m_ok, pos, ok, prefix, lo_q, q_per_row, MASK_WORDS: tl.constexpr):
    """[M, N] whether queries ``tok`` attend the draft keys at ``pos`` (token ``j = pos -
    prefix``): bit ``j`` of each query's mask words, and the window."""
    j = pos - prefix
    kpos = prefix + _tree_depth(Tree, row, j, ok, q_per_row, MASK_WORDS)
    words = Tree + (row * q_per_row + tok) * (MASK_WORDS + 1)
    word = tl.load(words[:, None] + j[None, :] // 32, mask=m_ok[:, None] & ok[None, :], other=0)
    return (((word >> (j[None, :] % 32)) & 1) != 0) & (kpos[None, :] >= lo_q[:, None])


@triton.jit
def _draft_keys(Tree, row, tok, m_ok, pos, ok, prefix, lo_q, seen, q_per_row, MASK_WORDS: tl.constexpr,
                WORDS_P2: tl.constexpr):
    """(:func:`_draft_allowed`, ``ok`` narrowed by :func:`_seen_keys`), both before the loads."""
    allowed = _draft_allowed(Tree, row, tok, m_ok, pos, ok, prefix, lo_q, q_per_row, MASK_WORDS)
    return allowed, ok & _seen_keys(seen, pos - prefix, WORDS_P2)
