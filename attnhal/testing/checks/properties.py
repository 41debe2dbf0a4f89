"""``deterministic`` and ``inputs_unchanged``: what every backend owes, claimed or not.

Both run on the plain and on every claimed fp8 cache (fixed and drawn examples).

* ``deterministic`` — one backend running the same batch twice gives bitwise-equal
  outputs (real tokens), and so do two replays of one captured graph and the replays of
  two independent captures of it (capture invariance: a restarted server or a re-captured
  size must not pick other kernels or tiles): an engine compares and caches results, and a
  speculative step must accept the same tokens when re-run.
* ``inputs_unchanged`` — after ``init_forward_metadata`` and ``forward``: ``q``, ``k``,
  ``v`` (views of a fused tensor included), every batch tensor, the pool's table and
  every layer's K/V are as they were, except ``out_cache_loc`` (and the padding slot) of
  the forward's layer, which hold the new tokens' K/V; and the forward's output is as it
  was after a second forward of the same backend (an eager output is the caller's: output
  lifetime, see :class:`~attnhal.backend.AttentionBackend`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from hypothesis import strategies as st

import attnhal.testing.checks.fixed as fixed
import attnhal.testing.strategies as hst
from attnhal.backend import ForwardBatch
from attnhal.kv_format import kv_format
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.platform import GraphKind
from attnhal.testing.cases import Case, CaseRecipe, build_case
from attnhal.testing.checks.capture import capture
from attnhal.testing.checks.claims import Claim, ClaimFalsified, ClaimKind
from attnhal.testing.checks.common import bits, blame, check_cache, heads, plural, run_examples
from attnhal.testing.checks.expected import expected
from attnhal.testing.checks.graphs import fixed_graph_cases
from attnhal.testing.checks.limits import claim_spec_configs, multi_step_graph
from attnhal.testing.checks.phases import canonical_cases
from attnhal.testing.checks.target import Target, checkable_dtypes
from attnhal.testing.checks.variants import fp8_flavours
from attnhal.testing.oracle import real_tokens

__all__ = ["check_deterministic", "check_inputs_unchanged"]


def _phases(target: Target) -> list[Phase]:
    return [p for p in Phase if p in target.caps.phases]


def _fp8(target: Target) -> list[dict[str, Any]]:
    """The claimed fp8 KV dtypes as recipe fields (the first e4m3 flavour checked here)."""
    fields = hst.kv_fields(target.caps, fp8_flavours(target)[:1])
    return [f for f in fields if kv_format(f["kv_dtype"]).scaled]


def _drawn(target: Target) -> st.SearchStrategy[CaseRecipe]:
    """Any claimed phase and dtype, with input variations, in a plain or a claimed fp8 cache."""
    caps = target.caps
    kv = st.sampled_from([{}, *_fp8(target)])
    return st.tuples(st.sampled_from(_phases(target)), st.sampled_from(checkable_dtypes(target)), kv).flatmap(
        lambda pdk: hst.case_specs(caps, pdk[0], dtype=pdk[1], max_requests=target.max_requests,
                                   max_seq_len=target.max_seq_len, max_cost=target.max_cost, inputs=True).map(
            lambda r: replace(r, **pdk[2])))


def _fixed(target: Target, pick: Callable[[CaseRecipe], list[CaseRecipe]]) -> list[CaseRecipe]:
    """``pick`` of every claimed phase's canonical case, then the same in each claimed fp8 cache
    (the first: the quantized write and the dequantized read are paths of their own)."""
    dtype, head = checkable_dtypes(target)[0], min(target.caps.head_sizes)
    out = [c for p in _phases(target) for c in pick(canonical_cases(target.caps, p, dtype, head)[0])]
    out += [replace(c, **kv) for kv in _fp8(target)[:1] for c in out[:]]
    return [c for c in out if fixed.fits(c, target.max_seq_len, target.max_cost)]


def _where(recipe: CaseRecipe) -> str:
    return f"{recipe.phase.value}, {recipe.dtype}, {heads(recipe)}, seq lens {recipe.seq_lens()}"


# --- deterministic -----------------------------------------------------------------------------

def check_deterministic(target: Target, claim: Claim) -> tuple[str, int]:
    def body(recipe: CaseRecipe) -> None:
        case = build_case(recipe, device=target.device)
        with blame(claim, f"{_where(recipe)}: the backend"):
            backend = target.new_backend(case.config, case.pool)
            backend.init_forward_metadata(case.batch)
            first = backend.forward(case.q, case.k, case.v, case.layer, case.batch).clone()
            second = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
        _same(claim, first, second, case.batch, f"{_where(recipe)}: two eager forwards of one batch")

    # Several KV chunks and splits: where a reduction order can vary.
    examples = _fixed(target, lambda base: fixed.boundary_cases(base)[:1])
    count = run_examples(target, "deterministic", _drawn(target), examples, body)
    replays = _check_replays(target, claim)
    how = f"; two replays and a second capture of {plural(replays, 'graph phase')}" if replays else ""
    return f"two eager forwards bitwise equal, every claimed phase; {plural(count, 'example')}{how}", count


def _same(claim: Claim, a: torch.Tensor, b: torch.Tensor, batch: ForwardBatch, what: str) -> None:
    index = torch.tensor(real_tokens(batch), dtype=torch.int64, device=a.device)
    x, y = a.index_select(0, index), b.index_select(0, index)
    if not torch.equal(x, y):
        diff = (x.double() - y.double()).abs()
        raise ClaimFalsified(claim, f"{what} differ: max |first - second| = {diff.nan_to_num(float('inf')).max():.3g} "
                                    f"in {int((x != y).sum())} of {x.numel()} elements (supported: bitwise equal)")


def graph_phase_cases(target: Target, requests: int) -> Iterator[tuple[Phase, Claim, CaseRecipe]]:
    """Each claimed graph phase this platform can capture, with its graph claim and first fixed
    case of ``requests`` requests (a phase whose limits no spec config meets is left out)."""
    if target.platform.graph_kind is GraphKind.NONE:
        return
    for phase in (p for p in GRAPH_PHASES if p in target.caps.graph):
        graph_claim = Claim(ClaimKind.GRAPH, phase.value)
        cases = fixed_graph_cases(target, graph_claim, (requests,))
        if cases and not claim_spec_configs(target, graph_claim).is_empty:
            yield phase, graph_claim, cases[0][0]


def _check_replays(target: Target, claim: Claim) -> int:
    """Replay each claimed graph phase's fixed case twice; returns how many phases ran."""
    ran = 0
    for _, graph_claim, first in graph_phase_cases(target, 2):
        recipe = fixed.at_lengths(first, (129, 65))
        try:
            _replay_twice(target, claim, graph_claim, recipe)
        except ClaimFalsified as exc:
            if exc.claim != graph_claim.name:
                raise
            continue  # no working graph to replay: the graph claim reports why
        ran += 1
    return ran


