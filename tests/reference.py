"""Builders of valid random batches for the backend tests, and the slow reference they use.

The reference lives in the package (:mod:`attnhal.testing.reference`: the masking table of
:mod:`attnhal.backend.batch` as Python loops in fp64) so that the conformance kit and these
tests compare against the same thing; it is re-exported here.

The builders (:func:`make_case`) produce a random but valid :class:`Case` for any
phase: a KV pool filled with random K/V, request rows with random slot
permutations, and a ForwardBatch following the per-phase layout.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import torch

from attnhal.backend import AttentionConfig, ForwardBatch, KVPool, SpecInfo
from attnhal.capabilities import Phase
from attnhal.testing.batches import tree_mask
from attnhal.testing.reference import attended_slots, query_tokens, reference_attention, reference_forward

__all__ = [
    "Case",
    "one_thread",
    "attended_slots",
    "make_case",
    "query_tokens",
    "reference_attention",
    "reference_forward",
    "tree_mask",
]


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run a test on one intra-op thread.

    Why: these tests run thousands of ops on tiny tensors; on a small shared
    machine the thread pool's barriers cost far more than they save (a busy
    sibling core stalls every parallel op by a scheduler time slice).
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


# --- builders of valid random batches ------------------------------------------------------------

@dataclass
class Case:
    """One forward: pool, config, batch and the new tokens' q/k/v."""

    config: AttentionConfig
    pool: KVPool
    batch: ForwardBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    layer: int = 0
    info: dict[str, object] = field(default_factory=dict)

    def reference(self) -> torch.Tensor:
        return reference_forward(self.q, self.k, self.v, self.layer, self.batch, self.pool,
                                 self.config.sm_scale)


