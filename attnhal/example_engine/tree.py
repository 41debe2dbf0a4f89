"""EAGLE-style draft trees as tensors: expand, select, mask, accept.

All functions except :func:`accept` use static shapes and no host syncs, so they
can run inside a captured graph. ``k`` is topk, ``S`` the number of draft steps.

Tree nodes of one request are numbered level by level: node ``s * k + j`` is
branch ``j`` at level ``s`` (the ``s + 1``-th draft token). Parents are node
numbers, ``-1`` for the root (the last committed token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftTree", "VerifyTree", "accept", "first_level", "grow", "select"]


@dataclass
class DraftTree:
    """Grown level by level: ``tokens``, ``scores``, ``parents`` are ``[bs, levels * k]``."""

    tokens: torch.Tensor
    scores: torch.Tensor
    parents: torch.Tensor
    k: int

    @property
    def branch_scores(self) -> torch.Tensor:
        """Cumulative log-probs of the current level's branches ``[bs, k]``."""
        return self.scores[:, -self.k:]

    def add_level(self, tokens: torch.Tensor, scores: torch.Tensor, parent_branch: torch.Tensor) -> DraftTree:
        """This tree with one more level (see :func:`grow`), each ``[bs, k]``."""
        level_start = self.tokens.shape[1] - self.k
        return DraftTree(torch.cat((self.tokens, tokens), dim=1), torch.cat((self.scores, scores), dim=1),
                         torch.cat((self.parents, level_start + parent_branch), dim=1), self.k)


def first_level(logits: torch.Tensor, k: int) -> DraftTree:
    """Level 0 from the draft's logits at the last committed token ``[bs, vocab]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    scores, tokens = logp.topk(k, dim=-1)
    parents = torch.full_like(tokens, -1)
    return DraftTree(tokens, scores, parents, k)


def grow(branch_scores: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The next level from the branches' scores ``[bs, k]`` and logits ``[bs * k, vocab]``.

    Each branch proposes its ``k`` best children; the ``k`` best children overall by
    cumulative log-prob become the new branches. Returns ``(tokens, scores,
    parent_branch)``, each ``[bs, k]``; ``parent_branch`` is the index of the branch
    (of the previous level) each new branch descends from.
    """
    bs, k = branch_scores.shape
    logp = torch.log_softmax(logits.float(), dim=-1).view(bs, k, -1)
    child_scores, child_tokens = logp.topk(k, dim=-1)  # [bs, k, k]
    scores, flat = (branch_scores[:, :, None] + child_scores).view(bs, k * k).topk(k, dim=-1)
    parent_branch = torch.div(flat, k, rounding_mode="floor")
    return child_tokens.view(bs, k * k).gather(1, flat), scores, parent_branch


@dataclass
class VerifyTree:
    """The tree the target verifies: node 0 is the root (last committed token).

    tokens: ``[bs, N]``; depth: ``[bs, N]`` (root 0); parent: ``[bs, N]`` node index in
    this tree (root: 0); mask: ``[bs, N, N]`` bool, node ``i`` sees ancestor-or-self ``j``.
    """

    tokens: torch.Tensor
    depth: torch.Tensor
    parent: torch.Tensor
    mask: torch.Tensor


def select(tree: DraftTree, root_tokens: torch.Tensor, num_nodes: int, num_steps: int) -> VerifyTree:
    """The ``num_nodes - 1`` best draft nodes plus the root, parents before children.

    A child's cumulative score never exceeds its parent's, and a stable sort puts the
    parent (lower node number) first on ties, so the chosen set is ancestor-closed.
    """
    bs, total = tree.scores.shape
    order = torch.sort(tree.scores, dim=1, descending=True, stable=True).indices[:, : num_nodes - 1]
    chosen = torch.sort(order, dim=1).values  # [bs, N-1] node numbers, parents first
    position = torch.zeros(bs, total + 1, dtype=torch.long, device=chosen.device)
    position.scatter_(1, chosen + 1, torch.arange(1, num_nodes, device=chosen.device).expand(bs, -1))
    parent = torch.cat((torch.zeros(bs, 1, dtype=torch.long, device=chosen.device),
                        position.gather(1, tree.parents.gather(1, chosen) + 1)), dim=1)
    tokens = torch.cat((root_tokens[:, None], tree.tokens.gather(1, chosen)), dim=1)
    mask, depth = _ancestry(parent, num_steps)
    return VerifyTree(tokens, depth, parent, mask)


def _ancestry(parent: torch.Tensor, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestor-or-self mask ``[bs, N, N]`` and depth ``[bs, N]`` by following parents S times."""
    bs, n = parent.shape
    nodes = torch.arange(n, device=parent.device).expand(bs, n)
    mask = torch.zeros(bs, n, n, dtype=torch.bool, device=parent.device)
    mask.scatter_(2, nodes[:, :, None], True)
    depth = torch.zeros(bs, n, dtype=torch.long, device=parent.device)
    current = nodes
    for _ in range(num_steps):
        depth += (current != 0).long()
        current = parent.gather(1, current)
        mask.scatter_(2, current[:, :, None], True)
    return mask, depth


def accept(tree: VerifyTree, target_next: torch.Tensor) -> list[tuple[list[int], int]]:
    """Greedy acceptance on the host: per request, (accepted node indices incl. root, bonus token).

    ``target_next`` ``[bs, N]``: the target's argmax after each node. Starting at the root,
    follow the child whose token equals the target's choice, as long as there is one.
    """
    tokens, parent, nxt = tree.tokens.tolist(), tree.parent.tolist(), target_next.tolist()
    out = []
    for toks, par, choice in zip(tokens, parent, nxt):
        path, node = [0], 0
        while True:
            child = next((c for c in range(1, len(toks)) if par[c] == node and toks[c] == choice[node]), None)
            if child is None:
                break
            path.append(child)
            node = child
        out.append((path, choice[node]))
    return out
