"""The GPU benchmarks' only call sites of attnhal backends (adapt here when their API changes).

:func:`paged_case` builds one layer's paged KV cache, a backend from the registry and
one batch of a phase; :meth:`PagedCase.run` runs that backend's public forward for the
phase (``forward_decode`` / ``forward_target_verify`` / ``forward_prefill``), which
reads K/V from the pool and writes nothing to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch, KVPool, SpecInfo
from attnhal.phases import Phase
from attnhal.registry import default_registry
from attnhal.testing.cases import tree_mask

__all__ = ["PagedCase", "draft_tree", "paged_case"]


@dataclass
class PagedCase:
    """One phase's batch over a filled pool: ``run()`` -> ``[tokens, q_heads, head]``."""

    backend: AttentionBackend
    batch: ForwardBatch
    q: torch.Tensor  # [tokens, q_heads, head]
    kv_bytes: int  # K and V bytes one forward must read

    def run(self) -> torch.Tensor:
        forward: dict[Phase, Callable[[torch.Tensor, int, ForwardBatch], torch.Tensor]] = {
            Phase.DECODE: self.backend.forward_decode,
            Phase.TARGET_VERIFY: self.backend.forward_target_verify,
            Phase.PREFILL: self.backend.forward_prefill,
        }
        return forward[self.batch.phase](self.q, 0, self.batch)


def draft_tree(tokens: int, topk: int = 2) -> torch.Tensor:
    """``[T, T]`` mask of a ``topk``-ary draft tree in breadth-first order (token ``i``'s
    parent is ``(i - 1) // topk``), as the kit builds tree masks."""
    return tree_mask([-1, *((i - 1) // topk for i in range(1, tokens))])


def _batch(phase: Phase, bs: int, ctx: int, draft_tokens: int, device: torch.device,
           tree: bool = False) -> ForwardBatch:
    """Rows 1..bs hold ``ctx`` tokens each in contiguous slots; the last ``T`` are the new
    tokens (a branching draft tree of them with ``tree``)."""
    t = {Phase.DECODE: 1, Phase.TARGET_VERIFY: draft_tokens, Phase.PREFILL: ctx}[phase]
    rows = torch.arange(1, bs + 1, device=device)
    last = (rows - 1)[:, None] * ctx + 1 + torch.arange(ctx - t, ctx, device=device)  # slots of new tokens
    seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device=device)
    spec = None
    if phase is Phase.TARGET_VERIFY:
        mask = draft_tree(t).to(device).expand(bs, t, t).contiguous() if tree else None
        spec = SpecInfo(topk=2 if tree else 1, num_draft_tokens=t, draft_extend_len=t, custom_mask=mask)
    extend = torch.full((bs,), t, dtype=torch.int32, device=device) if phase is Phase.PREFILL else None
    return ForwardBatch(phase, rows, seq_lens, last.flatten(), extend_lens=extend,
                        extend_lens_cpu=[t] * bs if extend is not None else None,
                        seq_lens_cpu=seq_lens.cpu(), spec=spec)


def paged_case(backend: str, phase: Phase, bs: int, ctx: int, *, q_heads: int = 32, kv_heads: int = 8,
               head: int = 128, dtype: torch.dtype = torch.bfloat16, draft_tokens: int = 4,
               device: str | torch.device = "cuda", kv_dtype: torch.dtype | None = None,
               tree: bool = False) -> PagedCase:
    """``bs`` requests of ``ctx`` tokens, page size 1, random K/V, backend ``backend`` (registered
    name); ``kv_dtype`` an fp8 storage dtype for a scaled fp8 cache; ``tree`` a branching
    verify tree."""
    device = torch.device(device)
    config = AttentionConfig(num_q_heads=q_heads, num_kv_heads=kv_heads, head_size=head, dtype=dtype)
    store = kv_dtype or dtype
    pool = KVPool(num_layers=1, num_slots=bs * ctx, num_kv_heads=kv_heads, head_dim=head, dtype=store,
                  max_reqs=bs, max_context_len=ctx, device=device)
    for cache in (pool.k[0], pool.v[0]):
        cache.copy_(torch.randn(cache.shape, device=device).to(store))
    if kv_dtype is not None:
        pool.k_scale.fill_(0.5)
        pool.v_scale.fill_(0.25)
    slots = 1 + torch.arange(bs * ctx, device=device, dtype=torch.int32).view(bs, ctx)
    pool.req_to_token[1:bs + 1, :ctx] = slots
    cls = default_registry().get(backend).backend
    if cls is None:
        raise RuntimeError(f"backend={backend} could not be loaded")
    batch = _batch(phase, bs, ctx, draft_tokens, device, tree)
    q = torch.randn(batch.out_cache_loc.numel(), q_heads, head, dtype=dtype, device=device)
    attn = cls(config, pool)
    attn.init_forward_metadata(batch)
    return PagedCase(attn, batch, q, kv_bytes=2 * bs * ctx * kv_heads * head * store.itemsize)
