"""``multi_step``: every forward of a :class:`~attnhal.backend.MultiStepDraft` against the
reference while the draft tree re-parents between forwards."""

from __future__ import annotations

from hypothesis import strategies as st

import attnhal.testing.strategies as hst
from attnhal.capabilities import SpecLimits
from attnhal.phases import Phase
from attnhal.reasons import ReasonCode
from attnhal.testing.cases import CaseRecipe, build_case
from attnhal.testing.checks.claims import Claim, ClaimFalsified
from attnhal.testing.checks.common import heads, mismatch, plural, run_examples
from attnhal.testing.checks.expected import expected, resize
from attnhal.testing.checks.phases import canonical_cases
from attnhal.testing.checks.target import Target, checkable_dtypes
from attnhal.testing.oracle import real_tokens


def check_multi_step(target: Target, claim: Claim) -> tuple[str, int]:
    caps = target.caps
    dtypes = checkable_dtypes(target)

    def body(recipe: CaseRecipe) -> None:
        case = build_case(recipe, device=target.device)
        exp = expected(target, claim, case, multi=True)
        tol = caps.tolerance_for(recipe.dtype, recipe.kv_dtype)
        for s, (eager, ref, batch) in enumerate(zip(exp.eager, exp.reference, exp.batches)):
            problem = mismatch(eager, ref, real_tokens(batch), tol)
            if problem is not None:
                raise ClaimFalsified(claim, f"forward {s} of {len(exp.eager)} (draft_step={s}, {heads(recipe)}, "
                                            f"re-parented before each forward): {problem}")

    fixed = [resize(c, c.requests, c.seed) for c in canonical_cases(caps, Phase.DRAFT_DECODE, dtypes[0],
                                                                     min(caps.head_sizes))]
    fixed = [c for c in fixed if c.spec is not None and not (caps.multi_step or SpecLimits()).violations(
        c.spec, ReasonCode.MULTI_STEP, "")]
    strategy = st.sampled_from(dtypes).flatmap(lambda d: hst.multi_step_specs(
        caps, dtype=d, max_requests=target.max_requests, max_seq_len=target.max_seq_len))
    count = run_examples(target, "multi_step", strategy, fixed, body)
    return (f"every forward against the reference, draft tree re-parented in between; "
            f"{plural(count, 'example')}"), count
