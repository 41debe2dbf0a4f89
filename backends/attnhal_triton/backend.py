"""TritonBackend: the attnhal backend contract on top of the Triton kernels.

Importing this module imports torch and attnhal but not triton: the kernels load
at the first launch (see :mod:`attnhal_triton.ops`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch, KVPool, dtype_name, maybe_validate_batch
from attnhal.capabilities import AttentionRequest, BackendCapabilities, not_supported_reasons
from attnhal.phases import Phase
from attnhal.platform import Platform, detect
from attnhal.reasons import Reason, ReasonCode, reason
from attnhal_triton import ops
from attnhal_triton.descriptor import CAPABILITIES
from attnhal_triton.launch_table import KERNELS, LaunchRow, lookup
from attnhal_triton.tree_mask import bit_weights, new_tree, pack_tree, word_count

__all__ = ["TritonBackend"]

_DECODE_PHASES = (Phase.DECODE, Phase.DRAFT_DECODE)
# Phases whose extend splits the KV range into partials merged by decode_reduce.
_SPLIT_PHASES = (Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND)
# The platform only picks launch rows: a simulated or CPU platform runs the same
# kernels through the interpreter, so vendor/arch reasons do not stop construction.
_PLATFORM_CODES = (ReasonCode.VENDOR, ReasonCode.ARCH)


@dataclass
class _Meta:
    """What the kernels of one batch read; static-buffer views when graphs are captured."""

    batch: ForwardBatch
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    kernel: str = "decode"
    num_splits: torch.Tensor | None = None
    ext_lens: torch.Tensor | None = None
    qo_indptr: torch.Tensor | None = None
    tree: torch.Tensor | None = None
    q_per_row: int = 1
    max_q: int = 1
    mid_o: torch.Tensor | None = None
    mid_lse: torch.Tensor | None = None


@dataclass
class _GraphState:
    """Static buffers for captured phases, sized once by ``init_graph_state``.

    ``mid_o`` ``[max(max_bs, max_num_tokens), Hq, S, D]`` and ``mid_lse`` ``[..., Hq, S]``
    hold the split partials (decode rows, or split-extend tokens) with ``S`` the rows'
    largest ``kv_splits``; ``num_splits`` ``[max_bs]`` each row's split count. The tree
    mask's shape depends on the spec config, so its buffers are made at the first
    capture of each shape (outside the captured region) and reused by every replay.
    """

    max_bs: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    ext_lens: torch.Tensor
    num_splits: torch.Tensor
    mid_o: torch.Tensor
    mid_lse: torch.Tensor
    bit_weights: torch.Tensor
    by_shape: dict[tuple[str, tuple[int, ...]], torch.Tensor] = field(default_factory=dict)

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
               allocate: bool) -> torch.Tensor:
        key = (name, shape)
        if key not in self.by_shape:
            if not allocate:
                raise RuntimeError(f"replay with {name} shape {shape} that was never captured")
            self.by_shape[key] = torch.zeros((self.max_bs, *shape), dtype=dtype,
                                             device=self.seq_lens.device)
        return self.by_shape[key]


class TritonBackend(AttentionBackend):
    """Paged attention in Triton for every phase (CUDA and HIP; CPU via the interpreter).

    Parameters
    ----------
    config, pool: see :class:`~attnhal.backend.AttentionBackend`.
    platform: selects the launch-table rows; :func:`attnhal.platform.detect` if None.
    """

    capabilities: ClassVar[BackendCapabilities] = CAPABILITIES

    def __init__(self, config: AttentionConfig, pool: KVPool, platform: Platform | None = None) -> None:
        super().__init__(config, pool)
        self.platform = platform if platform is not None else detect()
        dtype = dtype_name(config.dtype)
        _check_supported(config, pool, dtype, self.platform)
        self.rows: dict[str, LaunchRow] = {
            k: lookup(k, self.platform, config.head_size, dtype) for k in KERNELS}
        self._launch = {k: row.encode() for k, row in self.rows.items()}
        self._meta: _Meta | None = None
        self._graph: _GraphState | None = None
        self._eager_mid: tuple[torch.Tensor, torch.Tensor] | None = None
        self._leader: TritonBackend | None = None

    @classmethod
    def runtime_reasons(cls, platform: Platform) -> list[Reason]:
        """Triton runs host tensors only in its interpreter, which must be on before kernels are defined."""
        on_host = torch.device(platform.torch_device).type == "cpu"
        if on_host and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            return [Reason(ReasonCode.RUNTIME, f"device={platform.torch_device} (supported: a GPU, or "
                           "TRITON_INTERPRET=1 set before the Triton kernels are imported)")]
        return []

    @property
    def num_kv_splits(self) -> int:
        """Most KV splits of a row (decode and split extend): the partial buffers' ``S``."""
        return max(row.kv_splits for row in self.rows.values())

    # --- metadata ------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager: the batch's kernel variant, split counts, packed tree mask and partial buffers."""
        maybe_validate_batch(batch, self.pool, self.config)
        kernel = _kernel_of(batch)
        splits = _split_counts(batch.seq_lens, self.rows[kernel]) if _splits(kernel) else None
        mid = self._eager_mid_for(_partial_rows(batch)) if splits is not None else None
        tree = new_tree(_mask(batch))
        self._meta = _make_meta(batch, kernel, batch.req_pool_indices, batch.seq_lens,
                                batch.extend_lens, splits, tree, mid)

    def share_graph_state(self, leader: AttentionBackend) -> None:
        """Reuse ``leader``'s partial buffers (the steps of one multi-step draft run
        one after another, and each step's reduce consumes them before the next step)."""
        self._leader = leader if isinstance(leader, TritonBackend) else None

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate row metadata and split partial buffers for up to ``max_bs`` batch rows
        (``max_num_tokens`` query tokens)."""
        cfg, dev = self.config, self.pool.device
        shape = (max(max_bs, max_num_tokens), cfg.num_q_heads, self.num_kv_splits, cfg.head_size)
        leader = self._leader._graph if self._leader is not None else None
        if leader is not None and tuple(leader.mid_o.shape) == shape:
            mid_o, mid_lse = leader.mid_o, leader.mid_lse
        else:
            mid_o = torch.zeros(shape, dtype=torch.float32, device=dev)
            mid_lse = torch.zeros(shape[:-1], dtype=torch.float32, device=dev)
        self._graph = _GraphState(
            max_bs=max_bs,
            req_pool_indices=torch.zeros(max_bs, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=dev),
            ext_lens=torch.ones(max_bs, dtype=torch.int32, device=dev),
            num_splits=torch.ones(max_bs, dtype=torch.int32, device=dev),
            mid_o=mid_o, mid_lse=mid_lse, bit_weights=bit_weights(dev),
        )

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        """Copy ``batch`` into the static buffers and point the kernels' metadata at them."""
        state = self._graph_state(batch)
        req, seq, ext, splits, tree = self._copy_in(state, batch, allocate=True)
        rows = _partial_rows(batch)
        self._meta = _make_meta(batch, _kernel_of(batch), req, seq, ext, splits, tree,
                                (state.mid_o[:rows], state.mid_lse[:rows]))

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Copy ``batch``'s values into the static buffers and derive the split counts and
        packed mask from them on the device; no allocation of kept tensors, no host sync."""
        self._copy_in(self._graph_state(batch), batch, allocate=False)

    def _graph_state(self, batch: ForwardBatch) -> _GraphState:
        if self._graph is None:
            raise RuntimeError("init_graph_state(max_bs, max_num_tokens) must run before capture")
        if batch.batch_size > self._graph.max_bs:
            raise ValueError(f"batch_size={batch.batch_size} (supported: <= max_bs="
                             f"{self._graph.max_bs} given to init_graph_state)")
        if _partial_rows(batch) > self._graph.mid_o.shape[0]:
            raise ValueError(f"num_tokens={batch.num_tokens} (supported: <= max_num_tokens="
                             f"{self._graph.mid_o.shape[0]} given to init_graph_state)")
        return self._graph

    def _copy_in(self, state: _GraphState, batch: ForwardBatch, allocate: bool
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
        _split_counts(seq, self.rows[_kernel_of(batch)], out=splits)
        mask, tree = _mask(batch), None
        if mask is not None:
            t = mask.shape[-1]
            tree = state.buffer("tree", (t, word_count(t) + 1), torch.int32, allocate)[:bs]
            bits = state.buffer("tree_bits", (t, word_count(t) * 32), torch.int32, allocate)[:bs]
            pack_tree(mask, tree, bits, state.bit_weights)
        return req, seq, ext, splits, tree

    def _eager_mid_for(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Split partial buffers for eager batches, grown on demand and reused."""
        if self._eager_mid is None or self._eager_mid[0].shape[0] < rows:
            cfg, splits = self.config, self.num_kv_splits
            self._eager_mid = (
                torch.empty((rows, cfg.num_q_heads, splits, cfg.head_size),
                            dtype=torch.float32, device=self.pool.device),
                torch.empty((rows, cfg.num_q_heads, splits), dtype=torch.float32,
                            device=self.pool.device),
            )
        return self._eager_mid[0][:rows], self._eager_mid[1][:rows]

    def _meta_for(self, batch: ForwardBatch) -> _Meta:
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
        scaled = pool.is_fp8
        window = cfg.window(layer)
        return dict(k_cache=pool.k[layer], v_cache=pool.v[layer], req_to_page=pool.req_to_page,
                    k_scale=pool.k_scale[layer:layer + 1] if scaled else None,
                    v_scale=pool.v_scale[layer:layer + 1] if scaled else None,
                    page_size=pool.page_size, sm_scale=cfg.sm_scale,
                    softcap=float(cfg.logit_softcap or 0.0),
                    window=-1 if window is None else int(window))

    def _sinks(self, layer: int) -> torch.Tensor | None:
        sinks = self.config.sinks
        return None if sinks is None else sinks[layer].to(torch.float32)

    def _decode(self, q: torch.Tensor, layer: int, meta: _Meta,
                extra: torch.Tensor | None = None, num_extra: int = 0) -> torch.Tensor:
        """``q`` ``[rows, Hq, D]`` -> ``[rows, Hq, D]``: two launches (partials, merge).

        ``extra`` ``[rows, >= num_extra]``: slots each row attends after its prefix.
        """
        assert meta.mid_o is not None and meta.mid_lse is not None and meta.num_splits is not None
        out = q.new_empty(q.shape)
        ops.decode_partial(meta.mid_o, meta.mid_lse, q, req_pool_indices=meta.req_pool_indices,
                           seq_lens=meta.seq_lens, num_splits=meta.num_splits, extra_slots=extra,
                           num_extra=num_extra, launch=self._launch["decode"],
                           **self._layer_args(layer))
        ops.decode_reduce(out, meta.mid_o, meta.mid_lse, meta.num_splits, self._sinks(layer), 1,
                          self._launch["decode_reduce"])
        return out

    def _extend(self, q: torch.Tensor, layer: int, meta: _Meta) -> torch.Tensor:
        """``q`` ``[tokens, Hq, D]`` -> ``[tokens, Hq, D]``: one launch, or for the split
        variants two (partials, then the decode reduce over the tokens)."""
        out = q.new_empty(q.shape)
        split = meta.mid_o is not None
        ops.extend(out, meta.mid_o, meta.mid_lse, q, req_pool_indices=meta.req_pool_indices,
                   seq_lens=meta.seq_lens, num_splits=meta.num_splits, qo_indptr=meta.qo_indptr,
                   ext_lens=meta.ext_lens, tree=meta.tree,
                   sinks=None if split else self._sinks(layer), q_per_row=meta.q_per_row,
                   max_q=meta.max_q, launch=self._launch[meta.kernel], **self._layer_args(layer))
        if split:
            assert meta.mid_o is not None and meta.mid_lse is not None and meta.num_splits is not None
            ops.decode_reduce(out, meta.mid_o, meta.mid_lse, meta.num_splits, self._sinks(layer),
                              meta.q_per_row, self._launch["decode_reduce"])
        return out


