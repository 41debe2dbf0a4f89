"""The peers benchmark's shapes, K/V setup, fp32 reference and graph timing (importable; no work at import).

A :class:`Shape` names one row of the table (phase, batch, context, K/V storage);
:func:`build_case` fills one attnhal ``KVPool`` (page size 1, one layer) with random
K/V that every contender then reads (copied into its own layout where it has one),
and :func:`reference` computes the fp32 answer from the very values stored.
:func:`time_graph` times a call as a CUDA graph of 20 calls, median of 5 replays.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnhal.backend import (
    AttentionConfig,
    ForwardBatch,
    KVPool,
    SpecInfo,
    kv_storage_dtype,
)
from attnhal.phases import Phase
from attnhal.platform import Fp8Flavor, detect
from attnhal.testing.cases import tree_mask

__all__ = ["CALLS", "DEFAULT_SHAPES", "KINDS", "REPLAYS", "TINY_SHAPES", "Case", "Shape", "allowed", "build_case",
           "fp8_storage", "gather", "parse_shapes", "reference", "time_graph"]

HEADS, KV_HEADS, HEAD = 32, 8, 128
CALLS, REPLAYS = 20, 5
#: Table kinds: (phase, query tokens per row, tree mask, fp8 K/V).
KINDS: dict[str, tuple[Phase, int, bool, bool]] = {
    "decode": (Phase.DECODE, 1, False, False),
    "chain4": (Phase.TARGET_VERIFY, 4, False, False),
    "tree8": (Phase.TARGET_VERIFY, 8, True, False),
    "fp8": (Phase.DECODE, 1, False, True),
    "prefill": (Phase.PREFILL, 0, False, False),
}
#: Parents of the 8-token draft tree (token 0 is the root, the last accepted token):
#: two branches at the root, two under the first, chains below; depth 4.
TREE_PARENTS = (-1, 0, 0, 1, 1, 2, 3, 5)
FP8_SCALES = (0.04, 0.06)  # k_scale, v_scale: distinct, so a swapped scale shows in the check


@dataclass(frozen=True)
class Shape:
    """One table row: ``kind`` of :data:`KINDS`, ``bs`` requests of ``ctx`` tokens each."""

    kind: str
    bs: int
    ctx: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"shape kind={self.kind!r} (supported: {', '.join(KINDS)})")
        if self.bs < 1 or self.ctx < max(self.tokens, 16) or self.ctx % 16:
            raise ValueError(f"shape {self.kind}:{self.bs}x{self.ctx} (supported: bs >= 1, ctx a multiple "
                             f"of 16 (vLLM's block) and >= the query tokens per row)")
        if self.kind == "prefill" and self.bs != 1:
            raise ValueError(f"shape prefill:{self.bs}x{self.ctx} (supported: bs = 1)")

    @property
    def phase(self) -> Phase:
        return KINDS[self.kind][0]

    @property
    def tokens(self) -> int:
        """Query tokens per row (a prefill row's whole context)."""
        return KINDS[self.kind][1] or self.ctx

    @property
    def tree(self) -> bool:
        return KINDS[self.kind][2]

    @property
    def fp8(self) -> bool:
        return KINDS[self.kind][3]

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.bs}x{self.ctx}"

    @property
    def title(self) -> str:
        what = {"decode": "decode", "chain4": "target_verify 4-token chain", "tree8": "target_verify 8-token tree",
                "fp8": "fp8 e4m3 decode", "prefill": "prefill causal"}[self.kind]
        return f"{what} {self.bs} x {self.ctx}"


DEFAULT_SHAPES = tuple(Shape(k, bs, n) for k, bs, n in (
    ("decode", 1, 32768), ("decode", 8, 8192), ("decode", 64, 2048), ("decode", 256, 1024),
    ("chain4", 8, 8192), ("chain4", 64, 2048), ("chain4", 256, 1024),
    ("tree8", 8, 8192), ("tree8", 64, 2048), ("tree8", 256, 1024),
    ("fp8", 256, 1024), ("prefill", 1, 8192)))
