"""Capability descriptors: what a backend can do, as one frozen record.

A backend's :class:`BackendCapabilities` says which phases it runs, which it can
capture as a graph and under which speculative limits, whether it can serve as
a multi-step draft backend, and which dtypes / head sizes / page sizes /
features it supports. :func:`not_supported_reasons` turns a request and a
platform into a list of :class:`Reason` — an empty list means "supported".

Every "no" carries a stable :class:`ReasonCode` and a message written as
``field=value (supported: ...)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attnhal.platform import Platform, Vendor, arch_at_least

if TYPE_CHECKING:
    from attnhal.plan import SpecConfig

__all__ = [
    "DTYPES",
    "KV_DTYPES",
    "AttentionRequest",
    "BackendCapabilities",
    "Feature",
    "FillTerm",
    "Phase",
    "Reason",
    "ReasonCode",
    "SeqLenFill",
    "SpecLimits",
    "Tolerance",
    "not_supported_reasons",
]


class Phase(str, Enum):
    """The attention phases of one speculative-decoding step (see DESIGN.md)."""

    PREFILL = "prefill"
    DECODE = "decode"
    DRAFT_DECODE = "draft_decode"
    DRAFT_EXTEND = "draft_extend"
    TARGET_VERIFY = "target_verify"


#: Phases a graph may be captured for; prefill has a variable token count.
GRAPH_PHASES = (Phase.DECODE, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)

#: Compute dtypes by their torch names (``torch.float16`` -> ``"float16"``).
DTYPES = ("float32", "float16", "bfloat16")
#: KV-cache dtypes; ``fp8_e4m3`` resolves to the platform's :class:`~attnhal.platform.Fp8Flavor`.
KV_DTYPES = (*DTYPES, "fp8_e4m3", "fp8_e5m2")


class Feature(str, Enum):
    CUSTOM_MASK = "custom_mask"  # tree mask for target_verify with topk > 1
    SLIDING_WINDOW = "sliding_window"
    LOGIT_SOFTCAP = "logit_softcap"
    SINKS = "sinks"
    MLA = "mla"


class ReasonCode(str, Enum):
    """Stable codes for every "no" attnhal gives; tools may act on them."""

    VENDOR = "vendor"
    ARCH = "arch"
    PHASE = "phase"
    DTYPE = "dtype"
    KV_DTYPE = "kv_dtype"
    HEAD_SIZE = "head_size"
    PAGE_SIZE = "page_size"
    HEAD_RATIO = "head_ratio"
    FEATURE = "feature"
    MODULE_MISSING = "module_missing"
    LOAD_ERROR = "load_error"
    RUNTIME = "runtime"
    NO_BACKEND = "no_backend"
    MULTI_STEP = "multi_step"
    SPEC_LIMIT = "spec_limit"
    PHASE_NOT_RUN = "phase_not_run"
    GRAPH_UNSUPPORTED = "graph_unsupported"
    GRAPH_LIMIT = "graph_limit"
    GRAPHS_DISABLED = "graphs_disabled"
    NO_GRAPH_API = "no_graph_api"
    CAPTURE_FAILED = "capture_failed"
    NOT_SELECTED = "not_selected"


@dataclass(frozen=True)
class Reason:
    """One reason something is not supported: a stable code and a factual message."""

    code: ReasonCode
    message: str

    def __str__(self) -> str:
        return f"[{self.code.value}] {self.message}"

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message}


def fmt_set(values: Iterable[object]) -> str:
    """``{a, b}`` with numbers in numeric order; ``none`` for an empty set."""
    items = sorted((getattr(v, "value", v) for v in values), key=lambda x: (isinstance(x, str), x))
    return "{" + ", ".join(str(i) for i in items) + "}" if items else "none"


def reason(code: ReasonCode, name: str, value: object, supported: str) -> Reason:
    """``name=value (supported: ...)`` — the one message format of attnhal."""
    shown = getattr(value, "value", value)
    return Reason(code, f"{name}={shown} (supported: {supported})")


@dataclass(frozen=True)
class SpecLimits:
    """Speculative-decoding limits under which a claim (graph capture, multi-step) holds.

    ``None`` means unlimited. An empty ``SpecLimits()`` holds whenever the phase runs.
    New limits are new fields here; :meth:`violations` picks them up by name.
    """

    max_topk: int | None = None
    max_num_steps: int | None = None
    max_draft_tokens: int | None = None

    def violations(self, spec: SpecConfig, code: ReasonCode, what: str) -> list[Reason]:
        """Reasons ``spec`` breaks these limits; ``what`` names the claim (e.g. "graph draft_extend")."""
        actual = {"max_topk": spec.topk, "max_num_steps": spec.num_steps,
                  "max_draft_tokens": spec.num_draft_tokens}
        out = []
        for f in fields(self):
            limit = getattr(self, f.name)
            value = actual[f.name]
            if limit is not None and value > limit:
                name = f.name.removeprefix("max_")
                out.append(reason(code, name, value, f"<= {limit} for {what}"))
        return out

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


class FillTerm(str, Enum):
    """A spec-config quantity added to the graph seq-len fill value."""

    NONE = "none"
    NUM_DRAFT_TOKENS = "num_draft_tokens"
    NUM_STEPS = "num_steps"


@dataclass(frozen=True)
class SeqLenFill:
    """The seq len written into padded rows of a captured batch: ``base`` (+ a spec term)."""

    base: int = 1
    plus: FillTerm = FillTerm.NONE

    def value(self, spec: SpecConfig | None) -> int:
        if spec is None or self.plus is FillTerm.NONE:
            return self.base
        return self.base + (spec.num_draft_tokens if self.plus is FillTerm.NUM_DRAFT_TOKENS else spec.num_steps)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


_DEFAULT_TOLERANCES = MappingProxyType({
    "float32": Tolerance(1e-4, 1e-4),
    "float16": Tolerance(2e-3, 2e-3),
    "bfloat16": Tolerance(1.6e-2, 1.6e-2),
})


def _frozen(items: Iterable[Any]) -> frozenset[Any]:
    return frozenset(items)


@dataclass(frozen=True)
class BackendCapabilities:
    """The descriptor of one attention backend.

    Attributes
    ----------
    name: registry name (``"torch"``, ``"triton"``, ...).
    vendors: vendors it runs on.
    min_arch: minimum arch per vendor, in that vendor's notation (``{CUDA: "sm80", HIP: "gfx90a"}``).
    phases: phases it can run.
    graph: per phase, the limits under which that phase can be captured as a graph;
        a phase absent here is never captured.
    multi_step: limits under which it can run the multi-step draft (draft_decode
        through :class:`~attnhal.backend.MultiStepDraft`); ``None`` = cannot.
    dtypes, kv_dtypes: compute and KV-cache dtypes by name (see :data:`DTYPES`, :data:`KV_DTYPES`).
    head_sizes, page_sizes: supported values.
    features: optional attention features.
    seq_len_fill: the seq len written into padded rows of a captured batch.
    needs_host_seq_lens: whether replay metadata needs a host copy of seq lens.
    tolerances: per-dtype (atol, rtol) against the torch reference; the conformance kit uses these.
        Keys are compute dtypes, and optionally KV dtypes (``fp8_e4m3``...): a forward over
        such a cache is held to the looser of the two (:meth:`tolerance_for`).
    requires: Python modules that must be importable for the backend to load.
    """

    name: str
    vendors: frozenset[Vendor]
    phases: frozenset[Phase]
    graph: Mapping[Phase, SpecLimits] = field(default_factory=dict)
    multi_step: SpecLimits | None = None
    min_arch: Mapping[Vendor, str] = field(default_factory=dict)
    dtypes: frozenset[str] = frozenset(("float16", "bfloat16", "float32"))
    kv_dtypes: frozenset[str] | None = None
    head_sizes: frozenset[int] = frozenset((64, 128, 256))
    page_sizes: frozenset[int] = frozenset((1,))
    features: frozenset[Feature] = frozenset()
    seq_len_fill: SeqLenFill = SeqLenFill()
    needs_host_seq_lens: bool = False
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Normalize so that equal descriptors compare equal and hash, whatever was passed.
        set_ = object.__setattr__
        set_(self, "vendors", _frozen(Vendor(v) for v in self.vendors))
        set_(self, "phases", _frozen(Phase(p) for p in self.phases))
        set_(self, "graph", MappingProxyType({Phase(p): lim for p, lim in self.graph.items()}))
        set_(self, "min_arch", MappingProxyType({Vendor(v): a for v, a in self.min_arch.items()}))
        set_(self, "dtypes", _frozen(self.dtypes))
        set_(self, "kv_dtypes", _frozen(self.kv_dtypes if self.kv_dtypes is not None else self.dtypes))
        set_(self, "head_sizes", _frozen(self.head_sizes))
        set_(self, "page_sizes", _frozen(self.page_sizes))
        set_(self, "features", _frozen(Feature(f) for f in self.features))
        given = {d: t if isinstance(t, Tolerance) else Tolerance(*t) for d, t in self.tolerances.items()}
        set_(self, "tolerances", MappingProxyType({**_DEFAULT_TOLERANCES, **given}))
        set_(self, "requires", tuple(self.requires))
        _validate(self)

    def __hash__(self) -> int:
        return hash((self.name, self.vendors, self.phases, tuple(sorted(self.graph.items()))))

    def tolerance(self, dtype: str) -> Tolerance:
        return self.tolerances[dtype]

    def tolerance_for(self, dtype: str, kv_dtype: str | None = None) -> Tolerance:
        """The tolerance of compute ``dtype`` over a ``kv_dtype`` cache: the looser of the
        two declared ones (the compute dtype's when ``kv_dtype`` declares none)."""
        tol, kv = self.tolerances[dtype], self.tolerances.get(kv_dtype or dtype)
        return tol if kv is None else Tolerance(max(tol.atol, kv.atol), max(tol.rtol, kv.rtol))

    def graph_limits(self, phase: Phase) -> SpecLimits | None:
        """Limits under which ``phase`` is capturable, or None if it never is."""
        return self.graph.get(phase)

    def platform_reasons(self, platform: Platform) -> list[Reason]:
        """Why this backend cannot run on ``platform`` at all (vendor, arch)."""
        if platform.vendor not in self.vendors:
            return [reason(ReasonCode.VENDOR, "vendor", platform.vendor, fmt_set(self.vendors))]
        minimum = self.min_arch.get(platform.vendor)
        if minimum is not None and not arch_at_least(platform.vendor, platform.arch, minimum):
            return [reason(ReasonCode.ARCH, "arch", platform.arch, f">= {minimum}")]
        return []


def _validate(caps: BackendCapabilities) -> None:
    errors = []
    if not caps.name:
        errors.append("name='' (supported: a non-empty string)")
    not_run = [p.value for p in caps.graph if p not in caps.phases]
    if not_run:
        errors.append(f"graph={not_run} (supported: phases listed in phases={fmt_set(caps.phases)})")
    if Phase.PREFILL in caps.graph:
        errors.append(f"graph=prefill (supported: {fmt_set(GRAPH_PHASES)}; prefill has a variable token count)")
    for name, allowed in (("dtypes", DTYPES), ("kv_dtypes", KV_DTYPES)):
        bad = sorted(set(getattr(caps, name)) - set(allowed))
        if bad:
            errors.append(f"{name}={bad} (supported: {fmt_set(allowed)})")
    bad_tol = sorted(set(caps.tolerances) - set(KV_DTYPES))
    if bad_tol:
        errors.append(f"tolerances={bad_tol} (supported: {fmt_set(KV_DTYPES)})")
    for name in ("head_sizes", "page_sizes"):
        bad_int = sorted(v for v in getattr(caps, name) if not isinstance(v, int) or v < 1)
        if bad_int:
            errors.append(f"{name}={bad_int} (supported: positive integers)")
    for vendor, arch in caps.min_arch.items():
        try:
            arch_at_least(vendor, arch, arch)
        except ValueError as exc:
            errors.append(f"min_arch.{vendor.value}: {exc}")
    if errors:
        raise ValueError(f"backend {caps.name!r}: " + "; ".join(errors))


@dataclass(frozen=True)
class AttentionRequest:
    """What an engine asks of a backend; ``None`` fields are not checked."""

    phase: Phase | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    head_size: int | None = None
    page_size: int | None = None
    num_q_heads: int | None = None
    num_kv_heads: int | None = None
    features: frozenset[Feature] = frozenset()


def not_supported_reasons(
    caps: BackendCapabilities, request: AttentionRequest, platform: Platform
) -> list[Reason]:
    """Every reason ``caps`` cannot serve ``request`` on ``platform``; empty means supported."""
    out = caps.platform_reasons(platform)
    checks: list[tuple[ReasonCode, str, object, Iterable[object]]] = [
        (ReasonCode.PHASE, "phase", request.phase, caps.phases),
        (ReasonCode.DTYPE, "dtype", request.dtype, caps.dtypes),
        (ReasonCode.KV_DTYPE, "kv_dtype", request.kv_dtype, caps.kv_dtypes or ()),
        (ReasonCode.HEAD_SIZE, "head_size", request.head_size, caps.head_sizes),
        (ReasonCode.PAGE_SIZE, "page_size", request.page_size, caps.page_sizes),
    ]
    for code, name, value, allowed in checks:
        if value is not None and value not in allowed:
            out.append(reason(code, name, value, fmt_set(allowed)))
    for feature in sorted(request.features - caps.features, key=lambda f: f.value):
        out.append(reason(ReasonCode.FEATURE, "feature", feature, fmt_set(caps.features)))
    q, kv = request.num_q_heads, request.num_kv_heads
    if q is not None and kv is not None and (kv < 1 or q % kv):
        out.append(reason(ReasonCode.HEAD_RATIO, "num_q_heads/num_kv_heads", f"{q}/{kv}",
                          "num_kv_heads >= 1 dividing num_q_heads"))
    return out
