"""Feature variants of the phase cases: each claim's subject alone and combined with the rest.

A variant claim (``feature[F]``, ``page_size[P]``, ``kv_dtype[D]``) runs its subject on
the canonical case of every claimed phase, then on the fixed combinations where real
kernels broke (:func:`combination_cases`) and on drawn cases that switch every other
claimed feature on or off (:func:`drawn_cases`). Which claim a failure falsifies is
decided by :func:`strip`: a combined case that fails falsifies ``F`` only when the same
case without ``F`` passes — otherwise the defect is another claim's, and that claim's
own examples report it (a backend that ignores windows is not blamed for soft-capping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

import attnhal.testing.strategies as hst
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Feature, Phase
from attnhal.platform import Fp8Flavor
from attnhal.testing.cases import CaseRecipe
from attnhal.testing.checks.claims import Claim, ClaimKind
from attnhal.testing.checks.fixed import at_lengths, fits
from attnhal.testing.checks.phases import canonical_cases, full_sizes
from attnhal.testing.checks.target import Target, checkable_dtypes

__all__ = ["combination_cases", "drawn_cases", "fp8_flavours", "strip", "subject_fields"]

Fields = dict[str, Any]
#: The window of the fixed combinations (on layer 1, the canonical case's): short enough that
#: the canonical contexts reach past it.
_W = 3
#: The multi-token phases (a window there is per query position, not per row).
_MULTI_TOKEN = (Phase.PREFILL, Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND)
#: Contexts past several KV splits of typical split heuristics (splits of 256-1024 keys).
_SPLIT_LENS = (2049, 300)


def fp8_flavours(target: Target) -> tuple[str, ...]:
    """The e4m3 flavours ``fp8_e4m3`` is checked in: the platform's, or both on one without fp8."""
    own = target.platform.fp8_flavor
    return (own.value,) if own is not Fp8Flavor.NONE else (Fp8Flavor.OCP.value, Fp8Flavor.FNUZ.value)


def subject_fields(target: Target, claim: Claim) -> st.SearchStrategy[Fields]:
    """The recipe fields that switch ``claim``'s own subject on (drawn)."""
    if claim.kind is ClaimKind.PAGE_SIZE:
        return st.just({"page_size": int(claim.subject)})
    if claim.kind is ClaimKind.KV_DTYPE:
        kvs = [f for f in hst.kv_fields(target.caps, fp8_flavours(target)) if f["kv_dtype"] == claim.subject]
        return st.sampled_from(kvs)
    feature = Feature(claim.subject)
    if feature is Feature.SLIDING_WINDOW:
        return hst.window_fields()
    if feature is Feature.LOGIT_SOFTCAP:
        return st.floats(0.25, 30.0).map(lambda c: {"logit_softcap": c})
    if feature is Feature.SINKS:
        return st.just({"sinks": True})
    return st.just(hst.MLA_FIELDS)


def strip(caps: BackendCapabilities, claim: Claim, recipe: CaseRecipe) -> CaseRecipe | None:
    """``recipe`` without ``claim``'s subject (another claimed value in its place), or None
    when there is nothing claimed to put there."""
    if claim.kind is ClaimKind.PAGE_SIZE:
        return replace(recipe, page_size=1) if 1 in caps.page_sizes else None
    if claim.kind is ClaimKind.KV_DTYPE:
        return replace(recipe, kv_dtype=None, kv_scale=1.0)
    feature = Feature(claim.subject)
    if feature is Feature.SLIDING_WINDOW:
        return replace(recipe, sliding_window=None)
    if feature is Feature.LOGIT_SOFTCAP:
        return replace(recipe, logit_softcap=None)
    if feature is Feature.SINKS:
        return replace(recipe, sinks=False)
    others = sorted(h for h in caps.head_sizes if h != hst.MLA_FIELDS["head_size"])
    return replace(recipe, head_size=others[0], v_head_size=None) if others else None


def drawn_cases(target: Target, claim: Claim) -> st.SearchStrategy[CaseRecipe]:
    """Any claimed phase and dtype with ``claim``'s subject on and every other claimed feature,
    page size and KV dtype drawn on or off (:func:`~attnhal.testing.strategies.feature_fields`)."""
    caps = target.caps
    phases = [p for p in Phase if p in caps.phases]
    others = hst.feature_fields(caps, fp8_flavours(target))
    fields = st.tuples(others, subject_fields(target, claim)).map(lambda fs: {**fs[0], **fs[1]})
    return st.tuples(st.sampled_from(phases), st.sampled_from(checkable_dtypes(target)), fields).flatmap(
        lambda pdf: _drawn(target, *pdf))


def _drawn(target: Target, phase: Phase, dtype: str, fields: Fields) -> st.SearchStrategy[CaseRecipe]:
    rest = {k: v for k, v in fields.items() if k not in ("head_size", "page_size")}
    return hst.case_specs(target.caps, phase, dtype=dtype, head_size=fields.get("head_size"),
                          page_size=fields.get("page_size", 1), max_requests=target.max_requests,
                          max_seq_len=target.max_seq_len, max_cost=target.max_cost).map(
        lambda r: replace(r, **rest))


# --- fixed combinations ----------------------------------------------------------------------

