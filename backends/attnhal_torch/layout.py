"""Per-phase KV layouts: the masking table of :mod:`attnhal.backend.batch` as tensors.

Every phase is written as the same three things per row ``r`` and query token ``t``:

* ``limit[r, t]``: the query attends token positions ``p < limit`` of its
  request row (the "main" columns ``0..L-1``; column ``p`` reads the slot the page
  table gives position ``p``: ``req_to_page[row, p // P] * P + p % P``);
* optionally ``E`` *extra* columns with their own slots (``extra_slots[r, e]``)
  and mask (``extra_blocked[r, t, e]``): the draft tokens of ``target_verify``
  (a tree) and of ``draft_decode`` (the branch's path);
* for sliding windows, the query's KV position ``qpos[r, t]`` and each column's key
  position ``kpos[r, c]`` (main column ``p``: ``p``; extra columns: ``extra_pos``), per
  :class:`~attnhal.backend.AttentionConfig`; a window ``w`` blocks ``kpos < qpos - w``.

:class:`LayoutBuffers` holds every tensor of one layout preallocated, and the
``fill_*`` functions write them with ``out=`` / in-place ops only, so the same
code builds eager metadata (fresh buffers sized from host lengths) and graph
replay metadata (static buffers, no allocation, no host sync).
"""

from __future__ import annotations

import torch

from attnhal.backend import ForwardBatch, KVPool
from attnhal.phases import Phase

from .kernel import KVLayout

__all__ = ["LayoutBuffers", "fill_layout", "fill_prefill_piece", "round_up", "set_draft_columns"]


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


#: Largest precomputed gather index (``rows × kv_heads × columns`` int64) a layout keeps.
INDEX_BUDGET_BYTES = 64 << 20


