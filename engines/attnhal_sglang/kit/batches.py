"""attnhal batches as SGLang ``ForwardBatch`` es: phases to forward modes, and the layout rules.

=================  ====================  ===============================================================
attnhal phase      SGLang forward mode   what changes on the way
=================  ====================  ===============================================================
``prefill``        ``EXTEND``            ``extend_prefix_lens = seq_lens - extend_lens``
``decode``         ``DECODE``            as is
``target_verify``  ``TARGET_VERIFY``     ``seq_lens`` count the prefix only (SGLang's verify batches; at
                                         least 0 for a graph's padded rows);
                                         a tree mask becomes SGLang's flat mask: per request
                                         ``T x (prefix + T)``, the prefix columns set
``draft_extend``   ``DRAFT_EXTEND_V2``   ``T`` tokens per request (the padded width); the prefix is
                                         ``seq_lens - extend_lens`` (``extend_seq_lens_tensor``)
``draft_decode``   ``DECODE`` of the     one SGLang request per ``topk`` rows; branch ``b``'s draft token
                   multi-step backend    of step ``j`` where SGLang's draft puts it in the request's
                                         ``req_to_token`` row (:func:`draft_positions`)
=================  ====================  ===============================================================

The page table: attnhal's pool maps positions to pages, SGLang's ``req_to_token`` maps
them to slots, with the same slot numbering (page ``p`` owns ``p * page_size ..``); the
adapter keeps SGLang's table a mirror of attnhal's (:class:`TokenTable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnhal.backend import ForwardBatch, KVPool
from attnhal.phases import Phase

__all__ = ["MODES", "TokenTable", "draft_positions", "draft_room", "sglang_batch", "verify_mask", "write_draft_paths"]

#: The SGLang forward mode of each attnhal phase (by name: SGLang is imported when used).
MODES = {Phase.PREFILL: "EXTEND", Phase.DECODE: "DECODE", Phase.TARGET_VERIFY: "TARGET_VERIFY",
         Phase.DRAFT_EXTEND: "DRAFT_EXTEND_V2", Phase.DRAFT_DECODE: "DECODE"}


class TokenTable:
    """SGLang's ``req_to_token`` kept equal to ``pool``'s page table, position by position.

    ``refresh`` writes in place through index buffers made once, so it allocates nothing.
    """

    def __init__(self, pool: KVPool, req_to_token: torch.Tensor) -> None:
        self.pool, self.table = pool, req_to_token
        width = pool.max_context_len
        positions = torch.arange(width, device=pool.device)
        self._page_of = torch.div(positions, pool.page_size, rounding_mode="floor")
        self._offset = (positions % pool.page_size).to(torch.int32)
        self._scratch = torch.empty((pool.req_to_page.shape[0], width), dtype=torch.int32, device=pool.device)

    def refresh(self) -> None:
        rows, width = self._scratch.shape
        torch.index_select(self.pool.req_to_page, 1, self._page_of, out=self._scratch)
        self._scratch.mul_(self.pool.page_size).add_(self._offset)
        self.table[:rows, :width].copy_(self._scratch)


def draft_positions(seq_lens: torch.Tensor, topk: int, num_steps: int, page_size: int) -> torch.Tensor:
    """``[rows, num_steps]``: the ``req_to_token`` position of branch ``b``'s draft token of step
    ``j``, as SGLang lays the draft out (rows are requests x ``topk``, ``seq_lens`` per row).

    Page size 1 or a chain: ``prefix + b * num_steps + j``. Pages of more tokens with a tree:
    each branch continues the prefix's last partial page in pages of its own
    (``sglang/kernels/ops/speculative/cache_locs.py``, ``generate_draft_decode_kv_indices``).
    """
    rows = seq_lens.shape[0]
    seq = seq_lens.long().view(-1, 1)
    branch = (torch.arange(rows, device=seq_lens.device) % topk).view(-1, 1)
    step = torch.arange(num_steps, device=seq_lens.device)
    if page_size == 1 or topk == 1:
        return seq + branch * num_steps + step
    last = seq % page_size
    pages_per_branch = torch.div(last + num_steps + page_size - 1, page_size, rounding_mode="floor")
    return seq - last + branch * pages_per_branch * page_size + last + step


def draft_room(topk: int, num_steps: int, page_size: int) -> int:
    """Positions past a request's prefix that :func:`draft_positions` may reach."""
    return topk * (num_steps + 2 * page_size)


def write_draft_paths(table: torch.Tensor, batch: ForwardBatch, num_steps: int, page_size: int) -> None:
    """Each branch's drafted slots ``draft_path[row]`` at its :func:`draft_positions` in its
    request's row of ``table``."""
    spec = batch._spec()
    path = spec.draft_path
    assert path is not None
    rows, steps = path.shape[0], min(num_steps, path.shape[1])
    cols = draft_positions(batch.seq_lens, spec.topk, num_steps, page_size)[:, :steps]
    table[batch.req_pool_indices.view(-1, 1).expand(rows, steps), cols] = path[:, :steps].to(table.dtype)


