"""The planner: spec config + platform + each phase's backend descriptor -> GraphPlan.

This is the one code path every vendor takes. Each phase's decision reads only
that phase's own backend descriptor and :class:`~attnhal.platform.Platform`
fields; there is no ``isinstance`` and no vendor branch here, so a CUDA and a
HIP platform with a graph API get the same plan for the same descriptors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from attnhal.capabilities import (
    BackendCapabilities,
    Feature,
    Phase,
    Reason,
    ReasonCode,
    fmt_set,
    reason,
)
from attnhal.platform import Platform

__all__ = [
    "GraphPlan",
    "GraphPolicy",
    "PhaseBackends",
    "PhasePlan",
    "SpecAlgorithm",
    "SpecConfig",
    "plan",
]


class SpecAlgorithm(str, Enum):
    NONE = "none"
    EAGLE = "eagle"


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings.

    ``num_draft_tokens`` defaults to ``num_steps + 1`` for a chain (``topk == 1``);
    a tree (``topk > 1``) must give it, at most ``topk * num_steps + 1``.
    """

    algorithm: SpecAlgorithm = SpecAlgorithm.NONE
    num_steps: int = 1
    topk: int = 1
    num_draft_tokens: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithm", SpecAlgorithm(self.algorithm))
        for name in ("num_steps", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} (supported: >= 1)")
        if self.num_draft_tokens == 0:
            if self.topk > 1 and self.speculative:
                raise ValueError(f"num_draft_tokens=0 (supported: 2..{self.max_draft_tokens} "
                                 f"must be given when topk={self.topk} > 1)")
            object.__setattr__(self, "num_draft_tokens", self.num_steps + 1)
        if not 2 <= self.num_draft_tokens <= self.max_draft_tokens:
            raise ValueError(f"num_draft_tokens={self.num_draft_tokens} "
                             f"(supported: 2..{self.max_draft_tokens} for num_steps={self.num_steps}, "
                             f"topk={self.topk})")

    @property
    def speculative(self) -> bool:
        return self.algorithm is not SpecAlgorithm.NONE

    @property
    def max_draft_tokens(self) -> int:
        """The draft tree's size plus the root token."""
        return self.topk * self.num_steps + 1

    @property
    def draft_extend_len(self) -> int:
        """Query tokens per request in draft extend: the accepted tokens, padded."""
        return self.num_steps + 1 if self.topk == 1 else self.num_draft_tokens

    @classmethod
    def eagle(cls, num_steps: int, topk: int = 1, num_draft_tokens: int = 0) -> SpecConfig:
        return cls(SpecAlgorithm.EAGLE, num_steps, topk, num_draft_tokens)


@dataclass(frozen=True)
class GraphPolicy:
    """Whether and at which batch sizes to capture graphs."""

    enabled: bool = True
    max_batch_size: int = 32
    batch_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size} (supported: >= 1)")
        if self.batch_sizes is not None:
            bad = [b for b in self.batch_sizes if b < 1]
            if bad or not self.batch_sizes:
                raise ValueError(f"batch_sizes={list(self.batch_sizes)} (supported: a non-empty list of ints >= 1)")

    def capture_sizes(self) -> tuple[int, ...]:
        """Sorted capture batch sizes: the given list, else 1, 2, 4, 8 then steps of 8 up to max."""
        if self.batch_sizes is not None:
            return tuple(sorted(set(self.batch_sizes)))
        sizes = {b for b in (1, 2, 4) if b <= self.max_batch_size}
        sizes |= set(range(8, self.max_batch_size + 1, 8)) | {self.max_batch_size}
        return tuple(sorted(sizes))


@dataclass(frozen=True)
class PhaseBackends:
    """The descriptor of the backend running each role.

    ``draft_decode`` is the multi-step draft backend; engines have none when
    ``num_steps == 1``. ``draft_extend`` is the draft model's extend backend.
    """

    target: BackendCapabilities | None
    draft_decode: BackendCapabilities | None = None
    draft_extend: BackendCapabilities | None = None

    @classmethod
    def same(cls, caps: BackendCapabilities, spec: SpecConfig | None = None) -> PhaseBackends:
        """One backend for every role (no draft-decode backend when ``num_steps == 1``)."""
        multi = spec is None or spec.num_steps > 1
        return cls(target=caps, draft_decode=caps if multi else None, draft_extend=caps)

    def for_phase(self, phase: Phase) -> BackendCapabilities | None:
        return {
            Phase.PREFILL: self.target,
            Phase.DECODE: self.target,
            Phase.TARGET_VERIFY: self.target,
            Phase.DRAFT_DECODE: self.draft_decode,
            Phase.DRAFT_EXTEND: self.draft_extend,
        }[phase]


@dataclass(frozen=True)
class PhasePlan:
    """The decision for one phase. ``reasons`` say why it does not run or is not captured."""

    runs: bool
    capture: bool
    backend: str | None
    reasons: tuple[Reason, ...] = ()
    #: The phase runs but its backend cannot run it: the plan is invalid.
    blocking: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "capture": self.capture, "backend": self.backend,
                "reasons": [r.to_dict() for r in self.reasons]}