TINY_SHAPES = tuple(Shape(k, bs, n) for k, bs, n in (
    ("decode", 2, 32), ("chain4", 2, 32), ("tree8", 2, 32), ("fp8", 2, 32), ("prefill", 1, 32)))


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """``"decode:8x8192,tree8:64x2048"`` -> shapes (errors name the item and what is allowed)."""
    shapes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, _, size = item.partition(":")
        bs, _, ctx = size.partition("x")
        if not (bs.isdigit() and ctx.isdigit()):
            raise ValueError(f"--shapes item {item!r} (supported: KIND:BSxCTX, KIND in {', '.join(KINDS)})")
        shapes.append(Shape(kind, int(bs), int(ctx)))
    return tuple(shapes)


@dataclass
class Case:
    """One shape's inputs, shared by every contender.

    pool: one layer, page size 1; row ``r`` (request row ``r + 1``) holds ``ctx`` tokens in
        slots ``slots[r]``; fp8 pools carry :data:`FP8_SCALES`.
    q: ``[bs * T, HEADS, HEAD]`` in ``dtype``; draft mask ``[T, T]`` bool (``None``: causal/none).
    """

    shape: Shape
    dtype: torch.dtype
    pool: KVPool
    config: AttentionConfig
    batch: ForwardBatch
    q: torch.Tensor
    slots: torch.Tensor  # [bs, ctx] int64
    draft_mask: torch.Tensor | None

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the batch covers (what one forward must read at least)."""
        s = self.shape
        return 2 * s.bs * s.ctx * KV_HEADS * HEAD * self.pool.dtype.itemsize

    @property
    def flops(self) -> float:
        """Causal prefill: half of ``QK^T`` and ``PV`` (the other shapes report bytes)."""
        n = self.shape.ctx
        return 4.0 * n * n * HEADS * HEAD / 2


def fp8_storage() -> torch.dtype:
    """This platform's e4m3 storage dtype; OCP e4m3 where it has none (the interpreter)."""
    flavor = detect().fp8_flavor
    return kv_storage_dtype("fp8_e4m3", flavor if flavor is not Fp8Flavor.NONE else Fp8Flavor.OCP)


def _batch(shape: Shape, device: torch.device) -> tuple[ForwardBatch, torch.Tensor | None]:
    bs, ctx, t = shape.bs, shape.ctx, shape.tokens
    rows = torch.arange(1, bs + 1, device=device)
    new = (rows - 1)[:, None] * ctx + 1 + torch.arange(ctx - t, ctx, device=device)  # slots of new tokens
    seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device=device)
    mask = tree_mask(TREE_PARENTS[:t]).to(device) if shape.tree else None
    spec = None
    if shape.phase is Phase.TARGET_VERIFY:
        custom = None if mask is None else mask.expand(bs, t, t).contiguous()
        spec = SpecInfo(topk=2 if shape.tree else 1, num_draft_tokens=t, draft_extend_len=t, custom_mask=custom)
    extend = torch.full((bs,), t, dtype=torch.int32, device=device) if shape.phase is Phase.PREFILL else None
    batch = ForwardBatch(shape.phase, rows, seq_lens, new.flatten(), extend_lens=extend,
                         extend_lens_cpu=[t] * bs if extend is not None else None,
                         seq_lens_cpu=seq_lens.cpu(), spec=spec)
    return batch, mask


