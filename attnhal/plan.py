"""The planner: spec config + platform + context + each phase's backend descriptor -> GraphPlan.

This is the one code path every vendor takes. Each phase's decision reads only
that phase's own backend descriptor — resolved once against the plan's
:class:`~attnhal.capabilities.Facts` (platform, request/model context, spec
config) — and :class:`~attnhal.platform.Platform` fields; there is no
``isinstance`` and no vendor branch here, so a CUDA and a HIP platform with a
graph API get the same plan for the same vendor-independent descriptors.
Which phases run is data: :data:`ALGORITHM_PHASES`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from attnhal.capabilities import (
    AttentionRequest,
    BackendCapabilities,
    Facts,
    Feature,
    Phase,
    Reason,
    ReasonCode,
    fmt_set,
    reason,
    request_reasons,
    tokens_per_request,
)
from attnhal.platform import Platform, current
from attnhal.spec import (
    MAX_NUM_STEPS,
    ModelKind,
    RequestContext,
    SpecAlgorithm,
    SpecConfig,
    check_int,
)

__all__ = [
    "ALGORITHM_PHASES",
    "MAX_BATCH_SIZE",
    "AttentionMode",
    "GraphPlan",
    "GraphPolicy",
    "ModelKind",
    "PhaseBackends",
    "PhasePlan",
    "RequestContext",
    "SpecAlgorithm",
    "SpecConfig",
    "plan",
]

_SPEC_PHASES = frozenset((Phase.PREFILL, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE, Phase.TARGET_VERIFY))

#: The phases each algorithm runs (draft_decode besides only when num_steps > 1).
#: A new algorithm is a new row, never a new branch in the planner.
ALGORITHM_PHASES: Mapping[SpecAlgorithm, frozenset[Phase]] = MappingProxyType({
    SpecAlgorithm.NONE: frozenset((Phase.PREFILL, Phase.DECODE)),
    SpecAlgorithm.EAGLE: _SPEC_PHASES,
    SpecAlgorithm.EAGLE3: _SPEC_PHASES,
    SpecAlgorithm.MTP: _SPEC_PHASES,
    SpecAlgorithm.STANDALONE: _SPEC_PHASES,
    SpecAlgorithm.NGRAM: frozenset((Phase.PREFILL, Phase.TARGET_VERIFY)),
})

#: Bounds of the graph policy: capture sizes size static buffers.
MAX_BATCH_SIZE = 4096
MAX_CAPTURE_SIZES = 256
MAX_STEP_COUNTS = 16


class AttentionMode(str, Enum):
    """Which target backend target_verify (and, in :meth:`PhaseBackends.split`, draft_extend)
    runs on — SGLang's ``speculative_attention_mode``."""

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class GraphPolicy:
    """Whether, for which phases, at which batch sizes and step counts to capture graphs.

    Attributes
    ----------
    enabled: graphs at all.
    max_batch_size: largest capture batch size (1..4096).
    batch_sizes: explicit capture batch sizes (at most 256, each 1..4096), else derived from max.
    disabled_phases: phases never captured (an engine's per-phase switch), each with a reason.
    step_counts: adaptive speculation: the other ``num_steps`` values the engine may switch
        to; the plan is valid only if it is valid at each (at most 16, each 1..64).
    max_tokens: capture sizes from the spec width: a phase captures only batch sizes ``b``
        with ``b * tokens_per_request(phase) <= max_tokens`` (None: every size).
    """

    enabled: bool = True
    max_batch_size: int = 32
    batch_sizes: tuple[int, ...] | None = None
    disabled_phases: frozenset[Phase] = frozenset()
    step_counts: tuple[int, ...] | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"enabled={self.enabled!r} (supported: True or False)")
        check_int("max_batch_size", self.max_batch_size, 1, MAX_BATCH_SIZE)
        if self.batch_sizes is not None:
            object.__setattr__(self, "batch_sizes", _int_tuple("batch_sizes", self.batch_sizes, MAX_BATCH_SIZE,
                                                               MAX_CAPTURE_SIZES))
        object.__setattr__(self, "disabled_phases", frozenset(_phase(p) for p in self.disabled_phases))
        if self.step_counts is not None:
            object.__setattr__(self, "step_counts", _int_tuple("step_counts", self.step_counts, MAX_NUM_STEPS,
                                                               MAX_STEP_COUNTS))
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, 1, MAX_BATCH_SIZE * 1024)

    def capture_sizes(self) -> tuple[int, ...]:
        """Sorted capture batch sizes: the given list, else 1, 2, 4, 8 then steps of 8 up to max."""
        return self._sizes

    @functools.cached_property
    def _sizes(self) -> tuple[int, ...]:
        if self.batch_sizes is not None:
            return tuple(sorted(set(self.batch_sizes)))
        sizes = {b for b in (1, 2, 4) if b <= self.max_batch_size}
        sizes |= set(range(8, self.max_batch_size + 1, 8)) | {self.max_batch_size}
        return tuple(sorted(sizes))

    def capture_sizes_for(self, phase: Phase, spec: SpecConfig) -> tuple[int, ...]:
        """The capture sizes of ``phase``: :meth:`capture_sizes`, cut by ``max_tokens`` if given."""
        sizes = self.capture_sizes()
        if self.max_tokens is None:
            return sizes
        width = max(tokens_per_request(phase, spec), 1)
        return tuple(b for b in sizes if b * width <= self.max_tokens)


