"""The reference worker's limits that need no torch: checked by ``attnhal demo`` before torch loads."""

from __future__ import annotations

from attnhal.spec import SpecConfig

__all__ = ["check_tree_size", "worker_tree_tokens"]


def worker_tree_tokens(num_steps: int, topk: int) -> int:
    """The most tokens this worker verifies per request: the ``topk`` branches it keeps at each
    of ``num_steps`` levels (``tree.py``), plus the root."""
    return topk * num_steps + 1


def check_tree_size(spec: SpecConfig) -> None:
    """Raise ``ValueError`` if ``spec`` verifies more nodes than this worker's tree holds.

    Engines such as SGLang pick the verified nodes among every candidate child
    (:attr:`SpecConfig.max_draft_tokens`); this worker keeps only the ``topk`` branches of
    each level (``tree.py``), so it verifies at most ``topk * num_steps + 1`` tokens.
    """
    limit = worker_tree_tokens(spec.num_steps, spec.topk)
    if spec.speculative and spec.num_draft_tokens > limit:
        raise ValueError(f"num_draft_tokens={spec.num_draft_tokens} (supported: 2..{limit} in the reference "
                         f"worker for num_steps={spec.num_steps}, topk={spec.topk}: its tree keeps topk nodes "
                         "per level)")
