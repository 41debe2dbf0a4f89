"""Which claims can run here, and running one: :func:`verify` reports, :func:`check` raises."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from hypothesis.errors import Flaky

import attnhal.testing.checks.coverage as coverage
from attnhal.platform import GraphKind, Vendor
from attnhal.testing.checks.claims import Claim, ClaimFalsified, ClaimKind, ClaimResult, NothingToCheck, Status
from attnhal.testing.checks.edges import check_layer_pattern, check_scale_edges
from attnhal.testing.checks.features import (
    check_feature,
    check_kv_dtype,
    check_page_size,
    check_unclaimed_feature,
    feature_not_checked,
)
from attnhal.testing.checks.graphs import check_fill, check_graph
from attnhal.testing.checks.limits import claim_limits, claim_spec_configs
from attnhal.testing.checks.metamorphic import check_batch_invariant, check_empty_batch
from attnhal.testing.checks.multi_step import check_multi_step
from attnhal.testing.checks.phases import check_phase, check_unclaimed
from attnhal.testing.checks.properties import check_deterministic, check_inputs_unchanged
from attnhal.testing.checks.target import Target, process_reasons
from attnhal.testing.checks.tolerances import ceiling_breach, claim_tolerances, format_tolerances

def not_checked_reason(target: Target, claim: Claim) -> str | None:
    """Why ``claim`` cannot be checked in this process, or None if it can."""
    caps, platform = target.caps, target.platform
    if claim.kind is ClaimKind.VENDOR:
        if platform.vendor.value == claim.subject and not platform.simulated:
            return None
        arch = caps.min_arch.get(Vendor(claim.subject))
        return (f"no {claim.subject} device in this process (platform {platform.name}); native kernels "
                f"and real graphs there are unchecked" + (f", as is min_arch {arch}" if arch else ""))
    whole = process_reasons(target)
    if whole:
        return "; ".join(whole)
    if claim.kind in (ClaimKind.FEATURE, ClaimKind.UNCLAIMED_FEATURE):
        return feature_not_checked(target, claim)
    if claim.kind in (ClaimKind.GRAPH, ClaimKind.SEQ_LEN_FILL) and platform.graph_kind is GraphKind.NONE:
        return f"platform {platform.name} has no graph API"
    if claim.kind in (ClaimKind.GRAPH, ClaimKind.SEQ_LEN_FILL, ClaimKind.MULTI_STEP):
        if claim_spec_configs(target, claim).is_empty:
            return f"no spec config satisfies the claim's limits {claim_limits(target, claim).to_dict()}"
    return None


def depends_on(claim: Claim, done: Mapping[str, ClaimResult]) -> str | None:
    """Why ``claim`` is not run after the claims ``done`` (by name): the graph claim its check
    needs was falsified. Both front ends (the report and the pytest mixins) ask it, so they
    blame the same claims for one defect."""
    if claim.kind is ClaimKind.SEQ_LEN_FILL:
        graph = done.get(f"graph[{claim.subject}]")
        if graph is not None and graph.status is Status.FALSIFIED:
            return f"graph[{claim.subject}] is falsified; padding is checked through a working graph"
    return None


def verify(target: Target, claim: Claim) -> ClaimResult:
    """Run ``claim`` and report it: verified, falsified (with the counterexample; flaky when
    it did not repeat), not checked here, or a kit error — never an exception."""
    start = time.perf_counter()
    try:
        why = not_checked_reason(target, claim)
        if why is not None:
            return ClaimResult(claim, Status.NOT_CHECKED, why)
        if claim.kind is ClaimKind.VENDOR:
            return ClaimResult(claim, Status.VERIFIED, f"the other claims ran here, on {target.platform.name} "
                                                       f"({target.platform.device_name or target.device})")
        detail, count = check(target, claim)
        result = ClaimResult(claim, Status.VERIFIED, detail, examples=count, coverage=coverage.take(claim.name))
    except ClaimFalsified as exc:
        result = ClaimResult(claim, Status.FALSIFIED, _detail(claim, exc), counterexample=counterexample(exc))
    except NothingToCheck as exc:
        result = ClaimResult(claim, Status.NOT_CHECKED, str(exc))
    except Flaky as exc:
        result = flaky_result(claim, exc)
    except Exception as exc:  # noqa: BLE001 - the kit failing on one claim must not lose the others
        result = ClaimResult(claim, Status.ERROR, f"the kit failed: {type(exc).__name__}: {exc}")
    result.seconds = time.perf_counter() - start
    result.coverage = result.coverage or coverage.take(claim.name)
    return with_tolerance(target, result)


def with_tolerance(target: Target, result: ClaimResult) -> ClaimResult:
    """``result`` with the tolerance its claim is checked with, as the report prints it."""
    result.tolerance = format_tolerances(claim_tolerances(target.caps, result.claim))
    return result


def _detail(claim: Claim, exc: ClaimFalsified) -> str:
    return exc.detail if exc.claim == claim.name else f"{exc.claim} falsified: {exc.detail}"


def flaky_result(claim: Claim, exc: Flaky) -> ClaimResult:
    """A failure hypothesis saw once but not when it ran the example again: falsified, flaky."""
    inner = [e for e in getattr(exc, "exceptions", ()) if isinstance(e, ClaimFalsified)]
    what = _detail(claim, inner[0]) if inner else f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    notes = "\n".join(filter(None, [counterexample(exc), *(counterexample(e) or "" for e in inner)]))
    return ClaimResult(claim, Status.FALSIFIED, f"{what} (then passed when run again: a race, uninitialised "
                                                "memory or state carried between calls)",
                       counterexample=notes or None, flaky=True)


def counterexample(exc: BaseException) -> str | None:
    """The example hypothesis attached to ``exc`` (its notes), or None."""
    notes = [n for n in getattr(exc, "__notes__", ()) if "example" in n.lower() or "test case" in n.lower()]
    return "\n".join(notes) if notes else None


def check(target: Target, claim: Claim) -> tuple[str, int]:
    """Run ``claim``; returns ``(what was verified, examples run)`` or raises :class:`ClaimFalsified`."""
    runners: dict[ClaimKind, Callable[[Target, Claim], tuple[str, int]]] = {
        ClaimKind.PHASE: check_phase,
        ClaimKind.UNCLAIMED: check_unclaimed,
        ClaimKind.FEATURE: check_feature,
        ClaimKind.UNCLAIMED_FEATURE: check_unclaimed_feature,
        ClaimKind.PAGE_SIZE: check_page_size,
        ClaimKind.KV_DTYPE: check_kv_dtype,
        ClaimKind.GRAPH: check_graph,
        ClaimKind.SEQ_LEN_FILL: check_fill,
        ClaimKind.MULTI_STEP: check_multi_step,
        ClaimKind.DETERMINISTIC: check_deterministic,
        ClaimKind.INPUTS_UNCHANGED: check_inputs_unchanged,
        ClaimKind.BATCH_INVARIANT: check_batch_invariant,
        ClaimKind.LAYER_PATTERN: check_layer_pattern,
        ClaimKind.SCALE_EDGES: check_scale_edges,
        ClaimKind.EMPTY_BATCH: check_empty_batch,
    }
    if claim.kind not in runners:
        raise ValueError(f"claim={claim} (supported: {', '.join(k.value for k in runners)} run; "
                         "the others are reported by verify())")
    breach = ceiling_breach(target.caps, claim)
    if breach is not None:  # checked with a tolerance past the ceiling, the claim would prove nothing
        raise ClaimFalsified(claim, breach)
    with coverage.collecting(claim.name):
        return runners[claim.kind](target, claim)

