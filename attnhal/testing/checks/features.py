"""``feature[F]``, ``page_size[P]``, ``kv_dtype[D]`` and ``unclaimed_feature[F]``.

A feature, page size or KV dtype is a *variant* of the phase cases: the canonical case
of every claimed phase with the variant's :class:`CaseRecipe` fields set, the fixed
combinations where kernels break and drawn cases combining it with every other claimed
feature (:mod:`attnhal.testing.checks.variants`, which also decides which claim a failing
combination falsifies), run eagerly against the reference — which applies the same
window, soft-cap, sinks, V head size, page table and KV quantization — and, for every
claimed graph phase, one capture replayed against eager and the reference (the page
table, the fp8 scales and the sink logits are replay metadata too). fp8 KV dtypes also
run their life cycle (:mod:`attnhal.testing.checks.fp8`). ``custom_mask`` is the tree of
``target_verify``. An unclaimed feature must be refused with ``UnsupportedPhase``
(``UnsupportedFeature`` is one), never computed as if it were absent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

import attnhal.testing.strategies as hst
from attnhal.kv_format import kv_format
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import GraphKind
from attnhal.testing.cases import CaseRecipe
from attnhal.testing.checks.claims import Claim, ClaimFalsified, ClaimKind
from attnhal.testing.checks.common import plural, run_examples
from attnhal.testing.checks.expected import resize
from attnhal.testing.checks.fixed import fits
from attnhal.testing.checks.fp8 import check_late_scales, large_scale_cases, saturation_fields
from attnhal.testing.checks.graphs import in_limits, replay_fixed
from attnhal.testing.checks.phases import canonical_cases, eager_body, expect_refusal
from attnhal.testing.checks.target import Target, checkable_dtypes
from attnhal.testing.checks.variants import combination_cases, drawn_cases, fp8_flavours, strip

__all__ = ["FP8_K_SCALE", "MLA_HEAD_SIZE", "MLA_V_HEAD_SIZE", "check_feature", "check_kv_dtype", "check_page_size",
           "check_unclaimed_feature", "feature_not_checked"]

#: MLA (absorbed, DeepSeek): q/k head = latent 512 + rope 64, V = the latent part, one KV head.
MLA_HEAD_SIZE, MLA_V_HEAD_SIZE = 576, 512
#: ``k_scale`` of the KV-dtype cases (``v_scale`` is twice it): neither is 1, so a backend
#: that ignores either scale is off by that factor.
FP8_K_SCALE = 0.25

Variant = Callable[[CaseRecipe], CaseRecipe]

#: Per feature: the fixed variants of every phase's canonical case (several, e.g. a window
#: layer and a full layer next to it); the first one is also captured in every graph phase.
_FIXED: dict[Feature, list[dict[str, Any]]] = {
    Feature.SLIDING_WINDOW: [{"sliding_window": (None, 3)}, {"sliding_window": (3, None)}, {"sliding_window": 0}],
    Feature.LOGIT_SOFTCAP: [{"logit_softcap": 1.0}],
    Feature.SINKS: [{"sinks": True}],
    Feature.MLA: [{"head_size": MLA_HEAD_SIZE, "v_head_size": MLA_V_HEAD_SIZE, "num_kv_heads": 1}],
}


def feature_not_checked(target: Target, claim: Claim) -> str | None:
    """Why ``claim`` (a feature, page size or KV dtype) cannot be checked here, or None."""
    caps = target.caps
    if claim.kind is ClaimKind.FEATURE and claim.subject == Feature.CUSTOM_MASK.value:
        if Phase.TARGET_VERIFY not in caps.phases:
            return "custom_mask applies to target_verify, which the backend does not claim"
    if claim.kind is ClaimKind.FEATURE and claim.subject == Feature.MLA.value:
        if MLA_HEAD_SIZE not in caps.head_sizes:
            return f"mla needs head_size={MLA_HEAD_SIZE} (claimed: {sorted(caps.head_sizes)})"
    if claim.kind is ClaimKind.UNCLAIMED_FEATURE and Phase.DECODE not in caps.phases:
        return "the refusal is checked on decode, which the backend does not claim"
    return None


def check_feature(target: Target, claim: Claim) -> tuple[str, int]:
    feature = Feature(claim.subject)
    if feature is Feature.CUSTOM_MASK:
        return _check_custom_mask(target, claim)
    return _check_variant(target, claim, [_fields(f) for f in _FIXED[feature]])


def check_page_size(target: Target, claim: Claim) -> tuple[str, int]:
    return _check_variant(target, claim, [_fields({"page_size": int(claim.subject), "slot_seed": 7})])


def check_kv_dtype(target: Target, claim: Claim) -> tuple[str, int]:
    """Every flavour the platform may store ``fp8_e4m3`` in: its own, or both on a platform
    without one (the CPU stores either; which one is the caller's explicit choice). fp8
    also runs its life cycle (:mod:`attnhal.testing.checks.fp8`): values past the range,
    scales set after construction and after capture."""
    kv = claim.subject
    fmt = kv_format(kv)
    flavours = list(fp8_flavours(target)) if fmt.needs_flavor else ["e4m3fn"]
    variants = [{"kv_dtype": kv, "fp8_flavor": f, "kv_scale": FP8_K_SCALE} for f in flavours]
    fp8 = fmt.scaled
    extra = []
    if fp8:  # every phase's canonical case with values past the range, in each flavour
        caps, dtype = target.caps, checkable_dtypes(target)[0]
        extra = [replace(c, **saturation_fields(kv, f)) for f in flavours for p in Phase if p in caps.phases
                 for c in canonical_cases(caps, p, dtype, min(caps.head_sizes))]
        extra += large_scale_cases(target, kv, flavours)
    detail, count = _check_variant(target, claim, [_fields(v) for v in variants], extra)
    if fp8:
        replayed = check_late_scales(target, claim, variants)
        detail += "; saturated past the range; scales set late: eager" + (
            f" and replays of {', '.join(p.value for p in replayed)}" if replayed else "")
    if fmt.needs_flavor:
        detail = f"stored as {' and '.join(flavours)}; {detail}"
    return detail, count


def check_unclaimed_feature(target: Target, claim: Claim) -> tuple[str, int]:
    """A config with a feature the backend does not claim is refused, at construction or forward."""
    caps = target.caps
    recipe = _fields(_FIXED[Feature(claim.subject)][0])(
        canonical_cases(caps, Phase.DECODE, checkable_dtypes(target)[0], min(caps.head_sizes))[0])
    return expect_refusal(target, claim, recipe, claim.subject,
                          " (a backend must not compute attention without a feature it was given)")


# --- running a variant ------------------------------------------------------------------------------

def _fields(values: dict[str, Any]) -> Variant:
    return lambda recipe: replace(recipe, **values)


def _check_variant(target: Target, claim: Claim, fixed: list[Variant],
                   extra: Sequence[CaseRecipe] = ()) -> tuple[str, int]:
    """Every claimed phase, eager: the fixed variants of the canonical cases, the first variant
    at every other claimed head size (features and KV dtypes; the first claimed phase), ``extra``, the
    claim's fixed combinations (:func:`~attnhal.testing.checks.variants.combination_cases`),
    then drawn combinations; then every claimed graph phase captured once with the first
    variant."""
    caps = target.caps
    dtypes = checkable_dtypes(target)
    phases = [p for p in Phase if p in caps.phases]
    head = min(caps.head_sizes)
    cases = [v(c) for p in phases for v in fixed for c in canonical_cases(caps, p, dtypes[0], head)]
    # a feature or KV dtype at every other claimed head size once (missing in one instantiation);
    # the page table does not depend on the head size
    if claim.kind is not ClaimKind.PAGE_SIZE:
        cases += [fixed[0](c) for h in sorted(caps.head_sizes)[1:]
                  for c in canonical_cases(caps, phases[0], dtypes[0], h)]
    cases += [c for c in [*extra, *combination_cases(target, claim)]
              if fits(c, target.max_seq_len, target.max_cost)]
    cases = list(dict.fromkeys(cases))  # MLA fixes its head size: one case, not one per head size
    name = f"{claim.kind.value}_{claim.subject}"
    count = run_examples(target, name, drawn_cases(target, claim), cases, _attributed(target, claim))
    can_capture = target.platform.graph_kind is not GraphKind.NONE
    graphs = [p for p in GRAPH_PHASES if p in caps.graph and can_capture
              and _check_graph_variant(target, claim, p, fixed[0], dtypes[0], head)]
    return (f"phases {', '.join(p.value for p in phases)}; {plural(count, 'example')} eager"
            + (f"; graphs of {', '.join(p.value for p in graphs)}" if graphs else "")), count


def _attributed(target: Target, claim: Claim) -> Callable[[CaseRecipe], None]:
    """The eager check of ``claim``, blaming it only for what its subject makes fail: a case
    that fails also without the subject (:func:`~attnhal.testing.checks.variants.strip`) is
    another claim's counterexample, and that claim's own examples report the defect."""
    body = eager_body(target, claim)
    bare_body = eager_body(target, Claim(ClaimKind.PHASE, "without " + claim.name))

    def run(recipe: CaseRecipe) -> None:
        try:
            body(recipe)
        except ClaimFalsified:
            bare = strip(target.caps, claim, recipe)
            if bare is None or bare == recipe:
                raise
            try:
                bare_body(bare)
            except ClaimFalsified:
                return  # fails without the subject too: not this claim's defect
            raise

    return run


def _check_graph_variant(target: Target, claim: Claim, phase: Phase, variant: Variant, dtype: str,
                         head: int) -> bool:
    """Capture ``phase`` with the variant and replay 2 and 1 requests; False if the canonical
    case is outside the phase's graph limits (then the graph claim's own check covers it)."""
    graph_claim = Claim(ClaimKind.GRAPH, phase.value)
    base = variant(canonical_cases(target.caps, phase, dtype, head)[0])
    if not in_limits(target, graph_claim, base):
        return False
    try:
        replay_fixed(target, graph_claim, [resize(base, n, base.seed + n) for n in (2, 1)])
    except ClaimFalsified as exc:
        raise ClaimFalsified(claim, f"{exc.claim}: {exc.detail}") from exc
    return True


def _check_custom_mask(target: Target, claim: Claim) -> tuple[str, int]:
    caps = target.caps
    dtypes = checkable_dtypes(target)
    fixed = [c for h in sorted(caps.head_sizes)[:1] for c in canonical_cases(caps, Phase.TARGET_VERIFY, dtypes[0], h)]
    strategy = st.sampled_from(dtypes).flatmap(lambda d: hst.case_specs(
        caps, Phase.TARGET_VERIFY, dtype=d, tree=True, max_requests=target.max_requests,
        max_seq_len=target.max_seq_len))
    count = run_examples(target, "feature_custom_mask", strategy, fixed, eager_body(target, claim))
    return f"target_verify with draft-tree masks; {plural(count, 'example')}", count
