"""Strategies for forwards: head layouts, context lengths, input variations, draft trees,
and the batches of each phase bound to a descriptor (:func:`case_specs` and the ones
built on it).

Sizes reach what real kernels hit (:func:`context_lengths`: block boundaries
``2^k - 1, 2^k, 2^k + 1`` and contexts past 4096; prefill extends past 128 tokens;
:func:`head_layouts`: MHA, GQA groups 2..16, MQA with 8+ query heads) under a cost
model: a batch's ``max_cost`` (query tokens x attended positions x query heads x head
size, summed) bounds its size, so long contexts come with few requests.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.phases import Phase
from attnhal.spec import SpecConfig
from attnhal.testing.strategies.configs import dtypes, graph_limits, head_sizes, spec_configs_for

if TYPE_CHECKING:  # the batch strategies need torch (through attnhal.testing.cases); the others stay light
    import torch

    from attnhal.testing.cases import Case, CaseRecipe

__all__ = ["DEFAULT_MAX_COST", "DEFAULT_MAX_SEQ_LEN", "batch_cost", "case_specs", "cases", "context_lengths",
           "graph_case_specs", "head_configs", "head_layouts", "input_variations", "multi_step_specs",
           "tree_masks", "tree_parents"]

#: Longest context drawn by default: past the 4096 of long-context kernels' split tables.
DEFAULT_MAX_SEQ_LEN = 8193
#: Default cost bound of one drawn batch (see :func:`batch_cost`): ~0.1 s of the fp64
#: reference and the torch backend on one CPU core.
DEFAULT_MAX_COST = 2**25
#: Prefill extends past the query tiles of real kernels (64, 128, 256).
_EXTEND_EDGES = (31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257)


def head_configs(max_kv_heads: int = 2, max_group: int = 4) -> st.SearchStrategy[tuple[int, int]]:
    """``(num_q_heads, num_kv_heads)``: MHA (group 1), GQA, and MQA (one KV head).

    Shrinks towards one head; a bug that needs grouped heads shrinks to the smallest GQA.
    """
    return st.builds(lambda kv, group: (kv * group, kv), st.integers(1, max_kv_heads), st.integers(1, max_group))


def head_layouts(max_q_heads: int = 64) -> st.SearchStrategy[tuple[int, int]]:
    """``(num_q_heads, num_kv_heads)`` of real models: small ones (shrink targets), MHA,
    GQA with groups 2..16 (70B-class models use 8), MQA with 8..32 query heads."""
    gqa = st.builds(lambda kv, g: (kv * g, kv), st.sampled_from((2, 4, 8)), st.integers(2, 16))
    mqa = st.builds(lambda h: (h, 1), st.integers(8, 32))
    mha = st.builds(lambda h: (h, h), st.integers(2, 16))
    return st.one_of(head_configs(), gqa, mqa, mha).filter(lambda c: c[0] <= max_q_heads)


def context_lengths(max_len: int = DEFAULT_MAX_SEQ_LEN, low: int = 0, page_size: int = 1) -> st.SearchStrategy[int]:
    """KV lengths in ``[low, max_len]``: small ones (shrink targets), then the block, chunk
    and split boundaries of real kernels, ``2^k - 1, 2^k, 2^k + 1`` for ``k = 4 .. 13``
    (long contexts up to 8193); with ``page_size > 1`` also ``k P - 1, k P, k P + 1`` for
    ``k = 1 .. 4`` (the last page full, one token short of full, one token on a new page)."""
    small = st.integers(low, max(low, min(max_len, 64)))
    edges = {x for k in range(4, 14) for x in (2**k - 1, 2**k, 2**k + 1)}
    if page_size > 1:
        edges |= {k * page_size + d for k in range(1, 5) for d in (-1, 0, 1)}
    ordered = sorted(x for x in edges if low <= x <= max_len)
    return st.one_of(small, st.sampled_from(ordered)) if ordered else small


def input_variations(dtype: str, head_size: int) -> st.SearchStrategy[dict[str, Any]]:
    """The input-variation fields of a :class:`~attnhal.testing.cases.CaseRecipe`: an explicit
    scale (or the default), large-magnitude q/k (logits of hundreds), V near the dtype's
    range, and contiguous, fused or strided q/k/v. Shrinks to the plain inputs."""
    from attnhal.testing.cases import MAX_EXACT_QK, QKV_LAYOUTS

    scales = st.sampled_from((None, 0.5 * head_size**-0.5, 2.0 * head_size**-0.5, 2.0**-4, 1.0))
    # Large V: half of fp16's range in fp16; past fp16's range (a bf16/fp16 mix-up
    # overflows) but far below fp32's otherwise, since an fp32 accumulator sums the context.
    big_v = 2.0**15 if dtype == "float16" else 2.0**20
    return st.fixed_dictionaries({
        "scale": scales,
        "qk_magnitude": st.sampled_from((1, MAX_EXACT_QK)),
        "v_magnitude": st.sampled_from((1.0, big_v)),
        "qkv_layout": st.sampled_from(QKV_LAYOUTS),
    })


def batch_cost(recipe: CaseRecipe) -> int:
    """Work of one forward of ``recipe``: query tokens x attended positions x q heads x head size."""
    per_row = recipe.tokens_per_row
    news = recipe.new_lens if per_row is None else (per_row,) * recipe.requests
    return sum(n * s for n, s in zip(news, recipe.seq_lens())) * recipe.num_q_heads * recipe.head_size


def tree_parents(num_tokens: int) -> st.SearchStrategy[tuple[int, ...]]:
    """A draft tree of ``num_tokens`` tokens: the parent of each token (root ``-1``, parents earlier)."""
    if num_tokens < 1:
        return st.just(())
    return st.tuples(st.just(-1), *(st.integers(0, j - 1) for j in range(1, num_tokens)))


def tree_masks(num_tokens: int) -> st.SearchStrategy[torch.Tensor]:
    """``[T, T]`` bool ancestor-closed masks of draft trees (see :func:`~attnhal.testing.cases.tree_mask`)."""
    from attnhal.testing.cases import tree_mask

    return tree_parents(num_tokens).map(tree_mask)


class _Budget:
    """What is left of a batch's cost bound, in KV positions per query token."""

    def __init__(self, max_cost: int, heads: int, head_size: int, page_size: int = 1) -> None:
        self.left = max(1, max_cost // (heads * head_size))
        self.page_size = page_size

    def context(self, draw: st.DrawFn, queries: int, low: int, high: int) -> int:
        """A drawn KV length in ``[low, high]`` for a request of ``queries`` query tokens,
        within what is left (at least ``low``)."""
        top = max(low, min(high, self.left // max(queries, 1)))
        length = draw(context_lengths(top, low, self.page_size))
        self.left -= queries * length
        return length


@st.composite
def case_specs(draw: st.DrawFn, caps: BackendCapabilities, phase: Phase, *, dtype: str | None = None,
               head_size: int | None = None, spec: SpecConfig | None = None, requests: int | None = None,
               max_requests: int = 3, max_seq_len: int = DEFAULT_MAX_SEQ_LEN, max_cost: int = DEFAULT_MAX_COST,
               tree: bool | None = None, multi_step: bool = False, max_kv_heads: int | None = None,
               max_group: int | None = None, inputs: bool = False, page_size: int = 1) -> CaseRecipe:
    """A valid forward of ``phase`` that ``caps`` claims to run, as a :class:`CaseRecipe`.

    Draws the dtype and head size among the claimed ones (unless given), the head layout
    (:func:`head_layouts`; :func:`head_configs` when ``max_kv_heads`` or ``max_group`` is
    given), 1..``max_requests`` requests with lengths up to ``max_seq_len``
    (:func:`context_lengths`) within ``max_cost`` (:func:`batch_cost`), including the
    edges (``prefill`` rows of 0 new tokens and prefix 0, ``decode`` seq len 1, prefill
    extends past 128), the speculative shape (:func:`spec_configs_for`), a draft tree
    (``target_verify`` with ``topk > 1``; ``tree=True`` forces one), accepted lengths
    (``draft_extend``), the draft path and step (``draft_decode``; ``multi_step=True``:
    step 0 with re-parenting between forwards), layers, a slot layout, and with
    ``inputs=True`` the :func:`input_variations`, and what fills memory the batch does not own
    (``unowned``: NaN/inf or stale values). ``page_size``: the recipe's page size, and
    context lengths drawn around its multiples too (:func:`context_lengths`).
    """
    from attnhal.testing.cases import CaseRecipe
    from attnhal.testing.cases.unowned import UNOWNED

    if max_kv_heads is not None or max_group is not None:
        heads = draw(head_configs(max_kv_heads or 2, max_group or 4))
    else:
        heads = draw(head_layouts())
    size = head_size or draw(head_sizes(caps))
    kind = dtype or draw(dtypes(caps))
    if spec is None and phase is not Phase.PREFILL and phase is not Phase.DECODE:
        spec = draw(spec_configs_for(caps, phase).filter(lambda s: not tree or s.topk > 1))
    n = requests if requests is not None else draw(st.integers(1, max_requests))
    layers = draw(st.integers(1, 2))
    budget = _Budget(max_cost, heads[0], size, page_size)
    variation = draw(input_variations(kind, size)) if inputs else {}
    return CaseRecipe(phase, dtype=kind, num_q_heads=heads[0], num_kv_heads=heads[1],
                      head_size=size, spec=spec, num_layers=layers,
                      layer=draw(st.integers(0, layers - 1)), slot_seed=draw(st.integers(0, 2**16)),
                      seed=draw(st.integers(0, 2**16)), host_seq_lens=caps.needs_host_seq_lens, page_size=page_size,
                      unowned=draw(st.sampled_from(UNOWNED)),
                      **draw(_phase_fields(phase, spec, n, max_seq_len, multi_step, budget)), **variation)


def _extends(draw: st.DrawFn, high: int) -> int:
    """New tokens of one prefill request: small ones, then past the query tiles of real kernels."""
    edges = [x for x in _EXTEND_EDGES if x <= high]
    small = st.integers(0, max(0, min(16, high)))
    return draw(st.one_of(small, st.sampled_from(edges)) if edges else small)


@st.composite
def _phase_fields(draw: st.DrawFn, phase: Phase, spec: SpecConfig | None, n: int, max_seq_len: int,
                  multi_step: bool, budget: _Budget) -> dict[str, Any]:
    """The per-phase fields of a :class:`CaseRecipe` (lengths, tree, draft path)."""
    if phase is Phase.PREFILL:
        # x new tokens attend up to prefix + x positions each: x <= sqrt(what is left)
        new = tuple(_extends(draw, min(max_seq_len, math.isqrt(budget.left))) for _ in range(n))
        prefix = tuple(budget.context(draw, x, x, max_seq_len) - x for x in new)
        return {"new_lens": new, "prefix_lens": prefix}
    if phase is Phase.DECODE:
        return {"prefix_lens": tuple(budget.context(draw, 1, 1, max_seq_len) - 1 for _ in range(n))}
    assert spec is not None
    if phase is Phase.TARGET_VERIFY:
        T = spec.num_draft_tokens
        trees = tuple(draw(tree_parents(T)) for _ in range(n)) if spec.topk > 1 else ()
        prefix = tuple(budget.context(draw, T, T, max_seq_len) - T for _ in range(n))
        return {"prefix_lens": prefix, "tree_parents": trees}
    if phase is Phase.DRAFT_EXTEND:
        T = spec.draft_extend_len
        new = tuple(draw(st.integers(1, T)) for _ in range(n))
        return {"new_lens": new, "prefix_lens": tuple(budget.context(draw, T, x, max_seq_len) - x for x in new)}
    k, steps = spec.topk, spec.num_steps
    prefix = tuple(budget.context(draw, k, 1, max_seq_len) for _ in range(n))
    if multi_step:
        reparent = tuple(tuple(tuple(draw(st.integers(0, k - 1)) for _ in range(k)) for _ in range(n))
                         for _ in range(steps - 2))
        return {"prefix_lens": prefix, "reparent": reparent}
    step = draw(st.integers(0, steps - 2))
    picks = tuple(tuple(tuple(draw(st.integers(0, k - 1)) for _ in range(step)) for _ in range(k))
                  for _ in range(n))
    return {"prefix_lens": prefix, "draft_step": step, "draft_picks": picks}


def cases(caps: BackendCapabilities, phase: Phase, *, device: str = "cpu", **kwargs: object) -> st.SearchStrategy[Case]:
    """Built cases: :func:`case_specs` (same keyword arguments) through
    :func:`~attnhal.testing.cases.build_case` on ``device``: config, pool with random K/V,
    batch, ``q``, ``k``, ``v``."""
    from attnhal.testing.cases import build_case

    return case_specs(caps, phase, **kwargs).map(lambda spec: build_case(spec, device=device))  # type: ignore[arg-type]


def multi_step_specs(caps: BackendCapabilities, **kwargs: object) -> st.SearchStrategy[CaseRecipe]:
    """Step-0 ``draft_decode`` cases for :class:`~attnhal.backend.MultiStepDraft`, with a
    spec config within ``caps.multi_step`` and re-parenting between forwards."""
    limits = caps.multi_step or SpecLimits()
    return spec_configs_for(caps, Phase.DRAFT_DECODE, limits).flatmap(
        lambda spec: case_specs(caps, Phase.DRAFT_DECODE, spec=spec, multi_step=True, **kwargs))  # type: ignore[arg-type]


@st.composite
def graph_case_specs(draw: st.DrawFn, caps: BackendCapabilities, phase: Phase, *,
                     capture_sizes: tuple[int, ...] = (1, 2, 4), replays: tuple[int, int] = (1, 3),
                     multi_step: bool = False, **kwargs: object) -> tuple[CaseRecipe, ...]:
    """The batches replayed through one captured graph of ``phase``: same dtype, heads, layers
    and spec config (within the graph claim's limits), each of 1..``max(capture_sizes)``
    requests, so most are padded up to a capture size.

    ``draft_decode`` batches are at step 0 (a graph replays from the first forward);
    ``multi_step=True`` also keeps the spec within ``caps.multi_step`` and draws re-parenting.
    """
    limits = graph_limits(caps, phase, multi_step)
    multi_step = multi_step or phase is Phase.DRAFT_DECODE
    spec = None if phase is Phase.DECODE else draw(spec_configs_for(caps, phase, limits))
    first = draw(case_specs(caps, phase, spec=spec, requests=draw(st.integers(1, max(capture_sizes))),
                            multi_step=multi_step, **kwargs))  # type: ignore[arg-type]
    more = []
    same = {**kwargs, "dtype": first.dtype, "head_size": first.head_size}  # one graph, one model shape
    for _ in range(draw(st.integers(*replays)) - 1):
        other = draw(case_specs(caps, phase, spec=spec, requests=draw(st.integers(1, max(capture_sizes))),
                                multi_step=multi_step, **same))  # type: ignore[arg-type]
        more.append(dataclasses.replace(other, num_q_heads=first.num_q_heads, num_kv_heads=first.num_kv_heads,
                                        num_layers=first.num_layers, layer=first.layer))
    return (first, *more)