def _int_tuple(name: str, values: Iterable[int], maximum: int, max_len: int) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name}={values!r} (supported: a list of ints)")
    out = tuple(values)
    if not out or len(out) > max_len:
        raise ValueError(f"{name} has {len(out)} values (supported: 1..{max_len})")
    for v in out:
        check_int(name, v, 1, maximum)
    return out


def _phase(value: object) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        raise ValueError(f"phase={value!r} (supported: {', '.join(p.value for p in Phase)})") from None


#: The target phase whose backend target_verify follows in each mode.
_FOLLOWS = {AttentionMode.PREFILL: Phase.PREFILL, AttentionMode.DECODE: Phase.DECODE}
_ROLES = ("target", "draft_decode", "draft_extend", "prefill", "decode", "target_verify")


@dataclass(frozen=True)
class PhaseBackends:
    """The descriptor of the backend running each role.

    ``target`` serves prefill, decode and target_verify unless ``prefill`` /
    ``decode`` / ``target_verify`` name their own. Without an explicit
    ``target_verify``, verification runs on the prefill or the decode backend as
    ``speculative_attention_mode`` says (engines split prefill and decode
    backends). ``draft_decode`` is the multi-step draft backend; engines have
    none when ``num_steps == 1``. ``draft_extend`` is the draft model's extend
    backend. A role left ``None`` is never skipped: a phase that runs without a
    backend makes the plan invalid.
    """

    target: BackendCapabilities | None
    draft_decode: BackendCapabilities | None = None
    draft_extend: BackendCapabilities | None = None
    prefill: BackendCapabilities | None = None
    decode: BackendCapabilities | None = None
    target_verify: BackendCapabilities | None = None
    speculative_attention_mode: AttentionMode = AttentionMode.PREFILL

    def __post_init__(self) -> None:
        for name in _ROLES:
            value = getattr(self, name)
            if value is not None and not isinstance(value, BackendCapabilities):
                raise TypeError(f"{name}={value!r} (supported: a BackendCapabilities or None; "
                                "a registered name resolves through default_registry().get(name).capabilities)")
        try:
            object.__setattr__(self, "speculative_attention_mode", AttentionMode(self.speculative_attention_mode))
        except ValueError:
            raise ValueError(f"speculative_attention_mode={self.speculative_attention_mode!r} "
                             f"(supported: prefill, decode)") from None

    @classmethod
    def same(cls, caps: BackendCapabilities, spec: SpecConfig | None = None) -> PhaseBackends:
        """One backend for every role (no draft-decode backend when ``num_steps == 1``)."""
        _check_type("caps", caps, BackendCapabilities)
        if spec is not None:
            _check_type("spec", spec, SpecConfig)
        multi = spec is None or spec.num_steps > 1
        return cls(target=caps, draft_decode=caps if multi else None, draft_extend=caps)

    @classmethod
    def split(cls, prefill: BackendCapabilities, decode: BackendCapabilities, spec: SpecConfig | None = None,
              mode: AttentionMode | str = AttentionMode.PREFILL) -> PhaseBackends:
        """Separate prefill and decode backends, the draft model on the same ones: target_verify
        and draft_extend follow ``mode``; the multi-step draft runs on the decode backend."""
        if spec is not None:
            _check_type("spec", spec, SpecConfig)
        mode = AttentionMode(mode)
        follow = prefill if mode is AttentionMode.PREFILL else decode
        multi = spec is None or spec.num_steps > 1
        return cls(target=None, prefill=prefill, decode=decode, draft_extend=follow,
                   draft_decode=decode if multi else None, speculative_attention_mode=mode)

    def role(self, phase: Phase) -> tuple[str, BackendCapabilities | None]:
        """The role that runs ``phase`` and its backend."""
        if phase is Phase.PREFILL:
            return "prefill", self.prefill or self.target
        if phase is Phase.DECODE:
            return "decode", self.decode or self.target
        if phase is Phase.TARGET_VERIFY:
            if self.target_verify is not None:
                return "target_verify", self.target_verify
            return self.role(_FOLLOWS[self.speculative_attention_mode])
        return phase.value, getattr(self, phase.value)

    def for_phase(self, phase: Phase) -> BackendCapabilities | None:
        return self.role(phase)[1]


