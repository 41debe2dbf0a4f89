"""``phase[P, dtype]`` and ``unclaimed[P]``: each phase eagerly against the fp64 reference."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

import attnhal.testing.checks.fixed as fixed
import attnhal.testing.strategies as hst
from attnhal.backend import AttentionBackend, UnsupportedPhase
from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.phases import Feature, Phase
from attnhal.spec import DTYPES, SpecConfig
from attnhal.testing.cases import Case, CaseRecipe, build_case
from attnhal.testing.checks.claims import Claim, ClaimFalsified
from attnhal.testing.checks.common import (
    blame,
    check_cache,
    check_output,
    heads,
    input_tolerance,
    plural,
    run_examples,
    with_example,
)
from attnhal.testing.checks.target import Target, checkable_dtypes
from attnhal.testing.oracle import reference_forward

def canonical_cases(caps: BackendCapabilities, phase: Phase, dtype: str, head_size: int) -> list[CaseRecipe]:
    """The fixed examples of ``phase``: GQA, two layers, scattered slots, uneven rows, and the
    length edges (``prefill`` rows with 0 new tokens and prefix 0, ``decode`` seq len 1)."""
    tree = Feature.CUSTOM_MASK in caps.features
    fields: dict[Phase, dict[str, Any]] = {
        Phase.PREFILL: {"prefix_lens": (0, 9, 5), "new_lens": (6, 3, 0)},
        Phase.DECODE: {"prefix_lens": (0, 21)},
        Phase.TARGET_VERIFY: {"prefix_lens": (0, 13), "spec": SpecConfig.eagle(2, 2, 4),
                              "tree_parents": ((-1, 0, 0, 1), (-1, 0, 1, 2))} if tree
        else {"prefix_lens": (0, 13), "spec": SpecConfig.eagle(3)},
        Phase.DRAFT_EXTEND: {"prefix_lens": (6, 0), "new_lens": (1, 4), "spec": SpecConfig.eagle(3)},
        Phase.DRAFT_DECODE: {"prefix_lens": (5, 12), "spec": SpecConfig.eagle(3, 2, 5), "draft_step": 1,
                             "draft_picks": (((1,), (1,)), ((0,), (1,)))},
    }
    return [CaseRecipe(phase, dtype=dtype, num_q_heads=4, num_kv_heads=2, head_size=head_size, num_layers=2,
                       layer=1, slot_seed=7, seed=1, host_seq_lens=caps.needs_host_seq_lens, **fields[phase])]


def eager_body(target: Target, claim: Claim) -> Callable[[CaseRecipe], None]:
    def body(recipe: CaseRecipe) -> None:
        case = build_case(recipe, device=target.device)
        with blame(claim, f"head_size={recipe.head_size}, {heads(recipe)}: the backend"):
            backend = target.new_backend(case.config, case.pool)
        check_eager(target, claim, case, backend)

    return body


def check_eager(target: Target, claim: Claim, case: Case, backend: AttentionBackend, how: str = "") -> None:
    """One eager forward of ``case`` through ``backend`` against the reference (outputs within
    the backend's tolerance, the cache written only at ``out_cache_loc``); ``how`` adds to a
    failure's description."""
    recipe = case.recipe
    want = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale,
                             case.config)
    before = case.pool.k[case.layer].clone(), case.pool.v[case.layer].clone()
    what = f"head_size={recipe.head_size}, {heads(recipe)}{how}"
    with blame(claim, f"{what}: the backend"):
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    tol = input_tolerance(target.caps.tolerance_for(recipe.dtype, recipe.kv_dtype), case)
    check_output(claim, out, case.q, want, case.batch, tol, what + _inputs(recipe))
    check_cache(claim, case.pool, case.layer, before, case.batch, case.k, case.v, what)


def _inputs(recipe: CaseRecipe) -> str:
    """The input variations of ``recipe``, for a failure's description."""
    out = [f"scale={recipe.scale:g}"] if recipe.scale is not None else []
    out += [f"qk_magnitude={recipe.qk_magnitude}"] if recipe.qk_magnitude != 1 else []
    out += [f"v_magnitude={recipe.v_magnitude:g}"] if recipe.v_magnitude != 1 else []
    out += [f"{recipe.qkv_layout} q/k/v"] if recipe.qkv_layout != "contiguous" else []
    return "".join(f", {x}" for x in out)