class LayoutBuffers:
    """Preallocated tensors of one layout shape: up to ``max_rows`` rows × ``T`` tokens,
    ``main_len`` token positions and ``extra`` extra columns, for ``num_kv_heads`` heads.

    The per-chunk gather index is precomputed when it fits ``index_budget_bytes``.
    """

    def __init__(self, *, max_rows: int, tokens_per_row: int, main_len: int, extra: int,
                 chunk: int, table_width: int, num_kv_heads: int, device: torch.device,
                 page_size: int = 1, windows: tuple[int, ...] = (),
                 index_budget_bytes: int = INDEX_BUDGET_BYTES) -> None:
        R, T, L, E, KV = max_rows, tokens_per_row, main_len, extra, num_kv_heads
        width = round_up(L + E, chunk)
        i64, dev = torch.int64, device
        self.chunk, self.main_len, self.extra, self.width, self.num_kv_heads = chunk, L, E, width, KV
        self.index = (torch.empty((width // chunk, R * KV * chunk), dtype=i64, device=dev)
                      if R * KV * width * 8 <= index_budget_bytes else None)
        self.heads = torch.arange(KV, dtype=i64, device=dev)
        self.rows = torch.zeros((R, width), dtype=i64, device=dev)
        self.blocked = torch.ones((R, T, width), dtype=torch.bool, device=dev)
        self.dead = torch.empty((R, width), dtype=torch.bool, device=dev)
        self.limit = torch.empty((R, T), dtype=i64, device=dev)
        self.prefix = torch.empty((R,), dtype=i64, device=dev)
        self.flat_main = torch.empty((R, L), dtype=i64, device=dev)
        self.flat_extra = torch.empty((R, E), dtype=i64, device=dev)
        self.extra_offset = torch.empty((R, E), dtype=i64, device=dev)
        self.tokens = torch.empty((R * max(L, E),), dtype=torch.int32, device=dev)
        self.extra_slots = torch.zeros((R, E), dtype=i64, device=dev)
        self.extra_blocked = torch.ones((R, T, E), dtype=torch.bool, device=dev)
        self.positions = torch.arange(L, dtype=i64, device=dev)
        # Columns past the table's width are blocked anyway; clamping keeps the
        # flat index inside the row it belongs to.
        table_positions = self.positions.clamp(max=table_width - 1)
        self.page_size = page_size
        self.page_cols = torch.div(table_positions, page_size, rounding_mode="floor")
        self.page_offsets = table_positions % page_size
        self.token_index = torch.arange(T, dtype=i64, device=dev)
        self.extra_index = torch.arange(E, dtype=i64, device=dev)
        self.causal = torch.ones((T, T), dtype=torch.bool, device=dev).triu(1)
        # Sliding windows: positions of queries and columns, one mask per window size.
        self.qpos = torch.empty((R, T), dtype=i64, device=dev)
        self.kpos = torch.zeros((R, width), dtype=i64, device=dev)
        self.kpos[:, :L] = self.positions
        self.extra_pos = torch.zeros((R, E), dtype=i64, device=dev)
        self.threshold = torch.empty((R, T), dtype=i64, device=dev)
        self.window_blocked = {w: torch.ones((R, T, width), dtype=torch.bool, device=dev) for w in windows}

    @property
    def max_rows(self) -> int:
        return int(self.rows.shape[0])

    @property
    def tokens_per_row(self) -> int:
        return int(self.limit.shape[1])

    def view(self, rows: int) -> KVLayout:
        index = None if self.index is None else self.index[:, :rows * self.num_kv_heads * self.chunk]
        windows = {w: m[:rows] for w, m in self.window_blocked.items()}
        return KVLayout(self.rows[:rows], self.blocked[:rows], self.chunk, index, windows=windows)


def fill_layout(buf: LayoutBuffers, batch: ForwardBatch, pool: KVPool) -> KVLayout:
    """Write ``batch``'s layout into ``buf`` (graph-safe: out= ops only); returns its view.

    Covers every phase but ``prefill`` (see :func:`fill_prefill_piece`).
    """
    B = batch.batch_size
    fill = {Phase.DECODE: _limits_decode, Phase.DRAFT_DECODE: _limits_draft_decode,
            Phase.TARGET_VERIFY: _limits_verify, Phase.DRAFT_EXTEND: _limits_draft_extend}
    fill[batch.phase](buf, batch, pool, B)
    _finish(buf, B, batch.req_pool_indices, pool.req_to_page)
    return buf.view(B)


def fill_prefill_piece(buf: LayoutBuffers, req_row: torch.Tensor, first_limit: int, pool: KVPool) -> KVLayout:
    """One prefill row's query block: token ``t`` attends positions ``< first_limit + t``.

    ``req_row``: ``[1]`` int64, the request row of the page table (eager only).
    """
    torch.add(buf.token_index.view(1, -1), first_limit, out=buf.limit[:1])
    torch.sub(buf.limit[:1], 1, out=buf.qpos[:1])
    _finish(buf, 1, req_row, pool.req_to_page)
    layout = buf.view(1)
    layout.mask_from = first_limit // buf.chunk
    return layout


# --- per-phase limits and extra columns -------------------------------------------

def _limits_decode(buf: LayoutBuffers, batch: ForwardBatch, pool: KVPool, B: int) -> None:
    buf.limit[:B].copy_(batch.seq_lens.view(B, 1))
    torch.sub(buf.limit[:B], 1, out=buf.qpos[:B])


def _limits_draft_decode(buf: LayoutBuffers, batch: ForwardBatch, pool: KVPool, B: int) -> None:
    # The path's slots are not known yet: a draft tree may rewrite draft_path in
    # place up to the forward itself (see attnhal.backend.batch), so the forward
    # reads them (set_draft_columns). Here only the mask: the branch attends its
    # own path up to the current step, a static pattern.
    E, step = buf.extra, batch._spec().draft_step
    buf.limit[:B].copy_(batch.seq_lens.view(B, 1))
    buf.extra_slots[:B].zero_()
    torch.gt(buf.extra_index.view(1, 1, E).expand(B, 1, E), step, out=buf.extra_blocked[:B])
    # path token j sits at position seq_lens + j; the query is the step's token
    torch.add(buf.extra_index.view(1, E).expand(B, E), batch.seq_lens.view(B, 1), out=buf.extra_pos[:B])
    torch.add(batch.seq_lens.view(B, 1), step, out=buf.qpos[:B])


def set_draft_columns(buf: LayoutBuffers, rows: int, draft_path: torch.Tensor, step: int) -> None:
    """At forward time: point the draft columns of a ``draft_decode`` layout at the
    slots ``draft_path[:, :step + 1]`` (``[rows, num_steps]``) as they are now."""
    L, KV, C = buf.main_len, buf.num_kv_heads, buf.chunk
    cols = buf.rows[:rows, L:L + step + 1]
    torch.mul(draft_path[:, :step + 1], KV, out=cols)
    if buf.index is None:
        return
    # The same columns in the precomputed gather index: they may straddle chunks.
    for c in range(L // C, (L + step) // C + 1):
        lo, hi = max(L, c * C), min(L + step + 1, (c + 1) * C)
        dst = buf.index[c].view(-1, KV, C)[:rows, :, lo - c * C:hi - c * C]
        torch.add(buf.rows[:rows, lo:hi].view(rows, 1, hi - lo).expand_as(dst), buf.heads.view(1, KV, 1), out=dst)


def _limits_verify(buf: LayoutBuffers, batch: ForwardBatch, pool: KVPool, B: int) -> None:
    spec = batch._spec()
    T = buf.tokens_per_row
    prefix = buf.prefix[:B]
    # The prefix is the committed context; the T draft tokens come as extra columns
    # so that the tree mask applies to them alone. Clamp: padded rows may carry a
    # seq len below T.
    torch.sub(batch.seq_lens, T, out=prefix)
    prefix.clamp_(min=0)
    buf.limit[:B].copy_(prefix.view(B, 1).expand(B, T))
    _table_slots(buf, B, batch.req_pool_indices, prefix, pool, buf.extra_slots[:B])
    mask = spec.custom_mask
    if mask is None:
        buf.extra_blocked[:B].copy_(buf.causal.view(1, T, T).expand(B, T, T))
    else:
        torch.logical_not(mask, out=buf.extra_blocked[:B])
    # A draft token's position is prefix + its depth (drafts it attends, itself included, - 1).
    depth = buf.extra_pos[:B]
    torch.sum(buf.extra_blocked[:B], dim=2, out=depth)  # T - 1 - depth
    torch.sub(prefix.view(B, 1), depth, out=depth).add_(T - 1)
    buf.qpos[:B].copy_(depth)


def _limits_draft_extend(buf: LayoutBuffers, batch: ForwardBatch, pool: KVPool, B: int) -> None:
    assert batch.extend_lens is not None, "draft_extend needs extend_lens"
    T = buf.tokens_per_row
    prefix = buf.prefix[:B]
    torch.sub(batch.seq_lens, batch.extend_lens, out=prefix)
    # token t sees positions [0, min(prefix + t, seq_len - 1)]: padding tokens see the row's last token
    torch.add(buf.token_index.view(1, T).expand(B, T), prefix.view(B, 1), out=buf.limit[:B])
    buf.limit[:B].add_(1)
    torch.minimum(buf.limit[:B], batch.seq_lens.view(B, 1), out=buf.limit[:B])
    torch.sub(buf.limit[:B], 1, out=buf.qpos[:B])


def _table_slots(buf: LayoutBuffers, B: int, req_rows: torch.Tensor, start: torch.Tensor,
                 pool: KVPool, out: torch.Tensor) -> None:
    """``out[r, e]`` = the slot of position ``start[r] + e`` of request ``req_rows[r]``
    (positions clamped into the row)."""
    E, table, P = out.shape[1], pool.req_to_page, pool.page_size
    flat, offset = buf.flat_extra[:B], buf.extra_offset[:B]
    torch.add(buf.extra_index.view(1, E).expand(B, E), start.view(B, 1), out=flat)
    flat.clamp_(max=pool.max_context_len - 1)
    torch.remainder(flat, P, out=offset)
    flat.div_(P, rounding_mode="floor")
    _page_slots(buf, table, req_rows, flat, offset, P, out)


def _page_slots(buf: LayoutBuffers, table: torch.Tensor, req_rows: torch.Tensor, page_cols: torch.Tensor,
                offsets: torch.Tensor, P: int, out: torch.Tensor) -> None:
    """``out[r, c] = table[req_rows[r], page_cols[r, c]] * P + offsets[r, c]``; ``page_cols`` is
    overwritten (its rows become flat indices of ``table``)."""
    B, n = out.shape
    page_cols.add_(req_rows.view(B, 1), alpha=table.shape[1])
    pages = buf.tokens[:B * n]
    torch.index_select(table.view(-1), 0, page_cols.reshape(-1), out=pages)
    torch.mul(pages.view(B, n), P, out=out)
    out.add_(offsets)


def _window_masks(buf: LayoutBuffers, B: int) -> None:
    """Per window ``w``: ``blocked`` or key position ``< qpos - w``."""
    kpos = buf.kpos[:B].view(B, 1, -1)
    for w, mask in buf.window_blocked.items():
        threshold = buf.threshold[:B]
        torch.sub(buf.qpos[:B], w, out=threshold)
        torch.lt(kpos.expand_as(mask[:B]), threshold.view(B, -1, 1), out=mask[:B])
        mask[:B].logical_or_(buf.blocked[:B])


# --- shared tail ----------------------------------------------------------------------

def _finish(buf: LayoutBuffers, B: int, req_rows: torch.Tensor, table: torch.Tensor) -> None:
    """Slots and masks of all columns from ``limit``, ``qpos`` and the extra columns."""
    L, E, T = buf.main_len, buf.extra, buf.tokens_per_row
    rows, blocked = buf.rows[:B], buf.blocked[:B]
    if L:
        flat = buf.flat_main[:B]
        flat.copy_(buf.page_cols.view(1, L).expand(B, L))
        _page_slots(buf, table, req_rows, flat, buf.page_offsets.view(1, L).expand(B, L), buf.page_size,
                    rows[:, :L])
        torch.ge(buf.positions.view(1, 1, L).expand(B, T, L), buf.limit[:B].view(B, T, 1),
                 out=blocked[:, :, :L])
    if E:
        rows[:, L:L + E].copy_(buf.extra_slots[:B])
        blocked[:, :, L:L + E].copy_(buf.extra_blocked[:B])
        buf.kpos[:B, L:L + E].copy_(buf.extra_pos[:B])
    _window_masks(buf, B)
    # Columns no query attends read the padding slot: never a stale or
    # out-of-range entry, and a cache-hot one.
    dead = buf.dead[:B]
    if T == 1:
        dead.copy_(blocked[:, 0])
    else:
        torch.all(blocked, dim=1, out=dead)
    rows.masked_fill_(dead, 0)
    KV, C = buf.num_kv_heads, buf.chunk
    rows.mul_(KV)
    if buf.index is not None:
        nch = buf.width // C
        dst = buf.index.view(nch, -1, KV, C)[:, :B]
        cols = rows.view(B, nch, 1, C).permute(1, 0, 2, 3)
        torch.add(cols.expand(nch, B, KV, C), buf.heads.view(1, 1, KV, 1), out=dst)