def _check_type(name: str, value: object, kind: type) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{name}={value!r} (supported: a {kind.__name__})")


@dataclass(frozen=True)
class PhasePlan:
    """The decision for one phase. ``reasons`` say why it does not run or is not captured.

    ``role`` names the role whose backend was read; ``capture_sizes`` and
    ``seq_len_fill`` are set for a captured phase; ``variants`` lists the notes of
    the backend's conditional claims that applied.
    """

    runs: bool
    capture: bool
    backend: str | None
    reasons: tuple[Reason, ...] = ()
    #: The phase runs but its backend cannot run it: the plan is invalid.
    blocking: bool = False
    role: str | None = None
    capture_sizes: tuple[int, ...] = ()
    seq_len_fill: int | None = None
    variants: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "capture": self.capture, "backend": self.backend,
                "reasons": [r.to_dict() for r in self.reasons], "role": self.role,
                "capture_sizes": list(self.capture_sizes), "seq_len_fill": self.seq_len_fill,
                "variants": list(self.variants)}


@dataclass(frozen=True)
class GraphPlan:
    """Per phase: does it run, is it captured, which backend, and why not.

    With adaptive step counts (``GraphPolicy.step_counts``), ``adaptive`` holds
    the plan at each other step count; the plan is valid only if all are.
    ``unfit_steps`` holds the step counts the spec config cannot take at all (a
    tree whose ``num_draft_tokens`` exceeds ``topk * num_steps + 1``), each with
    its ``step_count`` reason; any makes the plan invalid.
    """

    platform: str
    spec: SpecConfig
    policy: GraphPolicy
    phases: Mapping[Phase, PhasePlan] = field(default_factory=dict)
    context: RequestContext = RequestContext()
    adaptive: Mapping[int, GraphPlan] = field(default_factory=dict)
    unfit_steps: Mapping[int, Reason] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "phases", MappingProxyType(dict(self.phases)))
        object.__setattr__(self, "adaptive", MappingProxyType(dict(self.adaptive)))
        object.__setattr__(self, "unfit_steps", MappingProxyType(dict(self.unfit_steps)))

    def __getitem__(self, phase: Phase | str) -> PhasePlan:
        return self.phases[Phase(phase)]

    def __iter__(self) -> Iterator[Phase]:
        return iter(self.phases)

    @property
    def valid(self) -> bool:
        """False if a phase that runs has no backend able to run it (at any planned step count),
        or if a planned step count does not fit the spec config."""
        return (not self.unfit_steps and not any(p.blocking for p in self.phases.values())
                and all(a.valid for a in self.adaptive.values()))

    @property
    def captured(self) -> tuple[Phase, ...]:
        return tuple(p for p, d in self.phases.items() if d.capture)

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        """The policy's capture sizes; each captured phase captures its own
        ``PhasePlan.capture_sizes`` (a subset, with ``GraphPolicy.max_tokens``)."""
        return self.policy.capture_sizes()

    def captured_steps(self, phase: Phase | str) -> tuple[int, ...]:
        """The step counts (this plan's and the adaptive ones) at which ``phase`` is captured."""
        plans = {self.spec.num_steps: self, **self.adaptive}
        return tuple(sorted(n for n, p in plans.items() if p[phase].capture))

    def with_capture_failure(self, phase: Phase, why: str) -> GraphPlan:
        """This plan with ``phase`` falling back to eager because its capture failed."""
        old = self.phases[phase]
        new = replace(old, capture=False,
                      reasons=(*old.reasons, Reason(ReasonCode.CAPTURE_FAILED, why)))
        return replace(self, phases={**self.phases, phase: new})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"platform": self.platform, "valid": self.valid,
                               "phases": {p.value: d.to_dict() for p, d in self.phases.items()}}
        given = {k: getattr(v, "value", v) for k, v in vars(self.context).items() if v is not None}
        if given:
            out["context"] = given
        if self.adaptive or self.unfit_steps:
            steps: dict[int, dict[str, Any]] = {
                n: {"valid": p.valid, "captured": [ph.value for ph in p.captured]} for n, p in self.adaptive.items()}
            steps.update({n: {"valid": False, "captured": [], "reasons": [r.to_dict()]}
                          for n, r in self.unfit_steps.items()})
            out["adaptive"] = {str(n): steps[n] for n in sorted(steps)}
        return out