@dataclass(frozen=True)
class GraphPlan:
    """Per phase: does it run, is it captured, which backend, and why not."""

    platform: str
    spec: SpecConfig
    policy: GraphPolicy
    phases: Mapping[Phase, PhasePlan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "phases", MappingProxyType(dict(self.phases)))

    def __getitem__(self, phase: Phase | str) -> PhasePlan:
        return self.phases[Phase(phase)]

    def __iter__(self) -> Iterator[Phase]:
        return iter(self.phases)

    @property
    def valid(self) -> bool:
        """False if a phase that runs has no backend able to run it."""
        return not any(p.blocking for p in self.phases.values())

    @property
    def captured(self) -> tuple[Phase, ...]:
        return tuple(p for p, d in self.phases.items() if d.capture)

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        return self.policy.capture_sizes()

    def with_capture_failure(self, phase: Phase, why: str) -> GraphPlan:
        """This plan with ``phase`` falling back to eager because its capture failed."""
        old = self.phases[phase]
        new = replace(old, capture=False,
                      reasons=(*old.reasons, Reason(ReasonCode.CAPTURE_FAILED, why)))
        return replace(self, phases={**self.phases, phase: new})

    def to_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, "valid": self.valid,
                "phases": {p.value: d.to_dict() for p, d in self.phases.items()}}


# --- the one code path ------------------------------------------------------------

def _runs(phase: Phase, spec: SpecConfig) -> Reason | None:
    """None if ``phase`` runs under ``spec``, else the reason it does not."""
    if phase is Phase.PREFILL:
        return None
    if phase is Phase.DECODE:
        if spec.speculative:
            return reason(ReasonCode.PHASE_NOT_RUN, "algorithm", spec.algorithm,
                          "decode runs without speculation; target_verify replaces it")
        return None
    if not spec.speculative:
        return reason(ReasonCode.PHASE_NOT_RUN, "algorithm", spec.algorithm,
                      f"{phase.value} runs with speculative decoding")
    if phase is Phase.DRAFT_DECODE and spec.num_steps == 1:
        return reason(ReasonCode.PHASE_NOT_RUN, "num_steps", 1,
                      "draft_decode runs when num_steps > 1; the first draft token comes from draft_extend")
    return None


def _required_features(phase: Phase, spec: SpecConfig) -> frozenset[Feature]:
    if phase is Phase.TARGET_VERIFY and spec.topk > 1:
        return frozenset((Feature.CUSTOM_MASK,))
    return frozenset()


def _run_reasons(phase: Phase, caps: BackendCapabilities, spec: SpecConfig,
                 platform: Platform) -> list[Reason]:
    """Why ``caps`` cannot run ``phase`` here (empty: it can)."""
    out = caps.platform_reasons(platform)
    if phase not in caps.phases:
        out.append(reason(ReasonCode.PHASE, "phase", phase,
                          fmt_set(caps.phases)))
    for feature in sorted(_required_features(phase, spec) - caps.features, key=lambda f: f.value):
        out.append(reason(ReasonCode.FEATURE, "feature", feature,
                          fmt_set(caps.features)
                          + f"; needed for {phase.value} with topk={spec.topk}"))
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
    if not platform.has_graph_api:
        return [reason(ReasonCode.NO_GRAPH_API, "platform", platform.spec, "a platform with a graph API")]
    limits = caps.graph_limits(phase)
    if limits is None:
        return [reason(ReasonCode.GRAPH_UNSUPPORTED, "phase", phase,
                       f"{fmt_set(caps.graph)} are capturable with backend {caps.name!r}")]
    return limits.violations(spec, ReasonCode.GRAPH_LIMIT, f"{phase.value} graphs of {caps.name!r}")


def plan_phase(phase: Phase, caps: BackendCapabilities | None, spec: SpecConfig,
               platform: Platform, policy: GraphPolicy) -> PhasePlan:
    """The decision for one phase, from that phase's own backend descriptor only."""
    not_run = _runs(phase, spec)
    name = caps.name if caps is not None else None
    if not_run is not None:
        return PhasePlan(runs=False, capture=False, backend=None, reasons=(not_run,))
    if caps is None:
        missing = reason(ReasonCode.NO_BACKEND, "backend", None, f"a backend for {phase.value}")
        return PhasePlan(runs=True, capture=False, backend=None, reasons=(missing,), blocking=True)
    cannot = _run_reasons(phase, caps, spec, platform)
    if cannot:
        return PhasePlan(runs=True, capture=False, backend=name, reasons=tuple(cannot), blocking=True)
    if phase is Phase.PREFILL:
        why = reason(ReasonCode.GRAPH_UNSUPPORTED, "phase", phase,
                     "decode, draft_decode, draft_extend, target_verify; prefill has a variable token count")
        return PhasePlan(runs=True, capture=False, backend=name, reasons=(why,))
    no_capture = _capture_reasons(phase, caps, spec, platform, policy)
    return PhasePlan(runs=True, capture=not no_capture, backend=name, reasons=tuple(no_capture))


def plan(spec: SpecConfig, platform: Platform, backends: PhaseBackends,
         policy: GraphPolicy | None = None) -> GraphPlan:
    """Decide, for every phase, whether it runs and whether it is captured as a graph.

    Never raises for a well-formed input; a phase that runs without a capable
    backend makes the plan invalid (``GraphPlan.valid``), with its reasons.
    """
    policy = policy or GraphPolicy()
    phases = {phase: plan_phase(phase, backends.for_phase(phase), spec, platform, policy)
              for phase in Phase}
    return GraphPlan(platform=platform.spec, spec=spec, policy=policy, phases=phases)
