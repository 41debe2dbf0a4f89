"""ForwardBatch: what one attention forward of one phase reads.

Token layout and masking per phase (``bs`` rows; KV position ``p`` of a row lives in slot ``pool.slots(row, p)``, through the page table ``pool.req_to_page``):

========================  ===========================  =====================================================
phase                     query tokens                 row ``r``, query ``i`` attends KV positions
========================  ===========================  =====================================================
``prefill``               packed, ``extend_lens[r]``   ``[0, prefix + i]``, ``prefix = seq_lens - extend_lens``
``decode``                1 per row                    ``[0, seq_lens[r])``
``target_verify``         ``T = num_draft_tokens``     prefix ``[0, seq_lens - T)`` plus draft ``j`` where
                          per row (uniform)            ``custom_mask[r, i, j]`` (causal ``j <= i`` if no mask)
``draft_extend``          ``T = draft_extend_len``     ``[0, min(prefix + i, seq_lens - 1)]``,
                          per row (uniform, padded)    ``prefix = seq_lens - extend_lens``; ``i >= extend_lens[r]``
                                                       are padding (finite, ignored by the caller)
``draft_decode``          1 per row (row = branch)     prefix ``[0, seq_lens[r])`` plus the slots
                                                       ``draft_path[r, :draft_step + 1]``
========================  ===========================  =====================================================

Every phase writes the new tokens' K/V to ``out_cache_loc`` before attending.
``draft_path`` is read when ``forward`` runs, never baked into metadata ahead of it: a
draft tree re-parents its branches between steps by rewriting ``draft_path`` in place
(inside a captured graph too).
KV positions map to slots through ``pool.req_to_page`` (see :mod:`attnhal.backend.kv_pool`).

Conventions the table relies on:

* A batch may be empty (``bs = 0``, no query tokens) in every phase: an idle
  data-parallel rank (SGLang's DP attention) runs its forwards without requests.
  ``forward`` returns an empty ``[0, num_q_heads, v_head_size]`` output and writes
  nothing; under graphs the runner replays the smallest capture size, every row padding.
* Query tokens are row-major: token ``i`` of row ``r`` is ``q[r * T + i]`` in the
  uniform phases, and rows follow each other in ``prefill``.
* Draft token ``j`` of ``target_verify`` sits at position ``seq_lens - T + j`` of the
  row. For every phase but ``draft_decode``, the new tokens' positions are already
  in the page table and map to the slots the tokens write to:
  ``pool.slots(req_pool_indices[r], prefix + i) == out_cache_loc`` of token ``i``
  (padding tokens excepted); attention reads every slot through the page table.
* ``draft_decode``: ``seq_lens`` counts the committed prefix only; the draft tokens
  are not in the page table — their slots come from ``draft_path``, and
  ``out_cache_loc == draft_path[:, draft_step]``.
* Padding: ``draft_extend`` tokens ``i >= extend_lens[r]`` and the rows a graph
  runner pads with (request ``PADDING_REQ``) write to the padding slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnhal import phases
from attnhal.phases import Phase

__all__ = ["ForwardBatch", "SpecInfo"]


@dataclass
class SpecInfo:
    """Speculative-decoding inputs of one batch.

    Attributes
    ----------
    topk: branches per request in the draft tree.
    num_draft_tokens: ``T`` of ``target_verify`` (query tokens per row).
    draft_extend_len: ``T`` of ``draft_extend`` (padded query tokens per row).
    custom_mask: ``target_verify`` tree mask ``[bs, T, T]`` bool: draft token ``i`` may
        attend draft token ``j``; ``None`` = causal chain (``topk == 1``).
    draft_path: ``draft_decode`` slots ``[rows, num_steps]`` int64 of each branch's drafted tokens.
    draft_step: ``draft_decode`` step ``s``: row attends ``draft_path[r, :s + 1]`` after its prefix.
    """

    topk: int = 1
    num_draft_tokens: int = 1
    draft_extend_len: int = 1
    custom_mask: torch.Tensor | None = None
    draft_path: torch.Tensor | None = None
    draft_step: int = 0


@dataclass
class ForwardBatch:
    """One attention forward's metadata (see the module docstring for per-phase layout).

    Attributes
    ----------
    phase: which phase this forward runs.
    req_pool_indices: ``[bs]`` int64, row of ``pool.req_to_page`` for each batch row.
    seq_lens: ``[bs]`` int32 (device), KV length of each row after this forward's K/V
        are written (for ``draft_decode``: the committed prefix, without draft tokens).
    out_cache_loc: ``[num_tokens]`` int64, KV slot of each new query token.
    extend_lens: ``[bs]`` int32, new tokens per row (``prefill``) or real tokens per row
        (``draft_extend``: accepted lengths, ``1 <= extend_lens <= draft_extend_len``).
    extend_lens_cpu: host copy of ``extend_lens`` (``prefill`` only; it is never captured).
    seq_lens_cpu: ``[bs]`` host copy of ``seq_lens``, for backends whose descriptor says
        ``needs_host_seq_lens``.
    spec: speculative inputs for the spec phases.
    """

    phase: Phase
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    extend_lens: torch.Tensor | None = None
    extend_lens_cpu: list[int] | None = None
    seq_lens_cpu: torch.Tensor | None = None
    spec: SpecInfo | None = None

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def tokens_per_row(self) -> int | None:
        """Query tokens per row for the uniform phases; ``None`` for packed ``prefill``."""
        return phases.tokens_per_row(self.phase, self.spec)

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])

    def _spec(self) -> SpecInfo:
        if self.spec is None:
            raise ValueError(f"spec=None (supported: a SpecInfo for phase={self.phase.value})")
        return self.spec
