"""The kit's fixed examples beyond the canonical one: what real kernels get wrong.

Each function derives cases from a phase's canonical case (GQA 4/2, two layers,
scattered slots), so that a failure differs from the canonical case in one respect:

* :func:`boundary_cases` — KV lengths ``2^k - 1, 2^k, 2^k + 1`` (block, chunk and split
  boundaries at 64, 128, 256) and a long context of 4097 (8193 and more when thorough);
  prefill extends past 128 new tokens;
* :func:`edge_cases` — an empty request (prefill: no new tokens, no prefix) and a
  length-1 request at every position of a 3-request batch;
* :func:`layout_cases` — MHA 8/8, GQA groups 8 and 16, MQA with 16 query heads;
* :func:`input_cases` — an explicit scale with logits of hundreds in a fused qkv, and V
  near the dtype's range in strided heads;
* :func:`acceptance_cases` — boundaries by construction: draft extend with every draft
  accepted, one accepted, and both in one batch; verify with the smallest tree (one draft
  node after the root) and the longest chain the phase runs;
* :func:`size_cases` — the phase at batch size 1 and at the largest capture size.

Cases whose cost exceeds the target's bounds are left out (an interpreter run passes
small ones), so the count of fixed examples depends on the target.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnhal.phases import Phase
from attnhal.spec import NUM_STEPS, SpecConfig
from attnhal.testing.cases import MAX_EXACT_QK, CaseRecipe
from attnhal.testing.strategies import batch_cost

__all__ = ["acceptance_cases", "at_lengths", "boundary_cases", "edge_cases", "fits", "input_cases", "layout_cases",
           "size_cases"]

#: KV lengths of the boundary batches: 2^k - 1, 2^k, 2^k + 1 for k = 6, 7, 8, spread so
#: that each batch mixes them.
_BOUNDARY_BATCHES = ((63, 129, 256), (64, 127, 257), (65, 128, 255))
#: Prefill new tokens of the same batches: full prefills, extends past 128, one-token extends.
_BOUNDARY_EXTENDS = ((63, 129, 1), (1, 0, 200), (65, 3, 17))
_LONG = ((4097,),)
_THOROUGH_LONG = ((4095,), (4096,), (8193,), (2049, 2047))


def fits(recipe: CaseRecipe, max_seq_len: int, max_cost: int) -> bool:
    """Whether ``recipe`` stays within a target's bounds."""
    return max(recipe.seq_lens()) <= max_seq_len and batch_cost(recipe) <= max_cost