# --- the one code path ------------------------------------------------------------

# The fixed reasons, built once rather than in every plan.
_NOT_RUN = {(phase, algorithm): reason(
    ReasonCode.PHASE_NOT_RUN, "algorithm", algorithm, f"{phase.value} runs with algorithm in "
    f"{fmt_set(a for a, phases in ALGORITHM_PHASES.items() if phase in phases)}")
    for phase in Phase for algorithm in SpecAlgorithm if phase not in ALGORITHM_PHASES[algorithm]}
_ONE_STEP = reason(ReasonCode.PHASE_NOT_RUN, "num_steps", 1,
                   "draft_decode runs when num_steps > 1; the first draft token comes from draft_extend")
_PREFILL_UNCAPTURED = reason(ReasonCode.GRAPH_UNSUPPORTED, "phase", Phase.PREFILL,
                             "decode, draft_decode, draft_extend, target_verify; prefill has a variable token count")
_PHASES = tuple(Phase)


def _runs(phase: Phase, spec: SpecConfig) -> Reason | None:
    """None if ``phase`` runs under ``spec``, else the reason it does not."""
    not_run = _NOT_RUN.get((phase, spec.algorithm))
    if not_run is not None:
        return not_run
    if phase is Phase.DRAFT_DECODE and spec.num_steps == 1:
        return _ONE_STEP
    return None


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
    decisions: dict[tuple[Phase, GraphPolicy, str | None], PhasePlan] = field(default_factory=dict, repr=False)

    def decide(self, phase: Phase, policy: GraphPolicy, role: str | None) -> PhasePlan:
        """The decision for ``phase`` run by this backend in ``role`` under ``policy``."""
        key = (phase, policy, role)
        decision = self.decisions.get(key)
        if decision is None:
            decision = self.decisions[key] = _decide(phase, self, self.spec, self.platform, policy, role)
        return decision


@functools.lru_cache(maxsize=512)
def _resolved(caps: BackendCapabilities, platform: Platform, context: RequestContext, spec: SpecConfig) -> _Resolved:
    """``caps`` resolved against the facts of one plan (the cached unit; see :class:`_Resolved`)."""
    caps = caps.resolve(Facts.of(platform, context, spec))
    request = AttentionRequest(dtype=context.dtype, kv_dtype=context.kv_dtype, head_size=context.head_size,
                               page_size=context.page_size, model=context.model)
    return _Resolved(caps, platform, spec, tuple(caps.platform_reasons(platform)),
                     tuple(request_reasons(caps, request)))


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
        return [reason(ReasonCode.GRAPHS_DISABLED, "graphs", "disabled", "enabled; disabled by policy")]
    if phase in policy.disabled_phases:
        return [reason(ReasonCode.GRAPHS_DISABLED, "phase", phase,
                       f"captured phases outside disabled_phases={fmt_set(policy.disabled_phases)}")]
    if not platform.has_graph_api:
        return [reason(ReasonCode.NO_GRAPH_API, "platform", platform.spec, "a platform with a graph API")]
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
               role: str | None = None) -> PhasePlan:
    """The decision for one phase, from that phase's own backend descriptor only."""
    if caps is None:
        return _decide(phase, None, spec, platform, policy, role)
    return _resolved(caps, platform, context or _NO_CONTEXT, spec).decide(phase, policy, role)