# --- helpers ----------------------------------------------------------------------------

def _check_supported(config: AttentionConfig, pool: KVPool, dtype: str, platform: Platform) -> None:
    request = AttentionRequest(dtype=dtype, kv_dtype=pool.kv_dtype, head_size=config.head_size,
                               page_size=pool.page_size, num_q_heads=config.num_q_heads,
                               num_kv_heads=config.num_kv_heads, features=config.features)
    reasons = [r for r in not_supported_reasons(CAPABILITIES, request, platform)
               if r.code not in _PLATFORM_CODES]
    reasons += pool.platform_reasons(platform)
    if (pool.num_kv_heads, pool.head_dim) != (config.num_kv_heads, config.head_size):
        reasons.append(reason(ReasonCode.HEAD_SIZE, "pool.num_kv_heads/head_dim",
                              f"{pool.num_kv_heads}/{pool.head_dim}",
                              f"{config.num_kv_heads}/{config.head_size} as in the attention config"))
    if reasons:
        raise ValueError("triton backend cannot serve this config: " + "; ".join(map(str, reasons)))


def _mask(batch: ForwardBatch) -> torch.Tensor | None:
    if batch.phase is Phase.TARGET_VERIFY and batch.spec is not None:
        return batch.spec.custom_mask
    return None


