"""Deterministic builders of valid forwards: a :class:`CaseSpec` in, a :class:`Case` out.

A :class:`CaseSpec` is a small frozen record of everything that defines one attention
forward (phase, dtype, head config, lengths per request, speculative shape, tree,
draft path, slot layout, seeds). :func:`build_case` turns it into tensors following the
per-phase layout of :mod:`attnhal.backend.batch`: a :class:`~attnhal.backend.KVPool`
filled with random K/V, request rows whose slots are scattered through the pool, a
:class:`~attnhal.backend.ForwardBatch` and the new tokens' ``q``, ``k``, ``v``.

The hypothesis strategies of :mod:`attnhal.testing.strategies` draw ``CaseSpec`` s, so a
shrunk counterexample prints as one readable record that :func:`build_case` rebuilds
exactly. No hypothesis here: these builders also serve fixed examples and benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

import torch

from attnhal import phases
from attnhal.backend import COMPUTE_DTYPES, PADDING_PAGE, PADDING_SLOT, AttentionConfig, ForwardBatch, KVPool, SpecInfo, kv_storage_dtype
from attnhal.capabilities import Phase
from attnhal.plan import SpecConfig
from attnhal.platform import Fp8Flavor

__all__ = [
    "TORCH_DTYPES",
    "reparent_rows",
    "Case",
    "CaseSpec",
    "attention_config",
    "PoolSize",
    "build_case",
    "fill_pool",
    "make_pool",
    "pool_size",
    "tree_mask",
]

#: Descriptor dtype names -> torch dtypes (the one table, in attnhal.backend.config).
TORCH_DTYPES = COMPUTE_DTYPES
#: How q, k, v may lie in memory (see ``CaseSpec.qkv_layout``).
QKV_LAYOUTS = ("contiguous", "fused", "strided")
#: Largest integer q/k magnitude whose products and sums (head size <= 256) every dtype
#: and an fp32 accumulator hold exactly (bf16 holds integers up to 256).
MAX_EXACT_QK = 32


@dataclass(frozen=True)
class CaseSpec:
    """Everything that defines one forward of ``phase``; :func:`build_case` builds it.

    Attributes
    ----------
    phase: the phase of the batch.
    dtype: compute and KV dtype by name (``"float16"``).
    num_q_heads, num_kv_heads, head_size: attention shape (MHA, GQA or MQA).
    prefix_lens: per request, tokens already in the cache before this forward
        (``draft_decode``: the committed prefix ``seq_lens``).
    new_lens: per request, ``prefill`` new tokens (``0`` allowed) or ``draft_extend``
        accepted tokens (``1..draft_extend_len``); unused by the other phases.
    spec: the speculative config of the spec phases (``T`` of ``target_verify`` and
        ``draft_extend``, ``topk`` and ``num_steps`` of ``draft_decode``).
    tree_parents: ``target_verify`` only: per request, the parent of each draft token
        (the root has ``-1``, every other parent comes earlier); ``()`` = causal chain.
    draft_picks: ``draft_decode`` only: per request, per branch, for each step
        ``j < draft_step`` which of the ``topk`` tokens of step ``j`` is the branch's
        ancestor (branches may share ancestors); ``()`` = branch ``b`` descends from token ``b``.
    draft_step: ``draft_decode`` step ``s``.
    reparent: for a multi-step draft (``draft_step == 0``, run through
        :class:`~attnhal.backend.MultiStepDraft`): before forward ``s >= 1``, per request,
        the branch each branch re-parents to — its ``draft_path[:, :s]`` becomes that
        branch's, as a draft tree rewrites the path in place; ``()`` = no re-parenting.
    num_layers, layer: pool layers and the layer this forward runs.
    slot_seed: ``0`` lays each request's tokens out in consecutive slots; any other
        value scatters them through the pool (a seeded permutation).
    seed: seeds the K/V in the pool, the stale table entries and ``q``, ``k``, ``v``.
    host_seq_lens: also give ``seq_lens_cpu`` (for backends declaring ``needs_host_seq_lens``).
    scale: explicit softmax scale of the attention config; ``None`` = ``head_size ** -0.5``.
    qk_magnitude: ``> 1``: q and every K (new and cached) are integers in
        ``[-qk_magnitude, qk_magnitude]`` — logits of hundreds that every dtype holds
        exactly, so a kernel that skips the max-subtraction or accumulates q·k in a narrow
        type shows, while a correct one is exact up to its softmax.
    v_magnitude: ``!= 1``: every V (new and cached) uniform in ``[-v_magnitude, v_magnitude]``:
        values near the dtype's range.
    qkv_layout: ``"contiguous"``; ``"fused"``: q, k, v are views of one ``[n, H + 2 KV, D]``
        tensor (a fused qkv projection); ``"strided"``: every other head of a tensor twice as
        wide (head stride ``2 D``). The last dimension stays contiguous.

    Features (see :class:`~attnhal.backend.AttentionConfig` and :mod:`attnhal.backend.kv_pool`):

    page_size: tokens per KV page; requests own whole pages (scattered with ``slot_seed``).
    kv_dtype: the KV-cache dtype name; ``None`` = ``dtype``. ``fp8_e4m3`` is stored in
        ``fp8_flavor`` (``"e4m3fn"`` or ``"e4m3fnuz"``, the simulated platform's).
    kv_scale: ``k_scale`` of every layer (``v_scale`` is twice it) for fp8 caches.
    sliding_window, logit_softcap: as in the attention config (a window per layer as a tuple).
    sinks: give seeded random sink logits ``[num_layers, num_q_heads]``.
    v_head_size: head size of V and the output (MLA: 512 with ``head_size`` 576).
    """

    phase: Phase
    dtype: str = "float32"
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 16
    prefix_lens: tuple[int, ...] = (3,)
    new_lens: tuple[int, ...] = ()
    spec: SpecConfig | None = None
    tree_parents: tuple[tuple[int, ...], ...] = ()
    draft_picks: tuple[tuple[tuple[int, ...], ...], ...] = ()
    draft_step: int = 0
    reparent: tuple[tuple[tuple[int, ...], ...], ...] = ()
    num_layers: int = 1
    layer: int = 0
    slot_seed: int = 0
    seed: int = 0
    host_seq_lens: bool = False
    # --- input variation (engineer j): scale, magnitudes and memory layout of q/k/v --------
    scale: float | None = None
    qk_magnitude: int = 1
    v_magnitude: float = 1.0
    qkv_layout: str = "contiguous"
    # --- features (issue 12): page table, KV storage, per-layer attention options ------
    page_size: int = 1
    kv_dtype: str | None = None
    fp8_flavor: str = "e4m3fn"
    kv_scale: float = 1.0
    sliding_window: int | tuple[int | None, ...] | None = None
    logit_softcap: float | None = None
    sinks: bool = False
    v_head_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", Phase(self.phase))
        for why in self._errors():
            raise ValueError(f"CaseSpec: {why}")

    def __repr__(self) -> str:
        # Valid Python showing only what differs from the defaults: a shrunk
        # counterexample stays short and can be pasted back into build_case().
        shown = [f"Phase.{self.phase.name}"]
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                shown.append(f"{f.name}={_spec_repr(value) if f.name == 'spec' else repr(value)}")
        return f"CaseSpec({', '.join(shown)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # hypothesis prints counterexamples with IPython-style pretty printers
        printer.text(repr(self))

    @property
    def requests(self) -> int:
        return len(self.prefix_lens)

    @property
    def topk(self) -> int:
        return self.spec.topk if self.spec is not None else 1

    @property
    def rows(self) -> int:
        """ForwardBatch rows: requests, times ``topk`` branches for ``draft_decode``."""
        return self.requests * (self.topk if self.phase is Phase.DRAFT_DECODE else 1)

    @property
    def tokens_per_row(self) -> int | None:
        """Query tokens per row of the uniform phases; None for packed ``prefill``."""
        return phases.tokens_per_row(self.phase, self.spec)

    def seq_lens(self) -> list[int]:
        """Per request: the KV length after this forward writes its tokens."""
        if self.phase in (Phase.PREFILL, Phase.DRAFT_EXTEND):
            added = list(self.new_lens)
        elif self.phase is Phase.TARGET_VERIFY:
            added = [self._spec.num_draft_tokens] * self.requests
        else:  # decode writes its one token into the row; draft tokens live in draft_path
            added = [1 if self.phase is Phase.DECODE else 0] * self.requests
        return [p + n for p, n in zip(self.prefix_lens, added)]

    @property
    def _spec(self) -> SpecConfig:
        if self.spec is None:
            raise ValueError(f"spec=None (supported: a SpecConfig for phase={self.phase.value})")
        return self.spec

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV pool's storage dtype."""
        return kv_storage_dtype(self.kv_dtype or self.dtype, Fp8Flavor(self.fp8_flavor))

    def _errors(self) -> list[str]:
        out = []
        if self.dtype not in TORCH_DTYPES:
            out.append(f"dtype={self.dtype} (supported: {', '.join(TORCH_DTYPES)})")
        out += self._input_errors()
        try:
            self.cache_dtype
        except ValueError as exc:
            out.append(str(exc))
        if self.page_size < 1 or not self.kv_scale > 0:
            out.append(f"page_size, kv_scale={self.page_size}, {self.kv_scale} (supported: >= 1, > 0)")
        if self.num_kv_heads < 1 or self.num_q_heads % self.num_kv_heads:
            out.append(f"num_q_heads/num_kv_heads={self.num_q_heads}/{self.num_kv_heads} "
                       "(supported: num_kv_heads >= 1 dividing num_q_heads)")
        if not self.prefix_lens or min(self.prefix_lens) < 0:
            out.append(f"prefix_lens={self.prefix_lens} (supported: one length >= 0 per request)")
        if not 0 <= self.layer < self.num_layers:
            out.append(f"layer={self.layer} (supported: 0..{self.num_layers - 1})")
        if self.phase in (Phase.PREFILL, Phase.DRAFT_EXTEND) and len(self.new_lens) != self.requests:
            out.append(f"new_lens={self.new_lens} (supported: one per request for {self.phase.value})")
        if self.phase in (Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE) and self.spec is None:
            out.append(f"spec=None (supported: a SpecConfig for {self.phase.value})")
        if self.phase is Phase.DRAFT_EXTEND and self.spec is not None:
            top = self.spec.draft_extend_len
            if any(not 1 <= n <= top for n in self.new_lens):
                out.append(f"new_lens={self.new_lens} (supported: 1..{top} accepted tokens per request)")
        if self.phase is Phase.DRAFT_DECODE and self.spec is not None:
            if not 0 <= self.draft_step < self.spec.num_steps:
                out.append(f"draft_step={self.draft_step} (supported: 0..{self.spec.num_steps - 1})")
        if self.draft_picks and self.spec is not None and (len(self.draft_picks) != self.requests or any(
                len(branches) != self.spec.topk or any(len(p) < self.draft_step or
                                                       any(not 0 <= x < self.spec.topk for x in p)
                                                       for p in branches)
                for branches in self.draft_picks)):
            out.append(f"draft_picks={self.draft_picks} (supported: per request, per branch, "
                       f"draft_step={self.draft_step} picks in 0..topk-1)")
        if self.reparent and self.spec is not None and (
                len(self.reparent) != max(self.spec.num_steps - 2, 0) or any(
                    len(per_req) != self.requests or any(
                        len(parents) != self.spec.topk or any(not 0 <= x < self.spec.topk for x in parents)
                        for parents in per_req)
                    for per_req in self.reparent)):
            out.append(f"reparent={self.reparent} (supported: per forward 1..num_steps-2, per request, "
                       "a parent branch in 0..topk-1 for each branch)")
        if self.tree_parents and (len(self.tree_parents) != self.requests or any(
                _bad_tree(p, self.tokens_per_row or 0) for p in self.tree_parents)):
            out.append(f"tree_parents={self.tree_parents} (supported: per request, parent < token "
                       "for each draft token, -1 for the root token 0)")
        return out


    def _input_errors(self) -> list[str]:
        out = []
        if self.scale is not None and not self.scale > 0:
            out.append(f"scale={self.scale} (supported: None or > 0)")
        if not 1 <= self.qk_magnitude <= MAX_EXACT_QK:
            out.append(f"qk_magnitude={self.qk_magnitude} (supported: 1..{MAX_EXACT_QK}, exact in every dtype)")
        if not self.v_magnitude > 0:
            out.append(f"v_magnitude={self.v_magnitude} (supported: > 0)")
        if self.qkv_layout not in QKV_LAYOUTS:
            out.append(f"qkv_layout={self.qkv_layout} (supported: {', '.join(QKV_LAYOUTS)})")
        return out


def _spec_repr(spec: SpecConfig) -> str:
    if not spec.speculative:
        return "SpecConfig()"
    return f"SpecConfig.eagle({spec.num_steps}, topk={spec.topk}, num_draft_tokens={spec.num_draft_tokens})"


def _bad_tree(parents: Sequence[int], tokens: int) -> bool:
    return (len(parents) != tokens or (tokens > 0 and parents[0] != -1)
            or any(not 0 <= p < j for j, p in enumerate(parents) if j))


def tree_mask(parents: Sequence[int]) -> torch.Tensor:
    """``[T, T]`` bool: token ``i`` attends ``j`` iff ``j`` is ``i`` or an ancestor of ``i``.

    ``parents[j]`` is the parent of token ``j`` (``< j``); the root token 0 has ``-1``.
    The mask is ancestor-closed, as a draft tree's is.
    """
    T = len(parents)
    mask = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


@dataclass
class Case:
    """One forward built from ``spec``.

    ``q``: ``[num_tokens, num_q_heads, head_size]``; ``k``: ``[num_tokens, num_kv_heads,
    head_size]``, ``v``: ``[num_tokens, num_kv_heads, v_head_size]``, the new tokens' K/V that
    ``forward`` writes to ``batch.out_cache_loc`` of layer ``layer``.
    """

    spec: CaseSpec
    config: AttentionConfig
    pool: KVPool
    batch: ForwardBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    layer: int = 0
    #: Per batch row, the request's slots by position (``draft_decode``: the prefix only).
    row_slots: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class PoolSize:
    """What a pool must hold for a set of cases: slots, request rows, context length."""

    num_slots: int
    max_reqs: int
    max_context_len: int

    def union(self, other: PoolSize) -> PoolSize:
        return PoolSize(max(self.num_slots, other.num_slots), max(self.max_reqs, other.max_reqs),
                        max(self.max_context_len, other.max_context_len))


def pool_size(spec: CaseSpec, spare: int = 8) -> PoolSize:
    """The smallest pool that holds ``spec`` (plus ``spare`` context and slots, so that a
    backend reading past a row's end reads stale but valid entries)."""
    seqs, P = spec.seq_lens(), spec.page_size
    draft = spec.requests * spec.topk * spec._spec.num_steps if spec.phase is Phase.DRAFT_DECODE else 0
    pages = sum(-(-n // P) for n in seqs) + -(-(draft + spare) // P)
    return PoolSize(num_slots=pages * P, max_reqs=spec.requests + 1, max_context_len=max(seqs) + spare)


def make_pool(spec: CaseSpec, size: PoolSize | None = None, device: str | torch.device = "cpu") -> KVPool:
    """An empty pool shaped for ``spec`` (heads, head size, dtype, layers) of ``size``."""
    size = size or pool_size(spec)
    pool = KVPool(num_layers=spec.num_layers, num_slots=size.num_slots, num_kv_heads=spec.num_kv_heads,
                  head_dim=spec.head_size, dtype=spec.cache_dtype, max_reqs=size.max_reqs,
                  max_context_len=size.max_context_len, device=device, page_size=spec.page_size,
                  v_head_dim=spec.v_head_size)
    if pool.is_fp8:
        pool.k_scale.fill_(spec.kv_scale)
        pool.v_scale.fill_(2 * spec.kv_scale)
    return pool


def fill_pool(pool: KVPool, gen: torch.Generator, qk_magnitude: int = 1, v_magnitude: float = 1.0) -> None:
    """Random K/V in every slot of every layer (the padding slot too), in place; K and V
    drawn as :func:`new_qkv` draws them (see ``CaseSpec.qk_magnitude``, ``v_magnitude``);
    fp8 caches store them divided by the layer's scale (they dequantize to those values)."""
    for caches, scales, draw in ((pool.k, pool.k_scale, partial(_draw, magnitude=qk_magnitude)),
                                 (pool.v, pool.v_scale, partial(_draw_v, magnitude=v_magnitude))):
        for cache, scale in zip(caches, scales.tolist()):
            values = draw(cache.shape, gen)
            cache.copy_((values / scale if pool.is_fp8 else values).to(cache.dtype))


def _draw(shape: tuple[int, ...] | torch.Size, gen: torch.Generator, magnitude: int) -> torch.Tensor:
    """Unit normal values, or integers in ``[-magnitude, magnitude]`` when ``magnitude > 1``."""
    if magnitude > 1:
        return torch.randint(-magnitude, magnitude + 1, tuple(shape), generator=gen).float()
    return torch.randn(shape, generator=gen)


def _draw_v(shape: tuple[int, ...] | torch.Size, gen: torch.Generator, magnitude: float) -> torch.Tensor:
    """Unit normal values, or uniform in ``[-magnitude, magnitude]`` (bounded: near a
    dtype's range, a normal tail would overflow it)."""
    if magnitude != 1:
        return (torch.rand(shape, generator=gen) * 2 - 1) * magnitude
    return torch.randn(shape, generator=gen)


def build_case(spec: CaseSpec, pool: KVPool | None = None, device: str | torch.device = "cpu") -> Case:
    """Build ``spec`` into tensors, in ``pool`` if given (overwritten in place) or a new one.

    Reusing a pool keeps its tensors (a captured graph holds them): the table is
    rewritten and K/V redrawn with ``copy_``. Entries of ``req_to_page`` past each
    row's end hold random pages: a backend must never read them.
    """
    need = pool_size(spec, spare=0)
    if pool is None:
        pool = make_pool(spec, pool_size(spec), device)
    elif (need.num_slots > pool.num_slots or need.max_reqs > pool.req_to_page.shape[0] - 1
          or need.max_context_len > pool.max_context_len or pool.page_size != spec.page_size):
        raise ValueError(f"pool of {pool.num_slots} slots, {pool.req_to_page.shape[0] - 1} rows, "
                         f"context {pool.max_context_len}, page size {pool.page_size} "
                         f"(supported: >= {need}, page size {spec.page_size} for {spec!r})")
    gen = torch.Generator().manual_seed(spec.seed)
    fill_pool(pool, gen, spec.qk_magnitude, spec.v_magnitude)
    P = pool.page_size
    num_pages = pool.num_slots // P
    free = _free_slots(num_pages, spec.slot_seed)  # pages
    reqs = list(range(1, spec.requests + 1))
    if spec.slot_seed:
        random.Random(spec.slot_seed).shuffle(reqs)
    table = torch.randint(1, num_pages + 1, tuple(pool.req_to_page.shape), generator=gen, dtype=torch.int32)
    table[0] = PADDING_PAGE  # the padding request's row (see attnhal.backend.kv_pool)
    slots = []
    for req, n in zip(reqs, spec.seq_lens()):
        pages = [free.pop() for _ in range(-(-n // P))]
        table[req, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        slots.append([pages[i // P] * P + i % P for i in range(n)])
    pool.req_to_page.copy_(table.to(pool.device))
    free = [page * P + i for page in free for i in range(P - 1, -1, -1)]  # slots of the pages left
    batch, row_slots = _BUILDERS[spec.phase](spec, reqs, slots, free)
    batch = _to(batch, pool.device)
    config = attention_config(spec)
    q, k, v = new_qkv(config, batch.num_tokens, gen, pool.device, spec)
    return Case(spec, config, pool, batch, q, k, v, layer=spec.layer, row_slots=row_slots)


def attention_config(spec: CaseSpec) -> AttentionConfig:
    """The attention config of ``spec``: heads, head sizes, dtype, scale, features."""
    sinks = None
    if spec.sinks:  # seeded by the shape alone: cases replayed through one graph share them
        gen = torch.Generator().manual_seed(7)
        sinks = 2 * torch.randn((spec.num_layers, spec.num_q_heads), generator=gen)
    return AttentionConfig(num_q_heads=spec.num_q_heads, num_kv_heads=spec.num_kv_heads,
                           head_size=spec.head_size, dtype=TORCH_DTYPES[spec.dtype], scale=spec.scale,
                           v_head_size=spec.v_head_size, sliding_window=spec.sliding_window,
                           logit_softcap=spec.logit_softcap, sinks=sinks)


def new_qkv(config: AttentionConfig, num_tokens: int, gen: torch.Generator, device: str | torch.device = "cpu",
            spec: CaseSpec | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``q`` ``[n, Hq, D]``, ``k`` ``[n, Hkv, D]``, ``v`` ``[n, Hkv, Dv]`` in the config's
    dtype, with the magnitudes and memory layout of ``spec`` (unit normal, contiguous without)."""
    n, H, KV, D, Dv = num_tokens, config.num_q_heads, config.num_kv_heads, config.head_size, config.out_head_size
    qk, vm, layout = (spec.qk_magnitude, spec.v_magnitude, spec.qkv_layout) if spec else (1, 1.0, "contiguous")
    q, k, v = _draw((n, H, D), gen, qk), _draw((n, KV, D), gen, qk), _draw_v((n, KV, Dv), gen, vm)
    q, k, v = (x.to(config.dtype).to(device) for x in (q, k, v))
    if layout == "fused":  # one [n, H D + KV D + KV Dv] row per token, as one qkv projection writes it
        fused = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)

        def heads(start: int, count: int, size: int) -> torch.Tensor:
            return fused.as_strided((n, count, size), (fused.shape[1], size, 1), start)

        return heads(0, H, D), heads(H * D, KV, D), heads((H + KV) * D, KV, Dv)
    if layout == "strided":
        return _every_other_head(q), _every_other_head(k), _every_other_head(v)
    return q, k, v


def _every_other_head(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the even heads of a tensor twice as wide (head stride ``2 D``; odd heads NaN,
    so a kernel reading them shows)."""
    n, h, d = x.shape
    wide = torch.full((n, 2 * h, d), float("nan"), dtype=x.dtype, device=x.device)
    wide[:, ::2] = x
    return wide[:, ::2]


def reparent_rows(spec: CaseSpec, forward: int) -> list[int]:
    """Global source row of each batch row for the re-parenting before multi-step forward
    ``forward >= 1`` (rows are requests x ``topk`` branches); identity without ``reparent``."""
    k = spec.topk
    if not spec.reparent:
        return list(range(spec.rows))
    return [r * k + parent for r, parents in enumerate(spec.reparent[forward - 1]) for parent in parents]


def _free_slots(num_slots: int, slot_seed: int) -> list[int]:
    """Slots (or pages) in the order they are taken (``pop`` from the end): ascending, or a seeded shuffle."""
    free = list(range(num_slots, 0, -1))
    if slot_seed:
        random.Random(slot_seed).shuffle(free)
    return free


# --- per-phase batches ------------------------------------------------------------------------

Built = tuple[ForwardBatch, list[list[int]]]


def _i64(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def _i32(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32)


def _batch(case: CaseSpec, phase: Phase, reqs: Sequence[int], seqs: Sequence[int], loc: Sequence[int],
           **kw: object) -> ForwardBatch:
    seq = _i32(seqs)
    host = seq.clone() if case.host_seq_lens else None
    return ForwardBatch(phase, _i64(reqs), seq, _i64(loc), seq_lens_cpu=host, **kw)  # type: ignore[arg-type]


def _prefill(spec: CaseSpec, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    loc = [s for p, row in zip(spec.prefix_lens, slots) for s in row[p:]]
    news = list(spec.new_lens)
    return _batch(spec, Phase.PREFILL, reqs, spec.seq_lens(), loc, extend_lens=_i32(news),
                  extend_lens_cpu=news), slots


def _decode(spec: CaseSpec, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    return _batch(spec, Phase.DECODE, reqs, spec.seq_lens(), [row[-1] for row in slots]), slots


def _target_verify(spec: CaseSpec, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    cfg = spec._spec
    loc = [s for p, row in zip(spec.prefix_lens, slots) for s in row[p:]]
    mask = torch.stack([tree_mask(p) for p in spec.tree_parents]) if spec.tree_parents else None
    info = SpecInfo(topk=cfg.topk, num_draft_tokens=cfg.num_draft_tokens,
                    draft_extend_len=cfg.draft_extend_len, custom_mask=mask)
    return _batch(spec, Phase.TARGET_VERIFY, reqs, spec.seq_lens(), loc, spec=info), slots


def _draft_extend(spec: CaseSpec, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    cfg = spec._spec
    T = cfg.draft_extend_len
    # A row's padding tokens write to the padding slot (batch.py: they are ignored).
    loc = [s for p, n, row in zip(spec.prefix_lens, spec.new_lens, slots)
           for s in row[p:] + [PADDING_SLOT] * (T - n)]
    info = SpecInfo(topk=cfg.topk, num_draft_tokens=cfg.num_draft_tokens, draft_extend_len=T)
    return _batch(spec, Phase.DRAFT_EXTEND, reqs, spec.seq_lens(), loc, extend_lens=_i32(spec.new_lens),
                  spec=info), slots


def _draft_decode(spec: CaseSpec, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    """Rows are requests x ``topk`` branches. Step ``j`` drafted ``topk`` tokens per request
    (fresh slots ``grid[j]``); branch ``b`` writes ``grid[s][b]`` at step ``s`` and its
    ancestors before ``draft_step`` follow ``draft_picks``."""
    cfg, s = spec._spec, spec.draft_step
    paths, rows, seqs, row_slots = [], [], [], []
    for r, (req, prefix) in enumerate(zip(reqs, spec.prefix_lens)):
        grid = [[free.pop() for _ in range(cfg.topk)] for _ in range(cfg.num_steps)]
        for b in range(cfg.topk):
            picks = spec.draft_picks[r][b] if spec.draft_picks else (b,) * s
            paths.append([grid[j][picks[j]] if j < s else grid[j][b] for j in range(cfg.num_steps)])
            rows.append(req)
            seqs.append(prefix)
            row_slots.append(slots[r])
    path = _i64([x for p in paths for x in p]).view(len(paths), cfg.num_steps)
    info = SpecInfo(topk=cfg.topk, num_draft_tokens=cfg.num_draft_tokens,
                    draft_extend_len=cfg.draft_extend_len, draft_path=path, draft_step=s)
    return _batch(spec, Phase.DRAFT_DECODE, rows, seqs, path[:, s].tolist(), spec=info), row_slots


_BUILDERS = {
    Phase.PREFILL: _prefill,
    Phase.DECODE: _decode,
    Phase.TARGET_VERIFY: _target_verify,
    Phase.DRAFT_EXTEND: _draft_extend,
    Phase.DRAFT_DECODE: _draft_decode,
}


def _to(batch: ForwardBatch, device: torch.device) -> ForwardBatch:
    """``batch`` with its device tensors on ``device`` (host copies stay on the host)."""
    if device.type == "cpu":
        return batch
    spec = batch.spec
    if spec is not None:
        spec.custom_mask = None if spec.custom_mask is None else spec.custom_mask.to(device)
        spec.draft_path = None if spec.draft_path is None else spec.draft_path.to(device)
    batch.req_pool_indices = batch.req_pool_indices.to(device)
    batch.seq_lens = batch.seq_lens.to(device)
    batch.out_cache_loc = batch.out_cache_loc.to(device)
    batch.extend_lens = None if batch.extend_lens is None else batch.extend_lens.to(device)
    return batch
