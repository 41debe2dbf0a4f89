"""Backends whose descriptors lie, each about one claim, for the conformance kit's tests.

Each is the torch reference backend (or a toy of ``broken_backends``) with one bug, so
every other claim stays true and the kit must name exactly the claim the bug breaks:

=================================  ==============================================  =========================
backend                            the lie                                         claim the kit falsifies
=================================  ==============================================  =========================
:class:`HostSyncDecode` (toy)      claims decode graphs, reads ``.item()`` in       ``graph[decode]``
                                   ``forward``
:class:`StaleReplayDecode` (toy)   replay metadata frozen at capture: a Python      ``graph[decode]``
                                   int sliced in ``forward``
:class:`ForgetfulReplay`           ``init_replay_metadata`` does nothing: replays   ``graph[*]``
                                   run on the capture-time layout
:class:`WrongGQA`                  query head ``h`` reads KV head ``h % kv``         ``phase[*, *]`` (GQA only)
                                   instead of ``h // group``
:class:`BadBF16`                   claims bf16, drops most of the output's          ``phase[*, bfloat16]``
                                   mantissa for it
:class:`BakedDraftPath`            reads ``draft_path`` when metadata is built,     ``multi_step``,
                                   not at forward: stale once the tree re-parents   ``graph[draft_decode]``
:class:`IgnoresDraftStep`          attends ``draft_path[:, :1]`` at every step      ``multi_step``,
                                                                                   ``phase[draft_decode, *]``
:class:`AnswersUnclaimed`          claims no prefill, computes it anyway            ``unclaimed[prefill]``
:class:`NaNPadding`                declares ``seq_len_fill`` 0 and returns NaN      ``seq_len_fill[decode]``
                                   for rows of seq len 0
:class:`ShortWindowDecode`         decode attends at most 30 positions: only a      ``phase[decode, *]``
                                   drawn example finds it, shrunk to seq len 31
:class:`AllocatingDecode` (toy)    allocates at every replay                        ``graph[decode]``
:class:`IgnoresWindow`             claims sliding_window, attends every position   ``feature[sliding_window]``
:class:`IgnoresSoftcap`            claims logit_softcap, never caps                ``feature[logit_softcap]``
:class:`IgnoresSinks`              claims sinks, leaves them out of the softmax    ``feature[sinks]``
:class:`MLAWrongScale`             MLA softmax scale from the V head size (512)     ``feature[mla]``
                                   instead of the q/k head size (576)
:class:`PageBlind`                 claims page size 16, reads ``req_to_page`` as    ``page_size[16]``
                                   a token table
:class:`UnscaledFP8`               claims fp8 KV, ignores ``k_scale``/``v_scale``   ``kv_dtype[fp8_e4m3]``
:class:`SilentWindow`              claims no sliding_window, accepts a window       ``unclaimed_feature[
                                   config and computes full attention               sliding_window]``
=================================  ==============================================  =========================
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
from broken_backends import AllocatingDecode, HostSyncDecode, StaleLenDecode

from attnhal.backend import AttentionConfig, ForwardBatch, KVPool
from attnhal.capabilities import BackendCapabilities, SeqLenFill
from attnhal.phases import Feature, Phase
from attnhal_torch import TorchBackend
from attnhal_torch.kernel import LayerParams

__all__ = [
    "LIES",
    "AllocatingDecode",
    "AnswersUnclaimed",
    "BadBF16",
    "BakedDraftPath",
    "ForgetfulReplay",
    "HostSyncDecode",
    "IgnoresDraftStep",
    "NaNPadding",
    "ShortWindowDecode",
    "StaleReplayDecode",
    "WrongGQA",
    "IgnoresSinks",
    "IgnoresSoftcap",
    "IgnoresWindow",
    "MLAWrongScale",
    "PageBlind",
    "SilentWindow",
    "UnscaledFP8",
]

_TORCH = TorchBackend.capabilities


def _named(name: str, **changes: Any) -> BackendCapabilities:
    return replace(_TORCH, name=name, **changes)


class StaleReplayDecode(StaleLenDecode):
    """The toy that slices with a host length computed in ``init_*_metadata``.

    It declares ``needs_host_seq_lens`` (it reads ``seq_lens_cpu``, which is legal),
    so only the stale slice is wrong: replays attend as many positions as the
    capture-time batch had.
    """

    capabilities = replace(StaleLenDecode.capabilities, name="lying-stale-replay", needs_host_seq_lens=True)


class ForgetfulReplay(TorchBackend):
    """Never refreshes its graph metadata: replays read the layout built at capture."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-forgetful-replay")

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        pass  # the bug: the static layout keeps the capture-time (padding) batch