def _kernel_of(batch: ForwardBatch) -> str:
    """The launch-table kernel variant that serves ``batch``."""
    phase = batch.phase
    if phase in _DECODE_PHASES:
        return "decode"
    if phase is Phase.TARGET_VERIFY:
        return "extend_verify_tree" if _mask(batch) is not None else "extend_verify"
    return "extend_draft" if phase is Phase.DRAFT_EXTEND else "extend_prefill"


def _splits(kernel: str) -> bool:
    return kernel == "decode" or kernel in ("extend_verify", "extend_verify_tree", "extend_draft")


def _partial_rows(batch: ForwardBatch) -> int:
    """Rows of split partials: one per decode row, one per query token of a split extend."""
    return batch.batch_size if batch.phase in _DECODE_PHASES else batch.num_tokens


def _split_counts(seq_lens: torch.Tensor, row: LaunchRow, out: torch.Tensor | None = None) -> torch.Tensor:
    """``clamp(ceil(seq_lens / split_len), 1, kv_splits)`` per row, int32, on the device.

    In place on ``out`` when given (graph replay: the buffer the captured kernels read).
    """
    if out is None:
        out = torch.empty_like(seq_lens, dtype=torch.int32)
    out.copy_(seq_lens)
    out.add_(row.split_len - 1).div_(row.split_len, rounding_mode="floor")
    return out.clamp_(1, row.kv_splits)


