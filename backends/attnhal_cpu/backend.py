"""CpuBackend: the attnhal backend contract on top of the fused C++ kernel.

Every phase is one launch of ``attnhal_cpu::attend`` over ``rows`` of ``T`` query
tokens (see ``csrc/attention.cpp``): decode and draft decode have ``T = 1``, target
verify ``T = num_draft_tokens`` (tree mask or causal chain), draft extend
``T = draft_extend_len`` (real tokens from ``extend_lens``), and prefill is cut into
blocks of up to :data:`~attnhal_cpu.descriptor.PREFILL_BLOCK` tokens, each one kernel
row. The kernel splits each (row, KV head) into ``num_splits`` KV ranges computed
from ``seq_lens`` inside the kernel, so a captured graph follows new lengths.

Graphs: ``init_graph_state`` allocates every static buffer (row metadata and the
split scratch ``mid_o``/``mid_lse``) once; the split count is fixed per captured
batch size; ``init_replay_metadata`` only copies into the static buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch, KVPool, maybe_validate_batch
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Phase
from attnhal.platform import Platform
from attnhal.reasons import Reason, ReasonCode, reason
from attnhal_cpu.build import native_build
from attnhal_cpu.descriptor import CAPABILITIES, PREFILL_BLOCK
from attnhal_cpu.ops import Kernel, host_kernel
from attnhal_cpu.params import split_count

__all__ = ["CpuBackend", "split_count"]

@dataclass
class _Meta:
    """What one launch reads: views of static buffers when graphs are captured.

    ``prefill_index``: prefill only, ``[tokens]`` int64 place of each packed query token
    in the block-padded layout ``[rows * T, H, D]`` the kernel reads.
    """

    batch: ForwardBatch
    req: torch.Tensor
    seq: torch.Tensor
    ext: torch.Tensor | None
    mask: torch.Tensor | None
    tokens_per_row: int
    splits: int
    mid_o: torch.Tensor
    mid_lse: torch.Tensor
    prefill_index: torch.Tensor | None = None


@dataclass
class _GraphState:
    """Static buffers sized once by ``init_graph_state``; masks per shape at their first capture."""

    max_bs: int
    req: torch.Tensor
    seq: torch.Tensor
    ext: torch.Tensor
    mid_o: torch.Tensor
    mid_lse: torch.Tensor
    masks: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    def bind(self, batch: ForwardBatch, allocate: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Copy ``batch``'s per-row tensors into the static buffers and return the views the
        kernel reads. ``draft_path`` stays the batch's own tensor: a multi-step draft rewrites
        it in place between steps, inside the graph too."""
        rows = batch.batch_size
        if rows > self.max_bs:
            raise ValueError(f"batch_size={rows} (supported: <= max_bs={self.max_bs} given to init_graph_state)")
        self.req[:rows].copy_(batch.req_pool_indices)
        self.seq[:rows].copy_(batch.seq_lens)
        ext, mask = _ext(batch), _mask(batch)
        if ext is not None:
            ext = self.ext[:rows].copy_(ext)
        if mask is not None:
            shape = tuple(mask.shape[1:])
            if shape not in self.masks:
                if not allocate:
                    raise RuntimeError(f"replay with a custom_mask of shape {shape} that was never captured")
                self.masks[shape] = torch.zeros((self.max_bs, *shape), dtype=torch.bool)
            mask = self.masks[shape][:rows].copy_(mask)
        return self.req[:rows], self.seq[:rows], ext, mask


