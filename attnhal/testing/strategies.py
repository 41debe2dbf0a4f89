"""Hypothesis strategies for attnhal, in the spirit of ``hypothesis.extra``.

Two families:

* **unbound** — need no backend: :func:`platforms` (simulated), :func:`platform_specs`,
  :func:`spec_configs`, :func:`spec_limits`, :func:`graph_policies`, :func:`descriptors`,
  :func:`head_configs`, :func:`tree_parents`, :func:`tree_masks`;
* **bound to a descriptor** — draw only what a backend's
  :class:`~attnhal.capabilities.BackendCapabilities` claims: :func:`dtypes`,
  :func:`head_sizes`, :func:`page_sizes`, :func:`spec_configs_for` (within a claim's
  :class:`~attnhal.capabilities.SpecLimits`), and the batches of each phase:
  :func:`case_specs` (a :class:`~attnhal.testing.batches.CaseSpec`, readable when
  shrunk), :func:`cases` (built: config, pool with random K/V, ForwardBatch, q, k, v),
  :func:`multi_step_specs` and :func:`graph_case_specs`.

Sizes reach what real kernels hit (:func:`context_lengths`: block boundaries
``2^k - 1, 2^k, 2^k + 1`` and contexts past 4096; prefill extends past 128 tokens;
:func:`head_layouts`: MHA, GQA groups 2..16, MQA with 8+ query heads) under a cost
model: a batch's ``max_cost`` (query tokens x attended positions x query heads x head
size, summed) bounds its size, so long contexts come with few requests. An interpreter
run passes a smaller ``max_seq_len`` and ``max_cost``. :func:`input_variations` draws
explicit scales, large magnitudes and non-contiguous q/k/v (``inputs=True``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from attnhal.capabilities import (
    DTYPES,
    GRAPH_PHASES,
    BackendCapabilities,
    Feature,
    Phase,
    SpecLimits,
)
from attnhal.plan import GraphPolicy, SpecConfig
from attnhal.platform import VENDORS, Platform, Vendor, detect, parse

if TYPE_CHECKING:  # the batch strategies need torch; the others stay light
    import torch

    from attnhal.testing.batches import Case, CaseSpec

__all__ = [
    "DEFAULT_MAX_COST",
    "DEFAULT_MAX_SEQ_LEN",
    "case_specs",
    "cases",
    "context_lengths",
    "input_variations",
    "head_layouts",
    "descriptors",
    "dtypes",
    "graph_case_specs",
    "graph_policies",
    "head_configs",
    "head_sizes",
    "multi_step_specs",
    "page_sizes",
    "platform_specs",
    "platforms",
    "spec_configs",
    "spec_configs_for",
    "spec_limits",
    "tree_masks",
    "tree_parents",
]

#: Longest context drawn by default: past the 4096 of long-context kernels' split tables.
DEFAULT_MAX_SEQ_LEN = 8193
#: Default cost bound of one drawn batch (see :func:`batch_cost`): ~0.1 s of the fp64
#: reference and the torch backend on one CPU core.
DEFAULT_MAX_COST = 2**25
#: Prefill extends past the query tiles of real kernels (64, 128, 256).
_EXTEND_EDGES = (31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257)

_CUDA_ARCHS = ("sm80", "sm86", "sm89", "sm90", "sm100")
_HIP_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100")


def platform_specs(vendors: tuple[Vendor, ...] = tuple(Vendor), graphs: bool | None = None) -> st.SearchStrategy[str]:
    """Spec strings for :func:`attnhal.platform.parse` (``"hip:gfx942"``, ``"cpu,nographs"``, ...)."""
    # Other vendors draw from their row's known archs (attnhal.platform.VENDORS).
    archs = {**{v: tuple(row.known) for v, row in VENDORS.items()},
             Vendor.CUDA: _CUDA_ARCHS, Vendor.HIP: _HIP_ARCHS, Vendor.CPU: ("",)}

    def spec(vendor: Vendor, arch: str, nographs: bool) -> str:
        base = f"{vendor.value}:{arch}" if arch else vendor.value
        return base + (",nographs" if nographs else "")

    nographs = st.just(not graphs) if graphs is not None else st.booleans()
    return st.sampled_from(vendors).flatmap(
        lambda v: st.builds(spec, st.just(v), st.sampled_from(archs[v]), nographs))


def platforms(vendors: tuple[Vendor, ...] = tuple(Vendor), graphs: bool | None = None,
              real: bool = False) -> st.SearchStrategy[Platform]:
    """Simulated platforms (see :func:`platform_specs`); with ``real=True`` the platform this
    process runs on (:func:`attnhal.platform.detect`) is drawn too."""
    simulated = platform_specs(vendors, graphs).map(parse)
    return st.one_of(st.builds(detect), simulated) if real else simulated


def spec_configs(max_steps: int = 5, max_topk: int = 4, speculative: bool | None = None) -> st.SearchStrategy[SpecConfig]:
    """Valid spec configs; with ``speculative=None`` both plain decoding and EAGLE."""
    @st.composite
    def eagle(draw: st.DrawFn) -> SpecConfig:
        steps = draw(st.integers(1, max_steps))
        topk = draw(st.integers(1, max_topk))
        if topk == 1:
            return SpecConfig.eagle(steps, 1)
        return SpecConfig.eagle(steps, topk, draw(st.integers(2, topk * steps + 1)))

    if speculative is None:
        return st.one_of(st.just(SpecConfig()), eagle())
    return eagle() if speculative else st.just(SpecConfig())


def spec_limits(max_value: int = 6) -> st.SearchStrategy[SpecLimits]:
    opt = st.none() | st.integers(1, max_value)
    return st.builds(SpecLimits, max_topk=opt, max_num_steps=opt, max_draft_tokens=opt)


def graph_policies() -> st.SearchStrategy[GraphPolicy]:
    return st.builds(GraphPolicy, enabled=st.booleans(), max_batch_size=st.integers(1, 64))


@st.composite
def descriptors(draw: st.DrawFn, vendors: tuple[Vendor, ...] = tuple(Vendor),
                min_arch: bool = True) -> BackendCapabilities:
    """Arbitrary well-formed descriptors (what a third party might declare).

    ``min_arch=False`` leaves out minimum archs, e.g. for vendor-symmetry checks.
    """
    archs = {Vendor.CUDA: st.sampled_from(_CUDA_ARCHS), Vendor.HIP: st.sampled_from(_HIP_ARCHS)}
    phases = draw(st.frozensets(st.sampled_from(list(Phase))))
    capturable = [p for p in GRAPH_PHASES if p in phases]
    graph_phases = draw(st.frozensets(st.sampled_from(capturable))) if capturable else frozenset()
    return BackendCapabilities(
        name=draw(st.sampled_from(["alpha", "beta", "gamma"])),
        vendors=draw(st.frozensets(st.sampled_from(vendors), min_size=1)),
        phases=phases,
        graph={p: draw(spec_limits()) for p in sorted(graph_phases)},
        multi_step=draw(st.none() | spec_limits()),
        dtypes=draw(st.frozensets(st.sampled_from(DTYPES), min_size=1)),
        head_sizes=draw(st.frozensets(st.sampled_from([32, 64, 96, 128, 256]), min_size=1)),
        features=draw(st.frozensets(st.sampled_from(list(Feature)))),
        min_arch=draw(st.fixed_dictionaries({}, optional=archs)) if min_arch else {},
    )


# --- bound to a descriptor: what a backend claims ------------------------------------------

def _claimed(values: Sequence[object], what: str, caps: BackendCapabilities) -> list[object]:
    if not values:
        raise ValueError(f"backend {caps.name!r} claims no {what}")
    return list(values)


def dtypes(caps: BackendCapabilities) -> st.SearchStrategy[str]:
    """The compute dtypes ``caps`` claims, by name, in :data:`~attnhal.capabilities.DTYPES` order."""
    return st.sampled_from(_claimed([d for d in DTYPES if d in caps.dtypes], "dtypes", caps))


def head_sizes(caps: BackendCapabilities, max_size: int | None = None) -> st.SearchStrategy[int]:
    """The head sizes ``caps`` claims (at most ``max_size``), smallest first."""
    return st.sampled_from(_claimed(sorted(h for h in caps.head_sizes if max_size is None or h <= max_size),
                                    "head sizes", caps))


def page_sizes(caps: BackendCapabilities) -> st.SearchStrategy[int]:
    """The page sizes ``caps`` claims (``CaseSpec.page_size`` builds requests owning whole pages)."""
    return st.sampled_from(_claimed(sorted(caps.page_sizes), "page sizes", caps))


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


def context_lengths(max_len: int = DEFAULT_MAX_SEQ_LEN, low: int = 0) -> st.SearchStrategy[int]:
    """KV lengths in ``[low, max_len]``: small ones (shrink targets), then the block, chunk
    and split boundaries of real kernels, ``2^k - 1, 2^k, 2^k + 1`` for ``k = 4 .. 13``
    (long contexts up to 8193)."""
    small = st.integers(low, max(low, min(max_len, 64)))
    edges = sorted({x for k in range(4, 14) for x in (2**k - 1, 2**k, 2**k + 1) if low <= x <= max_len})
    return st.one_of(small, st.sampled_from(edges)) if edges else small


def input_variations(dtype: str, head_size: int) -> st.SearchStrategy[dict[str, Any]]:
    """The input-variation fields of a :class:`~attnhal.testing.batches.CaseSpec`: an explicit
    scale (or the default), large-magnitude q/k (logits of hundreds), V near the dtype's
    range, and contiguous, fused or strided q/k/v. Shrinks to the plain inputs."""
    from attnhal.testing.batches import MAX_EXACT_QK, QKV_LAYOUTS

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


def batch_cost(spec: CaseSpec) -> int:
    """Work of one forward of ``spec``: query tokens x attended positions x q heads x head size."""
    per_row = spec.tokens_per_row
    news = spec.new_lens if per_row is None else (per_row,) * spec.requests
    return sum(n * s for n, s in zip(news, spec.seq_lens())) * spec.num_q_heads * spec.head_size


def tree_parents(num_tokens: int) -> st.SearchStrategy[tuple[int, ...]]:
    """A draft tree of ``num_tokens`` tokens: the parent of each token (root ``-1``, parents earlier)."""
    if num_tokens < 1:
        return st.just(())
    return st.tuples(st.just(-1), *(st.integers(0, j - 1) for j in range(1, num_tokens)))


def tree_masks(num_tokens: int) -> st.SearchStrategy[torch.Tensor]:
    """``[T, T]`` bool ancestor-closed masks of draft trees (see :func:`~attnhal.testing.batches.tree_mask`)."""
    from attnhal.testing.batches import tree_mask

    return tree_parents(num_tokens).map(tree_mask)


def spec_configs_for(caps: BackendCapabilities, phase: Phase, limits: SpecLimits | None = None,
                     max_steps: int = 4, max_topk: int = 3) -> st.SearchStrategy[SpecConfig]:
    """EAGLE configs under which ``caps`` runs ``phase`` within ``limits`` (e.g. a graph claim's).

    ``target_verify`` draws trees (``topk > 1``) only if ``caps`` claims ``custom_mask``;
    ``draft_decode`` has ``num_steps >= 2`` (one step runs no draft decode).
    """
    limits = limits or SpecLimits()
    low = 2 if phase is Phase.DRAFT_DECODE else 1
    steps_top = min(max_steps, limits.max_num_steps or max_steps)
    topk_top = min(max_topk, limits.max_topk or max_topk)
    if phase is Phase.TARGET_VERIFY and Feature.CUSTOM_MASK not in caps.features:
        topk_top = 1
    if steps_top < low or topk_top < 1 or (limits.max_draft_tokens or 2) < 2:
        return st.nothing()

    @st.composite
    def draw(draw_: st.DrawFn) -> SpecConfig:
        steps, topk = draw_(st.integers(low, steps_top)), draw_(st.integers(1, topk_top))
        top_tokens = min(topk * steps + 1, limits.max_draft_tokens or topk * steps + 1)
        if topk == 1 and steps + 1 <= top_tokens:
            return SpecConfig.eagle(steps)
        if top_tokens < 2:
            return draw_(st.nothing())
        return SpecConfig.eagle(steps, topk, draw_(st.integers(2, top_tokens)))

    return draw()


class _Budget:
    """What is left of a batch's cost bound, in KV positions per query token."""

    def __init__(self, max_cost: int, heads: int, head_size: int) -> None:
        self.left = max(1, max_cost // (heads * head_size))

    def context(self, draw: st.DrawFn, queries: int, low: int, high: int) -> int:
        """A drawn KV length in ``[low, high]`` for a request of ``queries`` query tokens,
        within what is left (at least ``low``)."""
        top = max(low, min(high, self.left // max(queries, 1)))
        length = draw(context_lengths(top, low))
        self.left -= queries * length
        return length


@st.composite
def case_specs(draw: st.DrawFn, caps: BackendCapabilities, phase: Phase, *, dtype: str | None = None,
               head_size: int | None = None, spec: SpecConfig | None = None, requests: int | None = None,
               max_requests: int = 3, max_seq_len: int = DEFAULT_MAX_SEQ_LEN, max_cost: int = DEFAULT_MAX_COST,
               tree: bool | None = None, multi_step: bool = False, max_kv_heads: int | None = None,
               max_group: int | None = None, inputs: bool = False) -> CaseSpec:
    """A valid forward of ``phase`` that ``caps`` claims to run, as a :class:`CaseSpec`.

    Draws the dtype and head size among the claimed ones (unless given), the head layout
    (:func:`head_layouts`; :func:`head_configs` when ``max_kv_heads`` or ``max_group`` is
    given), 1..``max_requests`` requests with lengths up to ``max_seq_len``
    (:func:`context_lengths`) within ``max_cost`` (:func:`batch_cost`), including the
    edges (``prefill`` rows of 0 new tokens and prefix 0, ``decode`` seq len 1, prefill
    extends past 128), the speculative shape (:func:`spec_configs_for`), a draft tree
    (``target_verify`` with ``topk > 1``; ``tree=True`` forces one), accepted lengths
    (``draft_extend``), the draft path and step (``draft_decode``; ``multi_step=True``:
    step 0 with re-parenting between forwards), layers, a slot layout, and with
    ``inputs=True`` the :func:`input_variations`.
    """
    from attnhal.testing.batches import CaseSpec

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
    budget = _Budget(max_cost, heads[0], size)
    variation = draw(input_variations(kind, size)) if inputs else {}
    return CaseSpec(phase, dtype=kind, num_q_heads=heads[0], num_kv_heads=heads[1],
                    head_size=size, spec=spec, num_layers=layers,
                    layer=draw(st.integers(0, layers - 1)), slot_seed=draw(st.integers(0, 2**16)),
                    seed=draw(st.integers(0, 2**16)), host_seq_lens=caps.needs_host_seq_lens,
                    **draw(_phase_fields(phase, spec, n, max_seq_len, multi_step, budget)), **variation)


def _extends(draw: st.DrawFn, high: int) -> int:
    """New tokens of one prefill request: small ones, then past the query tiles of real kernels."""
    edges = [x for x in _EXTEND_EDGES if x <= high]
    small = st.integers(0, max(0, min(16, high)))
    return draw(st.one_of(small, st.sampled_from(edges)) if edges else small)


@st.composite
def _phase_fields(draw: st.DrawFn, phase: Phase, spec: SpecConfig | None, n: int, max_seq_len: int,
                  multi_step: bool, budget: _Budget) -> dict[str, Any]:
    """The per-phase fields of a :class:`CaseSpec` (lengths, tree, draft path)."""
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
    :func:`~attnhal.testing.batches.build_case` on ``device``: config, pool with random K/V,
    batch, ``q``, ``k``, ``v``."""
    from attnhal.testing.batches import build_case

    return case_specs(caps, phase, **kwargs).map(lambda spec: build_case(spec, device=device))  # type: ignore[arg-type]


def multi_step_specs(caps: BackendCapabilities, **kwargs: object) -> st.SearchStrategy[CaseSpec]:
    """Step-0 ``draft_decode`` cases for :class:`~attnhal.backend.MultiStepDraft`, with a
    spec config within ``caps.multi_step`` and re-parenting between forwards."""
    limits = caps.multi_step or SpecLimits()
    return spec_configs_for(caps, Phase.DRAFT_DECODE, limits).flatmap(
        lambda spec: case_specs(caps, Phase.DRAFT_DECODE, spec=spec, multi_step=True, **kwargs))  # type: ignore[arg-type]


@st.composite
def graph_case_specs(draw: st.DrawFn, caps: BackendCapabilities, phase: Phase, *,
                     capture_sizes: tuple[int, ...] = (1, 2, 4), replays: tuple[int, int] = (1, 3),
                     multi_step: bool = False, **kwargs: object) -> tuple[CaseSpec, ...]:
    """The batches replayed through one captured graph of ``phase``: same dtype, heads, layers
    and spec config (within the graph claim's limits), each of 1..``max(capture_sizes)``
    requests, so most are padded up to a capture size.

    ``draft_decode`` batches are at step 0 (a graph replays from the first forward);
    ``multi_step=True`` also keeps the spec within ``caps.multi_step`` and draws re-parenting.
    """
    limits = caps.graph_limits(phase) or SpecLimits()
    if multi_step and caps.multi_step is not None:
        limits = _tighter(limits, caps.multi_step)
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


def _tighter(a: SpecLimits, b: SpecLimits) -> SpecLimits:
    """Limits that hold where both ``a`` and ``b`` hold."""
    def low(x: int | None, y: int | None) -> int | None:
        return y if x is None else x if y is None else min(x, y)

    return SpecLimits(max_topk=low(a.max_topk, b.max_topk), max_num_steps=low(a.max_num_steps, b.max_num_steps),
                      max_draft_tokens=low(a.max_draft_tokens, b.max_draft_tokens))