def _make_meta(batch: ForwardBatch, kernel: str, req: torch.Tensor, seq: torch.Tensor,
               ext: torch.Tensor | None, splits: torch.Tensor | None, tree: torch.Tensor | None,
               mid: tuple[torch.Tensor, torch.Tensor] | None) -> _Meta:
    """Per-phase launch parameters; only ``prefill`` reads a host value (its grid size)."""
    split = _splits(kernel)
    meta = _Meta(batch, req, seq, kernel=kernel, num_splits=splits if split else None, tree=tree,
                 mid_o=mid[0] if mid and split else None, mid_lse=mid[1] if mid and split else None)
    phase = batch.phase
    if phase is Phase.PREFILL:
        if ext is None:
            raise ValueError("extend_lens=None (supported: [bs] int32 new tokens per row for prefill)")
        meta.ext_lens = ext
        meta.qo_indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32, device=ext.device)
        torch.cumsum(ext, 0, dtype=torch.int32, out=meta.qo_indptr[1:])
        lens = batch.extend_lens_cpu
        meta.max_q = max(lens) if lens else int(ext.max()) if batch.batch_size else 0
    elif phase is Phase.TARGET_VERIFY:
        meta.q_per_row = meta.max_q = batch._spec().num_draft_tokens
    elif phase is Phase.DRAFT_EXTEND:
        if ext is None:
            raise ValueError("extend_lens=None (supported: [bs] int32 accepted lengths for draft_extend)")
        meta.q_per_row = meta.max_q = batch._spec().draft_extend_len
        meta.ext_lens = ext
    return meta