def combination_cases(target: Target, claim: Claim) -> list[CaseRecipe]:
    """The fixed cases of ``claim`` beyond its subject on the canonical cases: the
    combinations where real kernels broke, within the target's bounds."""
    caps = target.caps
    dtype, head = checkable_dtypes(target)[0], min(caps.head_sizes)
    canon = {p: canonical_cases(caps, p, dtype, head)[0] for p in Phase if p in caps.phases}
    builders: dict[ClaimKind, Callable[[Target, Claim, dict[Phase, CaseRecipe]], list[CaseRecipe]]] = {
        ClaimKind.FEATURE: _feature_combinations, ClaimKind.PAGE_SIZE: _page_boundaries}
    build = builders.get(claim.kind)
    out = build(target, claim, canon) if build else []
    return [c for c in out if fits(c, target.max_seq_len, target.max_cost)]


def _others_on(caps: BackendCapabilities, *features: Feature) -> Fields:
    """The fields of ``features`` that ``caps`` claims (window on layer 1, soft-cap 1, sinks)."""
    fields: dict[Feature, Fields] = {Feature.SLIDING_WINDOW: {"sliding_window": (None, _W)},
                                     Feature.LOGIT_SOFTCAP: {"logit_softcap": 1.0}, Feature.SINKS: {"sinks": True}}
    return {k: v for f in features if f in caps.features for k, v in fields[f].items()}


def _feature_combinations(target: Target, claim: Claim, canon: dict[Phase, CaseRecipe]) -> list[CaseRecipe]:
    caps, feature = target.caps, Feature(claim.subject)
    together = _others_on(caps, Feature.SLIDING_WINDOW, Feature.LOGIT_SOFTCAP, Feature.SINKS)
    out = []
    if feature in (Feature.SLIDING_WINDOW, Feature.LOGIT_SOFTCAP, Feature.SINKS) and len(together) > 1:
        out += [replace(c, **together) for c in canon.values()]  # window x soft-cap x sinks, every phase
    if feature is Feature.SLIDING_WINDOW:
        out += _window_combinations(caps, canon)
    if feature is Feature.SINKS and Phase.DECODE in canon:
        out.append(replace(at_lengths(canon[Phase.DECODE], _SPLIT_LENS), sinks=True))  # sinks x KV splits
    if feature is Feature.MLA:
        page = min((p for p in caps.page_sizes if p > 1), default=1)
        mla = {**hst.MLA_FIELDS, "page_size": page, **_others_on(caps, Feature.SLIDING_WINDOW)}
        out += [replace(canon[p], **mla) for p in (Phase.DECODE, Phase.TARGET_VERIFY) if p in canon]
        first = canon.get(Phase.DECODE) or next(iter(canon.values()))  # DeepSeek's 128 q heads on the latent
        out += [replace(first, **hst.MLA_FIELDS, num_q_heads=128)] if full_sizes(target) else []
    return out


def _window_combinations(caps: BackendCapabilities, canon: dict[Phase, CaseRecipe]) -> list[CaseRecipe]:
    window: Fields = {"sliding_window": (None, _W)}
    out: list[CaseRecipe] = []
    verify = canon.get(Phase.TARGET_VERIFY)
    if verify is not None and verify.tree_parents:
        # window x tree verify: branching trees behind a prefix longer than the window, so that
        # a draft token's position (prefix + depth) differs from prefix + its index
        out.append(replace(verify, prefix_lens=(13, 9), tree_parents=((-1, 0, 0, 1), (-1, 0, 1, 1)), **window))
    prefill = canon.get(Phase.PREFILL)
    if prefill is not None:
        # window x prefill tiles: the first and the last query of a 64- or 128-query tile
        # need different KV blocks
        out.append(replace(prefill, prefix_lens=(40, 3), new_lens=(200, 129), sliding_window=(None, 48)))
    # window x wide GQA (group 16) where a row has several query tokens
    out += [replace(canon[p], num_q_heads=32, num_kv_heads=2, **window) for p in _MULTI_TOKEN if p in canon]
    decode = canon.get(Phase.DECODE)
    if decode is not None:  # a window longer than a KV split, in a context of several
        out.append(replace(at_lengths(decode, _SPLIT_LENS), sliding_window=(None, 1000)))
    return out


def _page_boundaries(target: Target, claim: Claim, canon: dict[Phase, CaseRecipe]) -> list[CaseRecipe]:
    """Every phase at contexts ``k P - 1, k P, k P + 1``: the last page full, one short, one
    token on a new page (for ``draft_decode`` the committed prefix is at those lengths)."""
    P = int(claim.subject)
    out: list[CaseRecipe] = []
    for phase, base in canon.items():
        extra = base.draft_step + 1 if phase is Phase.DRAFT_DECODE else 0
        # the partial last pages' tails: NaN/inf and -1 past the rows, then stale values and pages past the pool
        for lens, unowned in (((P, 2 * P + 1, P - 1), "pad"), ((2 * P, P + 1, 3 * P), "stale")):
            case = at_lengths(base, tuple(n + extra for n in lens))
            out.append(replace(case, page_size=P, seed=base.seed + len(out), unowned=unowned))
    return out