def at_lengths(base: CaseRecipe, kv_lens: tuple[int, ...], new_lens: tuple[int, ...] = ()) -> CaseRecipe:
    """``base`` with one request per entry of ``kv_lens``, each attending that many KV
    positions (prefill and draft extend: ``new_lens`` of them new); per-request fields
    (trees, draft picks) are cycled."""
    n = len(kv_lens)

    def cyc(values: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(values[i % len(values)] for i in range(n)) if values else values

    phase = base.phase
    if phase in (Phase.PREFILL, Phase.DRAFT_EXTEND):
        news = new_lens or cyc(base.new_lens)
        if phase is Phase.DRAFT_EXTEND:
            news = tuple(min(max(x, 1), base.tokens_per_row or 1) for x in news)
        prefix = tuple(max(0, k - x) for k, x in zip(kv_lens, news))
        return replace(base, prefix_lens=prefix, new_lens=news)
    # decode adds its token; verify its draft tokens; draft decode attends draft_step + 1 draft slots
    added = {Phase.DECODE: 1, Phase.TARGET_VERIFY: base.tokens_per_row or 0,
             Phase.DRAFT_DECODE: base.draft_step + 1}[phase]
    low = 1 if phase is Phase.DRAFT_DECODE else 0
    prefix = tuple(max(low, k - added) for k in kv_lens)
    return replace(base, prefix_lens=prefix, tree_parents=cyc(base.tree_parents), draft_picks=cyc(base.draft_picks))


def boundary_cases(base: CaseRecipe, thorough: bool = False) -> list[CaseRecipe]:
    """KV lengths at and around 64, 128, 256, and long contexts (see the module docs)."""
    out = [at_lengths(base, lens, news) for lens, news in zip(_BOUNDARY_BATCHES, _BOUNDARY_EXTENDS)]
    for lens in _LONG + (_THOROUGH_LONG if thorough else ()):
        out.append(at_lengths(base, lens, (1,) * len(lens)))
    return [replace(c, seed=base.seed + i) for i, c in enumerate(out)]


def edge_cases(base: CaseRecipe) -> list[CaseRecipe]:
    """An empty request (prefill), then a length-1 one, at each position of 3 requests.

    Prefill: 0 new tokens and no prefix (seq len 0), then 1 new token; decode: seq len 1;
    target verify: no prefix; draft extend: 1 accepted token, no prefix; draft decode:
    prefix 1. The other requests attend 9 and 5 positions.
    """
    out = []
    edges = [(0, 0), (1, 1)] if base.phase is Phase.PREFILL else [(1, 1)]
    for kv_len, new in edges:
        for pos in range(3):
            lens, news = [9, 5, 9], [3, 5, 9]
            lens[pos], news[pos] = kv_len, new
            out.append(at_lengths(base, tuple(lens), tuple(news)))
    return out


def layout_cases(base: CaseRecipe) -> list[CaseRecipe]:
    """MHA, GQA with groups 8 and 16, MQA with 16 query heads: the head mappings real
    models use beyond the canonical 4/2."""
    return [replace(base, num_q_heads=h, num_kv_heads=kv, seed=base.seed + i)
            for i, (h, kv) in enumerate(((8, 8), (16, 2), (32, 2), (16, 1)))]


def input_cases(base: CaseRecipe, dtype: str) -> list[CaseRecipe]:
    """An explicit scale (0.3) with integer q/k of magnitude 32 (logits of hundreds) in a
    fused qkv tensor; V near the dtype's range (2^15 in fp16, 2^20 otherwise) in strided heads."""
    big_v = 2.0**15 if dtype == "float16" else 2.0**20
    return [replace(base, scale=0.3, qk_magnitude=MAX_EXACT_QK, qkv_layout="fused"),
            replace(base, v_magnitude=big_v, qkv_layout="strided", seed=base.seed + 1)]


def acceptance_cases(base: CaseRecipe, max_draft_tokens: int | None = None) -> list[CaseRecipe]:
    """Where masks and lengths meet their edges, built rather than drawn by chance.

    ``draft_extend``: every request accepting all ``draft_extend_len`` tokens, every one
    accepting a single token, and both mixed in one batch. ``target_verify``: the smallest
    draft (the root and one node) and the longest chain the phase runs
    (``max_draft_tokens``, else ``NUM_STEPS.high + 1`` tokens). Other phases: none.
    """
    if base.phase is Phase.DRAFT_EXTEND:
        T = base.required_spec().draft_extend_len
        lens = (9, 17, 5)
        return [at_lengths(base, lens, news) for news in ((T,) * 3, (1,) * 3, (T, 1, T))]
    if base.phase is Phase.TARGET_VERIFY:
        longest = min(NUM_STEPS.high, (max_draft_tokens or NUM_STEPS.high + 1) - 1)
        return [replace(base, spec=SpecConfig.eagle(steps), tree_parents=(), prefix_lens=(0, 13))
                for steps in sorted({1, max(longest, 1)})]
    return []


def size_cases(base: CaseRecipe, largest: int) -> list[CaseRecipe]:
    """``base`` at batch size 1 and at ``largest`` requests of mixed lengths."""
    lens = tuple(3 + 5 * i for i in range(largest))
    return [at_lengths(base, (12,)), replace(at_lengths(base, lens), seed=base.seed + 5)]
