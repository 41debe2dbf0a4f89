"""``graph[P]`` and ``seq_len_fill[P]``: capture, replay padded batches, compare with eager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from hypothesis import strategies as st

import attnhal.testing.strategies as hst
from attnhal.backend import KVPool
from attnhal.phases import Phase
from attnhal.reasons import ReasonCode
from attnhal.testing.cases import CaseRecipe, build_case
from attnhal.testing.checks.capture import CapturedGraph, capture
from attnhal.testing.checks.claims import Claim, ClaimFalsified, ClaimKind
from attnhal.testing.checks.common import blame, check_cache, mismatch, plural, run_examples
from attnhal.testing.checks.expected import expected, resize
from attnhal.testing.checks.fixed import at_lengths, fits
from attnhal.testing.checks.limits import claim_limits, multi_step_graph
from attnhal.testing.checks.phases import canonical_cases
from attnhal.testing.checks.target import Target, checkable_dtypes
from attnhal.testing.oracle import real_tokens


def _replay(target: Target, claim: Claim, graph: CapturedGraph, recipe: CaseRecipe, multi: bool,
            fill_claim: Claim | None = None) -> None:
    """Replay one case through ``graph`` and compare it with eager and the reference."""
    case = build_case(recipe, pool=graph.pool)
    exp = expected(target, claim, case, multi)
    phase, runner, layer = recipe.phase, graph.runner, graph.layer
    stats = runner.summary()[phase]
    sizes = [s for s in runner.captured_sizes(phase) if s >= recipe.requests]
    where = plural(recipe.requests, "request") + (
        f" padded to {sizes[0]}" if sizes and sizes[0] > recipe.requests else "")
    before = graph.pool.k[layer].clone(), graph.pool.v[layer].clone()
    with blame(claim, f"replay ({where})"):
        got = runner.run(phase, case.batch, exp.inputs)
    after = runner.summary()[phase]
    if after.replays != stats.replays + 1:
        raise ClaimFalsified(claim, f"{where}: ran eagerly instead of replaying a captured graph")
    if after.replay_allocations != stats.replay_allocations:
        raise ClaimFalsified(claim, f"replay allocated {after.replay_allocations - stats.replay_allocations} "
                                    "tensors (a replay may only write into buffers the graph owns)")
    outs = list(got) if isinstance(got, tuple) else [got]
    tol = target.caps.tolerance_for(recipe.dtype, recipe.kv_dtype)
    for s, (out, eager, ref, batch) in enumerate(zip(outs, exp.eager, exp.reference, exp.batches)):
        step = f"forward {s} of {len(outs)}, " if multi else ""
        for name, want in (("eager", eager), ("reference", ref)):
            problem = mismatch(out, want, real_tokens(batch), tol, ("replay", name))
            if problem is not None:
                raise ClaimFalsified(fill_claim or claim, f"{step}replay != {name} ({where}, seq_len_fill="
                                                          f"{graph.fill}): {problem}")
    if not multi:
        check_cache(claim, graph.pool, layer, before, case.batch, case.k, case.v, f"replay ({where})")
    if fill_claim is not None and sizes:
        _check_padded_rows(fill_claim, graph, recipe, sizes[0], where)


def _check_padded_rows(claim: Claim, graph: CapturedGraph, recipe: CaseRecipe, size: int, where: str) -> None:
    """Every output of the captured batch, padded rows included, is finite."""
    rows = size * (recipe.topk if recipe.phase is Phase.DRAFT_DECODE else 1)
    for s, static in enumerate(graph.outputs.get(str(rows), [])):
        if not torch.isfinite(static).all():
            bad = int((~torch.isfinite(static)).flatten(1).any(1).nonzero()[0])
            raise ClaimFalsified(claim, f"padded rows with seq_len_fill={graph.fill} give non-finite output "
                                        f"({where}; forward {s}, token {bad} of the captured batch)")


def _graph_cases(target: Target, claim: Claim, sizes: tuple[int, ...],
                 replays: tuple[int, int]) -> st.SearchStrategy[tuple[CaseRecipe, ...]]:
    caps, phase = target.caps, claim.phase
    multi = multi_step_graph(target, claim)
    dtypes = checkable_dtypes(target)
    return st.sampled_from(dtypes).flatmap(lambda d: hst.graph_case_specs(
        caps, phase, capture_sizes=sizes, replays=replays, multi_step=multi, dtype=d,
        max_seq_len=target.max_seq_len))


def fixed_graph_cases(target: Target, claim: Claim, requests: Sequence[int]) -> list[tuple[CaseRecipe, ...]]:
    """One fixed example: the canonical case of the phase at ``requests`` requests per replay."""
    caps, phase = target.caps, claim.phase
    dtype, head = checkable_dtypes(target)[0], min(caps.head_sizes)
    base = canonical_cases(caps, phase, dtype, head)[0]
    if phase is not Phase.DECODE and not in_limits(target, claim, base):
        return []  # the canonical spec config is outside this claim's limits: drawn examples only
    return [tuple(resize(base, n, seed=base.seed + i) for i, n in enumerate(requests))]

def check_graph(target: Target, claim: Claim) -> tuple[str, int]:
    sizes = target.capture_sizes
    multi = multi_step_graph(target, claim)

    def body(recipes: tuple[CaseRecipe, ...]) -> None:
        graph = capture(target, claim, recipes, sizes)
        for recipe in recipes:
            _replay(target, claim, graph, recipe, multi)

    fixed = fixed_graph_cases(target, claim, (3, 1))  # 3 requests replay the size-4 graph, padded
    # the same past KV block boundaries: replay metadata must cover long rows too
    longer = [(at_lengths(case[0], (257, 65, 129)), at_lengths(case[1], (300,))) for case in fixed]
    fixed += [case for case in longer if all(fits(s, target.max_seq_len, target.max_cost) for s in case)]
    count = run_examples(target, f"graph_{claim.subject}", _graph_cases(target, claim, sizes, (1, 2)), fixed, body)
    how = "all forwards of a MultiStepDraft in one graph, " if multi else ""
    return (f"{how}{target.platform.graph_kind.value} graphs at sizes {', '.join(map(str, sizes))}; "
            f"{plural(count, 'example')}"), count


def replay_fixed(target: Target, claim: Claim, recipes: Sequence[CaseRecipe],
                 after_capture: Callable[[KVPool], None] | None = None) -> None:
    """Capture ``claim``'s phase over ``recipes`` and replay each against eager and the
    reference (the fixed cases of a feature, page size or KV dtype); ``after_capture``
    changes the graph's pool in between (e.g. its fp8 scales), as an engine may."""
    multi = multi_step_graph(target, claim)
    graph = capture(target, claim, recipes, target.capture_sizes)
    if after_capture is not None:
        after_capture(graph.pool)
    for recipe in recipes:
        _replay(target, claim, graph, recipe, multi)


def in_limits(target: Target, claim: Claim, recipe: CaseRecipe) -> bool:
    """Whether ``recipe``'s spec config is within the graph limits of ``claim``."""
    spec = recipe.spec
    return spec is None or not claim_limits(target, claim).violations(spec, ReasonCode.GRAPH_LIMIT, "")


def check_fill(target: Target, claim: Claim) -> tuple[str, int]:
    size = max(*target.capture_sizes, 2)  # at least one padded row
    multi = multi_step_graph(target, claim)
    graph_claim = replace(claim, kind=ClaimKind.GRAPH)

    def body(recipes: tuple[CaseRecipe, ...]) -> None:
        small = tuple(resize(r, min(r.requests, size - 1), r.seed) if r.requests >= size else r for r in recipes)
        graph = capture(target, graph_claim, small, (size,))
        for recipe in small:
            _replay(target, graph_claim, graph, recipe, multi, fill_claim=claim)

    fixed = fixed_graph_cases(target, claim, (1,))
    count = run_examples(target, f"seq_len_fill_{claim.subject}", _graph_cases(target, claim, (size,), (1, 2)), fixed, body)
    return f"rows padded up to {size} requests: finite, real rows as eager; {plural(count, 'example')}", count


