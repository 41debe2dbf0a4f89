"""TritonBackend: the attnhal backend contract on top of the Triton kernels.

Importing this module imports torch and attnhal but not triton: the kernels load
at the first launch (see :mod:`attnhal_triton.ops`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch, KVPool, dtype_name
from attnhal.capabilities import (
    AttentionRequest,
    BackendCapabilities,
    Phase,
    Reason,
    ReasonCode,
    not_supported_reasons,
    reason,
)
from attnhal.platform import Platform, detect
from attnhal_triton import ops
from attnhal_triton.descriptor import CAPABILITIES
from attnhal_triton.launch_table import KERNELS, LaunchRow, lookup

__all__ = ["TritonBackend"]

_DECODE_PHASES = (Phase.DECODE, Phase.DRAFT_DECODE)
# The platform only picks launch rows: a simulated or CPU platform runs the same
# kernels through the interpreter, so vendor/arch reasons do not stop construction.
_PLATFORM_CODES = (ReasonCode.VENDOR, ReasonCode.ARCH)


@dataclass
class _Meta:
    """What the kernels of one batch read; static-buffer views when graphs are captured."""

    batch: ForwardBatch
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    ext_lens: torch.Tensor | None = None
    qo_indptr: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    q_per_row: int = 1
    max_q: int = 1
    mid_o: torch.Tensor | None = None
    mid_lse: torch.Tensor | None = None


@dataclass
class _GraphState:
    """Static buffers for captured phases, sized once by ``init_graph_state``.

    ``mid_o`` ``[max_bs, Hq, S, D]`` and ``mid_lse`` ``[max_bs, Hq, S]`` hold the decode
    partials with ``S`` fixed for the backend's life. The custom mask's shape depends
    on the spec config, so its buffer is made at the first capture of each shape
    (outside the captured region) and reused by every replay.
    """

    max_bs: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    ext_lens: torch.Tensor
    mid_o: torch.Tensor
    mid_lse: torch.Tensor
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
        """Split-KV count of the decode kernels (from the launch row)."""
        return self.rows["decode"].kv_splits

    # --- metadata ------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        mid = self._eager_mid_for(batch.batch_size) if batch.phase in _DECODE_PHASES else None
        self._meta = _make_meta(batch, batch.req_pool_indices, batch.seq_lens, batch.extend_lens,
                                _mask(batch), mid)

    def share_graph_state(self, leader: AttentionBackend) -> None:
        """Reuse ``leader``'s decode partial buffers (the steps of one multi-step draft run
        one after another, and each step's reduce consumes them before the next step)."""
        self._leader = leader if isinstance(leader, TritonBackend) else None

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate row metadata and decode partial buffers for up to ``max_bs`` batch rows."""
        cfg, dev = self.config, self.pool.device
        shape = (max_bs, cfg.num_q_heads, self.num_kv_splits, cfg.head_size)
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
            mid_o=mid_o, mid_lse=mid_lse,
        )

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        if batch.phase is Phase.PREFILL:
            self.init_forward_metadata(batch)  # never captured: a variable token count
            return
        state = self._graph_state(batch)
        req, seq, ext, mask = self._copy_in(state, batch, allocate=True)
        bs = batch.batch_size
        mid = (state.mid_o[:bs], state.mid_lse[:bs]) if batch.phase in _DECODE_PHASES else None
        self._meta = _make_meta(batch, req, seq, ext, mask, mid)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Copy ``batch``'s values into the static buffers; no allocation, no host sync."""
        self._copy_in(self._graph_state(batch), batch, allocate=False)

    def _graph_state(self, batch: ForwardBatch) -> _GraphState:
        if self._graph is None:
            raise RuntimeError("init_graph_state(max_bs, max_num_tokens) must run before capture")
        if batch.batch_size > self._graph.max_bs:
            raise ValueError(f"batch_size={batch.batch_size} (supported: <= max_bs="
                             f"{self._graph.max_bs} given to init_graph_state)")
        return self._graph

    @staticmethod
    def _copy_in(state: _GraphState, batch: ForwardBatch, allocate: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
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
        mask = _mask(batch)
        if mask is not None:
            static = state.buffer("mask", tuple(mask.shape[1:]), mask.dtype, allocate)[:bs]
            static.copy_(mask)
            mask = static
        return req, seq, ext, mask

    def _eager_mid_for(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode partial buffers for eager batches, grown on demand and reused."""
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

    def forward_prefill(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        return self._extend(q, layer, self._meta_for(batch))

    def forward_target_verify(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        return self._extend(q, layer, self._meta_for(batch))

    def forward_draft_extend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        return self._extend(q, layer, self._meta_for(batch))

    def _decode(self, q: torch.Tensor, layer: int, meta: _Meta,
                extra: torch.Tensor | None = None, num_extra: int = 0) -> torch.Tensor:
        """``q`` ``[rows, Hq, D]`` -> ``[rows, Hq, D]``: two launches (partials, merge).

        ``extra`` ``[rows, >= num_extra]``: slots each row attends after its prefix.
        """
        assert meta.mid_o is not None and meta.mid_lse is not None
        out = q.new_empty(q.shape)
        ops.decode_partial(meta.mid_o, meta.mid_lse, q, self.pool.k[layer], self.pool.v[layer],
                           self.pool.req_to_token, meta.req_pool_indices, meta.seq_lens,
                           extra, num_extra, self.config.sm_scale,
                           self._launch["decode"])
        ops.decode_reduce(out, meta.mid_o, meta.mid_lse, self._launch["decode_reduce"])
        return out

    def _extend(self, q: torch.Tensor, layer: int, meta: _Meta) -> torch.Tensor:
        """``q`` ``[tokens, Hq, D]`` -> ``[tokens, Hq, D]``: one launch."""
        out = q.new_empty(q.shape)
        ops.extend(out, q, self.pool.k[layer], self.pool.v[layer], self.pool.req_to_token,
                   meta.req_pool_indices, meta.seq_lens, meta.qo_indptr, meta.ext_lens,
                   meta.mask, meta.q_per_row, meta.max_q, self.config.sm_scale,
                   self._launch["extend"])
        return out


# --- helpers ----------------------------------------------------------------------------

def _check_supported(config: AttentionConfig, pool: KVPool, dtype: str, platform: Platform) -> None:
    request = AttentionRequest(dtype=dtype, kv_dtype=dtype_name(pool.dtype), head_size=config.head_size,
                               page_size=1, num_q_heads=config.num_q_heads,
                               num_kv_heads=config.num_kv_heads)
    reasons = [r for r in not_supported_reasons(CAPABILITIES, request, platform)
               if r.code not in _PLATFORM_CODES]
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


def _make_meta(batch: ForwardBatch, req: torch.Tensor, seq: torch.Tensor, ext: torch.Tensor | None,
               mask: torch.Tensor | None, mid: tuple[torch.Tensor, torch.Tensor] | None) -> _Meta:
    """Per-phase launch parameters; only ``prefill`` reads a host value (its grid size)."""
    meta = _Meta(batch, req, seq, mid_o=mid[0] if mid else None, mid_lse=mid[1] if mid else None)
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
        meta.mask = mask
    elif phase is Phase.DRAFT_EXTEND:
        if ext is None:
            raise ValueError("extend_lens=None (supported: [bs] int32 accepted lengths for draft_extend)")
        meta.q_per_row = meta.max_q = batch._spec().draft_extend_len
        meta.ext_lens = ext
    return meta
