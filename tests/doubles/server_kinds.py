"""One-defect backends of the kinds servers hit and the kit did not draw before issue 45:
memory no request wrote, outputs that must outlive the next call, long histories of one
instance, extreme values, server sizes.

Each is the torch backend with one defect and its descriptor unchanged (renamed), written
here: ``tests/testing/test_server_kinds.py`` shows each defect by hand and checks that the
claim owning its kind is falsified while the torch backend verifies the same claim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

import torch

from attnhal.backend import AttentionConfig, ForwardBatch, KVPool, set_debug, validate
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Phase
from attnhal_torch import TorchBackend

__all__ = ["SERVER_KINDS"]


class _Server(TorchBackend):
    """The torch backend, renamed after the subclass; one thread (defects keep state per call)."""

    capabilities: ClassVar[BackendCapabilities] = TorchBackend.capabilities

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.capabilities = replace(TorchBackend.capabilities, name=f"server-{cls.__name__}")

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        kwargs.setdefault("host_workers", 1)
        super().__init__(config, pool, **kwargs)


def _plain(config: AttentionConfig) -> bool:
    return config.sliding_window is None and config.logit_softcap is None and config.sinks is None


def _read(cache: torch.Tensor, slots: torch.Tensor, scale: torch.Tensor, fp8: bool) -> torch.Tensor:
    """``cache[slots]`` as float32 (fp8: through the bytes, times the layer's scale)."""
    if not fp8:
        return cache[slots].float()
    return cache.view(torch.uint8)[slots].view(cache.dtype).float() * scale


# --- memory no request wrote -----------------------------------------------------------------------

class MasksAfterTheDot(_Server):
    """Decode reads whole tiles of 16 positions, the page-table entries past the row's end and
    the slots they name included (an out-of-range slot wraps, as an unchecked address would),
    and masks the positions past ``seq_len`` after the dots: ``-inf`` scores, then ``P @ V``
    with ``P = 0`` there. Right on a clean pool; ``NaN * 0 = NaN`` where the tail holds NaN."""

    TILE = 16

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if not _plain(self.config):
            return super().forward_decode(q, layer, batch)
        pool, cfg = self.pool, self.config
        P, n = pool.page_size, pool.k[layer].shape[0]
        out = torch.empty((*q.shape[:2], cfg.out_head_size), dtype=q.dtype, device=q.device)
        G = cfg.num_q_heads // cfg.num_kv_heads
        for r, (req, seq) in enumerate(zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist())):
            pos = torch.arange(-(-seq // self.TILE) * self.TILE)
            cols = (pos // P).clamp(max=pool.req_to_page.shape[1] - 1)
            slots = (pool.req_to_page[req, cols].long() * P + pos % P) % n
            k = _read(pool.k[layer], slots, pool.k_scale[layer], pool.kv_format.scaled)  # [n, KV, D]
            v = _read(pool.v[layer], slots, pool.v_scale[layer], pool.kv_format.scaled)
            qr = q[r].float().view(cfg.num_kv_heads, G, -1)
            scores = torch.einsum("kgd,nkd->kgn", qr, k) * cfg.sm_scale
            scores[..., seq:] = float("-inf")
            probs = torch.softmax(scores, dim=-1)
            out[r] = torch.einsum("kgn,nkd->kgd", probs, v).reshape(cfg.num_q_heads, -1).to(q.dtype)
        return out


# --- output lifetime ------------------------------------------------------------------------------------

class ReturnsItsBuffer(_Server):
    """Eager ``forward`` copies its result into one persistent output buffer (graph style, to
    save an allocation) and returns a view of it: every answer is right until the next
    forward overwrites the previous one's output."""

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward(q, k, v, layer, batch)
        buf = self.__dict__.get("_out")
        if buf is None or buf.numel() < out.numel() or buf.dtype != out.dtype:
            buf = self._out = torch.empty(out.numel(), dtype=out.dtype, device=out.device)
        view = buf[:out.numel()].view(out.shape)
        view.copy_(out)
        return view


# --- histories -------------------------------------------------------------------------------------------

class FirstBatchSizesSplits(_Server):
    """Decode sizes its split-K workspace by the longest row of the first batch it sees and
    never grows it: a later row longer than that loses the keys past it. Every single-call
    check passes (each builds a fresh backend); a history whose lengths rise does not."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.phase is not Phase.DECODE or not batch.batch_size:
            return super().init_forward_metadata(batch)
        cap = self.__dict__.setdefault("_longest", int(batch.seq_lens.max()))
        host = None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.clamp(max=cap)
        self._short = (batch, replace(batch, seq_lens=batch.seq_lens.clamp(max=cap), seq_lens_cpu=host))
        with _unvalidated():
            super().init_forward_metadata(self._short[1])

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        short = getattr(self, "_short", (None, None))
        with _unvalidated():  # the clamped lengths are the defect, not a malformed batch
            return super().forward(q, k, v, layer, short[1] if short[0] is batch else batch)


@contextlib.contextmanager
def _unvalidated() -> Iterator[None]:
    saved = validate._override
    set_debug(False)
    try:
        yield
    finally:
        set_debug(saved)


# --- value ranges ----------------------------------------------------------------------------------------

class Fp16Scores(_Server):
    """Decode in fp16 forms its scores in fp16 (the dot's result rounded to the compute dtype
    before the softmax): right at unit-scale inputs, ``inf - inf = NaN`` once ``|q . k| * scale``
    passes 65,504."""

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if q.dtype is not torch.float16 or not _plain(self.config):
            return super().forward_decode(q, layer, batch)
        pool, cfg = self.pool, self.config
        out = torch.empty((*q.shape[:2], cfg.out_head_size), dtype=q.dtype, device=q.device)
        G = cfg.num_q_heads // cfg.num_kv_heads
        for r, (req, seq) in enumerate(zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist())):
            slots = pool.slots(torch.tensor([req]), torch.arange(seq)).flatten()
            k = _read(pool.k[layer], slots, pool.k_scale[layer], pool.kv_format.scaled)
            v = _read(pool.v[layer], slots, pool.v_scale[layer], pool.kv_format.scaled)
            qr = q[r].float().view(cfg.num_kv_heads, G, -1) * cfg.sm_scale
            scores = torch.einsum("kgd,nkd->kgn", qr, k).half().float()  # the fp16 score tile
            probs = torch.softmax(scores, dim=-1)
            out[r] = torch.einsum("kgn,nkd->kgd", probs, v).reshape(cfg.num_q_heads, -1).to(q.dtype)
        return out


# --- server sizes ----------------------------------------------------------------------------------------

class GroupPast64Wraps(_Server):
    """Query heads are launched in blocks of at most 64 per KV head: a GQA/MQA group past 64
    (128 heads on one KV head, DeepSeek's MLA ratio) gives heads ``64..`` the output of head
    ``h % 64``."""

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward(q, k, v, layer, batch)
        cfg = self.config
        G = cfg.num_q_heads // cfg.num_kv_heads
        if G > 64:
            grouped = out.view(out.shape[0], cfg.num_kv_heads, G, -1)
            grouped[:, :, 64:].copy_(grouped[:, :, :64].repeat(1, 1, -(-G // 64) - 1, 1)[:, :, :G - 64].clone())
        return out


class GridYClamped(_Server):
    """A launch grid of (query heads, rows) whose y-dimension (rows x heads folded) stops at
    65,535: rows past ``65535 // heads`` are never computed (left as allocated: zeros here)."""

    def forward(self, q: torch.Tensor, k: Any, v: Any, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward(q, k, v, layer, batch)
        limit = 65535 // self.config.num_q_heads
        if out.shape[0] > limit:
            out[limit:].zero_()
        return out


# --- feature x head size ------------------------------------------------------------------------------------

class SoftcapLostAtHead256(_Server):
    """The head-size-256 instantiation of the kernel was built without the soft-cap (Gemma 2's
    shape): right at every other head size."""

    def _layer_params(self, layer: int) -> Any:
        params = super()._layer_params(layer)
        return replace(params, softcap=None) if self.config.head_size == 256 else params


#: Each double and the claim that must catch it: ``(kind, subject, dtype)``.
SERVER_KINDS: dict[type[TorchBackend], tuple[str, str, str | None]] = {
    MasksAfterTheDot: ("phase", Phase.DECODE.value, "float32"),
    ReturnsItsBuffer: ("inputs_unchanged", "", None),
    FirstBatchSizesSplits: ("batch_invariant", "", None),
    Fp16Scores: ("phase", Phase.DECODE.value, "float16"),
    GroupPast64Wraps: ("phase", Phase.DECODE.value, "float32"),
    GridYClamped: ("phase", Phase.DECODE.value, "float32"),
    SoftcapLostAtHead256: ("feature", "logit_softcap", None),
}