def build_case(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Case:
    """The pool (sized for this shape only), K/V drawn in ``dtype`` and written through the
    pool (fp8: quantized with :data:`FP8_SCALES`), the batch and ``q``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    bs, ctx = shape.bs, shape.ctx
    storage = fp8_storage() if shape.fp8 else dtype
    config = AttentionConfig(num_q_heads=HEADS, num_kv_heads=KV_HEADS, head_size=HEAD, dtype=dtype)
    pool = KVPool(num_layers=1, num_slots=bs * ctx, num_kv_heads=KV_HEADS, head_dim=HEAD, dtype=storage,
                  max_reqs=bs, max_context_len=ctx, device=device)
    slots = 1 + torch.arange(bs * ctx, device=device).view(bs, ctx)
    pool.req_to_page[1:bs + 1, :ctx] = slots.to(torch.int32)
    if shape.fp8:
        pool.k_scale.fill_(FP8_SCALES[0])
        pool.v_scale.fill_(FP8_SCALES[1])
    for start in range(0, bs * ctx, 1 << 16):  # bounded scratch for the fp8 quantization
        loc = slots.flatten()[start:start + (1 << 16)]
        k, v = (torch.randn((loc.numel(), KV_HEADS, HEAD), generator=generator, device=device, dtype=dtype)
                for _ in range(2))
        pool.write(0, loc, k, v)
    batch, mask = _batch(shape, device)
    q = torch.randn((batch.num_tokens, HEADS, HEAD), generator=generator, device=device, dtype=dtype)
    return Case(shape, dtype, pool, config, batch, q, slots, mask)


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``cache[slots]`` moving bytes (torch lacks fp8 indexing on some devices)."""
    if cache.dtype.itemsize == 1 and cache.dtype.is_floating_point:
        return cache.view(torch.uint8)[slots].view(cache.dtype)
    return cache[slots]


def allowed(case: Case, queries: slice, draft_mask: torch.Tensor | None) -> torch.Tensor:
    """``[len(queries), ctx]`` bool: which positions query tokens ``queries`` of a row attend
    (the draft tokens through ``draft_mask`` ``[T, T]``, causally where it is ``None``)."""
    s, dev = case.shape, case.device
    t = s.tokens
    pos = torch.arange(s.ctx, device=dev)
    qpos = torch.arange(s.ctx - t, s.ctx, device=dev)[queries]  # each query token's own position
    ok = pos[None, :] <= qpos[:, None]  # causal: prefill, chain verify, decode (qpos = ctx - 1)
    if draft_mask is not None:
        ok[:, s.ctx - t:] = draft_mask[queries]
    return ok


def reference(case: Case, causal: bool = False, rows_per_chunk: int = 8,
              queries_per_chunk: int = 1024) -> torch.Tensor:
    """fp32 attention over the stored K/V (fp8: ``stored * scale``): ``[bs * T, HEADS, HEAD]``.

    ``causal``: the draft tokens attend causally even where the case has a tree mask.
    """
    draft_mask = None if causal else case.draft_mask
    s, pool = case.shape, case.pool
    t, group, scale = s.tokens, HEADS // KV_HEADS, case.config.sm_scale
    q = case.q.float().view(s.bs, t, KV_HEADS, group, HEAD)
    out = torch.empty(s.bs, t, KV_HEADS, group, HEAD, dtype=torch.float32, device=case.device)
    k_scale, v_scale = (float(x[0]) for x in (pool.k_scale, pool.v_scale)) if pool.kv_format.scaled else (1.0, 1.0)
    for r0 in range(0, s.bs, rows_per_chunk):
        rows = slice(r0, min(r0 + rows_per_chunk, s.bs))
        k = gather(pool.k[0], case.slots[rows]).float() * k_scale  # [c, ctx, KV, D]
        v = gather(pool.v[0], case.slots[rows]).float() * v_scale
        for q0 in range(0, t, queries_per_chunk):
            qs = slice(q0, min(q0 + queries_per_chunk, t))
            scores = torch.einsum("ctkgd,clkd->ckgtl", q[rows, qs], k) * scale
            scores.masked_fill_(~allowed(case, qs, draft_mask)[None, None, None], float("-inf"))
            out[rows, qs] = torch.einsum("ckgtl,clkd->ctkgd", scores.softmax(-1), v)
    return out.view(s.bs * t, HEADS, HEAD)


def time_graph(fn: Callable[[], object], calls: int = CALLS, replays: int = REPLAYS) -> float:
    """Seconds per ``fn()``: one ``torch.cuda.CUDAGraph`` of ``calls`` calls, median of ``replays``
    replays timed with CUDA events. ``fn`` must have run once (compiled) before."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm on the side stream, as torch's graph recipe asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(times)