class CpuBackend(AttentionBackend):
    """Fused paged attention on the CPU for every phase, eager and in graphs.

    Parameters
    ----------
    config, pool, platform: see :class:`~attnhal.backend.AttentionBackend` (which checks the
        descriptor's claims); the pool lives on the CPU.
    num_splits: KV splits per row; ``None``: :func:`split_count` per batch.
    kernel: the build and parameters to run (:class:`~attnhal_cpu.ops.Kernel`); ``None``: this
        host's build with the parameters measured here (:func:`~attnhal_cpu.ops.host_kernel`).
        Benchmarks pass another instruction set's build to compare them in one process.

    Raises :class:`~attnhal_cpu.ops.NativeUnavailable` when the kernel cannot be built
    here (``runtime_reasons`` says so before construction).
    """

    capabilities: ClassVar[BackendCapabilities] = CAPABILITIES

    def __init__(self, config: AttentionConfig, pool: KVPool, *, platform: Platform | None = None,
                 num_splits: int | None = None, kernel: Kernel | None = None) -> None:
        super().__init__(config, pool, platform=platform)
        if pool.device.type != "cpu":  # the base checked the claims; this is where the kernel runs
            raise ValueError(f"cpu backend: {reason(ReasonCode.RUNTIME, 'pool.device', pool.device, 'cpu')}")
        if num_splits is not None and num_splits < 1:
            raise ValueError(f"num_splits={num_splits} (supported: an int >= 1, or None)")
        self.num_splits = num_splits
        self.kernel = kernel if kernel is not None else host_kernel(pool.dtype.itemsize)
        self.kernel_params = self.kernel.params.for_itemsize(pool.dtype.itemsize)  # this pool's cache width
        self._meta: _Meta | None = None
        self._graph: _GraphState | None = None
        self._leader: CpuBackend | None = None
        self._eager_mid: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def runtime_reasons(cls, platform: Platform) -> list[Reason]:
        """The kernel runs on host tensors and must have built here (its error otherwise)."""
        if torch.device(platform.torch_device).type != "cpu":
            return [reason(ReasonCode.RUNTIME, "device", platform.torch_device, "cpu")]
        build = native_build()
        if not build.ok:
            return [Reason(ReasonCode.RUNTIME, f"native_build={build.name} failed (supported: a C++17 "
                                               f"compiler and ninja; see docs/cpu.md): {build.error}")]
        return []

    @classmethod
    def build_info(cls) -> str | None:
        return native_build().describe()

    @classmethod
    def parameters_info(cls) -> str | None:
        """The build's instruction set and its parameters here, measured or defaulted (tuning.py)."""
        build = native_build()
        return f"{build.name}: {build.parameters()}" if build.ok else None

    # --- metadata ----------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager: lengths may be read on the host (split count, prefill blocks)."""
        maybe_validate_batch(batch, self.pool, self.config)
        if batch.phase is Phase.PREFILL:
            self._meta = self._prefill_meta(batch)
            return
        T = _tokens_per_row(batch)
        host = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
        longest = int(host.max()) if batch.batch_size else 0
        splits = self._splits(batch.batch_size, longest + _extra_columns(batch))
        mid = self._eager_scratch(batch.batch_size * T, splits)
        self._meta = _Meta(batch, batch.req_pool_indices, batch.seq_lens, _ext(batch), _mask(batch), T, splits, *mid)

    def _prefill_meta(self, batch: ForwardBatch) -> _Meta:
        """Blocks of up to PREFILL_BLOCK new tokens of a row, each a kernel row of ``T`` tokens."""
        if batch.extend_lens is None:
            raise ValueError("extend_lens=None (supported: [bs] int32 new tokens per row for prefill)")
        ext = batch.extend_lens_cpu if batch.extend_lens_cpu is not None else batch.extend_lens.tolist()
        seq = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens).tolist()
        reqs = batch.req_pool_indices.tolist()
        T = max(1, min(PREFILL_BLOCK, max((int(n) for n in ext), default=1)))
        req: list[int] = []
        lens: list[int] = []
        real: list[int] = []
        index: list[int] = []
        for r, (n, s) in enumerate(zip(ext, seq)):
            prefix = int(s) - int(n)
            for t0 in range(0, int(n), T):
                t1 = min(int(n), t0 + T)
                index.extend(len(req) * T + i for i in range(t1 - t0))
                req.append(reqs[r])
                lens.append(prefix + t1)  # block row: the KV up to its last token; the block is its "extend"
                real.append(t1 - t0)
        dev = self.pool.device
        splits = self._splits(len(req), max(lens, default=0))
        return _Meta(batch, torch.tensor(req, dtype=torch.int64, device=dev),
                     torch.tensor(lens, dtype=torch.int32, device=dev),
                     torch.tensor(real, dtype=torch.int32, device=dev), None, T, splits,
                     *self._eager_scratch(len(req) * T, splits),
                     prefill_index=torch.tensor(index, dtype=torch.int64, device=dev))

    def _splits(self, rows: int, length: int) -> int:
        if self.num_splits is not None:
            return self.num_splits
        return split_count(rows, length, torch.get_num_threads(), self.kernel_params.tasks_per_thread)

    def _eager_scratch(self, tokens: int, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Split scratch for eager batches, grown on demand and reused."""
        parts = tokens * self.config.num_q_heads * splits
        if self._eager_mid is None or self._eager_mid[1].numel() < parts:
            self._eager_mid = (torch.empty(parts * self.config.head_size, dtype=torch.float32),
                               torch.empty(parts, dtype=torch.float32))
        return self._eager_mid

    def share_graph_state(self, leader: AttentionBackend) -> None:
        """Reuse ``leader``'s split scratch (multi-step draft steps run one after another)."""
        self._leader = leader if isinstance(leader, CpuBackend) else None

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate row metadata for ``max_bs`` rows and split scratch for ``max_num_tokens`` tokens."""
        if max_bs < 1 or max_num_tokens < 1:
            raise ValueError(f"max_bs, max_num_tokens={max_bs}, {max_num_tokens} (supported: >= 1)")
        cfg = self.config
        # The split count only falls as rows grow, so one row's count bounds every bucket.
        parts = max(max_bs, max_num_tokens) * cfg.num_q_heads * self._splits(1, self._graph_length())
        leader = self._leader._graph if self._leader is not None else None
        if leader is not None and leader.mid_lse.numel() >= parts:
            mid_o, mid_lse = leader.mid_o, leader.mid_lse
        else:
            mid_o = torch.zeros(parts * cfg.head_size, dtype=torch.float32)
            mid_lse = torch.zeros(parts, dtype=torch.float32)
        self._graph = _GraphState(max_bs, req=torch.zeros(max_bs, dtype=torch.int64),
                                  seq=torch.ones(max_bs, dtype=torch.int32),
                                  ext=torch.ones(max_bs, dtype=torch.int32), mid_o=mid_o, mid_lse=mid_lse)

    def _graph_length(self) -> int:
        return self.pool.max_context_len

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        """Bind the static row buffers to ``batch`` before its capture."""
        state = self._static()
        req, seq, ext, mask = state.bind(batch, allocate=True)
        # Fixed for this captured size: replays of any length use the same split count.
        splits = self._splits(batch.batch_size, self._graph_length() + _extra_columns(batch))
        self._meta = _Meta(batch, req, seq, ext, mask, _tokens_per_row(batch), splits, state.mid_o, state.mid_lse)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Copy ``batch``'s per-row tensors into the static buffers: no allocation, no host sync."""
        self._static().bind(batch, allocate=False)

    def _static(self) -> _GraphState:
        if self._graph is None:
            raise RuntimeError("init_graph_state(max_bs, max_num_tokens) must run before capture")
        return self._graph

    def _meta_for(self, batch: ForwardBatch) -> _Meta:
        if self._meta is None or self._meta.batch is not batch:
            raise RuntimeError("forward: metadata of this batch not built; call init_forward_metadata(batch) "
                               "(or init_capture_metadata) with this ForwardBatch object first")
        return self._meta

    # --- compute ---------------------------------------------------------------------------
    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """``q`` ``[tokens, Hq, D]`` -> ``[tokens, Hq, D]`` in ``q``'s dtype: one kernel launch."""
        meta = self._meta_for(batch)
        extra, num_extra = None, 0
        if batch.phase is Phase.DRAFT_DECODE:
            # Read at forward time: a draft tree rewrites the path in place between steps.
            spec = batch._spec()
            if spec.draft_path is None:
                raise ValueError("spec.draft_path=None (supported: [rows, num_steps] slots for draft_decode)")
            extra, num_extra = spec.draft_path, spec.draft_step + 1
        if meta.prefill_index is not None:
            rows = int(meta.req.shape[0])
            qp = q.new_zeros((rows * meta.tokens_per_row, *q.shape[1:]))
            qp.index_copy_(0, meta.prefill_index, q)
            outp = torch.empty_like(qp)
            self._launch(outp, qp, layer, meta, None, 0)
            return outp.index_select(0, meta.prefill_index)
        out = torch.empty_like(q)
        self._launch(out, q, layer, meta, extra, num_extra)
        return out

    def _launch(self, out: torch.Tensor, q: torch.Tensor, layer: int, meta: _Meta,
                extra: torch.Tensor | None, num_extra: int) -> None:
        params = self.kernel_params
        self.kernel.op(out, meta.mid_o, meta.mid_lse, q, self.pool.k[layer], self.pool.v[layer],
                       self.pool.req_to_page, meta.req, meta.seq, meta.ext, meta.mask, extra, num_extra,
                       meta.tokens_per_row, self.pool.page_size, self.config.sm_scale, meta.splits,
                       *params.op_args())


# --- helpers ----------------------------------------------------------------------------------

def _tokens_per_row(batch: ForwardBatch) -> int:
    per_row = batch.tokens_per_row
    assert per_row is not None
    return per_row


def _extra_columns(batch: ForwardBatch) -> int:
    if batch.phase is Phase.DRAFT_DECODE and batch.spec is not None and batch.spec.draft_path is not None:
        return int(batch.spec.draft_path.shape[1])
    return 0


def _ext(batch: ForwardBatch) -> torch.Tensor | None:
    """Real query tokens per row: draft extend's accepted lengths; other uniform phases: all ``T``."""
    return batch.extend_lens if batch.phase is Phase.DRAFT_EXTEND else None


def _mask(batch: ForwardBatch) -> torch.Tensor | None:
    if batch.phase is Phase.TARGET_VERIFY and batch.spec is not None and batch.spec.custom_mask is not None:
        return batch.spec.custom_mask.contiguous()
    return None
