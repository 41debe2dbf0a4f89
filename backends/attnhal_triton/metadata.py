"""Per-batch metadata of the Triton backend: what each launch reads, how it is sized,
and the static buffers of graph capture.

Importing this module imports torch and attnhal but not triton.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnhal.backend import ForwardBatch
from attnhal.phases import Phase
from attnhal_triton.launch_table import LaunchRow

__all__ = ["DECODE_PHASES", "GraphState", "Meta", "Partials", "Sizing", "kernel_of", "make_meta",
           "mask_of", "may_split", "partial_rows", "query_tokens", "split_counts"]

DECODE_PHASES = (Phase.DECODE, Phase.DRAFT_DECODE)


@dataclass
class Meta:
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
    launch: str = ""


@dataclass(frozen=True)
class Sizing:
    """One batch's launch sizing (host values, fixed for a captured batch size):
    the kernel variant, the batch's split cap (1 for an extend: no partials), its
    encoded launch row (an extend's ``BLOCK_M`` sized to its query rows)."""

    kernel: str
    splits: int
    launch: str

    @property
    def split(self) -> bool:
        return self.kernel == "decode" or self.splits > 1


@dataclass
class Partials:
    """Flat fp32 buffers for split partials: ``o`` ``[slots * Hq * D]``, ``lse``
    ``[slots * Hq]``, viewed per batch as ``[rows, Hq, S, D]`` / ``[rows, Hq, S]``."""

    o: torch.Tensor
    lse: torch.Tensor

    def views(self, rows: int, splits: int, num_q_heads: int, head_size: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        cells = rows * num_q_heads * splits
        if cells > self.lse.numel():
            raise ValueError(f"partial rows x splits={rows}x{splits} (supported: at most "
                             f"{self.lse.numel() // num_q_heads} slots sized at init_graph_state)")
        return (self.o[:cells * head_size].view(rows, num_q_heads, splits, head_size),
                self.lse[:cells].view(rows, num_q_heads, splits))


@dataclass
class GraphState:
    """Static buffers for captured phases, sized once by ``init_graph_state``.

    ``partials`` hold the split partials of any captured batch (:func:`work.partial_slots`
    bounds them by the work, not by the batch size); ``num_splits`` ``[max_bs]`` each
    row's split count. ``captured`` keys the batches captured: a captured launch froze its
    grid and split cap from the batch size, so a replay must be handed that very batch
    shape (the padded one), never the real rows alone. The tree mask's shape depends on the spec config, so its buffers
    are made at the first capture of each shape (outside the captured region) and
    reused by every replay.
    """

    max_bs: int
    max_rows: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    ext_lens: torch.Tensor
    num_splits: torch.Tensor
    partials: Partials
    bit_weights: torch.Tensor
    by_shape: dict[tuple[str, tuple[int, ...]], torch.Tensor] = field(default_factory=dict)
    #: (kernel, batch size, query tokens) of each captured batch: what a replay may be handed.
    captured: set[tuple[str, int, int]] = field(default_factory=set)

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
               allocate: bool) -> torch.Tensor:
        key = (name, shape)
        if key not in self.by_shape:
            if not allocate:
                raise RuntimeError(f"replay with {name} shape {shape} that was never captured")
            self.by_shape[key] = torch.zeros((self.max_bs, *shape), dtype=dtype,
                                             device=self.seq_lens.device)
        return self.by_shape[key]


def mask_of(batch: ForwardBatch) -> torch.Tensor | None:
    if batch.phase is Phase.TARGET_VERIFY and batch.spec is not None:
        return batch.spec.custom_mask
    return None


def kernel_of(batch: ForwardBatch) -> str:
    """The launch-table kernel variant that serves ``batch``."""
    phase = batch.phase
    if phase in DECODE_PHASES:
        return "decode"
    if phase is Phase.TARGET_VERIFY:
        return "extend_verify_tree" if mask_of(batch) is not None else "extend_verify"
    return "extend_draft" if phase is Phase.DRAFT_EXTEND else "extend_prefill"


def may_split(kernel: str) -> bool:
    """Whether ``kernel`` may split the KV range (decode always writes partials)."""
    return kernel == "decode" or kernel in ("extend_verify", "extend_verify_tree", "extend_draft")


def query_tokens(batch: ForwardBatch) -> int:
    """Query tokens of each row of a split-capable phase (1 for decode and prefill,
    whose launch sizing does not depend on them)."""
    phase = batch.phase
    if phase is Phase.TARGET_VERIFY:
        return batch._spec().num_draft_tokens
    if phase is Phase.DRAFT_EXTEND:
        return batch._spec().draft_extend_len
    return 1


def partial_rows(batch: ForwardBatch) -> int:
    """Rows of split partials: one per decode row, one per query token of a split extend."""
    return batch.batch_size if batch.phase in DECODE_PHASES else batch.num_tokens


def split_counts(seq_lens: torch.Tensor, row: LaunchRow, cap: int,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``clamp(ceil(seq_lens / split_len), 1, cap)`` per row, int32, on the device
    (``cap``: the batch's split cap).

    In place on ``out`` when given (graph replay: the buffer the captured kernels read).
    """
    if out is None:
        out = torch.empty_like(seq_lens, dtype=torch.int32)
    out.copy_(seq_lens)
    out.add_(row.split_len - 1).div_(row.split_len, rounding_mode="floor")
    return out.clamp_(1, cap)


def make_meta(batch: ForwardBatch, sizing: Sizing, req: torch.Tensor, seq: torch.Tensor,
               ext: torch.Tensor | None, splits: torch.Tensor | None, tree: torch.Tensor | None,
               mid: tuple[torch.Tensor, torch.Tensor] | None) -> Meta:
    """Per-phase launch parameters; only ``prefill`` reads a host value (its grid size)."""
    split = sizing.split
    meta = Meta(batch, req, seq, kernel=sizing.kernel, num_splits=splits if split else None,
                 tree=tree, mid_o=mid[0] if mid and split else None,
                 mid_lse=mid[1] if mid and split else None, launch=sizing.launch)
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
