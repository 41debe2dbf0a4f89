"""``feature[F]``: each claimed feature run against the reference."""

from __future__ import annotations

from hypothesis import strategies as st

from attnhal.capabilities import Feature, Phase
from attnhal.testing import strategies as ast
from attnhal.testing.checks.claims import Claim
from attnhal.testing.checks.common import plural, run_examples
from attnhal.testing.checks.phases import canonical_cases, eager_body
from attnhal.testing.checks.target import Target, checkable_dtypes


def feature_not_checked(target: Target, claim: Claim) -> str | None:
    """Why feature ``claim`` cannot be checked (the kit has no batch field for it...), or None."""
    if claim.subject != Feature.CUSTOM_MASK.value:
        return f"the kit has no batch field for feature {claim.subject} yet"
    if Phase.TARGET_VERIFY not in target.caps.phases:
        return "custom_mask applies to target_verify, which the backend does not claim"
    return None


def check_feature(target: Target, claim: Claim) -> tuple[str, int]:
    caps = target.caps
    dtypes = checkable_dtypes(target)
    fixed = [c for h in sorted(caps.head_sizes)[:1] for c in canonical_cases(caps, Phase.TARGET_VERIFY, dtypes[0], h)]
    strategy = st.sampled_from(dtypes).flatmap(lambda d: ast.case_specs(
        caps, Phase.TARGET_VERIFY, dtype=d, tree=True, max_requests=target.max_requests,
        max_seq_len=target.max_seq_len))
    count = run_examples(target, "feature_custom_mask", strategy, fixed, eager_body(target, claim))
    return f"target_verify with draft-tree masks; {plural(count, 'example')}", count


