"""``batch_invariant`` and ``empty_batch``: what every backend owes whatever batch a row is in.

* ``batch_invariant`` — a request's output does not depend on the rows around it: on every
  claimed phase, one backend (as an engine keeps one) runs a batch of mixed lengths, the
  same rows reversed and rotated, each row alone, the batch again after its requests moved
  to other request rows of the page table (a finished request's row taken by another),
  a batch of 64 rows of mixed lengths, and a history: one backend over one pool runs a
  fixed sequence of batches whose sizes grow and shrink and whose lengths rise past KV
  split lengths and fall back (:data:`HISTORY`). Every output is checked against the fp64
  reference within the declared tolerance, and a row's output in a reordered or moved batch
  of the same size is **bitwise** its output in the first batch (every backend owes
  ``deterministic``; only the batch size may change a kernel's split, never the order).
* ``empty_batch`` — a batch of 0 requests (an idle data-parallel rank's forward): every
  claimed phase returns an empty ``[0, H, Dv]`` output and writes nothing; every claimed
  graph phase replays its smallest captured size, all rows padding, and returns 0 rows.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from attnhal.backend import AttentionBackend
from attnhal.phases import Phase
from attnhal.testing.cases import Case, CaseRecipe, PoolSize, build_case, make_pool, pool_size
from attnhal.testing.cases.unowned import UNOWNED
from attnhal.testing.cases.rows import move_requests, row_tokens, select_rows
from attnhal.testing.checks.capture import capture, step_inputs
from attnhal.testing.checks.claims import Claim, ClaimFalsified
from attnhal.testing.checks.common import bits, blame, check_output, forward_checked, heads, with_example
from attnhal.testing.checks.coverage import note
from attnhal.testing.checks.fixed import at_lengths, fits
from attnhal.testing.checks.limits import multi_step_graph
from attnhal.testing.checks.phases import canonical_cases
from attnhal.testing.checks.properties import graph_phase_cases
from attnhal.testing.checks.target import Target, checkable_dtypes

__all__ = ["BIG_BATCH", "HISTORY", "check_batch_invariant", "check_empty_batch"]

#: Rows of the large batch: past the batch sizes where kernels switch paths (split counts,
#: persistent grids) and past every capture size the kit uses.
BIG_BATCH = 64
#: KV lengths of the mixed batch: short, across a 64-block boundary, long.
_MIXED = (37, 1, 70, 9, 130)
#: One backend's history: per batch, its requests' KV lengths. Sizes grow and shrink (1 to 8
#: rows); lengths rise past KV split lengths (256, 1024: the first split of a CPU or GPU
#: kernel) and 2048, then fall back to a few tokens.
HISTORY = ((5,), (40, 3), (300, 7, 1, 90), (1100,), (2049, 30), (3,) * 8, (2,))


def _base(target: Target, phase: Phase) -> CaseRecipe:
    caps = target.caps
    return canonical_cases(caps, phase, checkable_dtypes(target)[0], min(caps.head_sizes))[0]


def _phases(target: Target) -> list[Phase]:
    return [p for p in Phase if p in target.caps.phases]


# --- batch invariance ------------------------------------------------------------------------

def check_batch_invariant(target: Target, claim: Claim) -> tuple[str, int]:
    count = history = 0
    for phase in _phases(target):
        base = _base(target, phase)
        top = target.max_seq_len  # an interpreter's bound shortens the rows, never drops them
        mixed = at_lengths(base, tuple(min(n, top) for n in _MIXED))
        count += _check_sequence(target, claim, mixed)
        big = at_lengths(base, tuple(min(1 + (37 * i) % 90, top) for i in range(BIG_BATCH)))
        if fits(big, target.max_seq_len, target.max_cost):
            count += _check_sequence(target, claim, big, alone=False)
        history = _check_history(target, claim, base)
        count += history
    return (f"every claimed phase: {len(_MIXED)} rows of mixed lengths reversed, rotated, alone and moved to other "
            f"request rows (bitwise equal where the size is kept), {BIG_BATCH} rows, and a history of {history} "
            f"batches through one backend (lengths rising past KV splits and falling back); {count} batches"), count


def _check_history(target: Target, claim: Claim, base: CaseRecipe) -> int:
    """One backend and one pool run :data:`HISTORY` in turn, each batch against the reference:
    state sized or cached by an earlier batch (split-K partials, reduce bounds, a workspace
    grown for the longest row so far) shows when lengths rise past it or fall back."""
    top = target.max_seq_len
    recipes = [replace(at_lengths(base, tuple(min(n, top) for n in lens)), seed=base.seed + i,
                       unowned=UNOWNED[i % len(UNOWNED)])
               for i, lens in enumerate(HISTORY)]
    recipes = [r for r in recipes if fits(r, target.max_seq_len, target.max_cost)]
    pool = make_pool(recipes[0], functools.reduce(PoolSize.union, (pool_size(r) for r in recipes)), target.device)
    backend = None
    for i, recipe in enumerate(recipes):
        case = build_case(recipe, pool=pool)
        if backend is None:
            with blame(claim, f"{_where(recipe)}: the backend"):
                backend = target.new_backend(case.config, case.pool)
        _run(target, claim, backend, case, f"{_where(recipe)}, batch {i + 1} of a history of {len(recipes)}")
        note(recipe, history=len(recipes))
    return len(recipes)


def _check_sequence(target: Target, claim: Claim, recipe: CaseRecipe, alone: bool = True) -> int:
    """One backend runs ``recipe``'s batch and its variants, in turn; returns how many."""
    case = build_case(recipe, device=target.device)
    n = case.batch.batch_size
    with blame(claim, f"{_where(recipe)}: the backend"):
        backend = target.new_backend(case.config, case.pool)
    first = _run(target, claim, backend, case, f"{_where(recipe)}, {n} rows")
    variants = [("reversed", list(range(n - 1, -1, -1))), ("rotated by 1", [*range(1, n), 0])]
    for name, rows in variants:
        got = _run(target, claim, backend, select_rows(case, rows), f"{_where(recipe)}, rows {name}")
        _same_rows(claim, recipe, first, case, got, rows, f"rows {name}")
    moved = move_requests(case)
    got = _run(target, claim, backend, moved, f"{_where(recipe)}, requests moved to other request rows")
    _same_rows(claim, recipe, first, case, got, list(range(n)), "requests moved to other request rows")
    note(recipe)
    runs = 4
    if alone:
        for r in range(n):
            _run(target, claim, backend, select_rows(moved, [r]), f"{_where(recipe)}, row {r} alone")
        note(recipe, batch_sizes=1)
        runs += n
    return runs


