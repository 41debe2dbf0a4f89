"""The planner's algorithm: spec config + platform + context + each phase's backend -> GraphPlan.

This is the one code path every vendor takes. Each phase's decision reads only
that phase's own backend descriptor — resolved once against the plan's
:class:`~attnhal.capabilities.Facts` (platform, request/model context, spec
config) — and :class:`~attnhal.platform.Platform` fields; there is no
``isinstance`` and no vendor branch here, so a CUDA and a HIP platform with a
graph API get the same plan for the same vendor-independent descriptors.
Which phases run is data: :data:`~attnhal.phases.ALGORITHM_PHASES` and the engine's
:class:`~attnhal.phases.StepLayout`, read through :func:`~attnhal.phases.not_run_reason`.
Phases the layout captures as one graph (a :class:`~attnhal.phases.GraphGroup`) get one
answer, joined from their own decisions (:func:`_join_group`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from attnhal.capabilities.conditions import Facts
from attnhal.capabilities.descriptor import BackendCapabilities
from attnhal.capabilities.support import AttentionRequest, fp8_reasons, request_reasons
from attnhal.phases import DEFAULT_LAYOUT, Feature, GraphGroup, Phase, StepLayout, not_run_reason, tokens_per_request
from attnhal.planner.policy import GraphPolicy
from attnhal.planner.result import GraphPlan, PhasePlan
from attnhal.planner.roles import PhaseBackends
from attnhal.platform import Platform, as_platform
from attnhal.reasons import Reason, ReasonCode, fmt_set, reason
from attnhal.spec import RequestContext, SpecConfig, check_type, draft_tree_tokens

__all__ = ["plan", "plan_phase"]

# The fixed reasons, built once rather than in every plan.
_PREFILL_UNCAPTURED = reason(ReasonCode.GRAPH_UNSUPPORTED, "phase", Phase.PREFILL,
                             "decode, draft_decode, draft_extend, target_verify; prefill has a variable token count")
_PHASES = tuple(Phase)


def _required_features(phase: Phase, spec: SpecConfig) -> frozenset[Feature]:
    if phase is Phase.TARGET_VERIFY and spec.topk > 1:
        return frozenset((Feature.CUSTOM_MASK,))
    return frozenset()


@dataclass(frozen=True, eq=False)
class _Resolved:
    """One backend as plans read it under one platform, context and spec: its resolved
    claims, its phase-independent reasons, and the decisions made from it so far.

    Everything here is a pure function of (descriptor, platform, context, spec), so one
    instance serves every plan with those inputs (:func:`_resolved` caches it): conditions
    are evaluated and reason messages formatted once, not on every plan.
    """

    caps: BackendCapabilities
    platform: Platform
    spec: SpecConfig
    platform_reasons: tuple[Reason, ...]
    context_reasons: tuple[Reason, ...]
    decisions: dict[tuple[Phase, GraphPolicy, str | None, StepLayout], PhasePlan] = field(default_factory=dict,
                                                                                         repr=False)

    def decide(self, phase: Phase, policy: GraphPolicy, role: str | None,
               layout: StepLayout = DEFAULT_LAYOUT) -> PhasePlan:
        """The decision for ``phase`` run by this backend in ``role`` under ``policy`` and ``layout``."""
        key = (phase, policy, role, layout)
        decision = self.decisions.get(key)
        if decision is None:
            decision = self.decisions[key] = _decide(phase, self, self.spec, self.platform, policy, role, layout)
        return decision


@functools.lru_cache(maxsize=512)
def _resolved(caps: BackendCapabilities, platform: Platform, context: RequestContext, spec: SpecConfig) -> _Resolved:
    """``caps`` resolved against the facts of one plan (the cached unit; see :class:`_Resolved`)."""
    caps = caps.resolve(Facts.of(platform, context, spec))
    request = AttentionRequest.of(context)
    return _Resolved(caps, platform, spec, tuple(caps.platform_reasons(platform)),
                     tuple(fp8_reasons(platform, context.kv_dtype) + request_reasons(caps, request)))


def _run_reasons(phase: Phase, backend: _Resolved, spec: SpecConfig) -> list[Reason]:
    """Why the resolved backend cannot run ``phase`` here (empty: it can)."""
    caps = backend.caps
    out = list(backend.platform_reasons)
    if phase not in caps.phases:
        out.append(reason(ReasonCode.PHASE, "phase", phase, fmt_set(caps.phases)))
    out += backend.context_reasons
    for feature in sorted(_required_features(phase, spec) - caps.features, key=lambda f: f.value):
        out.append(reason(ReasonCode.FEATURE, "feature", feature,
                          fmt_set(caps.features)
                          + f"; needed for {phase.value} with topk={spec.topk}"))
    limits = caps.run_limits.get(phase)
    if limits is not None:
        out += limits.violations(spec, ReasonCode.SPEC_LIMIT, f"running {phase.value} with {caps.name!r}")
    if phase is Phase.DRAFT_DECODE:
        if caps.multi_step is None:
            out.append(reason(ReasonCode.MULTI_STEP, "multi_step", "none",
                              f"a backend declaring multi_step; {caps.name!r} declares none"))
        else:
            out += caps.multi_step.violations(spec, ReasonCode.MULTI_STEP, "multi-step draft")
    return out


def _capture_reasons(phase: Phase, caps: BackendCapabilities, spec: SpecConfig,
                     platform: Platform, policy: GraphPolicy) -> list[Reason]:
    """Why a running ``phase`` is not captured (empty: it is)."""
    if not policy.enabled:
        return [reason(ReasonCode.GRAPHS_DISABLED, "graphs", "disabled", f"enabled; disabled by {policy.disabled_by}")]
    if phase in policy.disabled_phases:
        return [reason(ReasonCode.GRAPHS_DISABLED, "phase", phase,
                       f"captured phases outside disabled_phases={fmt_set(policy.disabled_phases)}")]
    if not platform.has_graph_api:
        return [reason(ReasonCode.NO_GRAPH_API, "platform", platform.name, "a platform with a graph API")]
    if platform.graph_device_error is not None:  # never "captured" where no implementation loads
        return [reason(ReasonCode.GRAPH_DEVICE_UNAVAILABLE, "graph_device", platform.graph_device or "none",
                       f"a graph implementation that captures on {platform.name}; {platform.graph_device_error}")]
    limits = caps.graph_limits(phase)
    if limits is None:
        return [reason(ReasonCode.GRAPH_UNSUPPORTED, "phase", phase,
                       f"{fmt_set(caps.graph)} are capturable with backend {caps.name!r}")]
    out = limits.violations(spec, ReasonCode.GRAPH_LIMIT, f"{phase.value} graphs of {caps.name!r}")
    if not out and not policy.capture_sizes_for(phase, spec):
        width = tokens_per_request(phase, spec)
        out.append(reason(ReasonCode.GRAPH_LIMIT, "tokens_per_request", width,
                          f"<= max_tokens={policy.max_tokens} at batch size {policy.capture_sizes()[0]}"))
    return out


def plan_phase(phase: Phase, caps: BackendCapabilities | None, spec: SpecConfig,
               platform: Platform, policy: GraphPolicy, context: RequestContext | None = None,
               role: str | None = None, layout: StepLayout = DEFAULT_LAYOUT) -> PhasePlan:
    """The decision for one phase, from that phase's own backend descriptor only (a phase of a
    graph group is joined with the others by :func:`plan`, not here)."""
    if caps is None:
        return _decide(phase, None, spec, platform, policy, role, layout)
    return _resolved(caps, platform, context or _NO_CONTEXT, spec).decide(phase, policy, role, layout)


def _decide(phase: Phase, backend: _Resolved | None, spec: SpecConfig, platform: Platform,
            policy: GraphPolicy, role: str | None, layout: StepLayout = DEFAULT_LAYOUT) -> PhasePlan:
    not_run = not_run_reason(phase, spec, layout)
    if not_run is not None:
        return PhasePlan(runs=False, capture=False, backend=None, reasons=(not_run,))
    if backend is None:
        missing = reason(ReasonCode.NO_BACKEND, "backend", None, f"a backend for {phase.value}")
        return PhasePlan(runs=True, capture=False, backend=None, reasons=(missing,), blocking=True, role=role)
    caps = backend.caps
    cannot = _run_reasons(phase, backend, spec)
    if cannot:
        return _running(caps, role, reasons=tuple(cannot), blocking=True)
    if phase is Phase.PREFILL:
        return _running(caps, role, reasons=(_PREFILL_UNCAPTURED,))
    no_capture = _capture_reasons(phase, caps, spec, platform, policy)
    if no_capture:
        return _running(caps, role, reasons=tuple(no_capture))
    return _running(caps, role, capture=True, capture_sizes=policy.capture_sizes_for(phase, spec),
                    seq_len_fill=caps.fill_for(phase).value(spec, phase))


def _running(caps: BackendCapabilities, role: str | None, *, capture: bool = False, reasons: tuple[Reason, ...] = (),
             blocking: bool = False, capture_sizes: tuple[int, ...] = (),
             seq_len_fill: int | None = None) -> PhasePlan:
    """The decision for a phase that runs, read from the resolved descriptor ``caps`` in ``role``."""
    return PhasePlan(runs=True, capture=capture, backend=caps.name, reasons=reasons, blocking=blocking, role=role,
                     capture_sizes=capture_sizes, seq_len_fill=seq_len_fill, variants=caps.applied)


_DEFAULT_POLICY = GraphPolicy()
_NO_CONTEXT = RequestContext()


def plan(spec: SpecConfig, platform: Platform | str, backends: PhaseBackends,
         policy: GraphPolicy | None = None, context: RequestContext | None = None,
         layout: StepLayout | None = None) -> GraphPlan:
    """Decide, for every phase, whether it runs and whether it is captured as a graph.

    Parameters
    ----------
    spec: the speculative config.
    platform: a :class:`Platform`, or a spec string such as ``"hip:gfx942"`` (parsed
        with :func:`attnhal.platform.as_platform`).
    backends: the backend of each role.
    policy: graph policy (default :class:`GraphPolicy()`).
    context: model and KV-cache facts (page size, kv dtype, model kind, ...); every
        running phase checks its backend against them, and conditional claims
        (variants) resolve against them.
    layout: how the engine's worker lays out a step (default: EAGLE's, draft steps as decodes,
        one graph per phase): with draft steps as extends draft_decode does not run; the phases of
        each graph group get one answer, captured together at the batch sizes all of them
        capture, or all eager with a ``graph_group`` reason naming the phase that is not.

    Never raises for a well-formed input; a phase that runs without a capable
    backend makes the plan invalid (``GraphPlan.valid``), with its reasons.
    Wrong argument types raise ``TypeError`` naming the argument.
    """
    check_type("spec", spec, SpecConfig)
    if not isinstance(platform, (Platform, str)):
        raise TypeError(f"platform={platform!r} (supported: a Platform or a spec string like 'hip:gfx942')")
    platform = as_platform(platform)
    check_type("backends", backends, PhaseBackends)
    policy = policy if policy is not None else _DEFAULT_POLICY
    check_type("policy", policy, GraphPolicy)
    context = context if context is not None else _NO_CONTEXT
    check_type("context", context, RequestContext)
    layout = layout if layout is not None else DEFAULT_LAYOUT
    check_type("layout", layout, StepLayout)
    counts = sorted(set(policy.step_counts or ()) - {spec.num_steps})
    unfit = {n: r for n in counts if (r := _unfit_step_count(spec, n)) is not None}
    adaptive = {n: _plan_once(spec.with_steps(n), platform, backends, policy, context, layout)
                for n in counts if n not in unfit}
    return _plan_once(spec, platform, backends, policy, context, layout, adaptive, unfit)


def _unfit_step_count(spec: SpecConfig, num_steps: int) -> Reason | None:
    """None if ``spec`` can run at ``num_steps`` draft steps, else why not: a tree keeps its
    ``num_draft_tokens``, which must fit the candidates of the smaller tree
    (:func:`~attnhal.spec.draft_tree_tokens`)."""
    k = spec.topk
    if k == 1 or spec.num_draft_tokens <= draft_tree_tokens(num_steps, k):
        return None
    lowest = 1 + -(-(spec.num_draft_tokens - 1 - k) // (k * k))
    return reason(ReasonCode.STEP_COUNT, "step_counts", num_steps,
                  f">= {lowest}: num_draft_tokens={spec.num_draft_tokens} needs topk + (num_steps - 1) * topk^2 + 1 "
                  f">= {spec.num_draft_tokens} with topk={k}")


def _plan_once(spec: SpecConfig, platform: Platform, backends: PhaseBackends, policy: GraphPolicy,
               context: RequestContext, layout: StepLayout, adaptive: Mapping[int, GraphPlan] | None = None,
               unfit_steps: Mapping[int, Reason] | None = None) -> GraphPlan:
    resolved: dict[int, _Resolved] = {}  # each distinct backend looked up once per plan
    phases = {}
    for phase in _PHASES:
        role, caps = backends.role(phase)
        if caps is None:
            phases[phase] = _decide(phase, None, spec, platform, policy, role, layout)
            continue
        backend = resolved.get(id(caps))
        if backend is None:
            backend = resolved[id(caps)] = _resolved(caps, platform, context, spec)
        phases[phase] = backend.decide(phase, policy, role, layout)
    for group in layout.graph_groups:
        phases.update(_join_group(group, phases))
    return GraphPlan(platform=platform.name, spec=spec, policy=policy, phases=phases, context=context,
                     adaptive=adaptive or {}, unfit_steps=unfit_steps or {}, layout=layout)


def _join_group(group: GraphGroup, phases: Mapping[Phase, PhasePlan]) -> dict[Phase, PhasePlan]:
    """The one answer for the running phases of ``group``: captured in one graph at the batch
    sizes every one of them captures, or none captured, each saying which phase is not and why."""
    members = {p: d for p, d in phases.items() if p in group.phases and d.runs}
    sizes = sorted(set.intersection(*(set(d.capture_sizes) for d in members.values()))) if members else []
    eager = next(((p, d) for p, d in members.items() if not d.capture), None)
    if eager is None and sizes:
        return {p: replace(d, graph=group.name, capture_sizes=tuple(sizes)) for p, d in members.items()}
    if eager is not None:
        phase, decision = eager
        why = "; ".join(str(r) for r in decision.reasons) or "not captured"
        said = reason(ReasonCode.GRAPH_GROUP, "graph", group.name,
                      f"a graph whose phases all capture; {phase.value} does not: {why}")
    else:
        said = reason(ReasonCode.GRAPH_GROUP, "graph", group.name,
                      "a graph whose phases share a capture batch size; these share none")
    return {p: replace(d, graph=group.name) if not d.capture else
            replace(d, graph=group.name, capture=False, capture_sizes=(), seq_len_fill=None, reasons=(*d.reasons, said))
            for p, d in members.items()}
