"""The kit's tolerance ceiling: how loose a descriptor's declared tolerance may be.

A backend declares per dtype the tolerance its outputs meet against the fp64 reference
(:attr:`~attnhal.capabilities.BackendCapabilities.tolerances`). The kit checks every
claim with that tolerance, so a tolerance declared loose enough certifies anything
(``atol = inf`` passed a backend that dropped the softmax scale). The kit therefore owns a
ceiling per dtype: a descriptor may tighten its tolerance below the ceiling, never loosen it
past. A backend whose declared tolerance is looser fails every claim that compares numbers,
naming the ceiling and the reason for its value (:func:`ceiling_breach`).

The outputs compared are softmax-weighted means of V with unit-scale inputs, so an error of
the order of 0.1 is a wrong answer, not rounding (a dropped softmax scale errs by ~0.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from attnhal.capabilities import BackendCapabilities, Tolerance
from attnhal.testing.checks.claims import Claim, ClaimKind

__all__ = ["CEILINGS", "Ceiling", "ceiling_breach", "claim_tolerances", "format_tolerances"]


@dataclass(frozen=True)
class Ceiling:
    """The loosest tolerance the kit accepts for one dtype, and why that value."""

    limit: Tolerance
    why: str


#: dtype (compute or KV) -> the kit's ceiling. Each value is a few units of rounding of the
#: narrowest step a correct kernel of that dtype takes, far below the error of a wrong one.
CEILINGS: Mapping[str, Ceiling] = MappingProxyType({
    "float32": Ceiling(Tolerance(1e-3, 1e-3), "2 units of tf32 rounding (2^-11): a kernel may run its fp32 "
                                              "dots on tf32 tensor cores"),
    "float16": Ceiling(Tolerance(1e-2, 1e-2), "20 units of fp16 rounding (2^-11): P rounded to fp16 before "
                                              "the PV dot, plus the output's own rounding"),
    "bfloat16": Ceiling(Tolerance(5e-2, 5e-2), "12 units of bf16 rounding (2^-8): P rounded to bf16 before "
                                               "the PV dot, plus the output's own rounding"),
    "fp8_e4m3": Ceiling(Tolerance(6.25e-2, 6.25e-2), "1 unit of e4m3 rounding (2^-4): a kernel may round P to "
                                                     "the cache's fp8 before the PV dot (the dequantised cache "
                                                     "is the reference's input)"),
    "fp8_e5m2": Ceiling(Tolerance(1.25e-1, 1.25e-1), "1 unit of e5m2 rounding (2^-3): a kernel may round P to "
                                                     "the cache's fp8 before the PV dot (the dequantised cache "
                                                     "is the reference's input)"),
})

#: Claims whose check compares no numbers against the reference (refusals, bitwise
#: equality, untouched inputs, where the claims ran).
_EXACT = frozenset({ClaimKind.UNCLAIMED, ClaimKind.UNCLAIMED_FEATURE, ClaimKind.DETERMINISTIC,
                    ClaimKind.INPUTS_UNCHANGED, ClaimKind.VENDOR})


def claim_tolerances(caps: BackendCapabilities, claim: Claim) -> dict[str, Tolerance]:
    """The tolerance ``claim`` is checked with, per dtype it runs (empty for exact claims):
    ``phase[P, D]`` runs ``D``; ``kv_dtype[K]`` each compute dtype over a ``K`` cache; the
    others every claimed compute dtype."""
    if claim.kind in _EXACT:
        return {}
    if claim.dtype is not None:
        return {claim.dtype: caps.tolerance_for(claim.dtype)}
    dtypes = [d for d in caps.dtypes if d in CEILINGS]
    kv = claim.subject if claim.kind is ClaimKind.KV_DTYPE else None
    return {f"{d}+{kv}" if kv else d: caps.tolerance_for(d, kv) for d in sorted(dtypes)}


def ceiling_breach(caps: BackendCapabilities, claim: Claim) -> str | None:
    """Why ``claim`` cannot be certified with the tolerance ``caps`` declares: a declared
    tolerance of a dtype the claim runs is looser than the kit's ceiling; else None."""
    for dtype in _dtypes_run(caps, claim):
        declared, ceiling = caps.tolerances.get(dtype), CEILINGS.get(dtype)
        if declared is None or ceiling is None:
            continue
        if not (declared.atol <= ceiling.limit.atol and declared.rtol <= ceiling.limit.rtol):
            return (f"tolerances.{dtype}: atol={declared.atol:g} rtol={declared.rtol:g} is looser than the kit's "
                    f"ceiling for {dtype} (supported: atol <= {ceiling.limit.atol:g}, rtol <= "
                    f"{ceiling.limit.rtol:g}: {ceiling.why}); a descriptor may tighten it, never loosen it")
    return None


def _dtypes_run(caps: BackendCapabilities, claim: Claim) -> list[str]:
    """The dtypes (compute and KV) whose declared tolerance ``claim``'s check reads."""
    if claim.kind in _EXACT:
        return []
    compute = [claim.dtype] if claim.dtype is not None else sorted(caps.dtypes)
    kv = [claim.subject] if claim.kind is ClaimKind.KV_DTYPE else []
    return [*compute, *kv]


def format_tolerances(tolerances: Mapping[str, Tolerance]) -> str:
    """``float32 1e-05`` (atol = rtol) or ``float32 1e-05/2e-05`` (atol/rtol), joined by ``; ``."""
    def one(t: Tolerance) -> str:
        return f"{t.atol:g}" if t.atol == t.rtol else f"{t.atol:g}/{t.rtol:g}"
    return "; ".join(f"{d} {one(t)}" for d, t in tolerances.items())
