"""``phase[P, dtype]`` and ``unclaimed[P]``: each phase eagerly against the fp64 reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnhal.backend import UnsupportedPhase
from attnhal.capabilities import DTYPES, BackendCapabilities, Feature, Phase
from attnhal.plan import SpecConfig
from attnhal.testing import strategies as ast
from attnhal.testing.batches import CaseSpec, build_case
from attnhal.testing.checks.claims import Claim, ClaimFalsified
from attnhal.testing.checks.common import blame, check_cache, check_output, heads, plural, run_examples, with_example
from attnhal.testing.checks.target import Target
from attnhal.testing.reference import reference_forward

def canonical_cases(caps: BackendCapabilities, phase: Phase, dtype: str, head_size: int) -> list[CaseSpec]:
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
    return [CaseSpec(phase, dtype=dtype, num_q_heads=4, num_kv_heads=2, head_size=head_size, num_layers=2,
                     layer=1, slot_seed=7, seed=1, host_seq_lens=caps.needs_host_seq_lens, **fields[phase])]


def eager_body(target: Target, claim: Claim) -> Callable[[CaseSpec], None]:
    def body(spec: CaseSpec) -> None:
        case = build_case(spec, device=target.device)
        want = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale,
                                 case.config)
        before = case.pool.k[case.layer].clone(), case.pool.v[case.layer].clone()
        what = f"head_size={spec.head_size}, {heads(spec)}"
        with blame(claim, f"{what}: the backend"):
            backend = target.new_backend(case.config, case.pool)
            backend.init_forward_metadata(case.batch)
            out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
        check_output(claim, out, case.q, want, case.batch, target.caps.tolerance_for(spec.dtype, spec.kv_dtype), what)
        check_cache(claim, case.pool, case.layer, before, case.batch, case.k, case.v, what)

    return body


def check_phase(target: Target, claim: Claim) -> tuple[str, int]:
    caps, phase, dtype = target.caps, claim.phase, claim.dtype
    assert dtype is not None
    sizes = sorted(caps.head_sizes)
    fixed = [c for h in sizes for c in canonical_cases(caps, phase, dtype, h)]
    strategy = ast.case_specs(caps, phase, dtype=dtype, max_requests=target.max_requests,
                              max_seq_len=target.max_seq_len)
    count = run_examples(target, f"{claim.kind.value}_{phase.value}_{dtype}", strategy, fixed, eager_body(target, claim))
    return f"head sizes {', '.join(map(str, sizes))}; {plural(count, 'example')} ({len(fixed)} fixed)", count



def check_unclaimed(target: Target, claim: Claim) -> tuple[str, int]:
    caps, phase = target.caps, claim.phase
    dtype = next(d for d in DTYPES if d in caps.dtypes)
    spec = canonical_cases(caps, phase, dtype, min(caps.head_sizes))[0]
    case = build_case(spec, device=target.device)
    try:
        backend = target.new_backend(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    except UnsupportedPhase as exc:
        return f"UnsupportedPhase: {exc}", 1
    except Exception as exc:  # noqa: BLE001 - anything else is the wrong refusal
        raise with_example(ClaimFalsified(claim, f"{phase.value} is not claimed, yet the backend raised "
                                                  f"{type(exc).__name__}: {exc} (supported: UnsupportedPhase)"),
                            spec) from exc
    shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    raise with_example(ClaimFalsified(claim, f"{phase.value} is not claimed, yet forward returned {shape} "
                                              "instead of raising UnsupportedPhase"), spec)


