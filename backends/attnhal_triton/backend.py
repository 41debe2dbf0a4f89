"""TritonBackend: the attnhal backend contract on top of the Triton kernels.

Importing this module imports torch and attnhal but not triton: the kernels load
at the first launch (see :mod:`attnhal_triton.ops`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import torch

from attnhal.backend import (
    AttentionBackend,
    AttentionConfig,
    ForwardBatch,
    KVPool,
    UnsupportedFeature,
    dtype_name,
    maybe_validate_batch,
)
from attnhal.capabilities import BackendCapabilities
from attnhal.capabilities.support import fp8_reasons
from attnhal.errors import InvalidValue
from attnhal.platform import Platform
from attnhal.reasons import Reason, ReasonCode
from attnhal_triton import mla_ops, ops, work
from attnhal_triton.descriptor import CAPABILITIES
from attnhal_triton.launch_table import KERNELS, MLA_KERNELS, LaunchRow, lookup
from attnhal_triton.metadata import (
    GraphState,
    Meta,
    Partials,
    Sizing,
    kernel_of,
    make_meta,
    mask_of,
    may_split,
    partial_rows,
    query_tokens,
    split_counts,
)
from attnhal_triton.mla_table import MLA_SPLIT, mla_kernel_of, mla_lookup, mla_programs
from attnhal_triton.tree_mask import bit_weights, new_tree, pack_tree, word_count

__all__ = ["TritonBackend"]

class TritonBackend(AttentionBackend):
    """Paged attention in Triton for every phase (CUDA and HIP; CPU via the interpreter).

    Parameters
    ----------
    config, pool, platform: see :class:`~attnhal.backend.AttentionBackend` (which checks the
        claims once and resolves a missing platform); the platform selects the launch-table
        rows. Its vendor and arch only pick rows: a simulated or CPU platform runs the same
        kernels through the interpreter.
    """

    capabilities: ClassVar[BackendCapabilities] = CAPABILITIES

    def __init__(self, config: AttentionConfig, pool: KVPool, platform: Platform | None = None) -> None:
        super().__init__(config, pool, platform=platform)
        # On a GPU the kernels compute e4m3 in the hardware's flavour, which a platform without
        # one lacks; the interpreter (host tensors) reads whichever flavour the pool stores.
        no_fp8 = [] if _on_host(self.platform) else fp8_reasons(self.platform, pool.kv_dtype)
        if no_fp8:
            raise UnsupportedFeature("backend 'triton': " + "; ".join(r.message for r in no_fp8))
        dtype = dtype_name(config.dtype)
        tiles = work.row_dtype(dtype, pool.kv_dtype)
        self.rows: dict[str, LaunchRow] = {
            k: lookup(k, self.platform, config.head_size, tiles) for k in KERNELS}
        # MLA (and any head that is a power of two plus a tail, e.g. 576): the MLA kernel.
        self._mla = config.head_size & (config.head_size - 1) != 0 or config.out_head_size != config.head_size
        if self._mla:
            if mla_ops.head_split(config.head_size, config.out_head_size) is None:
                raise UnsupportedFeature(f"backend 'triton': head_size/v_head_size={config.head_size}/"
                                         f"{config.out_head_size} (supported: 576/512 (MLA) or 576/576)")
            v_tail = config.out_head_size == config.head_size
            self.rows.update({k: mla_lookup(k, self.platform, tiles, v_tail) for k in MLA_KERNELS})
        self._launch = {k: row.encode() for k, row in self.rows.items()}
        self._meta: Meta | None = None
        self._graph: GraphState | None = None
        self._eager_mid: Partials | None = None
        self._leader: TritonBackend | None = None

    def use_launch_rows(self, rows: Mapping[str, LaunchRow]) -> None:
        """Serve the kernels in ``rows`` with those launch rows instead of the table's
        (a tuning sweep's candidates); the next forward re-plans its metadata."""
        unknown = sorted(set(rows) - set(KERNELS + MLA_KERNELS))
        if unknown:
            raise ValueError(f"rows={unknown} (supported: kernels {', '.join(KERNELS + MLA_KERNELS)})")
        self.rows.update(rows)
        self._launch = {k: row.encode() for k, row in self.rows.items()}
        self._meta = None

    @classmethod
    def runtime_reasons(cls, platform: Platform) -> list[Reason]:
        """Triton runs host tensors only in its interpreter, which must be on before kernels are defined."""
        if _on_host(platform) and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            return [Reason(ReasonCode.RUNTIME, f"device={platform.torch_device} (supported: a GPU, or "
                           "TRITON_INTERPRET=1 set before the Triton kernels are imported)")]
        return []

    @property
    def num_kv_splits(self) -> int:
        """Most KV splits of a row (decode and split extend)."""
        return max(row.kv_splits for row in self.rows.values())

    # --- launch sizing -----------------------------------------------------------------
    def _sizing(self, batch: ForwardBatch) -> Sizing:
        """The batch's kernel variant, split cap and launch row (see :mod:`attnhal_triton.work`)."""
        cfg = self.config
        if self._mla:
            kernel, programs = mla_kernel_of(batch.phase, mask_of(batch) is not None), mla_programs
        else:
            kernel, programs = kernel_of(batch), work.programs
        plan = programs(kernel, self.rows[kernel], batch.batch_size, query_tokens(batch),
                        cfg.num_q_heads, cfg.num_kv_heads)
        return Sizing(kernel, plan.splits, self._launch_with(kernel, plan.blocks))

    def _launch_with(self, kernel: str, blocks: Mapping[str, int]) -> str:
        """The encoded row of ``kernel`` with the block sizes the batch launches it with."""
        key = f"{kernel}@{sorted(blocks.items())}"
        if key not in self._launch:
            self._launch[key] = replace(self.rows[kernel], blocks=blocks).encode()
        return self._launch[key]

    def _partial_views(self, partials: Partials, batch: ForwardBatch, sizing: Sizing
                       ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not sizing.split:
            return None
        cfg = self.config
        return partials.views(partial_rows(batch), sizing.splits, cfg.num_q_heads, cfg.out_head_size)

    # --- metadata ------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager: the batch's kernel variant, split counts, packed tree mask and partial buffers."""
        maybe_validate_batch(batch, self.pool, self.config)
        sizing = self._sizing(batch)
        splits, mid = None, None
        if sizing.split:
            splits = split_counts(batch.seq_lens, self.rows[sizing.kernel], sizing.splits)
            mid = self._partial_views(self._eager_partials(partial_rows(batch) * sizing.splits),
                                      batch, sizing)
        tree = new_tree(mask_of(batch))
        self._meta = make_meta(batch, sizing, batch.req_pool_indices, batch.seq_lens,
                                batch.extend_lens, splits, tree, mid)

    def share_graph_state(self, leader: AttentionBackend) -> None:
        """Reuse ``leader``'s partial buffers (the steps of one multi-step draft run
        one after another, and each step's reduce consumes them before the next step)."""
        self._leader = leader if isinstance(leader, TritonBackend) else None

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate row metadata and split partial buffers for up to ``max_bs`` batch rows
        (``max_num_tokens`` query tokens)."""
        dev, max_rows = self.pool.device, max(max_bs, max_num_tokens)
        slots = self._partial_slots(max_rows)
        leader = self._leader._graph if self._leader is not None else None
        if leader is not None and leader.partials.lse.numel() >= slots * self.config.num_q_heads:
            partials = leader.partials
        else:
            partials = self._new_partials(slots, torch.zeros)
        self._graph = GraphState(
            max_bs=max_bs, max_rows=max_rows,
            req_pool_indices=torch.zeros(max_bs, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=dev),
            ext_lens=torch.ones(max_bs, dtype=torch.int32, device=dev),
            num_splits=torch.ones(max_bs, dtype=torch.int32, device=dev),
            partials=partials, bit_weights=bit_weights(dev),
        )

    def _partial_slots(self, max_rows: int) -> int:
        """Partial slots per query head any batch of at most ``max_rows`` partial rows needs."""
        cfg = self.config
        group = cfg.num_q_heads // cfg.num_kv_heads
        return max(work.partial_slots(max_rows, self.rows[k], cfg.num_kv_heads, group,
                                      self.rows[k].blocks.get("BLOCK_M", 1))
                   for k in self.rows if (k in MLA_KERNELS) == self._mla and (may_split(k) or k in MLA_SPLIT))

    def _new_partials(self, slots: int, alloc: Any = torch.empty) -> Partials:
        cfg, dev = self.config, self.pool.device
        cells = slots * cfg.num_q_heads
        return Partials(alloc(cells * cfg.out_head_size, dtype=torch.float32, device=dev),
                         alloc(cells, dtype=torch.float32, device=dev))

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        """Copy ``batch`` into the static buffers and point the kernels' metadata at them."""
        state = self._graph_state(batch)
        sizing = self._sizing(batch)
        state.captured.add(_graph_key(batch))
        req, seq, ext, splits, tree = self._copy_in(state, batch, sizing, allocate=True)
        self._meta = make_meta(batch, sizing, req, seq, ext, splits, tree,
                                self._partial_views(state.partials, batch, sizing))

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Copy ``batch``'s values into the static buffers and derive the split counts and
        packed mask from them on the device; no allocation of kept tensors, no host sync.

        ``batch`` must have the shape of a captured batch (kernel, batch size, query tokens):
        the captured grid and split cap follow from it, so another shape (the unpadded
        rows of a padded capture) is refused rather than replayed with a wrong split cap.
        """
        state = self._graph_state(batch)
        key = _graph_key(batch)
        if key not in state.captured:
            sizes = sorted(bs for k, bs, t in state.captured if (k, t) == (key[0], key[2]))
            raise InvalidValue("batch_size", batch.batch_size,
                               f"a captured batch of {key[0]} with {key[2]} query token(s) per row: "
                               f"{', '.join(map(str, sizes)) or 'none captured'}; hand init_replay_metadata "
                               "the batch as captured (padded), not its real rows")
        self._copy_in(state, batch, self._sizing(batch), allocate=False)

    def _graph_state(self, batch: ForwardBatch) -> GraphState:
        if self._graph is None:
            raise RuntimeError("init_graph_state(max_bs, max_num_tokens) must run before capture")
        if batch.batch_size > self._graph.max_bs:
            raise ValueError(f"batch_size={batch.batch_size} (supported: <= max_bs="
                             f"{self._graph.max_bs} given to init_graph_state)")
        if partial_rows(batch) > self._graph.max_rows:
            raise ValueError(f"num_tokens={batch.num_tokens} (supported: <= max_num_tokens="
                             f"{self._graph.max_rows} given to init_graph_state)")
        return self._graph

    def _copy_in(self, state: GraphState, batch: ForwardBatch, sizing: Sizing, allocate: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor,
                            torch.Tensor | None]:
        """Write the batch's per-row tensors into static buffers; returns their views.

        ``draft_path`` is not copied: ``forward`` reads the batch's own tensor, which a
        multi-step draft rewrites in place between steps, inside the graph too.
        """
        bs = batch.batch_size
        req, seq = state.req_pool_indices[:bs], state.seq_lens[:bs]
        req.copy_(batch.req_pool_indices)
        seq.copy_(batch.seq_lens)
        ext = None
        if batch.extend_lens is not None:
            ext = state.ext_lens[:bs]
            ext.copy_(batch.extend_lens)
        splits = state.num_splits[:bs]
        split_counts(seq, self.rows[sizing.kernel], sizing.splits, out=splits)
        mask, tree = mask_of(batch), None
        if mask is not None:
            t = mask.shape[-1]
            tree = state.buffer("tree", (t, word_count(t) + 1), torch.int32, allocate)[:bs]
            bits = state.buffer("tree_bits", (t, word_count(t) * 32), torch.int32, allocate)[:bs]
            pack_tree(mask, tree, bits, state.bit_weights)
        return req, seq, ext, splits, tree

    def _eager_partials(self, slots: int) -> Partials:
        """Split partial buffers for eager batches, grown on demand and reused."""
        if self._eager_mid is None or self._eager_mid.lse.numel() < slots * self.config.num_q_heads:
            self._eager_mid = self._new_partials(slots)
        return self._eager_mid

    def _meta_for(self, batch: ForwardBatch) -> Meta:
        if self._meta is None or self._meta.batch is not batch:
            self.init_forward_metadata(batch)
        assert self._meta is not None
        return self._meta

    # --- compute ---------------------------------------------------------------------
    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        return self._decode(q, layer, self._meta_for(batch))

    def forward_draft_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        # Read at forward time: the draft path and step belong to this very step.
        spec = batch._spec()
        if spec.draft_path is None:
            raise ValueError("spec.draft_path=None (supported: [rows, num_steps] slots for draft_decode)")
        return self._decode(q, layer, self._meta_for(batch), spec.draft_path, spec.draft_step + 1)

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Prefill, target verify and draft extend: the extend kernel variant of the batch."""
        return self._extend(q, layer, self._meta_for(batch))

    def _layer_args(self, layer: int) -> dict[str, Any]:
        """The per-layer arguments every kernel takes: cache, scales, features."""
        pool, cfg = self.pool, self.config
        window = cfg.window(layer)
        return dict(k_cache=pool.k[layer], v_cache=pool.v[layer], req_to_page=pool.req_to_page,
                    k_scale=pool.k_scale[layer:layer + 1], v_scale=pool.v_scale[layer:layer + 1],
                    kv_dtype=pool.kv_format.name, page_size=pool.page_size, sm_scale=cfg.sm_scale,
                    softcap=float(cfg.logit_softcap or 0.0),
                    window=-1 if window is None else int(window))

    def _sinks(self, layer: int) -> torch.Tensor | None:
        sinks = self.config.sinks
        return None if sinks is None else sinks[layer].to(torch.float32)

    def _decode(self, q: torch.Tensor, layer: int, meta: Meta,
                extra: torch.Tensor | None = None, num_extra: int = 0) -> torch.Tensor:
        """``q`` ``[rows, Hq, D]`` -> ``[rows, Hq, D]``: two launches (partials, merge).

        ``extra`` ``[rows, >= num_extra]``: slots each row attends after its prefix.
        """
        if self._mla:
            return mla_ops.mla_forward(q, meta, self._layer_args(layer), self._sinks(layer),
                                       self._launch["decode_reduce"], self.config.out_head_size, extra, num_extra)
        assert meta.mid_o is not None and meta.mid_lse is not None and meta.num_splits is not None
        out = q.new_empty(q.shape)
        ops.decode_partial(meta.mid_o, meta.mid_lse, q, req_pool_indices=meta.req_pool_indices,
                           seq_lens=meta.seq_lens, num_splits=meta.num_splits, extra_slots=extra,
                           num_extra=num_extra, launch=meta.launch,
                           **self._layer_args(layer))
        ops.decode_reduce(out, meta.mid_o, meta.mid_lse, meta.num_splits, self._sinks(layer), 1,
                          self._launch["decode_reduce"])
        return out

    def _extend(self, q: torch.Tensor, layer: int, meta: Meta) -> torch.Tensor:
        """``q`` ``[tokens, Hq, D]`` -> ``[tokens, Hq, D]``: one launch, or for the split
        variants two (partials, then the decode reduce over the tokens)."""
        if self._mla:
            return mla_ops.mla_forward(q, meta, self._layer_args(layer), self._sinks(layer),
                                       self._launch["decode_reduce"], self.config.out_head_size)
        out = q.new_empty(q.shape)
        split = meta.mid_o is not None
        ops.extend(out, meta.mid_o, meta.mid_lse, q, req_pool_indices=meta.req_pool_indices,
                   seq_lens=meta.seq_lens, num_splits=meta.num_splits, qo_indptr=meta.qo_indptr,
                   ext_lens=meta.ext_lens, tree=meta.tree,
                   sinks=None if split else self._sinks(layer), q_per_row=meta.q_per_row,
                   max_q=meta.max_q, launch=meta.launch, **self._layer_args(layer))
        if split:
            assert meta.mid_o is not None and meta.mid_lse is not None and meta.num_splits is not None
            ops.decode_reduce(out, meta.mid_o, meta.mid_lse, meta.num_splits, self._sinks(layer),
                              meta.q_per_row, self._launch["decode_reduce"])
        return out


# --- helpers ----------------------------------------------------------------------------

def _graph_key(batch: ForwardBatch) -> tuple[str, int, int]:
    """What fixes a captured launch's shape: (kernel, batch size, query tokens per row)."""
    return kernel_of(batch), batch.batch_size, query_tokens(batch)


def _on_host(platform: Platform) -> bool:
    """The platform's tensors live in host memory: the kernels run in Triton's interpreter."""
    return torch.device(platform.torch_device).type == "cpu"