def _run(target: Target, claim: Claim, backend: AttentionBackend, case: Case, what: str) -> torch.Tensor:
    with blame(claim, f"{what}: the backend"):
        backend.init_forward_metadata(case.batch)
    return forward_checked(target, claim, backend, case, what)


def _same_rows(claim: Claim, recipe: CaseRecipe, first: torch.Tensor, case: Case, got: torch.Tensor,
               rows: list[int], how: str) -> None:
    """Row ``j`` of ``got`` (row ``rows[j]`` of ``case``) is bitwise its output in ``first``."""
    per_row = row_tokens(case.batch)
    lens = case.batch.extend_lens
    ext = lens.tolist() if recipe.phase is Phase.DRAFT_EXTEND and lens is not None else None
    start = 0
    for j, r in enumerate(rows):
        real = per_row[r][:ext[r]] if ext is not None else per_row[r]
        mine = list(range(start, start + len(real)))
        start += len(per_row[r])
        a, b = first[real], got[mine]
        if not torch.equal(bits(a), bits(b)):
            diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max()
            raise with_example(ClaimFalsified(claim, f"{_where(recipe)}: request {r}'s output changed when {how} "
                                                     f"(at position {j} of {len(rows)}): max |a - b| = {diff:.3g} "
                                                     "(supported: bitwise equal; the same rows in another order "
                                                     "or other request rows are the same work)"), recipe)


def _where(recipe: CaseRecipe) -> str:
    return f"{recipe.phase.value}, {recipe.dtype}, {heads(recipe)}, seq lens {recipe.seq_lens()}"


# --- empty batches -----------------------------------------------------------------------------

def check_empty_batch(target: Target, claim: Claim) -> tuple[str, int]:
    count = 0
    for phase in _phases(target):
        case = select_rows(build_case(_base(target, phase), device=target.device), [])
        saved = case.pool.k[case.layer].clone(), case.pool.v[case.layer].clone()
        what = f"{phase.value}, a batch of 0 requests"
        with blame(claim, f"{what}: the backend"):
            backend = target.new_backend(case.config, case.pool)
            backend.init_forward_metadata(case.batch)
            out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
        check_output(claim, out, case.q, case.q.new_zeros((0, 1, case.config.out_head_size)), case.batch,
                     target.caps.tolerance(case.recipe.dtype), what)
        _unwritten(claim, case, saved, what)
        note(case.recipe, batch_sizes=0, context_lengths=[], extend_lengths=[],
             acceptance_lengths=[])
        count += 1
    replays = _check_empty_replays(target, claim)
    how = f"; {replays} graph phases replay their smallest size" if replays else ""
    return f"every claimed phase returns an empty output and writes nothing{how}", count + replays


def _unwritten(claim: Claim, case: Case, saved: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    for name, cache, before in (("K", case.pool.k[case.layer], saved[0]), ("V", case.pool.v[case.layer], saved[1])):
        wrong = (bits(cache) != bits(before)).flatten(1).any(1)
        wrong[0] = False  # the padding slot: padded rows of a replay write there
        if wrong.any():
            slots = wrong.nonzero().flatten()[:8].tolist()
            raise ClaimFalsified(claim, f"{what} wrote the {name} cache at slots {slots} (supported: nothing written)")


def _check_empty_replays(target: Target, claim: Claim) -> int:
    ran = 0
    for phase, graph_claim, first in graph_phase_cases(target, 1):
        try:
            graph = capture(target, graph_claim, (first,), (1,))
        except ClaimFalsified:
            continue  # no working graph: the graph claim reports why
        case = select_rows(build_case(first, pool=graph.pool), [])
        steps = max((len(o) for o in graph.outputs.values()), default=1)
        inputs = {name: torch.zeros((0, *shape), dtype=dtype, device=target.device)
                  for name, (_, shape, dtype) in step_inputs(case.config, steps, multi_step_graph(target, graph_claim)
                                                             ).items()}
        saved = graph.pool.k[graph.layer].clone(), graph.pool.v[graph.layer].clone()
        what = f"{phase.value}, a batch of 0 requests through its captured graph"
        with blame(claim, f"{what}: the replay"):
            got = graph.runner.run(phase, case.batch, inputs)
        outs = got if isinstance(got, tuple) else (got,)
        if any(o.shape[0] for o in outs) or graph.runner.summary()[phase].replays < 1:
            raise ClaimFalsified(claim, f"{what}: returned {[list(o.shape) for o in outs]} after "
                                        f"{graph.runner.summary()[phase].replays} replays (supported: 0 rows, "
                                        "by replaying the smallest captured size)")
        _unwritten(claim, case, saved, what)
        ran += 1
    return ran