def verify_mask(batch: ForwardBatch, prefix: torch.Tensor) -> torch.Tensor | None:
    """SGLang's flat verify mask of a tree batch: per request ``T`` rows of ``prefix + T``
    columns, the prefix visible to every draft token. ``None`` for a chain (causal)."""
    spec = batch._spec()
    if spec.custom_mask is None:
        return None
    parts = []
    for r, p in enumerate(prefix.tolist()):
        rows = torch.ones((spec.num_draft_tokens, p + spec.num_draft_tokens), dtype=torch.bool,
                          device=prefix.device)
        rows[:, p:] = spec.custom_mask[r]
        parts.append(rows.flatten())
    return torch.cat(parts)


@dataclass
class Derived:
    """The SGLang-side values of one attnhal batch (device tensors, then host values)."""

    mode: str
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    accepted: torch.Tensor | None = None
    custom_mask: torch.Tensor | None = None
    tokens_per_req: int = 1


def derive(batch: ForwardBatch) -> Derived:
    """What SGLang's batch of ``batch``'s phase holds (allocates: eager, or outside a graph)."""
    phase, seq, loc = batch.phase, batch.seq_lens, batch.out_cache_loc
    reqs = batch.req_pool_indices
    if phase is Phase.PREFILL:
        assert batch.extend_lens is not None
        prefix = seq - batch.extend_lens
        positions = torch.cat([torch.arange(int(p), int(s)) for p, s in zip(prefix.tolist(), seq.tolist())]
                              or [torch.zeros(0, dtype=torch.int64)]).to(seq.device)
        return Derived(MODES[phase], batch.batch_size, reqs, seq, loc, positions, prefix, batch.extend_lens.clone())
    if phase is Phase.DECODE:
        return Derived(MODES[phase], batch.batch_size, reqs, seq, loc, (seq - 1).long())
    spec = batch._spec()
    if phase is Phase.TARGET_VERIFY:
        t = spec.num_draft_tokens
        # A graph's padded rows carry seq_lens = the fill value, shorter than their draft.
        prefix = (seq - t).clamp(min=0)
        positions = (prefix.long().view(-1, 1) + torch.arange(t, device=seq.device)).flatten()
        return Derived(MODES[phase], batch.batch_size, reqs, prefix, loc, positions, prefix,
                       torch.full_like(seq, t), custom_mask=verify_mask(batch, prefix), tokens_per_req=t)
    if phase is Phase.DRAFT_EXTEND:
        assert batch.extend_lens is not None
        t = spec.draft_extend_len
        prefix = seq - batch.extend_lens
        positions = torch.minimum(prefix.long().view(-1, 1) + torch.arange(t, device=seq.device),
                                  (seq.long() - 1).view(-1, 1)).flatten()
        return Derived(MODES[phase], batch.batch_size, reqs, seq, loc, positions, prefix, torch.full_like(seq, t),
                       accepted=batch.extend_lens.clone(), tokens_per_req=t)
    # draft_decode: one SGLang request per topk rows (they share the request and its prefix)
    k = spec.topk
    return Derived(MODES[phase], batch.batch_size // k, reqs[::k].contiguous(), seq[::k].contiguous(), loc,
                   seq.long().clone(), tokens_per_req=1)


def sglang_batch(d: Derived, spec_info: Any = None, host: bool = True) -> Any:
    """SGLang's ``ForwardBatch`` of ``d`` (``host``: with the host copies eager metadata reads)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch as SGLangBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seq_cpu = d.seq_lens.cpu() if host else None
    # A batch of 0 requests is what an idle data-parallel rank runs: SGLang's IDLE mode, whatever the phase.
    mode = ForwardMode.IDLE if d.batch_size == 0 else getattr(ForwardMode, d.mode)
    fb = SGLangBatch(forward_mode=mode, batch_size=d.batch_size,
                     input_ids=torch.zeros(d.out_cache_loc.shape[0], dtype=torch.int64, device=d.seq_lens.device),
                     req_pool_indices=d.req_pool_indices, seq_lens=d.seq_lens, seq_lens_cpu=seq_cpu,
                     out_cache_loc=d.out_cache_loc, seq_lens_sum=None if seq_cpu is None else int(seq_cpu.sum()),
                     positions=d.positions, spec_info=spec_info)
    if d.extend_seq_lens is not None:
        fb.extend_prefix_lens, fb.extend_seq_lens = d.extend_prefix_lens, d.extend_seq_lens
        if host:
            assert d.extend_prefix_lens is not None
            fb.extend_prefix_lens_cpu = d.extend_prefix_lens.tolist()
            fb.extend_seq_lens_cpu = d.extend_seq_lens.tolist()
            fb.extend_num_tokens = int(sum(fb.extend_seq_lens_cpu))
    return fb