def _replay_twice(target: Target, claim: Claim, graph_claim: Claim, recipe: CaseRecipe) -> None:
    graph = capture(target, graph_claim, (recipe,), (recipe.requests,))
    case = build_case(recipe, pool=graph.pool)
    multi = multi_step_graph(target, graph_claim)
    exp = expected(target, claim, case, multi)
    saved = graph.pool.k[graph.layer].clone(), graph.pool.v[graph.layer].clone()
    path = case.batch.spec.draft_path if case.batch.spec is not None else None
    saved_path = path.clone() if path is not None else None
    outs = []
    for _ in range(2):
        graph.pool.k[graph.layer].copy_(saved[0])
        graph.pool.v[graph.layer].copy_(saved[1])
        if path is not None and saved_path is not None:
            path.copy_(saved_path)
        with blame(claim, f"replay of {recipe.phase.value}"):
            got = graph.runner.run(recipe.phase, case.batch, exp.inputs)
        outs.append([o.clone() for o in (got if isinstance(got, tuple) else (got,))])
    for s, (a, b) in enumerate(zip(*outs)):
        _same(claim, a, b, exp.batches[s], f"{_where(recipe)}: two replays of one graph (forward {s})")
    # A second, independent capture (a restarted server, a re-captured size) must pick the same
    # kernels: its replay is bitwise the first capture's.
    again = capture(target, graph_claim, (recipe,), (recipe.requests,))
    case2 = build_case(recipe, pool=again.pool)
    with blame(claim, f"replay of a second capture of {recipe.phase.value}"):
        got = again.runner.run(recipe.phase, case2.batch, exp.inputs)
    for s, (a, b) in enumerate(zip(outs[0], got if isinstance(got, tuple) else (got,))):
        _same(claim, a, b, exp.batches[s], f"{_where(recipe)}: replays of two captures of one graph (forward {s})")


