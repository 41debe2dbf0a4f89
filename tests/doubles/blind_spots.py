"""One-defect backends for the kit's blind spots of issue 31: batch composition, scale edges,
heterogeneous layers, acceptance boundaries, capture-to-capture determinism, empty batches.

Each is the torch backend with one defect and its descriptor unchanged (renamed), written
here (not taken from the set the kit was measured against) for the claims that catch the
kind: ``tests/testing/test_blind_spots.py`` shows each defect by hand and checks that its
claim is falsified while the torch backend verifies it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, ClassVar

import torch

from attnhal.backend import AttentionConfig, ForwardBatch, KVPool
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Phase
from attnhal_torch import TorchBackend

__all__ = ["BLIND_SPOTS"]


class _Blind(TorchBackend):
    """The torch backend, renamed after the subclass; one thread (defects patch state per call)."""

    capabilities: ClassVar[BackendCapabilities] = TorchBackend.capabilities

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.capabilities = replace(TorchBackend.capabilities, name=f"blind-{cls.__name__}")

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        kwargs.setdefault("host_workers", 1)
        super().__init__(config, pool, **kwargs)


# --- batch composition -------------------------------------------------------------------------

class SortsRowsByLength(_Blind):
    """A decode of more than 4 rows runs its rows sorted by seq len (longest first, to balance
    the work) and writes the outputs in that order: never restored."""

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward(q, k, v, layer, batch)
        bs = batch.batch_size
        if batch.phase is not Phase.DECODE or bs <= 4:
            return out
        order = torch.argsort(batch.seq_lens.cpu(), descending=True, stable=True)
        return out.view(bs, -1, *out.shape[1:])[order].reshape(out.shape)


class ReusesRowState(_Blind):
    """Caches each request row's page table the first time it sees the row, and reuses it when
    another request later takes that row (state keyed by ``req_pool_indices``)."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        seen: dict[int, torch.Tensor] = self.__dict__.setdefault("_rows_seen", {})
        table = self.pool.req_to_page
        for row in batch.req_pool_indices.tolist():
            seen.setdefault(row, table[row].clone())
        fresh = table.clone()
        for row, stale in seen.items():
            table[row] = stale
        try:
            super().init_forward_metadata(batch)
        finally:
            table.copy_(fresh)


class OtherPathPastBatchSize(_Blind):
    """Past 32 rows a persistent-grid path is taken, which applies the softmax scale twice."""

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if batch.batch_size <= 32:
            return super().forward(q, k, v, layer, batch)
        saved = self.layer_params[layer]
        self.layer_params[layer] = replace(saved, scale=saved.scale ** 2)
        try:
            return super().forward(q, k, v, layer, batch)
        finally:
            self.layer_params[layer] = saved


# --- scale edges ---------------------------------------------------------------------------------

class Wraps16BitLengths(_Blind):
    """Seq lens are packed into 16 bits for the kernel: a context of 65,537 attends 1 key."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        host = None if batch.seq_lens_cpu is None else batch.seq_lens_cpu % 65536
        self._narrow = (batch, replace(batch, seq_lens=batch.seq_lens % 65536, seq_lens_cpu=host))
        super().init_forward_metadata(self._narrow[1])

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        narrow = getattr(self, "_narrow", (None, None))
        return super().forward(q, k, v, layer, narrow[1] if narrow[0] is batch else batch)


class Wraps32BitOffsets(_Blind):
    """Element offsets ``slot * heads * head_size`` are computed in int32: past 2^31 they wrap,
    and the keys are read from the wrong end of the pool."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pool, table = self.pool, self.pool.req_to_page
        per_page = pool.page_size * pool.num_kv_heads * pool.head_dim
        fresh = table.clone()
        wrapped = (table.to(torch.int64) * per_page) % 2**31 // per_page
        table.copy_(wrapped.to(table.dtype))
        try:
            super().init_forward_metadata(batch)
        finally:
            table.copy_(fresh)


# --- heterogeneous layers --------------------------------------------------------------------------

class LayerParamsModTwo(_Blind):
    """Per-layer parameters (window, sinks, fp8 scales) indexed by ``layer % 2``: right on
    any model of at most two layer kinds in alternation, wrong on layer 2 of (full, 6, 2, full)."""

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        saved = self.layer_params[layer]
        self.layer_params[layer] = self.layer_params[layer % 2]
        try:
            return super().forward(q, k, v, layer, batch)
        finally:
            self.layer_params[layer] = saved


# --- acceptance boundaries --------------------------------------------------------------------------

class FullAcceptanceUnmasked(_Blind):
    """A draft extend where every request accepted all its tokens takes a "dense" path without
    the causal mask: every token attends the whole row, as the last one does."""

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward(q, k, v, layer, batch)
        if batch.phase is not Phase.DRAFT_EXTEND or batch.extend_lens is None or not batch.batch_size:
            return out
        T = batch._spec().draft_extend_len
        if bool((batch.extend_lens == T).all()):
            rows = out.view(batch.batch_size, T, *out.shape[1:])
            rows.copy_(rows[:, T - 1:T].expand_as(rows).clone())
        return out


# --- determinism across captures -----------------------------------------------------------------------

class CaptureVariesTiles(_Blind):
    """Each capture picks its tile configuration from a process-wide counter: every other
    capture rounds its output one unit differently (within tolerance; bitwise not the same)."""

    _captures = itertools.count()

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        super().init_graph_state(max_bs, max_num_tokens)
        self._odd = next(CaptureVariesTiles._captures) % 2 == 1

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward(q, k, v, layer, batch)
        if getattr(self, "_odd", False):
            out.mul_(1 + torch.finfo(out.dtype).eps)  # in place: a replay allocates nothing
        return out


# --- empty batches ---------------------------------------------------------------------------------------

class EmptyBatchCrashes(_Blind):
    """Sizes its launch from ``seq_lens.max()``, which an empty batch does not have."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        int(batch.seq_lens.max())  # RuntimeError on 0 elements, as a real launch sizing would
        super().init_forward_metadata(batch)


#: Each double and the claim kind that must catch it.
BLIND_SPOTS: dict[type[TorchBackend], str] = {
    SortsRowsByLength: "batch_invariant",
    ReusesRowState: "batch_invariant",
    OtherPathPastBatchSize: "batch_invariant",
    Wraps16BitLengths: "scale_edges",
    Wraps32BitOffsets: "scale_edges",
    LayerParamsModTwo: "layer_pattern",
    FullAcceptanceUnmasked: "phase",
    CaptureVariesTiles: "deterministic",
    EmptyBatchCrashes: "empty_batch",
}
