"""TorchBackend: the reference attention backend in plain torch, on any device.

Plan/run split: ``init_forward_metadata`` turns a batch into :class:`KVLayout`
tensors once (which slot every KV column reads, which query may see which
column); ``forward`` runs :func:`~attnhal_torch.kernel.paged_attention` per layer.

Eager metadata is sized from host lengths (the batch's longest row). Graph
metadata lives in static :class:`LayoutBuffers` covering the pool's whole
``max_context_len``: replay rewrites them in place, and the kernel's loop over
KV chunks has the same length at every replay.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch

from attnhal.backend import (
    AttentionBackend,
    AttentionConfig,
    ForwardBatch,
    KVPool,
    UnsupportedPhase,
    maybe_validate_batch,
)
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Phase
from attnhal.platform import Platform

from .descriptor import CAPABILITIES
from .kernel import KVLayout, LayerParams, Workspace, paged_attention, reserve_graph_workspace
from .layout import INDEX_BUDGET_BYTES, LayoutBuffers, fill_layout, fill_prefill_piece, set_draft_columns
from .workers import host_workers

__all__ = ["TorchBackend"]


def _split_rows(piece: _Piece, batch: ForwardBatch, parts: int) -> list[_Piece]:
    """``piece`` (all rows of a uniform batch) cut into up to ``parts`` groups of whole rows."""
    rows = batch.batch_size
    per_row = batch.num_tokens // max(rows, 1)
    step = -(-rows // parts)
    layout = piece.layout
    return [_Piece(slice(b0 * per_row, min(rows, b0 + step) * per_row), layout.row_slice(b0, b0 + step))
            for b0 in range(0, rows, step)]


@dataclass
class _Piece:
    """Query tokens ``tokens`` of the batch, attending per ``layout``."""

    tokens: slice
    layout: KVLayout


@dataclass
class _Plan:
    """The metadata of the batch the next forwards run.

    ``draft``: for ``draft_decode``, the layout buffers whose draft columns each
    forward points at ``draft_path`` as it is then. ``workers``: host worker
    threads that run the pieces in parallel (0: the calling thread, with ``workspace``).
    """

    batch: ForwardBatch
    pieces: list[_Piece]
    workspace: Workspace
    draft: LayoutBuffers | None = None
    workers: int = 0


class TorchBackend(AttentionBackend):
    """Reference backend: all five phases, GQA/MQA/MLA, fp32/fp16/bf16 compute, fp8 KV
    (either e4m3 flavour, e5m2), any page size, tree masks, sliding window, soft-cap,
    sinks, graphs.

    Parameters
    ----------
    config, pool: see :class:`~attnhal.backend.AttentionBackend`.
    platform: the platform the backend runs for (see :class:`~attnhal.backend.AttentionBackend`):
        a pool whose fp8 flavour differs from the platform's is refused
        (:meth:`~attnhal.backend.KVPool.platform_reasons`). The CPU computes in no flavour:
        it reads either in software.
    chunk: KV columns gathered per step; small enough that a chunk of K (or V)
        for the whole batch stays in cache.
    score_budget_bytes: fp32 scores kept at once (one softmax segment).
    host_workers: worker threads for eager forwards on host tensors (see
        :mod:`attnhal_torch.workers`); ``None``: ``torch.get_num_threads()`` at
        metadata time. Graph capture and replay always run on the calling thread.
    index_budget_bytes: largest per-batch gather index kept precomputed (else
        each chunk computes its own; only huge graph layouts hit this).
    """

    capabilities: ClassVar[BackendCapabilities] = CAPABILITIES

    def __init__(self, config: AttentionConfig, pool: KVPool, *, platform: Platform | None = None,
                 chunk: int = 64, score_budget_bytes: int = 16 << 20, host_workers: int | None = None,
                 index_budget_bytes: int = INDEX_BUDGET_BYTES) -> None:
        super().__init__(config, pool, platform=platform)
        if chunk < 1 or (host_workers is not None and host_workers < 1):
            raise ValueError(f"chunk, host_workers={chunk}, {host_workers} (supported: >= 1)")
        self.layer_params = [self._layer_params(layer) for layer in range(pool.num_layers)]
        self.chunk = chunk
        self.score_budget_bytes = score_budget_bytes
        self.host_workers = host_workers
        self.index_budget_bytes = index_budget_bytes
        self._eager_ws = Workspace(pool.device)
        self._worker_ws = threading.local()
        self._graph_ws: Workspace | None = None
        self._graph_max: tuple[int, int] | None = None
        self._graph_layouts: dict[tuple[Phase, int, int], LayoutBuffers] = {}
        self._plan: _Plan | None = None

    def _layer_params(self, layer: int) -> LayerParams:
        """What layer ``layer`` adds to the shared layout; tensors are views kept for graphs."""
        cfg, pool = self.config, self.pool
        sinks = None
        if cfg.sinks is not None:
            sinks = cfg.sinks[layer].to(device=pool.device, dtype=torch.float32)
        fp8 = pool.kv_format.scaled
        return LayerParams(cfg.sm_scale, cfg.window(layer), cfg.logit_softcap, sinks,
                           pool.k_scale[layer] if fp8 else None, pool.v_scale[layer] if fp8 else None)

    # --- eager --------------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Build the batch's layouts, sized from host lengths (reads seq lens once)."""
        maybe_validate_batch(batch, self.pool, self.config)
        workers = self._eager_workers()
        if not workers:
            self._plan = self._eager_plan(batch, 0)
            return
        # On a worker too: small ops, and one intra-op thread never waits on a barrier.
        plans: list[_Plan] = []
        host_workers(workers).run([lambda: plans.append(self._eager_plan(batch, workers))])
        self._plan = plans[0]

    def _eager_plan(self, batch: ForwardBatch, workers: int) -> _Plan:
        if not batch.batch_size:  # an idle rank's forward: nothing to attend, an empty output
            return _Plan(batch, [], self._eager_ws)
        if batch.phase is Phase.PREFILL:
            return _Plan(batch, self._prefill_pieces(batch), self._eager_ws, workers=workers)
        buf = self._layout_buffers(batch, rows=batch.batch_size, main_len=self._eager_main_len(batch))
        plan = self._single_plan(batch, buf, self._eager_ws)
        if batch.batch_size:  # eager may read the host: chunks all queries attend need no mask
            plan.pieces[0].layout.mask_from = int(buf.limit[:batch.batch_size].min()) // self.chunk
        if workers:
            plan.pieces, plan.workers = _split_rows(plan.pieces[0], batch, workers), workers
        return plan

    def _single_plan(self, batch: ForwardBatch, buf: LayoutBuffers, ws: Workspace) -> _Plan:
        layout = fill_layout(buf, batch, self.pool)
        draft = buf if batch.phase is Phase.DRAFT_DECODE else None
        return _Plan(batch, [_Piece(slice(0, batch.num_tokens), layout)], ws, draft)

    def _eager_workers(self) -> int:
        """Worker threads for this eager batch; 0 = run on the calling thread.

        Only host tensors: their ops execute on the calling thread. A device op
        is queued on the caller's stream, which another thread would not use.
        """
        count = self.host_workers if self.host_workers is not None else torch.get_num_threads()
        return count if count > 1 and self.pool.device.type == "cpu" else 0

    def _eager_main_len(self, batch: ForwardBatch) -> int:
        host = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
        longest = int(host.max()) if batch.batch_size else 0
        if batch.phase is Phase.TARGET_VERIFY:
            # the draft tokens are extra columns; the main part is the prefix
            longest -= batch._spec().num_draft_tokens
        return max(0, min(longest, self.pool.max_context_len))

    def _prefill_pieces(self, batch: ForwardBatch) -> list[_Piece]:
        """One piece per (row, block of query tokens): prefill rows differ in length."""
        assert batch.extend_lens is not None, "prefill needs extend_lens"
        ext = batch.extend_lens_cpu if batch.extend_lens_cpu is not None else batch.extend_lens.tolist()
        seq = batch.seq_lens_cpu.tolist() if batch.seq_lens_cpu is not None else batch.seq_lens.tolist()
        block = self._prefill_block()
        pieces, start = [], 0
        for r, (n, s) in enumerate(zip(ext, seq)):
            prefix = int(s) - int(n)
            for t0 in range(0, int(n), block):
                t1 = min(int(n), t0 + block)
                buf = LayoutBuffers(max_rows=1, tokens_per_row=t1 - t0, main_len=prefix + t1, extra=0,
                                    chunk=self.chunk, table_width=self.pool.max_context_len,
                                    num_kv_heads=self._kv_heads, device=self.pool.device,
                                    page_size=self.pool.page_size, windows=self.config.windows)
                layout = fill_prefill_piece(buf, batch.req_pool_indices[r:r + 1], prefix + t0 + 1, self.pool)
                pieces.append(_Piece(slice(start + t0, start + t1), layout))
            start += int(n)
        return pieces

    def _prefill_block(self) -> int:
        """Query tokens per prefill piece: a segment then spans >= 8 chunks of scores."""
        per_token = self.config.num_q_heads * self.chunk * 4 * 8
        return max(16, self.score_budget_bytes // per_token)

    # --- graphs ---------------------------------------------------------------------------
    def share_graph_state(self, leader: AttentionBackend) -> None:
        """Reuse ``leader``'s graph workspace (same class, config and pool; runs after it)."""
        if isinstance(leader, TorchBackend) and leader.config == self.config and leader.pool is self.pool:
            self._graph_ws = leader._graph_ws

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Size the compute workspace for ``max_bs`` rows and ``max_num_tokens`` query tokens."""
        if max_bs < 1 or max_num_tokens < 1:
            raise ValueError(f"max_bs, max_num_tokens={max_bs}, {max_num_tokens} (supported: >= 1)")
        ws = self._graph_ws if self._graph_ws is not None else Workspace(self.pool.device)
        if not ws.frozen:
            reserve_graph_workspace(
                ws, max_rows=max_bs, max_tokens=max_num_tokens, num_q_heads=self.config.num_q_heads,
                num_kv_heads=self._kv_heads, head_size=self.config.head_size,
                v_head_size=self.config.out_head_size, chunk=self.chunk,
                budget_bytes=self.score_budget_bytes, cache_dtype=self.pool.dtype)
            ws.frozen = True
        self._graph_ws, self._graph_max = ws, (max_bs, max_num_tokens)

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        """Fill the static layout of ``batch``'s shape (allocated on first use) before capture."""
        if self._graph_ws is None or self._graph_max is None:
            raise RuntimeError("init_capture_metadata before init_graph_state(max_bs, max_num_tokens)")
        buf = self._graph_layouts.get(self._graph_key(batch))
        if buf is None:
            buf = self._layout_buffers(batch, rows=self._graph_max[0], main_len=self.pool.max_context_len)
            self._graph_layouts[self._graph_key(batch)] = buf
        self._check_graph_batch(batch, buf)
        self._plan = self._single_plan(batch, buf, self._graph_ws)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Rewrite the static layout in place: no allocation, no host sync."""
        buf = self._graph_layouts.get(self._graph_key(batch))
        if buf is None:
            raise RuntimeError(f"init_replay_metadata: no graph captured for phase={batch.phase.value} "
                               f"with this shape (call init_capture_metadata first)")
        self._check_graph_batch(batch, buf)
        fill_layout(buf, batch, self.pool)

    def _graph_key(self, batch: ForwardBatch) -> tuple[Phase, int, int]:
        if batch.phase is Phase.PREFILL:
            raise UnsupportedPhase("backend 'torch': phase=prefill (supported: decode, draft_decode, "
                                   "draft_extend, target_verify for graphs; prefill has a variable token count)")
        return batch.phase, self._tokens_per_row(batch), self._extra_columns(batch)

    def _check_graph_batch(self, batch: ForwardBatch, buf: LayoutBuffers) -> None:
        assert self._graph_max is not None
        max_bs, max_tokens = self._graph_max
        if batch.batch_size > buf.max_rows or batch.num_tokens > max_tokens:
            raise ValueError(f"batch rows/tokens={batch.batch_size}/{batch.num_tokens} "
                             f"(supported: <= {max_bs}/{max_tokens} from init_graph_state)")

    # --- layouts --------------------------------------------------------------------------------
    @property
    def _kv_heads(self) -> int:
        return self.config.num_kv_heads

    def _tokens_per_row(self, batch: ForwardBatch) -> int:
        per_row = batch.tokens_per_row
        assert per_row is not None
        return per_row

    def _extra_columns(self, batch: ForwardBatch) -> int:
        """Columns beyond the request's positions: verify's draft tokens, draft decode's path."""
        if batch.phase is Phase.TARGET_VERIFY:
            return batch._spec().num_draft_tokens
        if batch.phase is Phase.DRAFT_DECODE:
            path = batch._spec().draft_path
            if path is None:
                raise ValueError("spec.draft_path=None (supported: a [rows, num_steps] int64 tensor "
                                 "for draft_decode)")
            return int(path.shape[1])
        return 0

    def _layout_buffers(self, batch: ForwardBatch, *, rows: int, main_len: int) -> LayoutBuffers:
        return LayoutBuffers(max_rows=rows, tokens_per_row=self._tokens_per_row(batch), main_len=main_len,
                             extra=self._extra_columns(batch), chunk=self.chunk,
                             table_width=self.pool.max_context_len, num_kv_heads=self._kv_heads,
                             device=self.pool.device, page_size=self.pool.page_size,
                             windows=self.config.windows, index_budget_bytes=self.index_budget_bytes)

    # --- compute ------------------------------------------------------------------------------------
    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Every phase: the pieces of the batch's plan, each one chunked paged attention."""
        plan = self._plan
        if plan is None or plan.batch is not batch:
            raise RuntimeError("forward: metadata of this batch not built; call init_forward_metadata(batch) "
                               "(or init_capture_metadata) with this ForwardBatch object first")
        if plan.draft is not None:
            spec = batch._spec()
            assert spec.draft_path is not None
            set_draft_columns(plan.draft, batch.batch_size, spec.draft_path, spec.draft_step)
        out = torch.empty((*q.shape[:2], self.config.out_head_size), dtype=q.dtype, device=q.device)
        k, v, params = self.pool.k[layer], self.pool.v[layer], self.layer_params[layer]
        if plan.workers and len(plan.pieces) > 1:
            host_workers(plan.workers).run([partial(self._run_piece, q, k, v, params, p, out, None)
                                            for p in plan.pieces])
        else:
            for piece in plan.pieces:
                self._run_piece(q, k, v, params, piece, out, plan.workspace)
        return out

    def _run_piece(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: LayerParams,
                   piece: _Piece, out: torch.Tensor, ws: Workspace | None) -> None:
        if ws is None:  # a worker thread: its own scratch
            ws = getattr(self._worker_ws, "ws", None)
            if ws is None:
                ws = self._worker_ws.ws = Workspace(self.pool.device)
        paged_attention(q[piece.tokens], k, v, piece.layout, params, ws, self.score_budget_bytes,
                        out[piece.tokens])
