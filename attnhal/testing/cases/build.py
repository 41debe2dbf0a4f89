"""Building a :class:`~attnhal.testing.cases.CaseRecipe` into tensors: a :class:`Case`.

:func:`build_case` follows the per-phase layout of :mod:`attnhal.backend.batch`: a
:class:`~attnhal.backend.KVPool` filled with random K/V, request rows whose pages are
scattered through the pool, a :class:`~attnhal.backend.ForwardBatch` (one builder per
phase) and the new tokens' ``q``, ``k``, ``v``. Deterministic and free of hypothesis:
these builders also serve fixed examples and benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from attnhal.backend import PADDING_PAGE, PADDING_SLOT, AttentionConfig, ForwardBatch, KVPool, SpecInfo
from attnhal.phases import Phase
from attnhal.testing.cases.pools import draw_qk, draw_v, fill_pool, make_pool, pool_size
from attnhal.testing.cases.recipe import TORCH_DTYPES, CaseRecipe
from attnhal.testing.cases.unowned import spoil_unowned

__all__ = ["Case", "attention_config", "build_case", "new_qkv", "reparent_rows", "tree_mask"]


@dataclass
class Case:
    """One forward built from ``recipe``.

    ``q``: ``[num_tokens, num_q_heads, head_size]``; ``k``: ``[num_tokens, num_kv_heads,
    head_size]``, ``v``: ``[num_tokens, num_kv_heads, v_head_size]``, the new tokens' K/V that
    ``forward`` writes to ``batch.out_cache_loc`` of layer ``layer``.
    """

    recipe: CaseRecipe
    config: AttentionConfig
    pool: KVPool
    batch: ForwardBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    layer: int = 0
    #: Per batch row, the request's slots by position (``draft_decode``: the prefix only).
    row_slots: list[list[int]] = field(default_factory=list)

    @property
    def spec(self) -> CaseRecipe:
        """The recipe, under the name it had when the record was called ``CaseSpec``."""
        return self.recipe


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


def build_case(recipe: CaseRecipe, pool: KVPool | None = None, device: str | torch.device = "cpu") -> Case:
    """Build ``recipe`` into tensors, in ``pool`` if given (overwritten in place) or a new one.

    Reusing a pool keeps its tensors (a captured graph holds them): the table is
    rewritten and K/V redrawn with ``copy_``. What the batch does not own (K/V slots of no
    position of its rows, ``req_to_page`` entries past each row's end) holds what
    ``recipe.unowned`` says (:mod:`~attnhal.testing.cases.unowned`: NaN/inf and ``-1``, or
    stale values and out-of-range pages): a backend must never read it.
    """
    need = pool_size(recipe, spare=0)
    if pool is None:
        pool = make_pool(recipe, pool_size(recipe), device)
    elif (need.num_slots > pool.num_slots or need.max_reqs > pool.req_to_page.shape[0] - 1
          or need.max_context_len > pool.max_context_len or pool.page_size != recipe.page_size):
        raise ValueError(f"pool of {pool.num_slots} slots, {pool.req_to_page.shape[0] - 1} rows, "
                         f"context {pool.max_context_len}, page size {pool.page_size} "
                         f"(supported: >= {need}, page size {recipe.page_size} for {recipe!r})")
    gen = torch.Generator().manual_seed(recipe.seed)
    fill_pool(pool, gen, recipe.qk_magnitude, recipe.v_magnitude)
    P = pool.page_size
    num_pages = pool.num_slots // P
    free = _free_slots(num_pages, recipe.slot_seed)  # pages
    reqs = list(range(1, recipe.requests + 1))
    if recipe.slot_seed:
        random.Random(recipe.slot_seed).shuffle(reqs)
    table = torch.randint(1, num_pages + 1, tuple(pool.req_to_page.shape), generator=gen, dtype=torch.int32)
    table[0] = PADDING_PAGE  # the padding request's row (see attnhal.backend.kv_pool)
    slots = []
    for req, n in zip(reqs, recipe.seq_lens()):
        pages = [free.pop() for _ in range(-(-n // P))]
        table[req, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        slots.append([pages[i // P] * P + i % P for i in range(n)])
    pool.req_to_page.copy_(table.to(pool.device))
    free = [page * P + i for page in free for i in range(P - 1, -1, -1)]  # slots of the pages left
    batch, row_slots = _BUILDERS[recipe.phase](recipe, reqs, slots, free)
    _spoil(pool, recipe, reqs, row_slots, batch)
    batch = _to(batch, pool.device)
    config = attention_config(recipe)
    q, k, v = new_qkv(config, batch.num_tokens, gen, pool.device, recipe)
    return Case(recipe, config, pool, batch, q, k, v, layer=recipe.layer, row_slots=row_slots)


def _spoil(pool: KVPool, recipe: CaseRecipe, reqs: list[int], row_slots: list[list[int]],
           batch: ForwardBatch) -> None:
    """Fill what ``batch`` does not own as ``recipe.unowned`` says (before the batch moves to the device)."""
    owned = {s for row in row_slots for s in row} | set(batch.out_cache_loc.tolist())
    info = batch.spec
    if info is not None and info.draft_path is not None:
        owned |= set(info.draft_path.flatten().tolist())
    spoil_unowned(pool, owned, dict(zip(reqs, recipe.seq_lens())), recipe.unowned, recipe.seed + 1)


def attention_config(recipe: CaseRecipe) -> AttentionConfig:
    """The attention config of ``recipe``: heads, head sizes, dtype, scale, features."""
    sinks = None
    if recipe.sinks:  # seeded by the shape alone: cases replayed through one graph share them
        gen = torch.Generator().manual_seed(7)
        sinks = 2 * torch.randn((recipe.num_layers, recipe.num_q_heads), generator=gen)
    return AttentionConfig(num_q_heads=recipe.num_q_heads, num_kv_heads=recipe.num_kv_heads,
                           head_size=recipe.head_size, dtype=TORCH_DTYPES[recipe.dtype], scale=recipe.scale,
                           v_head_size=recipe.v_head_size, sliding_window=recipe.sliding_window,
                           logit_softcap=recipe.logit_softcap, sinks=sinks)


def new_qkv(config: AttentionConfig, num_tokens: int, gen: torch.Generator, device: str | torch.device = "cpu",
            recipe: CaseRecipe | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``q`` ``[n, Hq, D]``, ``k`` ``[n, Hkv, D]``, ``v`` ``[n, Hkv, Dv]`` in the config's
    dtype, with the magnitudes and memory layout of ``recipe`` (unit normal, contiguous without)."""
    n, H, KV, D, Dv = num_tokens, config.num_q_heads, config.num_kv_heads, config.head_size, config.out_head_size
    qk, vm, layout = (recipe.qk_magnitude, recipe.v_magnitude, recipe.qkv_layout) if recipe else (1, 1.0, "contiguous")
    q, k, v = draw_qk((n, H, D), gen, qk), draw_qk((n, KV, D), gen, qk), draw_v((n, KV, Dv), gen, vm)
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


def reparent_rows(recipe: CaseRecipe, forward: int) -> list[int]:
    """Global source row of each batch row for the re-parenting before multi-step forward
    ``forward >= 1`` (rows are requests x ``topk`` branches); identity without ``reparent``."""
    k = recipe.topk
    if not recipe.reparent:
        return list(range(recipe.rows))
    return [r * k + parent for r, parents in enumerate(recipe.reparent[forward - 1]) for parent in parents]


def _free_slots(num_slots: int, slot_seed: int) -> list[int]:
    """Slots (or pages) in the order they are taken (``pop`` from the end): ascending, or a seeded shuffle."""
    free = list(range(num_slots, 0, -1))
    if slot_seed:
        random.Random(slot_seed).shuffle(free)
    return free


# --- per-phase batches ------------------------------------------------------------------------

Built = tuple[ForwardBatch, list[list[int]]]
Builder = Callable[[CaseRecipe, list[int], list[list[int]], list[int]], Built]


def _i64(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def _i32(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32)


def _batch(recipe: CaseRecipe, phase: Phase, reqs: Sequence[int], seqs: Sequence[int], loc: Sequence[int],
           **kw: object) -> ForwardBatch:
    seq = _i32(seqs)
    host = seq.clone() if recipe.host_seq_lens else None
    return ForwardBatch(phase, _i64(reqs), seq, _i64(loc), seq_lens_cpu=host, **kw)  # type: ignore[arg-type]


def _prefill(recipe: CaseRecipe, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    loc = [s for p, row in zip(recipe.prefix_lens, slots) for s in row[p:]]
    news = list(recipe.new_lens)
    return _batch(recipe, Phase.PREFILL, reqs, recipe.seq_lens(), loc, extend_lens=_i32(news),
                  extend_lens_cpu=news), slots


def _decode(recipe: CaseRecipe, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    return _batch(recipe, Phase.DECODE, reqs, recipe.seq_lens(), [row[-1] for row in slots]), slots


def _target_verify(recipe: CaseRecipe, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    spec = recipe.required_spec()
    loc = [s for p, row in zip(recipe.prefix_lens, slots) for s in row[p:]]
    mask = torch.stack([tree_mask(p) for p in recipe.tree_parents]) if recipe.tree_parents else None
    info = SpecInfo(topk=spec.topk, num_draft_tokens=spec.num_draft_tokens,
                    draft_extend_len=spec.draft_extend_len, custom_mask=mask)
    return _batch(recipe, Phase.TARGET_VERIFY, reqs, recipe.seq_lens(), loc, spec=info), slots


def _draft_extend(recipe: CaseRecipe, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    spec = recipe.required_spec()
    T = spec.draft_extend_len
    # A row's padding tokens write to the padding slot (batch.py: they are ignored).
    loc = [s for p, n, row in zip(recipe.prefix_lens, recipe.new_lens, slots)
           for s in row[p:] + [PADDING_SLOT] * (T - n)]
    info = SpecInfo(topk=spec.topk, num_draft_tokens=spec.num_draft_tokens, draft_extend_len=T)
    return _batch(recipe, Phase.DRAFT_EXTEND, reqs, recipe.seq_lens(), loc, extend_lens=_i32(recipe.new_lens),
                  spec=info), slots


def _draft_decode(recipe: CaseRecipe, reqs: list[int], slots: list[list[int]], free: list[int]) -> Built:
    """Rows are requests x ``topk`` branches. Step ``j`` drafted ``topk`` tokens per request
    (fresh slots ``grid[j]``); branch ``b`` writes ``grid[s][b]`` at step ``s`` and its
    ancestors before ``draft_step`` follow ``draft_picks``."""
    spec, s = recipe.required_spec(), recipe.draft_step
    paths, rows, seqs, row_slots = [], [], [], []
    for r, (req, prefix) in enumerate(zip(reqs, recipe.prefix_lens)):
        grid = [[free.pop() for _ in range(spec.topk)] for _ in range(spec.num_steps)]
        for b in range(spec.topk):
            picks = recipe.draft_picks[r][b] if recipe.draft_picks else (b,) * s
            paths.append([grid[j][picks[j]] if j < s else grid[j][b] for j in range(spec.num_steps)])
            rows.append(req)
            seqs.append(prefix)
            row_slots.append(slots[r])
    path = _i64([x for p in paths for x in p]).view(len(paths), spec.num_steps)
    info = SpecInfo(topk=spec.topk, num_draft_tokens=spec.num_draft_tokens,
                    draft_extend_len=spec.draft_extend_len, draft_path=path, draft_step=s)
    return _batch(recipe, Phase.DRAFT_DECODE, rows, seqs, path[:, s].tolist(), spec=info), row_slots


_BUILDERS: dict[Phase, Builder] = {
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
    info = batch.spec
    if info is not None:
        info.custom_mask = None if info.custom_mask is None else info.custom_mask.to(device)
        info.draft_path = None if info.draft_path is None else info.draft_path.to(device)
    batch.req_pool_indices = batch.req_pool_indices.to(device)
    batch.seq_lens = batch.seq_lens.to(device)
    batch.out_cache_loc = batch.out_cache_loc.to(device)
    batch.extend_lens = None if batch.extend_lens is None else batch.extend_lens.to(device)
    return batch