def _decide(phase: Phase, backend: _Resolved | None, spec: SpecConfig, platform: Platform,
            policy: GraphPolicy, role: str | None) -> PhasePlan:
    not_run = _runs(phase, spec)
    if not_run is not None:
        return PhasePlan(runs=False, capture=False, backend=None, reasons=(not_run,))
    if backend is None:
        missing = reason(ReasonCode.NO_BACKEND, "backend", None, f"a backend for {phase.value}")
        return PhasePlan(runs=True, capture=False, backend=None, reasons=(missing,), blocking=True, role=role)
    caps = backend.caps
    common = dict(backend=caps.name, role=role, variants=caps.applied)
    cannot = _run_reasons(phase, backend, spec)
    if cannot:
        return PhasePlan(runs=True, capture=False, reasons=tuple(cannot), blocking=True, **common)  # type: ignore[arg-type]
    if phase is Phase.PREFILL:
        return PhasePlan(runs=True, capture=False, reasons=(_PREFILL_UNCAPTURED,), **common)  # type: ignore[arg-type]
    no_capture = _capture_reasons(phase, caps, spec, platform, policy)
    if no_capture:
        return PhasePlan(runs=True, capture=False, reasons=tuple(no_capture), **common)  # type: ignore[arg-type]
    return PhasePlan(runs=True, capture=True, capture_sizes=policy.capture_sizes_for(phase, spec),
                     seq_len_fill=caps.fill_for(phase).value(spec, phase), **common)  # type: ignore[arg-type]


_DEFAULT_POLICY = GraphPolicy()
_NO_CONTEXT = RequestContext()


def plan(spec: SpecConfig, platform: Platform | str, backends: PhaseBackends,
         policy: GraphPolicy | None = None, context: RequestContext | None = None) -> GraphPlan:
    """Decide, for every phase, whether it runs and whether it is captured as a graph.

    Parameters
    ----------
    spec: the speculative config.
    platform: a :class:`Platform`, or a spec string such as ``"hip:gfx942"`` (parsed
        with :func:`attnhal.platform.current`).
    backends: the backend of each role.
    policy: graph policy (default :class:`GraphPolicy()`).
    context: model and KV-cache facts (page size, kv dtype, model kind, ...); every
        running phase checks its backend against them, and conditional claims
        (variants) resolve against them.

    Never raises for a well-formed input; a phase that runs without a capable
    backend makes the plan invalid (``GraphPlan.valid``), with its reasons.
    Wrong argument types raise ``TypeError`` naming the argument.
    """
    _check_type("spec", spec, SpecConfig)
    if not isinstance(platform, (Platform, str)):
        raise TypeError(f"platform={platform!r} (supported: a Platform or a spec string like 'hip:gfx942')")
    platform = current(platform)
    _check_type("backends", backends, PhaseBackends)
    policy = policy if policy is not None else _DEFAULT_POLICY
    _check_type("policy", policy, GraphPolicy)
    context = context if context is not None else _NO_CONTEXT
    _check_type("context", context, RequestContext)
    counts = sorted(set(policy.step_counts or ()) - {spec.num_steps})
    unfit = {n: r for n in counts if (r := _unfit_step_count(spec, n)) is not None}
    adaptive = {n: _plan_once(spec.with_steps(n), platform, backends, policy, context)
                for n in counts if n not in unfit}
    return _plan_once(spec, platform, backends, policy, context, adaptive, unfit)


def _unfit_step_count(spec: SpecConfig, num_steps: int) -> Reason | None:
    """None if ``spec`` can run at ``num_steps`` draft steps, else why not: a tree keeps its
    ``num_draft_tokens``, which must fit the ``topk * num_steps + 1`` tokens of the smaller tree."""
    fits = spec.topk * num_steps + 1
    if spec.topk == 1 or spec.num_draft_tokens <= fits:
        return None
    lowest = -(-(spec.num_draft_tokens - 1) // spec.topk)
    return reason(ReasonCode.STEP_COUNT, "step_counts", num_steps,
                  f">= {lowest}: num_draft_tokens={spec.num_draft_tokens} needs topk * num_steps + 1 "
                  f">= {spec.num_draft_tokens} with topk={spec.topk}")


def _plan_once(spec: SpecConfig, platform: Platform, backends: PhaseBackends, policy: GraphPolicy,
               context: RequestContext, adaptive: Mapping[int, GraphPlan] | None = None,
               unfit_steps: Mapping[int, Reason] | None = None) -> GraphPlan:
    resolved: dict[int, _Resolved] = {}  # each distinct backend looked up once per plan
    phases = {}
    for phase in _PHASES:
        role, caps = backends.role(phase)
        if caps is None:
            phases[phase] = _decide(phase, None, spec, platform, policy, role)
            continue
        backend = resolved.get(id(caps))
        if backend is None:
            backend = resolved[id(caps)] = _resolved(caps, platform, context, spec)
        phases[phase] = backend.decide(phase, policy, role)
    return GraphPlan(platform=platform.spec, spec=spec, policy=policy, phases=phases, context=context,
                     adaptive=adaptive or {}, unfit_steps=unfit_steps or {})
