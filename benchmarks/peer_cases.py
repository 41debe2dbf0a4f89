"""The peers benchmark's shapes, K/V setup, fp32 reference and graph timing (importable; no work at import).

A :class:`Shape` names one row of the table (phase, batch, context, K/V storage);
:func:`build_case` fills one attnhal ``KVPool`` (page size 1, one layer) with random
K/V that every contender then reads (copied into its own layout where it has one),
and :func:`reference` computes the fp32 answer from the very values stored. The MLA
kinds (``mla``, ``mla4``, ``mla8``) hold DeepSeek's absorbed latent cache instead: one KV
"head" of 576 (latent 512 + rope 64) in a ``v_in_k`` pool, V its first 512 columns.
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

__all__ = ["CALLS", "DEFAULT_SHAPES", "DTYPES", "KINDS", "MLA_KINDS", "REPLAYS", "SHAPE_SETS", "TINY_MLA_SHAPES",
           "TINY_SHAPES", "Case", "Shape", "allowed", "build_case", "fp8_storage", "gather", "parse_shapes",
           "reference", "time_graph"]

#: The compute dtypes a benchmark takes, by their short names (``--dtype``).
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: The defaults of a shape: 8 KV heads, group 4 (32 query heads), head size 128.
HEADS, KV_HEADS, HEAD, GROUP = 32, 8, 128, 4
#: MLA (absorbed, DeepSeek V3/R1): one latent KV head of 576 = 512 + rope 64, V and the
#: output the latent 512; 16 q heads (TP 8) unless ``/hH`` (TP 1: 128).
MLA_HEAD, MLA_V_HEAD, MLA_HEADS = 576, 512, 16
MLA_HEAD_CHOICES = (16, 32, 64, 128)
CALLS, REPLAYS = 20, 5
#: Table kinds: (phase, query tokens per row, tree mask, fp8 K/V).
KINDS: dict[str, tuple[Phase, int, bool, bool]] = {
    "decode": (Phase.DECODE, 1, False, False),
    "chain4": (Phase.TARGET_VERIFY, 4, False, False),
    "tree8": (Phase.TARGET_VERIFY, 8, True, False),
    "fp8": (Phase.DECODE, 1, False, True),
    "prefill": (Phase.PREFILL, 0, False, False),
    "mla": (Phase.DECODE, 1, False, False),
    "mla4": (Phase.TARGET_VERIFY, 4, False, False),  # MTP / EAGLE chain of 1 + 3
    "mla8": (Phase.TARGET_VERIFY, 8, False, False),  # and of 1 + 7
}
MLA_KINDS = frozenset({"mla", "mla4", "mla8"})
#: Parents of the 8-token draft tree (token 0 is the root, the last accepted token):
#: two branches at the root, two under the first, chains below; depth 4.
TREE_PARENTS = (-1, 0, 0, 1, 1, 2, 3, 5)
FP8_SCALES = (0.04, 0.06)  # k_scale, v_scale: distinct, so a swapped scale shows in the check


@dataclass(frozen=True)
class Shape:
    """One table row: ``kind`` of :data:`KINDS`, ``bs`` requests of ``ctx`` tokens each (the
    mean with ``ragged``: lengths spread from ctx / 4 to 7 ctx / 4), 8 KV heads times
    ``group`` query heads of size ``head`` (0: the kind's default). MLA kinds: one latent KV
    head of 576, ``group`` = the q heads (16 to 128), V 512."""

    kind: str
    bs: int
    ctx: int
    group: int = 0
    head: int = 0
    ragged: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"shape kind={self.kind!r} (supported: {', '.join(KINDS)})")
        mla = self.kind in MLA_KINDS
        object.__setattr__(self, "group", self.group or (MLA_HEADS if mla else GROUP))
        object.__setattr__(self, "head", self.head or (MLA_HEAD if mla else HEAD))
        if mla and (self.group not in MLA_HEAD_CHOICES or self.head != MLA_HEAD):
            raise ValueError(f"shape {self.key} (supported: MLA heads /h16, /h32, /h64, /h128; head 576)")
        if self.bs < 1 or self.ctx < max(self.tokens, 16) or self.ctx % 16:
            raise ValueError(f"shape {self.key} (supported: bs >= 1, ctx a multiple "
                             f"of 16 (vLLM's block) and >= the query tokens per row)")
        if self.kind == "prefill" and (self.bs != 1 or self.ragged):
            raise ValueError(f"shape {self.key} (supported: prefill at bs = 1, not ragged)")
        if self.ragged and self.bs < 2:
            raise ValueError(f"shape {self.key} (supported: ragged with bs >= 2)")
        if not mla and (not 1 <= self.group <= 16 or self.head not in (64, 128, 256)):
            raise ValueError(f"shape {self.key} (supported: /g1../g16, /d64, /d128, /d256)")

    @property
    def phase(self) -> Phase:
        return KINDS[self.kind][0]

    @property
    def mla(self) -> bool:
        return self.kind in MLA_KINDS

    @property
    def kv_heads(self) -> int:
        return 1 if self.mla else KV_HEADS

    @property
    def heads(self) -> int:
        return self.kv_heads * self.group

    @property
    def v_head(self) -> int:
        """V's and the output's head size (MLA: the latent 512)."""
        return MLA_V_HEAD if self.mla else self.head

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
    def lens(self) -> tuple[int, ...]:
        """Each row's context length (multiples of 16, at least the query tokens)."""
        if not self.ragged:
            return (self.ctx,) * self.bs
        spread = [self.ctx * (1 + 6 * r / (self.bs - 1)) / 4 for r in range(self.bs)]
        return tuple(max(16 * -(-self.tokens // 16), 16 * round(n / 16)) for n in spread)

    @property
    def max_len(self) -> int:
        return max(self.lens)

    @property
    def key(self) -> str:
        if self.mla:
            extra = f"/h{self.group}" if self.group != MLA_HEADS else ""
        else:
            extra = (f"/g{self.group}" if self.group != GROUP else "") + (f"/d{self.head}" if self.head != HEAD else "")
        return f"{self.kind}:{self.bs}x{self.ctx}{extra}" + ("/ragged" if self.ragged else "")

    @property
    def title(self) -> str:
        what = {"decode": "decode", "chain4": "target_verify 4-token chain", "tree8": "target_verify 8-token tree",
                "fp8": "fp8 e4m3 decode", "prefill": "prefill causal", "mla": "MLA decode",
                "mla4": "MLA target_verify 1+3 chain", "mla8": "MLA target_verify 1+7 chain"}[self.kind]
        if self.mla:
            return f"{what} {self.bs} x {self.ctx}, {self.group} heads" + (", ragged" if self.ragged else "")
        extra = (f", group {self.group}" if self.group != GROUP else "") + \
            (f", head {self.head}" if self.head != HEAD else "") + (", ragged" if self.ragged else "")
        return f"{what} {self.bs} x {self.ctx}{extra}"


def _shape(text: str) -> Shape:
    kind, size, *extra = text.split("/")[0].partition(":")[::2] + tuple(text.split("/")[1:])
    fields: dict[str, object] = {}
    for item in extra:
        if item == "ragged":
            fields["ragged"] = True
        elif item[:1] in ("g", "d", "h") and item[1:].isdigit() and (item[0] == "h") == (kind in MLA_KINDS):
            fields["head" if item[0] == "d" else "group"] = int(item[1:])  # MLA: /hH q heads over one latent
        else:
            raise ValueError(f"--shapes item {text!r} (supported: KIND:BSxCTX[/gG][/dD][/ragged]; "
                             f"MLA kinds: KIND:BSxCTX[/hH][/ragged])")
    return Shape(kind, *_size(text, size), **fields)  # type: ignore[arg-type]


def _size(text: str, size: str) -> tuple[int, int]:
    bs, _, ctx = size.partition("x")
    if not (bs.isdigit() and ctx.isdigit()):
        raise ValueError(f"--shapes item {text!r} (supported: KIND:BSxCTX[/gG][/dD][/ragged], KIND in "
                         f"{', '.join(KINDS)})")
    return int(bs), int(ctx)


#: The referee's table: decode at the usual sizes, at groups 1/8/16, heads 64/256 and ragged;
#: verify (chain and tree) at 1 x 32k, 8 x 8k, 16 x 2k, 64 x 2k, 256 x 1k and ragged; fp8; prefill.
DEFAULT_SHAPES = tuple(_shape(t) for t in (
    "decode:1x32768", "decode:8x8192", "decode:64x2048", "decode:256x1024",
    "decode:64x2048/g1", "decode:64x2048/g8", "decode:64x2048/g16", "decode:64x2048/d64", "decode:64x2048/d256",
    "decode:8x8192/ragged", "decode:64x2048/ragged",
    *(f"{k}:{s}" for k in ("chain4", "tree8")
      for s in ("1x32768", "8x8192", "16x2048", "64x2048", "256x1024", "64x2048/ragged", "64x2048/g16")),
    "fp8:64x2048", "fp8:256x1024", "prefill:1x8192", "prefill:1x8192/d64",
    *(f"{k}:{s}{h}" for k in ("mla", "mla4", "mla8") for h in ("/h128", "")
      for s in ("1x32768", "16x4096", "64x2048", "256x1024"))))
#: The device session's plans (benchmarks/gpu_session.sh PLAN): ``core``, the issue's
#: first rows (decode, the chain and the tree at the four base sizes, fp8, prefill),
#: ``rest`` (groups, heads, ragged, 8 x 8192 verify, head-64 prefill) and ``mla`` (every MLA
#: row: decode and the 1+3 / 1+7 chains at 128 and 16 heads); together the default.
SHAPE_SETS = {"core": tuple(s for s in DEFAULT_SHAPES if s.key in (
    "decode:1x32768", "decode:8x8192", "decode:64x2048", "decode:256x1024", "chain4:1x32768", "chain4:16x2048",
    "chain4:64x2048", "chain4:256x1024", "tree8:1x32768", "tree8:16x2048", "tree8:64x2048", "tree8:256x1024",
    "fp8:64x2048", "fp8:256x1024", "prefill:1x8192"))}
SHAPE_SETS["mla"] = tuple(s for s in DEFAULT_SHAPES if s.mla)
SHAPE_SETS["rest"] = tuple(s for s in DEFAULT_SHAPES if s not in SHAPE_SETS["core"] + SHAPE_SETS["mla"])
#: MLA at interpreter sizes: decode (16 and 128 heads) and both verify chains.
TINY_MLA_SHAPES = tuple(_shape(t) for t in ("mla:2x64", "mla:2x64/h128", "mla4:2x64", "mla8:2x64"))
TINY_SHAPES = tuple(_shape(t) for t in (
    "decode:2x32", "chain4:2x32", "tree8:2x32", "fp8:2x32", "prefill:1x32", "decode:3x32/ragged/g1",
    "tree8:2x32/g16/d64")) + TINY_MLA_SHAPES


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """``"decode:8x8192,tree8:64x2048/g16/ragged,mla8:64x2048/h128"`` -> shapes (errors name the
    item and what is allowed); a name of :data:`SHAPE_SETS` (``core``, ``rest``, ``mla``) is that set."""
    if text in SHAPE_SETS:
        return SHAPE_SETS[text]
    return tuple(_shape(s.strip()) for s in text.split(",") if s.strip())


@dataclass
class Case:
    """One shape's inputs, shared by every contender.

    pool: one layer, page size 1; row ``r`` (request row ``r + 1``) holds ``lens[r]`` tokens in
        ``slots[r, :lens[r]]`` (``slots`` ``[bs, max_len]``); fp8 pools carry :data:`FP8_SCALES`.
        MLA: ``k[0]`` ``[slots, 1, 576]`` the latent rows, ``v[0]`` the view of their first 512.
    q: ``[bs * T, heads, head]`` in ``dtype``; draft mask ``[T, T]`` bool (``None``: causal/none).
    """

    shape: Shape
    dtype: torch.dtype
    pool: KVPool
    config: AttentionConfig
    batch: ForwardBatch
    q: torch.Tensor
    slots: torch.Tensor  # [bs, max_len] int64
    draft_mask: torch.Tensor | None

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the batch covers (what one forward must read at least); MLA: the
        latent rows (576 values a position: V is inside them)."""
        s = self.shape
        return (1 if s.mla else 2) * sum(s.lens) * s.kv_heads * s.head * self.pool.dtype.itemsize

    @property
    def flops(self) -> float:
        """Causal prefill: half of ``QK^T`` and ``PV`` (the other shapes report bytes)."""
        n = self.shape.ctx
        return 4.0 * n * n * self.shape.heads * self.shape.head / 2

    def kv_indices(self) -> torch.Tensor:
        """The slots of every row's context, row after row: ``[sum(lens)]`` int64."""
        return torch.cat([self.slots[r, :n] for r, n in enumerate(self.shape.lens)]).to(torch.int64)


def fp8_storage() -> torch.dtype:
    """This platform's e4m3 storage dtype; OCP e4m3 where it has none (the interpreter)."""
    flavor = detect().fp8_flavor
    return kv_storage_dtype("fp8_e4m3", flavor if flavor is not Fp8Flavor.NONE else Fp8Flavor.OCP)


def _batch(shape: Shape, slots: torch.Tensor, device: torch.device) -> tuple[ForwardBatch, torch.Tensor | None]:
    bs, t = shape.bs, shape.tokens
    rows = torch.arange(1, bs + 1, device=device)
    new = torch.cat([slots[r, n - t:n] for r, n in enumerate(shape.lens)])  # slots of the new tokens
    seq_lens = torch.tensor(shape.lens, dtype=torch.int32, device=device)
    mask = tree_mask(TREE_PARENTS[:t]).to(device) if shape.tree else None
    spec = None
    if shape.phase is Phase.TARGET_VERIFY:
        custom = None if mask is None else mask.expand(bs, t, t).contiguous()
        spec = SpecInfo(topk=2 if shape.tree else 1, num_draft_tokens=t, draft_extend_len=t, custom_mask=custom)
    extend = torch.full((bs,), t, dtype=torch.int32, device=device) if shape.phase is Phase.PREFILL else None
    batch = ForwardBatch(shape.phase, rows, seq_lens, new, extend_lens=extend,
                         extend_lens_cpu=[t] * bs if extend is not None else None,
                         seq_lens_cpu=seq_lens.cpu(), spec=spec)
    return batch, mask


def build_case(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Case:
    """The pool (sized for this shape only), K/V drawn in ``dtype`` and written through the
    pool (fp8: quantized with :data:`FP8_SCALES`), the batch and ``q``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    bs, width, head, kv_heads = shape.bs, shape.max_len, shape.head, shape.kv_heads
    storage = fp8_storage() if shape.fp8 else dtype
    config = AttentionConfig(num_q_heads=shape.heads, num_kv_heads=kv_heads, head_size=head, dtype=dtype,
                             v_head_size=shape.v_head)
    pool = KVPool(num_layers=1, num_slots=bs * width, num_kv_heads=kv_heads, head_dim=head, dtype=storage,
                  max_reqs=bs, max_context_len=width, device=device, v_head_dim=shape.v_head, v_in_k=shape.mla)
    slots = 1 + torch.arange(bs * width, device=device).view(bs, width)
    pool.req_to_page[1:bs + 1, :width] = slots.to(torch.int32)
    if shape.fp8:
        pool.k_scale.fill_(FP8_SCALES[0])
        pool.v_scale.fill_(FP8_SCALES[1])
    for start in range(0, bs * width, 1 << 16):  # bounded scratch for the fp8 quantization
        loc = slots.flatten()[start:start + (1 << 16)]
        k, v = (torch.randn((loc.numel(), kv_heads, head), generator=generator, device=device, dtype=dtype)
                for _ in range(2))
        pool.write(0, loc, k, k[..., :shape.v_head] if shape.mla else v)  # MLA: the latent is K and V
    batch, mask = _batch(shape, slots, device)
    q = torch.randn((batch.num_tokens, shape.heads, head), generator=generator, device=device, dtype=dtype)
    return Case(shape, dtype, pool, config, batch, q, slots, mask)


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``cache[slots]`` moving bytes (torch lacks fp8 indexing on some devices)."""
    if cache.dtype.itemsize == 1 and cache.dtype.is_floating_point:
        return cache.view(torch.uint8)[slots].view(cache.dtype)
    return cache[slots]


def allowed(case: Case, queries: slice, draft_mask: torch.Tensor | None, length: int | None = None,
            kv_fraction: float = 1.0) -> torch.Tensor:
    """``[len(queries), length]`` bool: which positions query tokens ``queries`` of a row of
    ``length`` tokens (default: the shape's ``ctx``) attend (the draft tokens through
    ``draft_mask`` ``[T, T]``, causally where it is ``None``). ``kv_fraction < 1``: the
    context before the new tokens (prefill: all keys) is cut to that fraction, each query
    keeping its own position (a kernel that skips the rest)."""
    t, n, dev = case.shape.tokens, length or case.shape.ctx, case.device
    pos = torch.arange(n, device=dev)
    qpos = torch.arange(n - t, n, device=dev)[queries]  # each query token's own position
    ok = pos[None, :] <= qpos[:, None]  # causal: prefill, chain verify, decode (qpos = n - 1)
    if draft_mask is not None:
        ok[:, n - t:] = draft_mask[queries]
    if kv_fraction < 1:  # the context before the new tokens (prefill: every key but the query's own)
        end = n - t if n > t else n
        ok[:, int(end * kv_fraction):end] = False
        ok[torch.arange(len(qpos), device=dev), qpos] = True
    return ok


def reference(case: Case, causal: bool = False, rows_per_chunk: int = 8,
              queries_per_chunk: int = 1024, kv_fraction: float = 1.0) -> torch.Tensor:
    """fp32 attention over the stored K/V (fp8: ``stored * scale``): ``[bs * T, heads, v_head]``.

    ``causal``: the draft tokens attend causally even where the case has a tree mask.
    ``kv_fraction``: attend only that fraction of each row's context (see :func:`allowed`).
    """
    draft_mask = None if causal else case.draft_mask
    s, pool = case.shape, case.pool
    t, group, d, scale, kv = s.tokens, s.group, s.head, case.config.sm_scale, s.kv_heads
    q = case.q.float().view(s.bs, t, kv, group, d)
    out = torch.empty(s.bs, t, kv, group, s.v_head, dtype=torch.float32, device=case.device)
    k_scale, v_scale = (float(x[0]) for x in (pool.k_scale, pool.v_scale)) if pool.kv_format.scaled else (1.0, 1.0)
    step = 1 if s.ragged else rows_per_chunk
    for r0 in range(0, s.bs, step):
        rows, n = slice(r0, min(r0 + step, s.bs)), s.lens[r0]
        k = gather(pool.k[0], case.slots[rows, :n]).float() * k_scale  # [c, n, KV, D]
        v = gather(pool.v[0], case.slots[rows, :n]).float() * v_scale
        for q0 in range(0, t, queries_per_chunk):
            qs = slice(q0, min(q0 + queries_per_chunk, t))
            scores = torch.einsum("ctkgd,clkd->ckgtl", q[rows, qs], k) * scale
            scores.masked_fill_(~allowed(case, qs, draft_mask, n, kv_fraction)[None, None, None], float("-inf"))
            out[rows, qs] = torch.einsum("ckgtl,clkd->ctkgd", scores.softmax(-1), v)
    return out.view(s.bs * t, s.heads, s.v_head)


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