class _Scratch:
    """Graph-safe scratch for a wrapper's own work: buffers sized in ``init_graph_state``,
    views of them at capture and replay (a wrapper that allocates would break the graph
    claims for the wrong reason)."""

    def __init__(self) -> None:
        self.bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = 1
        for n in shape:
            numel *= n
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = self.bufs[name] = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel].view(shape)


class WrongGQA(TorchBackend):
    """Maps query head ``h`` to KV head ``h % num_kv_heads`` (interleaved) instead of
    ``h // group`` (consecutive groups): right for MHA and MQA, wrong for GQA."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-wrong-gqa")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scratch = _Scratch()

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        super().init_graph_state(max_bs, max_num_tokens)
        shape = (max_num_tokens, self.config.num_q_heads, self.config.head_size)
        for name in ("q", "out"):
            self.scratch.get(name, shape, self.config.dtype, self.pool.device)

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        kv, group = self.config.num_kv_heads, self.config.group_size
        n, h, d = q.shape
        # the bug: query head h = g * kv + j is fed to the kernel as head j * group + g
        swapped = self.scratch.get("q", (n, h, d), q.dtype, q.device)
        swapped.view(n, kv, group, d).copy_(q.reshape(n, group, kv, d).transpose(1, 2))
        out = super().forward(swapped, k, v, layer, batch)
        back = self.scratch.get("out", (n, h, d), q.dtype, q.device)
        back.view(n, group, kv, d).copy_(out.view(n, kv, group, d).transpose(1, 2))
        return back


class BadBF16(TorchBackend):
    """Claims bf16 but packs its bf16 output wrongly (keeps 1 of 7 mantissa bits)."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-bad-bf16")

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        out = super().forward(q, k, v, layer, batch)
        if out.dtype == torch.bfloat16:
            bits = out.view(torch.int16)
            bits.bitwise_and_(-64)  # 0xFFC0: sign, exponent, 1 mantissa bit
        return out


class BakedDraftPath(TorchBackend):
    """Copies ``draft_path`` when the metadata is built and attends that copy: right until a
    draft tree re-parents its branches between forwards (batch.py: read it at forward time)."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-baked-draft-path")
    _baked: torch.Tensor | None = None

    def _bake(self, batch: ForwardBatch) -> None:
        path = batch.spec.draft_path if batch.spec is not None else None
        if path is None:
            self._baked = None
        elif self._baked is not None and self._baked.shape[0] >= path.shape[0] \
                and self._baked.shape[1] == path.shape[1]:
            self._baked[:path.shape[0]].copy_(path)  # in place: graph-safe, and still stale
        else:
            self._baked = path.clone()

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        self._bake(batch)

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        super().init_capture_metadata(batch)
        self._bake(batch)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        super().init_replay_metadata(batch)
        self._bake(batch)

    def forward_draft_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        spec = batch._spec()
        live = spec.draft_path
        assert self._baked is not None and live is not None
        spec.draft_path = self._baked[:live.shape[0]]  # the bug: attend the copy made at metadata time
        try:
            return super().forward_draft_decode(q, layer, batch)
        finally:
            spec.draft_path = live


class IgnoresDraftStep(TorchBackend):
    """Points only the first draft column at ``draft_path`` at every step (treats
    ``draft_step`` as 0 at forward time): steps > 0 attend the padding slot instead of
    the branch's later draft tokens."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-ignores-draft-step")

    def forward_draft_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        spec = batch._spec()
        step, spec.draft_step = spec.draft_step, 0  # the bug
        try:
            return super().forward_draft_decode(q, layer, batch)
        finally:
            spec.draft_step = step


class AnswersUnclaimed(TorchBackend):
    """Its descriptor leaves out prefill, but it computes prefill anyway (overrides the
    contract's check in ``forward``): an engine trusting the descriptor never knows."""

    capabilities: ClassVar[BackendCapabilities] = _named(
        "lying-answers-unclaimed", phases=frozenset(set(Phase) - {Phase.PREFILL}))

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        if k is not None and v is not None:
            self.pool.write(layer, batch.out_cache_loc, k, v)
        out: torch.Tensor = getattr(self, f"forward_{batch.phase.value}")(q, layer, batch)
        return out


