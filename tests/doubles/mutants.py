"""One-defect backends: the mutation self-test of the conformance kit.

Each mutant is the torch reference backend with **one realistic defect** and its
descriptor unchanged (only renamed), as a backend author outside this repository would
ship it. ``tests/testing/test_mutants.py`` shows each defect by hand (a trigger
case where the mutant is wrong and the torch backend right) and checks that the kit, at
its default budget, falsifies the claim the defect breaks.

The categories are the defects real kernels have had: sizes (block boundaries, long contexts, long
prefill extends, GQA groups of 8-16, MQA with many heads, head sizes, empty and length-1
rows), inputs (explicit scale, large logits, narrow accumulators, bf16/fp16 mix-up,
non-contiguous q/k/v), properties (determinism, inputs left unchanged, flaky failures),
graphs replayed with long contexts, features in combination (a window with tree verify,
prefill tiles and wide GQA; sinks with a window and with KV splits), page-boundary
contexts, and the fp8 life cycle (scales set late, saturation, fp8 inputs and determinism).

Mutants run with ``host_workers=1``: several patch the kernel's module functions for the
duration of their own call, which must not race with a worker thread.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from unittest import mock

import torch

import attnhal_torch.kernel as kernel
import attnhal_torch.layout as torch_layout
from attnhal.backend import AttentionConfig, ForwardBatch, KVPool
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Phase
from attnhal.spec import SpecConfig
from attnhal.testing.cases import CaseRecipe
from attnhal_torch import TorchBackend
from attnhal_torch.backend import _Piece
from attnhal_torch.kernel import KVLayout, LayerParams, Workspace

__all__ = ["MUTANTS", "Mutant"]


class _OneDefect(TorchBackend):
    """The torch backend, renamed after the subclass; one thread (see the module docs)."""

    capabilities: ClassVar[BackendCapabilities] = TorchBackend.capabilities

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.capabilities = replace(TorchBackend.capabilities, name=f"mutant-{cls.__name__}")

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        kwargs.setdefault("host_workers", 1)
        super().__init__(config, pool, **kwargs)

    def _layout(self) -> KVLayout:
        """The eager layout of a uniform batch (one piece with one worker), masked everywhere."""
        assert self._plan is not None and len(self._plan.pieces) == 1
        layout = self._plan.pieces[0].layout
        layout.mask_from = 0  # the defects below change which columns are blocked
        return layout



# --- sizes ------------------------------------------------------------------------------------------

class DropsKeyAfterBlock(_OneDefect):
    """Decode loops over KV blocks of 64 with ``range(0, seq_len - 1, 64)``: when
    ``seq_len % 64 == 1`` the last key (the one in a block of its own) is never read."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if batch.phase is Phase.DECODE:
            for r, seq in enumerate(batch.seq_lens.tolist()):
                if seq > 1 and seq % 64 == 1:
                    self._layout().blocked[r, :, seq - 1] = True


class MasksFirstBlockOnly(_OneDefect):
    """Decode applies the sequence-end mask in the first KV block only (later blocks are
    assumed full): past 64 keys, a partial last block attends the padding columns."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if batch.phase is Phase.DECODE:
            layout = self._layout()
            layout.blocked[:, :, self.chunk:] = False


class TruncatesLongContext(_OneDefect):
    """Decode splits the context over a fixed table of 16 splits x 256 keys: keys past
    4096 belong to no split and are silently dropped."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if batch.phase is Phase.DECODE:
            self._layout().blocked[:, :, 4096:] = True


