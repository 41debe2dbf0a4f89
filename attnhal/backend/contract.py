"""The attention backend contract every backend (ours or a third party's) implements.

Lifecycle (FlashInfer-style plan/run split):

* eager: ``init_forward_metadata(batch)`` once per batch, then ``forward(...)`` per layer;
* graphs: ``init_graph_state(max_bs, max_num_tokens)`` once, sizing every static
  buffer; ``init_capture_metadata(batch)`` before capturing a batch size;
  ``init_replay_metadata(batch)`` before each replay — it only writes into the
  static buffers, never allocates, never syncs with the host.

Names are vendor-neutral: nothing here says "cuda".
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from attnhal.backend.batch import ForwardBatch
from attnhal.backend.kv_pool import KVPool
from attnhal.backend.validate import maybe_validate_forward
from attnhal.capabilities import BackendCapabilities, Feature, Phase, Reason, ReasonCode, fmt_set, reason
from attnhal.platform import Platform

if TYPE_CHECKING:
    from attnhal.plan import SpecConfig

__all__ = ["AttentionBackend", "AttentionConfig", "UnsupportedFeature", "UnsupportedPhase", "config_reasons"]


class UnsupportedPhase(NotImplementedError):
    """A backend was asked to run a phase its descriptor does not list."""


class UnsupportedFeature(UnsupportedPhase):
    """A backend was given a feature, page size or KV dtype its descriptor does not claim.

    Raised at construction: a backend never runs a model whose attention it would
    compute differently (e.g. full attention for a window it ignores).
    """


_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"`` (the names descriptors use)."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype} (supported: {sorted(_DTYPE_NAMES.values())})") from None


@dataclass(frozen=True)
class AttentionConfig:
    """Shapes, dtypes and optional features of one model's attention layers.

    Attributes
    ----------
    num_q_heads, num_kv_heads, head_size: ``head_size`` is the q/k head size.
    dtype: compute dtype of q/k/v and the output.
    scale: softmax scale; defaults to ``head_size ** -0.5``.
    v_head_size: head size of V and of the output; ``None`` = ``head_size``. MLA (absorbed):
        ``head_size = kv_lora_rank + rope_dim`` (576) and ``v_head_size = kv_lora_rank`` (512).
    sliding_window: left window, FlashAttention's ``window_size[0]`` (HF's ``sliding_window - 1``):
        a query at KV position ``p`` attends keys at positions ``max(0, p - w) .. p``. An int for
        every layer, or a per-layer tuple where ``None`` marks a full-attention layer.
    logit_softcap: ``cap``: logits ``s = scale * q.k`` become ``cap * tanh(s / cap)`` before softmax.
    sinks: ``[num_layers, num_q_heads]`` float32 learned sink logits (gpt-oss): each head's
        softmax denominator gains ``exp(sink)``; the sink contributes no value. A query
        that attends no key (a padding row) outputs zeros.

    A query's KV position ``p`` is its place in the row's layout (see
    :mod:`attnhal.backend.batch`): ``prefix + i`` for prefill, ``min(prefix + i, seq_lens - 1)``
    for draft extend (padding tokens sit on the row's last token), ``seq_lens - 1`` for
    decode, ``seq_lens + draft_step`` for draft decode, and in target verify ``prefix + depth``
    where ``depth`` counts the draft tokens the query attends (itself included) minus one —
    ``i`` for a chain. Keys are placed by the same rule: a committed token at its index in
    the row, a draft token of target verify at ``prefix + `` its own depth, path token ``j``
    of draft decode at ``seq_lens + j``. The window keeps keys at positions ``>= p - w``.

    :attr:`features` lists what a backend must claim to serve this config; MLA is a
    ``v_head_size`` different from ``head_size``.
    """

    num_q_heads: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype = torch.float32
    scale: float | None = None
    v_head_size: int | None = None
    sliding_window: int | tuple[int | None, ...] | None = None
    logit_softcap: float | None = None
    sinks: torch.Tensor | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_kv_heads < 1 or self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads/num_kv_heads={self.num_q_heads}/{self.num_kv_heads} "
                             "(supported: num_kv_heads >= 1 dividing num_q_heads)")
        dtype_name(self.dtype)
        windows = self.sliding_window if isinstance(self.sliding_window, tuple) else (self.sliding_window,)
        bad = [w for w in windows if w is not None and (not isinstance(w, int) or w < 0)]
        if bad:
            raise ValueError(f"sliding_window={self.sliding_window!r} (supported: an int >= 0, "
                             "a per-layer tuple of such ints or None, or None)")
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise ValueError(f"logit_softcap={self.logit_softcap!r} (supported: a float > 0, or None)")
        if self.sinks is not None and (self.sinks.dim() != 2 or self.sinks.shape[1] != self.num_q_heads):
            raise ValueError(f"sinks shape={tuple(self.sinks.shape)} "
                             f"(supported: [num_layers, num_q_heads={self.num_q_heads}])")

    @property
    def sm_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_size ** -0.5

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def out_head_size(self) -> int:
        """Head size of V and of the output."""
        return self.v_head_size if self.v_head_size is not None else self.head_size

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct left windows of the layers (empty: all layers full)."""
        per_layer = self.sliding_window if isinstance(self.sliding_window, tuple) else (self.sliding_window,)
        return tuple(sorted({w for w in per_layer if w is not None}))

    @property
    def features(self) -> frozenset[Feature]:
        """The descriptor features this config needs (``custom_mask`` is per batch, not here)."""
        wanted = {Feature.SLIDING_WINDOW: bool(self.windows),
                  Feature.LOGIT_SOFTCAP: self.logit_softcap is not None,
                  Feature.SINKS: self.sinks is not None,
                  Feature.MLA: self.out_head_size != self.head_size}
        return frozenset(f for f, on in wanted.items() if on)

    def window(self, layer: int) -> int | None:
        """The left window of ``layer``; ``None`` = full attention."""
        if isinstance(self.sliding_window, tuple):
            return self.sliding_window[layer]
        return self.sliding_window


class AttentionBackend(ABC):
    """Base class of every attention backend.

    Subclasses set the class attribute ``capabilities`` and implement the
    ``forward_<phase>`` methods of the phases it lists. Tensor shapes:

    * ``q``: ``[num_tokens, num_q_heads, head_size]``
    * ``k``: ``[num_tokens, num_kv_heads, head_size]``, ``v``: ``[num_tokens, num_kv_heads,
      v_head_size]`` — the new tokens' K/V, written to ``batch.out_cache_loc`` of layer
      ``layer`` before attending (quantized by the pool when it stores fp8)
    * returns ``[num_tokens, num_q_heads, v_head_size]`` in ``q``'s dtype

    The base ``__init__`` refuses (:class:`UnsupportedFeature`) a config feature, page
    size or KV dtype the descriptor does not claim; subclasses call it first.
    """

    capabilities: ClassVar[BackendCapabilities]

    def __init__(self, config: AttentionConfig, pool: KVPool) -> None:
        reasons = config_reasons(self.capabilities, config, pool)
        if reasons:
            raise UnsupportedFeature(f"backend {self.capabilities.name!r}: " + "; ".join(r.message for r in reasons))
        self.config = config
        self.pool = pool

    @classmethod
    def runtime_reasons(cls, platform: Platform) -> list[Reason]:
        """Why this process cannot run the backend on ``platform`` although the descriptor fits.

        The descriptor says what the hardware can do; this says what *this process*
        can do (e.g. a Triton backend on a simulated platform, whose tensors live on
        the CPU, needs the Triton interpreter). Default: nothing stands in the way.
        """
        return []

    @classmethod
    def build_info(cls) -> str | None:
        """What native code this backend built or loaded in this process, and how long it took
        (``attnhal info --build`` prints it); ``None``: the backend has no native build step."""
        return None

    # --- metadata -------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager: prepare whatever ``forward`` needs for ``batch`` (called once per batch)."""

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate every static buffer graph capture and replay will use, once."""

    def share_graph_state(self, leader: AttentionBackend) -> None:
        """Optionally reuse ``leader``'s graph scratch buffers; called before ``init_graph_state``.

        ``leader`` runs in the same graph, never concurrently (the steps of a
        :class:`~attnhal.backend.MultiStepDraft`). Default: share nothing.
        """

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        """Before capturing ``batch`` (whose tensors are the graph runner's static buffers)."""
        self.init_forward_metadata(batch)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Before replaying ``batch``: only write into static buffers; no allocation, no host sync."""

    def graph_seq_len_fill_value(self, spec: SpecConfig | None = None, phase: Phase | None = None) -> int:
        """The seq len this descriptor asks for in padded rows of a captured ``phase`` batch.

        ``phase``'s own rule (``capabilities.fill_for(phase)``), else ``seq_len_fill``;
        variants are not resolved here. A :class:`~attnhal.graphs.GraphRunner` pads with
        the plan's ``PhasePlan.seq_len_fill`` — this rule resolved against the plan's
        platform, context and spec — and asks this only for a hand-built plan without one.
        """
        rule = self.capabilities.fill_for(phase) if phase is not None else self.capabilities.seq_len_fill
        return rule.value(spec, phase)

    # --- compute ----------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Attention of ``batch.phase``; ``k``/``v`` None means "already in the pool"."""
        phase = batch.phase
        if phase not in self.capabilities.phases:
            supported = ", ".join(sorted(p.value for p in self.capabilities.phases))
            raise UnsupportedPhase(f"backend {self.capabilities.name!r}: phase={phase.value} "
                                   f"(supported: {supported})")
        maybe_validate_forward(q, k, v, layer, batch, self.pool, self.config)  # debug only; no-op in graphs
        if k is not None and v is not None:
            self.pool.write(layer, batch.out_cache_loc, k, v)
        method = getattr(self, f"forward_{phase.value}")
        out: torch.Tensor = method(q, layer, batch)
        return out

    def _missing(self, phase: Phase) -> UnsupportedPhase:
        return UnsupportedPhase(f"backend {self.capabilities.name!r} lists phase={phase.value} "
                                "but does not implement it")

    def forward_prefill(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        raise self._missing(Phase.PREFILL)

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        raise self._missing(Phase.DECODE)

    def forward_draft_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        raise self._missing(Phase.DRAFT_DECODE)

    def forward_draft_extend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        raise self._missing(Phase.DRAFT_EXTEND)

    def forward_target_verify(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        raise self._missing(Phase.TARGET_VERIFY)


def config_reasons(caps: BackendCapabilities, config: AttentionConfig, pool: KVPool) -> list[Reason]:
    """Why ``caps`` cannot serve ``config`` over ``pool``: unclaimed features, page size, KV dtype."""
    out = [reason(ReasonCode.FEATURE, "feature", f.value, fmt_set(caps.features))
           for f in sorted(config.features - caps.features, key=lambda f: f.value)]
    if pool.page_size not in caps.page_sizes:
        out.append(reason(ReasonCode.PAGE_SIZE, "page_size", pool.page_size, fmt_set(caps.page_sizes)))
    kv_dtypes = caps.kv_dtypes or frozenset()
    if pool.kv_dtype not in kv_dtypes:
        out.append(reason(ReasonCode.KV_DTYPE, "kv_dtype", pool.kv_dtype, fmt_set(kv_dtypes)))
    return out