class NaNPadding(TorchBackend):
    """Declares ``seq_len_fill`` 0, but divides by the attended length: rows of seq len 0
    (the padded rows) come out NaN."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-nan-padding", seq_len_fill=SeqLenFill(base=0))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scratch = _Scratch()

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        super().init_graph_state(max_bs, max_num_tokens)
        self.scratch.get("norm", (max_bs,), torch.float32, self.pool.device)

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward_decode(q, layer, batch)
        # the bug: 0/0 = NaN for rows of seq len 0 (1 elsewhere), an unguarded normalisation
        norm = self.scratch.get("norm", (batch.batch_size,), torch.float32, q.device)
        torch.div(batch.seq_lens, batch.seq_lens, out=norm)
        return out.mul_(norm.view(-1, 1, 1))


class ShortWindowDecode(TorchBackend):
    """Decode attends at most the first ``WINDOW`` positions of a row, a limit its descriptor
    never states. The kit's fixed examples stay below it; hypothesis finds and shrinks it."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-short-window")
    WINDOW = 30

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if batch.phase is Phase.DECODE:
            assert self._plan is not None
            for piece in self._plan.pieces:
                piece.layout.blocked[:, :, self.WINDOW:] = True  # the bug: positions past the window


class _DropsLayerParam(TorchBackend):
    """Runs every layer with some :class:`LayerParams` fields reset (the lie of a subclass)."""

    dropped: ClassVar[dict[str, Any]] = {}

    def _layer_params(self, layer: int) -> LayerParams:
        return replace(super()._layer_params(layer), **self.dropped)


class IgnoresWindow(_DropsLayerParam):
    capabilities: ClassVar[BackendCapabilities] = _named("lying-ignores-window")
    dropped: ClassVar[dict[str, Any]] = {"window": None}


class IgnoresSoftcap(_DropsLayerParam):
    capabilities: ClassVar[BackendCapabilities] = _named("lying-ignores-softcap")
    dropped: ClassVar[dict[str, Any]] = {"softcap": None}


class IgnoresSinks(_DropsLayerParam):
    capabilities: ClassVar[BackendCapabilities] = _named("lying-ignores-sinks")
    dropped: ClassVar[dict[str, Any]] = {"sinks": None}


class UnscaledFP8(_DropsLayerParam):
    """Reads fp8 bytes without the per-layer scales (right only when every scale is 1)."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-unscaled-fp8")
    dropped: ClassVar[dict[str, Any]] = {"k_scale": None, "v_scale": None}


class MLAWrongScale(TorchBackend):
    """Takes the softmax scale from the output (V) head size: the same as the q/k head size
    everywhere but MLA, where 512 ** -0.5 replaces 576 ** -0.5."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-mla-wrong-scale")

    def _layer_params(self, layer: int) -> LayerParams:
        return replace(super()._layer_params(layer), scale=self.config.out_head_size ** -0.5)


class PageBlind(TorchBackend):
    """Builds its layouts as if the pool had page size 1: ``req_to_page`` read as token slots."""

    capabilities: ClassVar[BackendCapabilities] = _named("lying-page-blind")

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        real, self.pool.page_size = self.pool.page_size, 1
        try:
            super().init_forward_metadata(batch)
        finally:
            self.pool.page_size = real


class SilentWindow(TorchBackend):
    """Claims no sliding window but, instead of refusing a window config, drops the window."""

    capabilities: ClassVar[BackendCapabilities] = _named(
        "lying-silent-window", features=_TORCH.features - {Feature.SLIDING_WINDOW})

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        super().__init__(replace(config, sliding_window=None), pool, **kwargs)


#: Each lying backend and the claim the kit must falsify for it.
LIES: dict[str, tuple[type[Any], str]] = {
    "host_sync": (HostSyncDecode, "graph[decode]"),
    "stale_replay": (StaleReplayDecode, "graph[decode]"),
    "forgetful_replay": (ForgetfulReplay, "graph[decode]"),
    "wrong_gqa": (WrongGQA, "phase[decode, float32]"),
    "bad_bf16": (BadBF16, "phase[decode, bfloat16]"),
    "baked_draft_path": (BakedDraftPath, "multi_step"),
    "ignores_draft_step": (IgnoresDraftStep, "multi_step"),
    "answers_unclaimed": (AnswersUnclaimed, "unclaimed[prefill]"),
    "nan_padding": (NaNPadding, "seq_len_fill[decode]"),
    "allocating": (AllocatingDecode, "graph[decode]"),
    "short_window": (ShortWindowDecode, "phase[decode, float32]"),
    "ignores_window": (IgnoresWindow, "feature[sliding_window]"),
    "ignores_softcap": (IgnoresSoftcap, "feature[logit_softcap]"),
    "ignores_sinks": (IgnoresSinks, "feature[sinks]"),
    "mla_wrong_scale": (MLAWrongScale, "feature[mla]"),
    "page_blind": (PageBlind, "page_size[16]"),
    "unscaled_fp8": (UnscaledFP8, "kv_dtype[fp8_e4m3]"),
    "silent_window": (SilentWindow, "unclaimed_feature[sliding_window]"),
}
