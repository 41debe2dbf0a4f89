"""The attention shapes and features of one model (:class:`AttentionConfig`), and the
names descriptors give compute dtypes.

A peer of :mod:`~attnhal.backend.batch` and :mod:`~attnhal.backend.kv_pool`: the
contract and the validators both read it, and it reads neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

import torch

from attnhal.errors import InvalidValue
from attnhal.phases import Feature
from attnhal.spec import DTYPES

__all__ = ["COMPUTE_DTYPES", "AttentionConfig", "compute_dtype", "dtype_name"]

#: Compute dtypes by the name descriptors give them (``attnhal.spec.DTYPES``, torch's own names):
#: the one table, read both ways by :func:`compute_dtype` and :func:`dtype_name`.
COMPUTE_DTYPES: Mapping[str, torch.dtype] = MappingProxyType({name: getattr(torch, name) for name in DTYPES})
_NAMES: Mapping[torch.dtype, str] = MappingProxyType({dtype: name for name, dtype in COMPUTE_DTYPES.items()})


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"`` (the names descriptors use)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise InvalidValue("dtype", dtype, ", ".join(f"torch.{n}" for n in COMPUTE_DTYPES)) from None


def compute_dtype(name: str) -> torch.dtype:
    """``"float16"`` -> ``torch.float16``: the torch dtype of a descriptor's dtype name."""
    try:
        return COMPUTE_DTYPES[name]
    except KeyError:
        raise InvalidValue("dtype", name, ", ".join(COMPUTE_DTYPES)) from None


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

    A config may be built on any device (a checkpoint loads on the host); a backend keeps
    :meth:`on_device` of it for its pool's device (the base contract does, once).
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
            raise InvalidValue("num_kv_heads", self.num_kv_heads,
                               f"an int >= 1 dividing num_q_heads={self.num_q_heads}")
        dtype_name(self.dtype)
        windows = self.sliding_window if isinstance(self.sliding_window, tuple) else (self.sliding_window,)
        bad = [w for w in windows if w is not None and (not isinstance(w, int) or w < 0)]
        if bad:
            raise InvalidValue("sliding_window", self.sliding_window,
                               "an int >= 0, a per-layer tuple of such ints or None, or None")
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise InvalidValue("logit_softcap", self.logit_softcap, "a float > 0, or None")
        if self.sinks is not None and (self.sinks.dim() != 2 or self.sinks.shape[1] != self.num_q_heads):
            raise InvalidValue("sinks.shape", tuple(self.sinks.shape), f"[num_layers, num_q_heads={self.num_q_heads}]")

    def on_device(self, device: torch.device) -> AttentionConfig:
        """This config with every tensor field (``sinks``) on ``device``: ``self`` when all
        already are, else a copy whose tensors were moved (one host-to-device copy each).

        Kernels take these tensors as launch arguments, and a GPU kernel cannot read a host
        tensor: a backend moves them once at construction, never per forward.
        """
        moved: dict[str, Any] = {f.name: value.to(device) for f in fields(self)
                 if isinstance(value := getattr(self, f.name), torch.Tensor) and value.device != device}
        return replace(self, **moved) if moved else self

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