class PrefillTileOffset(_OneDefect):
    """Prefill processes queries in tiles of 128 and computes the causal limit from the
    tile's position minus one tile: from query 128 of a row on, each query attends 128
    keys too few."""

    def _prefill_block(self) -> int:
        return 128

    def _prefill_pieces(self, batch: ForwardBatch) -> list[_Piece]:
        pieces = super()._prefill_pieces(batch)
        assert batch.extend_lens is not None
        out, i = [], 0
        for n, seq in zip(batch.extend_lens.tolist(), batch.seq_lens.tolist()):
            for t, piece in enumerate(pieces[i:i + -(-n // 128)]):
                if t:  # the bug: the limit of a later tile is one tile short
                    wrong = seq - n + (t - 1) * 128
                    for j in range(piece.layout.tokens_per_row):
                        piece.layout.blocked[0, j, wrong + j + 1:] = True
                    piece.layout.mask_from = 0
                out.append(piece)
            i += -(-n // 128)
        return out


def _forward_heads(backend: TorchBackend, q: torch.Tensor, layer: int, batch: ForwardBatch,
                   kernel_head: torch.Tensor) -> torch.Tensor:
    """Run the attention with query head ``h`` computed as kernel head ``kernel_head[h]``."""
    moved = torch.empty_like(q)
    moved[:, kernel_head] = q
    out = TorchBackend.attend(backend, moved, layer, batch)
    return out[:, kernel_head]


class GQATilesRoundRobin(_OneDefect):
    """Wide GQA groups (8+ query heads per KV head) are split into tiles of 4 query heads,
    and tile ``t`` is given KV head ``t % num_kv_heads`` instead of ``t // (group / 4)``."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        H, KV = self.config.num_q_heads, self.config.num_kv_heads
        G = H // KV
        if G < 8 or G % 4 or KV == 1:
            return super().attend(q, layer, batch)
        h = torch.arange(H)
        tile, lane = h // 4, h % 4
        kernel_head = (tile % KV) * G + (tile // KV) * 4 + lane  # a permutation: kernel head // G = tile % KV
        return _forward_heads(self, q, layer, batch, kernel_head)


class MQAFirstTileOnly(_OneDefect):
    """MQA (one KV head) with more than 8 query heads: the grid covers one tile of 8 heads
    and the others get a copy of its output (head ``h`` gets head ``h % 8``)."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().attend(q, layer, batch)
        H = self.config.num_q_heads
        if self.config.num_kv_heads == 1 and H > 8:
            out[:, 8:] = out[:, torch.arange(8, H) % 8]
        return out


class PowerOfTwoHeadDim(_OneDefect):
    """The dot product loops over the largest power of two not above the head size:
    head sizes 80 and 96 drop their last 16 or 32 dimensions from q.k."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        D = self.config.head_size
        used = 1 << (D.bit_length() - 1)
        if used == D:
            return super().attend(q, layer, batch)
        short = q.clone()
        short[..., used:] = 0
        return super().attend(short, layer, batch)


class EmptyRowShift(_OneDefect):
    """Prefill row offsets are a running sum of ``max(extend_len, 1) - 1`` after an empty
    row (a guard against empty rows written the wrong way): every row after an empty one
    reads and writes its tokens one place too early."""

    def _prefill_pieces(self, batch: ForwardBatch) -> list[_Piece]:
        pieces = super()._prefill_pieces(batch)
        assert batch.extend_lens is not None
        block = self._prefill_block()
        out, i, shift = [], 0, 0
        for n in batch.extend_lens.tolist():
            for piece in pieces[i:i + -(-n // block)]:
                start = max(0, piece.tokens.start - shift)
                out.append(_Piece(slice(start, start + piece.tokens.stop - piece.tokens.start), piece.layout))
            i += -(-n // block)
            shift += n == 0
        return out


class SingleKeyFastPath(_OneDefect):
    """Decode rows with one key take a fast path (the output is that key's V), but the
    fast path reads the key of batch row 0: right only when the short row comes first."""

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward_decode(q, layer, batch)
        G = self.config.group_size
        first = int(self.pool.req_to_token[int(batch.req_pool_indices[0]), 0])
        for r, seq in enumerate(batch.seq_lens.tolist()):
            if seq == 1 and r > 0:
                out[r] = self.pool.v[layer][first].repeat_interleave(G, dim=0).to(out.dtype)
        return out


# --- inputs -----------------------------------------------------------------------------------------

class DefaultScale(_OneDefect):
    """Ignores ``AttentionConfig.scale``: always ``head_size ** -0.5``."""

    def _layer_params(self, layer: int) -> LayerParams:
        return replace(super()._layer_params(layer), scale=self.config.head_size**-0.5)


def _softmax_without_max(scores: torch.Tensor, b: Any, *, first: bool) -> None:
    """exp(s) / sum(exp(s)): softmax is shift-invariant in exact arithmetic, so unit-scale
    logits give the right answer; logits past ~88 overflow fp32."""
    if first:
        b.m.zero_()
    scores.exp_()
    if first:
        torch.sum(scores, dim=(0, 3), keepdim=True, out=b.l)
    else:
        torch.sum(scores, dim=(0, 3), keepdim=True, out=b.l_seg)
        b.l.add_(b.l_seg)


class NoMaxSubtraction(_OneDefect):
    """The softmax skips subtracting the running max."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        with mock.patch.object(kernel, "_softmax_segment", _softmax_without_max):
            return super().attend(q, layer, batch)


class HalfAccumulator(_OneDefect):
    """fp16 batches accumulate ``sum(p * v)`` (before dividing by the softmax sum) in an
    fp16 register: fine at unit scale, inf once values near fp16's range add up."""

    def _run_piece(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: LayerParams, piece: _Piece,
                   out: torch.Tensor, ws: Workspace | None) -> None:
        super()._run_piece(q, k, v, params, piece, out, ws)
        if q.dtype != torch.float16:
            return
        assert ws is not None
        B, T, H, KV = piece.layout.num_rows, piece.layout.tokens_per_row, q.shape[1], k.shape[1]
        G = H // KV
        sums = ws.take("l", (1, B * KV, T * G, 1), torch.float32)  # this call's softmax denominators
        per_head = sums.view(B, KV, T, G).permute(0, 2, 1, 3).reshape(B * T, H, 1)
        acc = out[piece.tokens].float() * per_head  # what was accumulated before normalising
        out[piece.tokens] = (acc.to(torch.float16).float() / per_head).to(out.dtype)  # the bug: fp16 acc


class Bf16AsFp16(_OneDefect):
    """Dispatch maps bfloat16 to the float16 kernel: more mantissa, so unit-scale values
    come out fine; values past fp16's range (65504) become inf."""

    def _run_piece(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: LayerParams, piece: _Piece,
                   out: torch.Tensor, ws: Workspace | None) -> None:
        if q.dtype != torch.bfloat16:
            return super()._run_piece(q, k, v, params, piece, out, ws)
        half = torch.empty(out.shape, dtype=torch.float16)
        super()._run_piece(q.half(), k.half(), v.half(), params, piece, half, ws)
        out[piece.tokens] = half[piece.tokens].to(out.dtype)


def _as_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x``'s memory read as if ``x`` were contiguous (what a raw pointer plus its shape gives)."""
    n, h, d = x.shape
    return x.as_strided(x.shape, (h * d, d, 1), x.storage_offset())


class ContiguousQ(_OneDefect):
    """Reads q through its data pointer assuming a contiguous ``[n, H, D]`` layout: a q that
    is a view of a fused qkv tensor (or of strided heads) is read from the wrong places."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        return super().attend(_as_contiguous(q), layer, batch)


class HeadStrideD(_OneDefect):
    """Honours q's token stride but assumes its head stride is ``D``: views of a fused qkv
    tensor work, heads strided by ``2 D`` are read from the wrong places."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        d = q.shape[2]
        return super().attend(q.as_strided(q.shape, (q.stride(0), d, 1), q.storage_offset()), layer, batch)


class ContiguousCacheWrite(_OneDefect):
    """The cache write copies k and v as contiguous ``[n, KV, D]`` blocks from their data
    pointers: from a fused qkv tensor it writes other tokens' and heads' values into the cache."""

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        if k is not None and v is not None:
            k, v = _as_contiguous(k), _as_contiguous(v)
        return super().forward(q, k, v, layer, batch)


# --- properties ---------------------------------------------------------------------------------

class SplitsByCallCount(_OneDefect):
    """Picks how many KV chunks share one softmax segment from a workspace heuristic that
    changes call by call: the same batch is summed in a different order the second time,
    a last-bit difference on contexts of more than one chunk."""

    calls = 0

    def _run_piece(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: LayerParams, piece: _Piece,
                   out: torch.Tensor, ws: Workspace | None) -> None:
        self.calls += 1
        budget = self.score_budget_bytes if self.calls % 2 else 1  # 1 byte: one chunk per segment
        assert ws is not None
        kernel.paged_attention(q[piece.tokens], k, v, piece.layout, params, ws, budget, out[piece.tokens])


class ScalesQInPlace(_OneDefect):
    """Saves a buffer by scaling q in place (and running the kernel with scale 1): the
    output is right, the engine's q tensor is not."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        q.mul_(self.config.sm_scale)
        with _scale_one(self):
            return super().attend(q, layer, batch)


@contextlib.contextmanager
def _scale_one(backend: TorchBackend) -> Iterator[None]:
    params = backend.layer_params
    backend.layer_params = [replace(p, scale=1.0) for p in params]
    try:
        yield
    finally:
        backend.layer_params = params


class WritesEveryLayer(_OneDefect):
    """The cache write ignores the layer index's stride and writes the new K/V into every
    layer: the forward's own layer is right, the others are overwritten."""

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        if k is not None and v is not None:
            for other in range(self.pool.num_layers):
                self.pool.write(other, batch.out_cache_loc, k, v)
        return super().forward(q, k, v, layer, batch)


class ClampsSeqLens(_OneDefect):
    """Clamps ``seq_lens`` to at least 1 in place while building metadata (to avoid an
    empty row): the engine's tensor changes under it."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        batch.seq_lens.clamp_(min=1)
        super().init_forward_metadata(batch)


class FlakyEveryFifthCall(_OneDefect):
    """Every fifth forward in the process returns a wrong output (a race on a shared
    buffer): a failure that does not repeat when the same example runs again."""

    counter: ClassVar[itertools.count[int]] = itertools.count(1)

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().attend(q, layer, batch)
        if next(FlakyEveryFifthCall.counter) % 5 == 0:
            out.add_(1.0)
        return out


# --- graphs ---------------------------------------------------------------------------------------

class ReplayCapsContext(_OneDefect):
    """Replay metadata covers at most 256 KV positions (the graph's layout was sized from a
    short capture batch and the rest never unblocked): replays of longer contexts attend
    only their first 256 keys."""

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        super().init_replay_metadata(batch)
        self._graph_layouts[self._graph_key(batch)].blocked[:, :, 256:] = True


# --- features in combination ------------------------------------------------------------------

_limits_verify = torch_layout._limits_verify


def _verify_positions_by_index(buf: Any, batch: ForwardBatch, pool: KVPool, B: int) -> None:
    """Verify's layout with a draft token's position ``prefix + index`` instead of ``prefix + depth``."""
    _limits_verify(buf, batch, pool, B)
    T = buf.tokens_per_row
    torch.add(buf.prefix[:B].view(B, 1), buf.token_index.view(1, T), out=buf.qpos[:B])
    buf.extra_pos[:B].copy_(buf.qpos[:B])


class WindowVerifyByIndex(_OneDefect):
    """Target verify places draft token ``j`` at ``prefix + j`` for the sliding window, as a
    chain would (it sits at ``prefix + depth``): in a branching tree a window layer's
    tokens past the first branch see the wrong keys. Right for chains and full layers."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        with mock.patch.object(torch_layout, "_limits_verify", _verify_positions_by_index):
            super().init_forward_metadata(batch)

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        with mock.patch.object(torch_layout, "_limits_verify", _verify_positions_by_index):
            super().build_capture_metadata(batch)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        with mock.patch.object(torch_layout, "_limits_verify", _verify_positions_by_index):
            super().init_replay_metadata(batch)


class WindowTileFromLastQuery(_OneDefect):
    """Prefill runs tiles of 64 queries and skips the KV blocks of 64 keys that lie wholly
    before the window of the tile's *last* query: the first queries of a tile lose the keys
    of the blocks their own windows start in."""

    def _prefill_block(self) -> int:
        return 64

    def _prefill_pieces(self, batch: ForwardBatch) -> list[_Piece]:
        pieces = super()._prefill_pieces(batch)
        for piece in pieces:
            last = int((~piece.layout.blocked[0, -1]).sum()) - 1  # the last query's position
            for w, mask in piece.layout.windows.items():
                mask[0, :, :max(0, last - w) // 64 * 64] = True
        return pieces


@contextlib.contextmanager
def _layer_param(backend: TorchBackend, layer: int, **values: Any) -> Iterator[None]:
    """``backend``'s parameters of ``layer`` with ``values`` for the block."""
    params = backend.layer_params
    backend.layer_params = [replace(p, **values) if i == layer else p for i, p in enumerate(params)]
    try:
        yield
    finally:
        backend.layer_params = params


_MULTI_TOKEN = (Phase.PREFILL, Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND)


class WideGQASecondLaunchNoWindow(_OneDefect):
    """Multi-token phases with more than 8 query heads per KV head run the heads past the
    first 8 of each group in a second launch, which is not given the layer's window: those
    heads attend the whole context. Decode (one token per row) takes another path."""

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().attend(q, layer, batch)
        G = self.config.group_size
        if G <= 8 or batch.phase not in _MULTI_TOKEN or self.layer_params[layer].window is None:
            return out
        with _layer_param(self, layer, window=None):
            full = super().attend(q, layer, batch)
        late = torch.arange(self.config.num_q_heads) % G >= 8
        out[:, late] = full[:, late]
        return out


class SinksSkippedUnderWindow(_OneDefect):
    """The sliding-window kernel variant has no sink term: a layer with both a window and
    sinks runs without its sinks (full layers keep them)."""

    def _layer_params(self, layer: int) -> LayerParams:
        params = super()._layer_params(layer)
        return replace(params, sinks=None) if params.window is not None else params


class SinksPerKVSplit(_OneDefect):
    """Splits the context into KV splits of 1024 keys (as many as the longest row needs)
    and adds the sink term to every split's softmax denominator before merging them: a
    context of several splits counts its sink once per split."""

    SPLIT = 1024

    def _run_piece(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: LayerParams, piece: _Piece,
                   out: torch.Tensor, ws: Workspace | None) -> None:
        splits = -(-piece.layout.num_chunks * piece.layout.chunk // self.SPLIT)
        if params.sinks is None or splits == 1:
            return super()._run_piece(q, k, v, params, piece, out, ws)
        once = kernel._add_sinks

        def per_split(*args: Any) -> None:
            for _ in range(splits):
                once(*args)

        with mock.patch.object(kernel, "_add_sinks", per_split):
            super()._run_piece(q, k, v, params, piece, out, ws)


# --- pages ------------------------------------------------------------------------------------------

class LastPageFullDropped(_OneDefect):
    """Decode takes a row's last-page length as ``seq_len % page_size``: a context that is an
    exact multiple of the page size (its last page full) reads that page as empty and
    drops its keys. Right at every other length, and with page size 1."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        P = self.pool.page_size
        if P > 1 and batch.phase is Phase.DECODE:
            layout = self._layout()
            for r, seq in enumerate(batch.seq_lens.tolist()):
                if seq and seq % P == 0:
                    layout.blocked[r, :, seq - P:seq] = True


# --- the fp8 life cycle ---------------------------------------------------------------------------

class ScalesReadAtConstruction(_OneDefect):
    """Copies the pool's fp8 scales when the backend is built: scales an engine loads from
    its checkpoint afterwards are never seen (right whenever they were set first)."""

    def _layer_params(self, layer: int) -> LayerParams:
        params = super()._layer_params(layer)
        if params.k_scale is None or params.v_scale is None:
            return params
        return replace(params, k_scale=params.k_scale.clone(), v_scale=params.v_scale.clone())


class ScalesOfLayerZero(_OneDefect):
    """Dequantizes every layer with layer 0's fp8 scales (one scale pair per model): right
    while all layers share their scales, as a freshly built pool's do."""

    def _layer_params(self, layer: int) -> LayerParams:
        params = super()._layer_params(layer)
        if params.k_scale is None or params.v_scale is None:
            return params
        return replace(params, k_scale=self.pool.k_scale[0], v_scale=self.pool.v_scale[0])


class ScalesCopiedAtCapture(_OneDefect):
    """Keeps the fp8 scales beside its other static graph metadata, copied when the first
    graph is captured: eager forwards are right, a replay after the engine sets new scales
    dequantizes with the old ones (nothing calls the backend when a scale changes)."""

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        super().build_capture_metadata(batch)
        if self.pool.kv_format.scaled and not getattr(self, "_scales_copied", False):
            self._scales_copied = True
            self.layer_params = [p if p.k_scale is None or p.v_scale is None else
                                 replace(p, k_scale=p.k_scale.clone(), v_scale=p.v_scale.clone())
                                 for p in self.layer_params]


class Fp8NoSaturation(_OneDefect):
    """Writes fp8 K/V as ``(x / scale)`` converted without clamping, relying on the conversion
    to saturate: torch's e4m3fn conversion does, its e4m3fnuz one gives NaN and its e5m2 one
    inf past the range."""

    _scratch: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        if k is None or v is None or not self.pool.kv_format.scaled:
            return super().forward(q, k, v, layer, batch)
        pool = self.pool
        for cache, x, scale in ((pool.k[layer], k, pool.k_scale[layer]), (pool.v[layer], v, pool.v_scale[layer])):
            wide, narrow = self._buffers(x.numel())
            torch.div(x, scale, out=wide[:x.numel()].view(x.shape))  # the bug: no clamp to the range
            fp8 = narrow[:x.numel()].view(x.shape)
            fp8.copy_(wide[:x.numel()].view(x.shape))
            cache.view(torch.uint8).index_copy_(0, batch.out_cache_loc, fp8.view(torch.uint8))
        return super().forward(q, None, None, layer, batch)

    def _buffers(self, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Kept and grown like the pool's own scratch: a replay reuses what its capture took.
        if self._scratch is None or self._scratch[0].numel() < numel:
            self._scratch = (torch.empty(numel, dtype=torch.float32, device=self.pool.device),
                             torch.empty(numel, dtype=self.pool.dtype, device=self.pool.device))
        return self._scratch


class Fp8QuantizesInPlace(_OneDefect):
    """Saves a buffer on fp8 caches by dividing the new k/v by the scales in place before
    storing them: the cache and the output are right, the engine's k and v are not."""

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        if k is None or v is None or not self.pool.kv_format.scaled:
            return super().forward(q, k, v, layer, batch)
        pool, top = self.pool, torch.finfo(self.pool.dtype).max
        for cache, x, scale in ((pool.k[layer], k, pool.k_scale[layer]), (pool.v[layer], v, pool.v_scale[layer])):
            x.div_(scale).clamp_(-top, top)  # the bug: in place, in the engine's tensor
            cache.view(torch.uint8).index_copy_(0, batch.out_cache_loc, x.to(pool.dtype).view(torch.uint8))
        return super().forward(q, None, None, layer, batch)


class Fp8SplitsByCallCount(SplitsByCallCount):
    """:class:`SplitsByCallCount`'s call-count heuristic, on the fp8 path only (the dequantizing
    kernel has its own launch heuristics): plain caches are deterministic."""

    def _run_piece(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: LayerParams, piece: _Piece,
                   out: torch.Tensor, ws: Workspace | None) -> None:
        if not self.pool.kv_format.scaled:
            return TorchBackend._run_piece(self, q, k, v, params, piece, out, ws)
        super()._run_piece(q, k, v, params, piece, out, ws)


# --- the table --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mutant:
    """A one-defect backend, the claim the kit must falsify for it, and a trigger: a case
    where the defect shows (``kind``: ``output`` off the reference, ``inputs`` changed,
    ``nondeterministic`` output, ``flaky``: wrong on some calls only, ``graph``: off after
    replay metadata, ``late_scales``: off with fp8 scales set after construction,
    ``replay_scales``: off with fp8 scales set after the capture metadata)."""

    cls: type[TorchBackend]
    claim: str
    category: str
    trigger: CaseRecipe
    kind: str = "output"


def _decode(*seq_lens: int, **kw: Any) -> CaseRecipe:
    return CaseRecipe(Phase.DECODE, prefix_lens=tuple(s - 1 for s in seq_lens), **kw)


MUTANTS: dict[str, Mutant] = {
    "drops_key_after_block": Mutant(DropsKeyAfterBlock, "phase[decode, float32]", "sizes: block boundary",
                                    _decode(65)),
    "masks_first_block_only": Mutant(MasksFirstBlockOnly, "phase[decode, float32]", "sizes: block boundary",
                                     _decode(100)),
    "truncates_long_context": Mutant(TruncatesLongContext, "phase[decode, float32]", "sizes: long context",
                                     _decode(4097)),
    "prefill_tile_offset": Mutant(PrefillTileOffset, "phase[prefill, float32]", "sizes: prefill extend > 128",
                                  CaseRecipe(Phase.PREFILL, prefix_lens=(0,), new_lens=(129,))),
    "gqa_tiles_round_robin": Mutant(GQATilesRoundRobin, "phase[decode, float32]", "sizes: GQA group 8-16",
                                    _decode(9, 5, num_q_heads=16, num_kv_heads=2)),
    "mqa_first_tile_only": Mutant(MQAFirstTileOnly, "phase[decode, float32]", "sizes: MQA with 8+ heads",
                                  _decode(9, 5, num_q_heads=16, num_kv_heads=1)),
    "power_of_two_head_dim": Mutant(PowerOfTwoHeadDim, "phase[decode, float32]", "sizes: every head size",
                                    _decode(9, head_size=80)),
    "empty_row_shift": Mutant(EmptyRowShift, "phase[prefill, float32]", "sizes: empty request mid-batch",
                              CaseRecipe(Phase.PREFILL, prefix_lens=(2, 0, 3), new_lens=(3, 0, 4))),
    "single_key_fast_path": Mutant(SingleKeyFastPath, "phase[decode, float32]", "sizes: length-1 request",
                                   _decode(9, 1)),
    "default_scale": Mutant(DefaultScale, "phase[decode, float32]", "inputs: explicit scale",
                            _decode(9, scale=0.3)),
    "no_max_subtraction": Mutant(NoMaxSubtraction, "phase[decode, float32]", "inputs: large logits",
                                 _decode(9, qk_magnitude=32)),
    "half_accumulator": Mutant(HalfAccumulator, "phase[decode, float16]", "inputs: narrow accumulator",
                               _decode(9, dtype="float16", v_magnitude=2.0**15)),
    "bf16_as_fp16": Mutant(Bf16AsFp16, "phase[decode, bfloat16]", "inputs: bf16/fp16 mix-up",
                           _decode(9, dtype="bfloat16", v_magnitude=2.0**20)),
    "contiguous_q": Mutant(ContiguousQ, "phase[decode, float32]", "inputs: fused qkv views",
                           _decode(9, 5, qkv_layout="fused")),
    "head_stride_d": Mutant(HeadStrideD, "phase[decode, float32]", "inputs: strided heads",
                            _decode(9, 5, qkv_layout="strided")),
    "contiguous_cache_write": Mutant(ContiguousCacheWrite, "phase[decode, float32]", "inputs: fused qkv views",
                                     _decode(9, 5, qkv_layout="fused")),
    "splits_by_call_count": Mutant(SplitsByCallCount, "deterministic", "properties: deterministic",
                                   _decode(200), kind="nondeterministic"),
    "scales_q_in_place": Mutant(ScalesQInPlace, "inputs_unchanged", "properties: inputs unchanged",
                                _decode(9), kind="inputs"),
    "writes_every_layer": Mutant(WritesEveryLayer, "inputs_unchanged", "properties: inputs unchanged",
                                 _decode(9, num_layers=2), kind="inputs"),
    "clamps_seq_lens": Mutant(ClampsSeqLens, "inputs_unchanged", "properties: inputs unchanged",
                              CaseRecipe(Phase.PREFILL, prefix_lens=(0, 3), new_lens=(0, 2)), kind="inputs"),
    "flaky_every_fifth_call": Mutant(FlakyEveryFifthCall, "phase[decode, float32]", "properties: flaky failure",
                                     _decode(9), kind="flaky"),
    "replay_caps_context": Mutant(ReplayCapsContext, "graph[decode]", "graphs: long context replay",
                                  _decode(300), kind="graph"),
    "window_verify_by_index": Mutant(
        WindowVerifyByIndex, "feature[sliding_window]", "features: window x tree verify",
        CaseRecipe(Phase.TARGET_VERIFY, prefix_lens=(13,), spec=SpecConfig.eagle(2, 2, 4),
                 tree_parents=((-1, 0, 0, 1),), sliding_window=2)),
    "window_tile_from_last_query": Mutant(
        WindowTileFromLastQuery, "feature[sliding_window]", "features: window x prefill tiles",
        CaseRecipe(Phase.PREFILL, prefix_lens=(0,), new_lens=(129,), sliding_window=32)),
    "wide_gqa_second_launch_no_window": Mutant(
        WideGQASecondLaunchNoWindow, "feature[sliding_window]", "features: window x wide GQA",
        CaseRecipe(Phase.PREFILL, num_q_heads=32, num_kv_heads=2, prefix_lens=(9,), new_lens=(3,), sliding_window=3)),
    "sinks_skipped_under_window": Mutant(SinksSkippedUnderWindow, "feature[sinks]", "features: sinks x window",
                                         _decode(9, sinks=True, sliding_window=3)),
    "sinks_per_kv_split": Mutant(SinksPerKVSplit, "feature[sinks]", "features: sinks x KV splits",
                                 _decode(2049, sinks=True)),
    "last_page_full_dropped": Mutant(LastPageFullDropped, "page_size[16]", "pages: last page full",
                                     _decode(32, 17, page_size=16)),
    "scales_read_at_construction": Mutant(
        ScalesReadAtConstruction, "kv_dtype[fp8_e4m3]", "fp8: scales set after construction",
        _decode(9, kv_dtype="fp8_e4m3", kv_scale=0.25), kind="late_scales"),
    "scales_of_layer_zero": Mutant(
        ScalesOfLayerZero, "kv_dtype[fp8_e4m3]", "fp8: per-layer scales",
        _decode(9, kv_dtype="fp8_e4m3", kv_scale=0.25, num_layers=2, layer=1), kind="late_scales"),
    "scales_copied_at_capture": Mutant(
        ScalesCopiedAtCapture, "kv_dtype[fp8_e4m3]", "fp8: scales set after capture",
        _decode(9, kv_dtype="fp8_e4m3", kv_scale=0.25), kind="replay_scales"),
    "fp8_no_saturation": Mutant(
        Fp8NoSaturation, "kv_dtype[fp8_e4m3]", "fp8: values past the range",
        _decode(9, kv_dtype="fp8_e4m3", fp8_flavor="e4m3fnuz", kv_scale=2.0**-4, v_magnitude=120.0)),
    "fp8_quantizes_in_place": Mutant(Fp8QuantizesInPlace, "inputs_unchanged", "fp8: inputs unchanged",
                                     _decode(9, kv_dtype="fp8_e4m3", kv_scale=0.25), kind="inputs"),
    "fp8_splits_by_call_count": Mutant(Fp8SplitsByCallCount, "deterministic", "fp8: deterministic",
                                       _decode(200, kv_dtype="fp8_e4m3", kv_scale=0.25), kind="nondeterministic"),
}