def make_case(phase: Phase, *, seed: int, bs: int = 2, num_q_heads: int = 4, num_kv_heads: int = 2,
              head_size: int = 16, dtype: torch.dtype = torch.float32, prefix_lens: list[int] | None = None,
              extend_lens: list[int] | None = None, topk: int = 1, num_draft_tokens: int = 3,
              draft_extend_len: int = 3, num_steps: int = 3, draft_step: int = 0, num_layers: int = 1,
              spare_context: int = 3, custom_mask: bool | None = None, pool: KVPool | None = None) -> Case:
    """A valid random forward of ``phase``.

    ``prefix_lens[r]``: tokens of row ``r`` already in the cache before this forward
    (for ``draft_decode``: per request; rows are requests × ``topk``).
    ``extend_lens``: new tokens per row (``prefill``) or accepted tokens (``draft_extend``).
    Slots are a random permutation of the pool, request rows are random. With
    ``pool``, that pool is refilled instead of a new one made (its sizes must fit).
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    prefix = prefix_lens if prefix_lens is not None else [rng.randint(0, 12) for _ in range(bs)]
    news = _new_tokens(phase, bs, prefix, extend_lens, num_draft_tokens, draft_extend_len, rng)
    seqs = [p + n for p, n in zip(prefix, news)]
    draft_slots = bs * topk * num_steps if phase is Phase.DRAFT_DECODE else 0
    if pool is None:
        num_slots = sum(seqs) + draft_slots + rng.randint(0, 8) + 1
        max_ctx = max(seqs + [1]) + spare_context + num_draft_tokens
        pool = KVPool(num_layers=num_layers, num_slots=num_slots, num_kv_heads=num_kv_heads,
                      head_dim=head_size, dtype=dtype, max_reqs=bs + rng.randint(0, 3), max_context_len=max_ctx)
    num_slots, max_ctx, num_layers = pool.num_slots, pool.max_context_len, pool.num_layers
    assert sum(seqs) + draft_slots <= num_slots and max(seqs + [0]) <= max_ctx, "pool too small for this case"
    pool.req_to_token.zero_()
    for layer in range(num_layers):
        pool.k[layer].copy_(torch.randn(pool.k[layer].shape, generator=gen).to(dtype))
        pool.v[layer].copy_(torch.randn(pool.v[layer].shape, generator=gen).to(dtype))
    free = list(range(1, num_slots + 1))
    rng.shuffle(free)
    reqs = rng.sample(range(1, pool.req_to_token.shape[0]), bs)
    rows_slots = []
    for r in range(bs):
        slots = [free.pop() for _ in range(seqs[r])]
        rows_slots.append(slots)
        pool.req_to_token[reqs[r], :seqs[r]] = torch.tensor(slots, dtype=torch.int32)
        # Stale entries past the row's end: a backend must never read them.
        pool.req_to_token[reqs[r], seqs[r]:] = torch.tensor(
            [rng.randint(1, num_slots) for _ in range(max_ctx - seqs[r])], dtype=torch.int32)
    build = _BUILDERS[phase]
    batch = build(rng, gen, bs, prefix, news, seqs, reqs, rows_slots, free, topk=topk,
                  num_draft_tokens=num_draft_tokens, draft_extend_len=draft_extend_len,
                  num_steps=num_steps, draft_step=draft_step, custom_mask=custom_mask)
    config = AttentionConfig(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype)
    n = batch.num_tokens
    q = torch.randn(n, num_q_heads, head_size, generator=gen).to(dtype)
    k = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    v = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    return Case(config, pool, batch, q, k, v, layer=rng.randrange(num_layers),
                info={"prefix": prefix, "seqs": seqs})


def _new_tokens(phase: Phase, bs: int, prefix: list[int], extend_lens: list[int] | None,
                num_draft_tokens: int, draft_extend_len: int, rng: random.Random) -> list[int]:
    if phase is Phase.PREFILL:
        return extend_lens if extend_lens is not None else [rng.randint(0, 9) for _ in range(bs)]
    if phase is Phase.DECODE:
        return [1] * bs
    if phase is Phase.TARGET_VERIFY:
        return [num_draft_tokens] * bs
    if phase is Phase.DRAFT_EXTEND:
        return extend_lens if extend_lens is not None else [rng.randint(1, draft_extend_len) for _ in range(bs)]
    return [0] * bs  # draft_decode: the draft tokens live in draft_path, not in the row


def _i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _prefill(rng: random.Random, gen: torch.Generator, bs: int, prefix: list[int], news: list[int],
             seqs: list[int], reqs: list[int], rows: list[list[int]], free: list[int],
             **_: object) -> ForwardBatch:
    loc = [s for r in range(bs) for s in rows[r][prefix[r]:]]
    return ForwardBatch(Phase.PREFILL, _i64(reqs), _i32(seqs), _i64(loc), extend_lens=_i32(news),
                        extend_lens_cpu=list(news))


def _decode(rng: random.Random, gen: torch.Generator, bs: int, prefix: list[int], news: list[int],
            seqs: list[int], reqs: list[int], rows: list[list[int]], free: list[int],
            **_: object) -> ForwardBatch:
    return ForwardBatch(Phase.DECODE, _i64(reqs), _i32(seqs), _i64([row[-1] for row in rows]))


def _target_verify(rng: random.Random, gen: torch.Generator, bs: int, prefix: list[int], news: list[int],
                   seqs: list[int], reqs: list[int], rows: list[list[int]], free: list[int], *,
                   topk: int, num_draft_tokens: int, custom_mask: bool | None, **_: object) -> ForwardBatch:
    T = num_draft_tokens
    loc = [s for r in range(bs) for s in rows[r][prefix[r]:]]
    use_mask = custom_mask if custom_mask is not None else topk > 1
    mask = None
    if use_mask:
        masks = [tree_mask([-1] + [rng.randrange(j) for j in range(1, T)]) for _ in range(bs)]
        mask = torch.stack(masks)
    spec = SpecInfo(topk=topk, num_draft_tokens=T, custom_mask=mask)
    return ForwardBatch(Phase.TARGET_VERIFY, _i64(reqs), _i32(seqs), _i64(loc), spec=spec)


def _draft_extend(rng: random.Random, gen: torch.Generator, bs: int, prefix: list[int], news: list[int],
                  seqs: list[int], reqs: list[int], rows: list[list[int]], free: list[int], *,
                  draft_extend_len: int, **_: object) -> ForwardBatch:
    T = draft_extend_len
    # padding tokens write to the padding slot 0
    loc = [s for r in range(bs) for s in rows[r][prefix[r]:] + [0] * (T - news[r])]
    spec = SpecInfo(draft_extend_len=T)
    return ForwardBatch(Phase.DRAFT_EXTEND, _i64(reqs), _i32(seqs), _i64(loc), extend_lens=_i32(news), spec=spec)


def _draft_decode(rng: random.Random, gen: torch.Generator, bs: int, prefix: list[int], news: list[int],
                  seqs: list[int], reqs: list[int], rows: list[list[int]], free: list[int], *,
                  topk: int, num_steps: int, draft_step: int, **_: object) -> ForwardBatch:
    """Rows are requests x topk branches; step ``j`` drafted ``topk`` tokens per request
    (slots ``grid[j]``), and each branch's path picks one of them per step, so
    branches may share ancestors. Branch ``b`` writes ``grid[draft_step][b]``."""
    path = []
    for r in range(bs):
        grid = [[free.pop() for _ in range(topk)] for _ in range(num_steps)]
        for b in range(topk):
            branch = [rng.choice(grid[j]) for j in range(num_steps)]
            branch[draft_step] = grid[draft_step][b]
            path.append(branch)
    draft_path = _i64([s for p in path for s in p]).view(bs * topk, num_steps)
    spec = SpecInfo(topk=topk, draft_path=draft_path, draft_step=draft_step)
    rep = [x for x in reqs for _ in range(topk)]
    seq = [x for x in seqs for _ in range(topk)]
    return ForwardBatch(Phase.DRAFT_DECODE, _i64(rep), _i32(seq), draft_path[:, draft_step].clone(), spec=spec)


_BUILDERS: dict[Phase, Callable[..., ForwardBatch]] = {
    Phase.PREFILL: _prefill,
    Phase.DECODE: _decode,
    Phase.TARGET_VERIFY: _target_verify,
    Phase.DRAFT_EXTEND: _draft_extend,
    Phase.DRAFT_DECODE: _draft_decode,
}