def phase_examples(target: Target, phase: Phase, dtype: str) -> list[CaseRecipe]:
    """The fixed examples of ``phase`` in ``dtype``: the canonical case at every claimed head
    size (memory the batch does not own holding NaN/inf), then at the smallest the same with a
    page table padded with -1 and with stale memory (:mod:`~attnhal.testing.cases.unowned`),
    block boundaries, edge rows, head layouts, input variations, logits past fp16's range
    and (in the first checkable dtype) server sizes (:mod:`attnhal.testing.checks.fixed`),
    within the target's bounds."""
    caps = target.caps
    sizes = sorted(caps.head_sizes)
    out = [c for h in sizes for c in canonical_cases(caps, phase, dtype, h)]
    base = canonical_cases(caps, phase, dtype, sizes[0])[0]
    out += [replace(base, unowned=u, seed=base.seed + 9) for u in ("pad", "stale")]  # beside the default "nan"
    out += [*fixed.boundary_cases(base, target.thorough), *fixed.edge_cases(base), *fixed.layout_cases(base),
            *fixed.input_cases(base, dtype), *fixed.size_cases(base, max(target.capture_sizes)),
            *fixed.acceptance_cases(base, caps.run_limits.get(phase, SpecLimits()).max_draft_tokens),
            *fixed.range_cases(base)]
    if dtype == checkable_dtypes(target)[0] and full_sizes(target):  # once per phase: the rows cost, not the dtype
        out += fixed.server_cases(base, target.thorough)
    return [c for c in out if fixed.fits(c, target.max_seq_len, target.max_cost)]


def full_sizes(target: Target) -> bool:
    """Whether the target runs server sizes (128 query heads, 1,024 rows): not under a
    ``max_seq_len`` below the default, an interpreter's bound (it runs programs one by one:
    256 decode rows take minutes there)."""
    return target.max_seq_len >= hst.DEFAULT_MAX_SEQ_LEN


def check_phase(target: Target, claim: Claim) -> tuple[str, int]:
    caps, phase, dtype = target.caps, claim.phase, claim.dtype
    assert dtype is not None
    sizes = sorted(caps.head_sizes)
    examples = phase_examples(target, phase, dtype)
    strategy = hst.case_specs(caps, phase, dtype=dtype, max_requests=target.max_requests,
                              max_seq_len=target.max_seq_len, max_cost=target.max_cost, inputs=True)
    count = run_examples(target, f"{claim.kind.value}_{phase.value}_{dtype}", strategy, examples,
                         eager_body(target, claim))
    left = "" if full_sizes(target) else f"; server sizes left out (max_seq_len {target.max_seq_len})"
    return f"head sizes {', '.join(map(str, sizes))}; {plural(count, 'example')} ({len(examples)} fixed){left}", count



def check_unclaimed(target: Target, claim: Claim) -> tuple[str, int]:
    caps, phase = target.caps, claim.phase
    dtype = next(d for d in DTYPES if d in caps.dtypes)
    return expect_refusal(target, claim, canonical_cases(caps, phase, dtype, min(caps.head_sizes))[0], phase.value)


def expect_refusal(target: Target, claim: Claim, recipe: CaseRecipe, what: str, why: str = "") -> tuple[str, int]:
    """Run ``recipe`` through a new backend, which must raise ``UnsupportedPhase`` (or a subclass)
    because ``what`` is not claimed; ``why`` adds to the falsification when it computes instead."""
    case = build_case(recipe, device=target.device)
    try:
        backend = target.new_backend(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    except UnsupportedPhase as exc:
        return f"{type(exc).__name__}: {exc}", 1
    except Exception as exc:  # noqa: BLE001 - anything else is the wrong refusal
        raise with_example(ClaimFalsified(claim, f"{what} is not claimed, yet the backend raised "
                                                 f"{type(exc).__name__}: {exc} (supported: UnsupportedPhase)"),
                           recipe) from exc
    shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    raise with_example(ClaimFalsified(claim, f"{what} is not claimed, yet forward returned {shape} "
                                             f"instead of raising UnsupportedPhase{why}"), recipe)