# --- inputs unchanged ------------------------------------------------------------------------------

def check_inputs_unchanged(target: Target, claim: Claim) -> tuple[str, int]:
    def body(recipe: CaseRecipe) -> None:
        case = build_case(recipe, device=target.device)
        tensors = {"q": case.q, "k": case.k, "v": case.v, "req_to_page": case.pool.req_to_page,
                   **_batch_tensors(case.batch)}
        tensors |= {f"K cache of layer {i}": c for i, c in enumerate(case.pool.k) if i != case.layer}
        tensors |= {f"V cache of layer {i}": c for i, c in enumerate(case.pool.v) if i != case.layer}
        before = {name: t.clone() for name, t in tensors.items()}
        layer = case.pool.k[case.layer].clone(), case.pool.v[case.layer].clone()
        what = f"{_where(recipe)}, {recipe.qkv_layout} q/k/v"
        with blame(claim, f"{what}: the backend"):
            backend = target.new_backend(case.config, case.pool)
            backend.init_forward_metadata(case.batch)
            out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
        changed = [name for name, t in tensors.items() if not torch.equal(bits(t), bits(before[name]))]
        if changed:
            raise ClaimFalsified(claim, f"{what}: forward changed {', '.join(changed)} (supported: only "
                                        "out_cache_loc of the forward's layer is written)")
        check_cache(claim, case.pool, case.layer, layer, case.batch, case.k, case.v, what)
        _output_kept(claim, backend, case, out, what)

    examples = _fixed(target, lambda base: [fixed.edge_cases(base)[0], fixed.input_cases(base, base.dtype)[0]])
    count = run_examples(target, "inputs_unchanged", _drawn(target), examples, body)
    return (f"q/k/v, batch tensors, the pool's table and other layers untouched, the output kept through a "
            f"second forward, every claimed phase; "
            f"{plural(count, 'example')}"), count


def _output_kept(claim: Claim, backend: Any, case: Case, out: Any, what: str) -> None:
    """The output of a forward keeps its values through the next forward of the same backend
    (another batch's queries: ``-q``, the same K/V): an eager output is the caller's."""
    if not isinstance(out, torch.Tensor):
        return  # check_output of the phase claims reports it
    kept = out.clone()
    with blame(claim, f"{what}: the backend's second forward"):
        backend.init_forward_metadata(case.batch)
        backend.forward(-case.q, case.k, case.v, case.layer, case.batch)
    if not torch.equal(bits(out), bits(kept)):
        raise ClaimFalsified(claim, f"{what}: the first forward's output changed during a second forward "
                                    f"({int((bits(out) != bits(kept)).sum())} of {out.numel()} elements; supported: "
                                    "an eager output is the caller's, never a buffer the backend writes again)")


def _batch_tensors(batch: ForwardBatch) -> dict[str, torch.Tensor]:
    out = {name: getattr(batch, name) for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "extend_lens",
                                                   "seq_lens_cpu")}
    if batch.spec is not None:
        out |= {"spec.custom_mask": batch.spec.custom_mask, "spec.draft_path": batch.spec.draft_path}
    return {f"batch.{name}": t for name, t in out.items() if isinstance(t, torch.Tensor)}
