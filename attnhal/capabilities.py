"""Capability descriptors: what a backend can do, as one frozen record.

A backend's :class:`BackendCapabilities` says which phases it runs, which it can
capture as a graph and under which speculative limits, which speculative
settings it can run at all (run limits), whether it can serve as a multi-step
draft backend, and which archs / model kinds / dtypes / head sizes / page sizes
/ features it supports. :func:`not_supported_reasons` turns a request and a
platform into a list of :class:`Reason` — an empty list means "supported".

Claims that hold only under conditions are **variants**: ordered
``(when, changes)`` pairs. :meth:`BackendCapabilities.resolve` applies the
variants whose :class:`When` matches the :class:`Facts` of one plan (platform,
model, KV cache, spec config) and returns a plain descriptor; this is the one
place conditions are evaluated. The planner reads only resolved descriptors.

Every "no" carries a stable :class:`ReasonCode` and a message written as
``field=value (supported: ...)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from attnhal.platform import ArchSet, Fp8Flavor, Platform, PlatformSpecError, Vendor, arch_at_least, arch_sets
from attnhal.spec import DTYPES, KV_DTYPES, ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__all__ = [
    "DTYPES",
    "GRAPH_PHASES",
    "KV_DTYPES",
    "AttentionRequest",
    "BackendCapabilities",
    "Facts",
    "Feature",
    "FillTerm",
    "IntSet",
    "Phase",
    "Reason",
    "ReasonCode",
    "SeqLenFill",
    "SpecLimits",
    "Tolerance",
    "Variant",
    "When",
    "not_supported_reasons",
    "request_reasons",
    "tokens_per_request",
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


class Feature(str, Enum):
    CUSTOM_MASK = "custom_mask"  # tree mask for target_verify with topk > 1
    SLIDING_WINDOW = "sliding_window"
    LOGIT_SOFTCAP = "logit_softcap"
    SINKS = "sinks"
    MLA = "mla"  # kept for old files: implies model kind "mla" in ``models``


class ReasonCode(str, Enum):
    """Stable codes for every "no" attnhal gives; tools may act on them."""

    VENDOR = "vendor"
    ARCH = "arch"
    PHASE = "phase"
    MODEL = "model"
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
    SPEC_LIMIT = "spec_limit"  # a run limit: the phase cannot run with these spec settings
    STEP_COUNT = "step_count"  # an adaptive step count the spec config cannot take
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


def tokens_per_request(phase: Phase, spec: SpecConfig) -> int:
    """Query tokens per request of ``phase`` under ``spec`` (the phase's *width*); prefill: 0 (variable)."""
    return {Phase.PREFILL: 0, Phase.DECODE: 1, Phase.DRAFT_DECODE: spec.topk,
            Phase.DRAFT_EXTEND: spec.draft_extend_len, Phase.TARGET_VERIFY: spec.num_draft_tokens}[phase]


@dataclass(frozen=True)
class SpecLimits:
    """Speculative-decoding limits under which a claim (running, graph capture, multi-step) holds.

    ``None`` means unlimited. An empty ``SpecLimits()`` holds whenever the phase runs.
    New limits are new fields here; :meth:`violations` picks them up by name.
    """

    max_topk: int | None = None
    max_num_steps: int | None = None
    max_draft_tokens: int | None = None

    def violations(self, spec: SpecConfig, code: ReasonCode, what: str) -> list[Reason]:
        """Reasons ``spec`` breaks these limits; ``what`` names the claim (e.g. "graph draft_extend")."""
        out = []
        for name, limit in vars(self).items():
            if limit is not None:
                value = getattr(spec, _SPEC_FIELD[name])
                if value > limit:
                    out.append(reason(code, name.removeprefix("max_"), value, f"<= {limit} for {what}"))
        return out

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


#: SpecLimits field -> the SpecConfig field it limits.
_SPEC_FIELD = {"max_topk": "topk", "max_num_steps": "num_steps", "max_draft_tokens": "num_draft_tokens"}


class FillTerm(str, Enum):
    """A spec-config quantity used by a graph seq-len fill rule."""

    NONE = "none"
    NUM_DRAFT_TOKENS = "num_draft_tokens"
    NUM_STEPS = "num_steps"
    TOPK = "topk"
    WIDTH = "width"  # query tokens per request of the phase (tokens_per_request)

    def value_for(self, spec: SpecConfig | None, phase: Phase | None) -> int:
        if spec is None or self is FillTerm.NONE:
            return 0
        if self is FillTerm.WIDTH:
            return tokens_per_request(phase, spec) if phase is not None else 0
        return int(getattr(spec, self.value))


@dataclass(frozen=True)
class SeqLenFill:
    """The seq len written into padded rows of a captured batch.

    ``max(base + plus, at_least + at_least_plus)``: ``plus`` and ``at_least_plus``
    are spec terms (:class:`FillTerm`), e.g. ``max(1, width + 1)`` is
    ``SeqLenFill(1, at_least=1, at_least_plus=FillTerm.WIDTH)``.
    """

    base: int = 1
    plus: FillTerm = FillTerm.NONE
    at_least: int = 0
    at_least_plus: FillTerm = FillTerm.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "plus", FillTerm(self.plus))
        object.__setattr__(self, "at_least_plus", FillTerm(self.at_least_plus))

    def value(self, spec: SpecConfig | None, phase: Phase | None = None) -> int:
        main = self.base + self.plus.value_for(spec, phase)
        floor = self.at_least + self.at_least_plus.value_for(spec, phase)
        return max(main, floor)

    def __str__(self) -> str:
        text = str(self.base) + (f" + {self.plus.value}" if self.plus is not FillTerm.NONE else "")
        if self.at_least or self.at_least_plus is not FillTerm.NONE:
            floor = " + ".join(s for s in (str(self.at_least) if self.at_least else "",
                                           self.at_least_plus.value if self.at_least_plus is not FillTerm.NONE
                                           else "") if s)
            text = f"max({text}, {floor})"
        return text


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


_DEFAULT_TOLERANCES = MappingProxyType({
    "float32": Tolerance(1e-4, 1e-4),
    "float16": Tolerance(2e-3, 2e-3),
    "bfloat16": Tolerance(1.6e-2, 1.6e-2),
})


# --- conditions: evaluated here and nowhere else --------------------------------------

@dataclass(frozen=True)
class Facts:
    """What a condition can test: platform, model/KV-cache context and spec config facts.

    ``None`` = not known; a condition on an unknown fact does not match.
    """

    vendor: Vendor | None = None
    arch: str | None = None
    fp8: Fp8Flavor | None = None
    model: ModelKind | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    head_size: int | None = None
    page_size: int | None = None
    algorithm: SpecAlgorithm | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None

    @classmethod
    def of(cls, platform: Platform | None = None, context: RequestContext | None = None,
           spec: SpecConfig | None = None) -> Facts:
        c = context or RequestContext()
        kwargs: dict[str, Any] = dict(model=c.model, dtype=c.dtype, kv_dtype=c.kv_dtype, head_size=c.head_size,
                                      page_size=c.page_size)
        if platform is not None:
            kwargs.update(vendor=platform.vendor, arch=platform.arch, fp8=platform.fp8_flavor)
        if spec is not None:
            kwargs.update(algorithm=spec.algorithm, num_steps=spec.num_steps, topk=spec.topk,
                          num_draft_tokens=spec.num_draft_tokens)
        return cls(**kwargs)


@dataclass(frozen=True)
class IntSet:
    """Integers: listed ``values``, or the inclusive range ``min..max`` (either end open)."""

    values: frozenset[int] = frozenset()
    min: int | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", frozenset(self.values))
        if not self.values and self.min is None and self.max is None:
            raise ValueError("IntSet() (supported: listed values, or a range with min and/or max)")

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        if self.values:
            return value in self.values
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def __str__(self) -> str:
        if self.values:
            return fmt_set(self.values)
        return f"{'' if self.min is None else self.min}..{'' if self.max is None else self.max}"


_INT_FACTS = ("head_size", "page_size", "num_steps", "topk", "num_draft_tokens")
_ENUM_FACTS: dict[str, type[Enum]] = {"vendor": Vendor, "fp8": Fp8Flavor, "model": ModelKind,
                                      "algorithm": SpecAlgorithm}
_STR_FACTS = {"dtype": DTYPES, "kv_dtype": KV_DTYPES}


@dataclass(frozen=True)
class When:
    """A condition: every given field must match (and); a field's values are alternatives (or).

    ``arch`` maps a vendor to the archs (or ranges) that match on that vendor; a
    platform of another vendor does not match it. ``fp8`` tests the platform's
    fp8 flavour (``none`` = no fp8 instructions).
    """

    vendor: frozenset[Vendor] | None = None
    arch: Mapping[Vendor, ArchSet] | None = None
    fp8: frozenset[Fp8Flavor] | None = None
    model: frozenset[ModelKind] | None = None
    dtype: frozenset[str] | None = None
    kv_dtype: frozenset[str] | None = None
    head_size: IntSet | None = None
    page_size: IntSet | None = None
    algorithm: frozenset[SpecAlgorithm] | None = None
    num_steps: IntSet | None = None
    topk: IntSet | None = None
    num_draft_tokens: IntSet | None = None
    #: (fact, test) for each given condition, computed once.
    tests: tuple[tuple[str, Any], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name, enum in _ENUM_FACTS.items():
            if getattr(self, name) is not None:
                set_(self, name, frozenset(enum(v) for v in getattr(self, name)))
        for name, allowed in _STR_FACTS.items():
            values = getattr(self, name)
            if values is not None:
                bad = sorted(set(values) - set(allowed))
                if bad:
                    raise ValueError(f"when.{name}={bad} (supported: {fmt_set(allowed)})")
                set_(self, name, frozenset(values))
        for name in _INT_FACTS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, IntSet):
                set_(self, name, IntSet(frozenset(value)))
        if self.arch is not None:
            set_(self, "arch", MappingProxyType(arch_sets(self.arch)))
        tests = tuple((f.name, getattr(self, f.name)) for f in fields(self)
                      if f.init and getattr(self, f.name) is not None)
        if not tests:
            raise ValueError("when={} (supported: at least one condition; a variant without one is a base claim)")
        set_(self, "tests", tests)

    def matches(self, facts: Facts) -> bool:
        """True if every condition holds for ``facts`` (an unknown fact never holds)."""
        for name, test in self.tests:
            value = getattr(facts, name)
            if value is None:
                return False
            if name == "arch":
                archs = test.get(facts.vendor)
                if archs is None or value not in archs:
                    return False
            elif value not in test:
                return False
        return True

    def __str__(self) -> str:
        parts = []
        for name, test in self.tests:
            if name == "arch":
                shown = "; ".join(f"{v.value} {s}" for v, s in test.items())
            else:
                shown = str(test) if isinstance(test, IntSet) else fmt_set(test)
            parts.append(f"{name} {shown}")
        return ", ".join(parts)

    def __hash__(self) -> int:
        return hash(str(self))


#: Fields a variant may change. Mapping fields merge per key (a ``None`` value removes the key);
#: other fields are replaced. ``add`` / ``remove`` edit the set fields.
_MAPPING_FIELDS: dict[str, type[Enum]] = {"graph": Phase, "run_limits": Phase, "phase_fill": Phase,
                                          "min_arch": Vendor, "archs": Vendor}
_SET_FIELDS: dict[str, type[Enum] | None] = {"vendors": Vendor, "phases": Phase, "models": ModelKind,
                                             "features": Feature, "dtypes": None, "kv_dtypes": None,
                                             "head_sizes": None, "page_sizes": None}
_SCALAR_FIELDS = ("multi_step", "seq_len_fill", "needs_host_seq_lens")
VARIANT_FIELDS = (*_MAPPING_FIELDS, *_SET_FIELDS, *_SCALAR_FIELDS)


def _elements(name: str, items: Iterable[Any]) -> frozenset[Any]:
    enum = _SET_FIELDS[name]
    return frozenset(enum(i) for i in items) if enum is not None else frozenset(items)


@dataclass(frozen=True)
class Variant:
    """Claims that hold under a condition: applied in order on top of the base claims.

    Attributes
    ----------
    when: the condition.
    changes: field -> value. ``graph``, ``run_limits``, ``phase_fill``, ``min_arch``
        and ``archs`` merge per key (``None`` removes the key, e.g.
        ``{"graph": {"draft_extend": None}}`` = no draft-extend graph); other fields
        are replaced.
    add, remove: set field -> items added / removed (``{"features": {"custom_mask"}}``).
    note: why the variant exists (shown in plans and the capability matrix).
    """

    when: When
    changes: Mapping[str, Any] = field(default_factory=dict)
    add: Mapping[str, frozenset[Any]] = field(default_factory=dict)
    remove: Mapping[str, frozenset[Any]] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.changes) - set(VARIANT_FIELDS))
        if unknown:
            raise ValueError(f"variant field={unknown[0]} (supported: {', '.join(VARIANT_FIELDS)})")
        bad = sorted((set(self.add) | set(self.remove)) - set(_SET_FIELDS))
        if bad:
            raise ValueError(f"variant add/remove field={bad[0]} (supported: {', '.join(_SET_FIELDS)})")
        changes = {name: _NORMALIZE.get(name, _same)(value) for name, value in self.changes.items()}
        object.__setattr__(self, "changes", MappingProxyType(changes))
        for attr in ("add", "remove"):
            edits = {name: _elements(name, items) for name, items in getattr(self, attr).items()}
            object.__setattr__(self, attr, MappingProxyType(edits))
        if not (self.changes or self.add or self.remove):
            raise ValueError(f"variant when {self.when}: changes nothing (supported: at least one change)")

    def apply(self, values: dict[str, Any]) -> None:
        """Apply this variant's changes to ``values`` (field -> value) in place."""
        for name, new in self.changes.items():
            if name in _MAPPING_FIELDS:
                merged = dict(values[name])
                for key, value in new.items():
                    if value is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = value
                values[name] = merged
            else:
                values[name] = new
        for name, items in self.add.items():  # both sides are normalized already
            values[name] = values[name] | items
        for name, items in self.remove.items():
            values[name] = values[name] - items

    def __hash__(self) -> int:
        return hash((self.when, self.note))


def _frozen(items: Iterable[Any]) -> frozenset[Any]:
    return frozenset(items)


def _default_models(features: frozenset[Feature]) -> frozenset[ModelKind]:
    base = {ModelKind.MHA, ModelKind.GQA}
    return frozenset(base | ({ModelKind.MLA} if Feature.MLA in features else set()))


@dataclass(frozen=True)
class BackendCapabilities:
    """The descriptor of one attention backend.

    Attributes
    ----------
    name: registry name (``"torch"``, ``"triton"``, ...).
    vendors: vendors it runs on.
    min_arch: minimum arch per vendor, in that vendor's notation (``{CUDA: "sm80", HIP: "gfx90a"}``);
        shorthand for ``archs={CUDA: ["sm80.."]}``.
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
    archs: per vendor, the archs it runs on (exact names and ranges, :class:`~attnhal.platform.ArchSet`).
    models: model kinds it serves (default ``{mha, gqa}``, plus ``mla`` for the old ``mla`` feature).
    run_limits: per phase, spec limits beyond which the phase cannot run at all (eager
        or captured): a violated run limit makes the plan invalid.
    phase_fill: per phase, a seq-len fill rule that replaces ``seq_len_fill``.
    variants: conditional claims, applied in order by :meth:`resolve`.
    applied: notes of the variants :meth:`resolve` applied (empty on a base descriptor).
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
    archs: Mapping[Vendor, ArchSet] = field(default_factory=dict)
    models: frozenset[ModelKind] | None = None
    run_limits: Mapping[Phase, SpecLimits] = field(default_factory=dict)
    phase_fill: Mapping[Phase, SeqLenFill] = field(default_factory=dict)
    variants: tuple[Variant, ...] = ()
    applied: tuple[str, ...] = ()

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
        set_(self, "archs", MappingProxyType(arch_sets(self.archs)))
        models = self.models if self.models is not None else _default_models(self.features)
        set_(self, "models", _frozen(ModelKind(m) for m in models))
        set_(self, "run_limits", MappingProxyType({Phase(p): lim for p, lim in self.run_limits.items()}))
        set_(self, "phase_fill", MappingProxyType({Phase(p): f for p, f in self.phase_fill.items()}))
        set_(self, "variants", tuple(self.variants))
        set_(self, "applied", tuple(self.applied))
        _validate(self)

    def __hash__(self) -> int:
        # Hashing the variants formats their conditions: done once per descriptor, since the
        # planner's resolution cache hashes the descriptor on every plan.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.name, self.vendors, self.phases, tuple(sorted(self.graph.items())), self.variants))
            self.__dict__["_hash"] = cached
        return cached

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

    def fill_for(self, phase: Phase) -> SeqLenFill:
        """The seq-len fill rule of ``phase``: its own rule, else ``seq_len_fill``."""
        return self.phase_fill.get(phase, self.seq_len_fill)

    def resolve(self, facts: Facts) -> BackendCapabilities:
        """The claims that hold under ``facts``: the variants whose condition matches,
        applied in order on the base claims. The result has no variants; ``applied``
        lists the notes of those applied. The one place conditions are evaluated."""
        if not self.variants:
            return self
        matched = [v for v in self.variants if v.when.matches(facts)]
        if not matched:
            return self
        return _apply_variants(self, matched)

    def platform_reasons(self, platform: Platform) -> list[Reason]:
        """Why this backend cannot run on ``platform`` at all (vendor, arch)."""
        if platform.vendor not in self.vendors:
            return [reason(ReasonCode.VENDOR, "vendor", platform.vendor, fmt_set(self.vendors))]
        minimum = self.min_arch.get(platform.vendor)
        if minimum is not None and not arch_at_least(platform.vendor, platform.arch, minimum):
            return [reason(ReasonCode.ARCH, "arch", platform.arch, f">= {minimum}")]
        allowed = self.archs.get(platform.vendor)
        if allowed is not None and platform.arch not in allowed:
            return [reason(ReasonCode.ARCH, "arch", platform.arch, f"{platform.vendor.value} {allowed}")]
        return []


def _apply_variants(caps: BackendCapabilities, variants: Iterable[Variant], strict: bool = False) -> BackendCapabilities:
    values = {name: getattr(caps, name) for name in VARIANT_FIELDS}
    notes = []
    for v in variants:
        v.apply(values)
        notes.append(v.note or f"when {v.when}")
    # A variant that drops a phase drops its graph, run limit and fill claims with it. ``strict``
    # (the construction check) keeps claims on phases the descriptor never runs, to report them.
    keep = values["phases"] | (frozenset(Phase) - caps.phases if strict else frozenset())
    for name in ("graph", "run_limits", "phase_fill"):
        values[name] = MappingProxyType({p: x for p, x in values[name].items() if p in keep})
    return _with(caps, {**values, "variants": (), "applied": (*caps.applied, *notes)})


def _with(caps: BackendCapabilities, values: dict[str, Any]) -> BackendCapabilities:
    """``caps`` with already-normalized ``values``, built without re-running the checks: they
    run once per descriptor, at its construction (:func:`_validate` applies every variant)."""
    new = object.__new__(BackendCapabilities)
    new.__dict__.update(caps.__dict__)
    new.__dict__.update(values)
    new.__dict__.pop("_hash", None)  # the cached hash is ``caps``'s, not this descriptor's
    return new


def _same(value: Any) -> Any:
    return value


def _mapping(enum: type[Enum]) -> Any:
    return lambda table: MappingProxyType({enum(k): v for k, v in table.items()})


#: How each field a variant may change is normalized (the same as in __post_init__).
_NORMALIZE: dict[str, Any] = {
    **{name: _mapping(enum) for name, enum in _MAPPING_FIELDS.items()},
    **{name: (lambda name: lambda items: _elements(name, items))(name) for name in _SET_FIELDS},
}


def _validate(caps: BackendCapabilities) -> None:
    errors = []
    if not caps.name:
        errors.append("name='' (supported: a non-empty string)")
    for key, table in (("graph", caps.graph), ("run_limits", caps.run_limits), ("phase_fill", caps.phase_fill)):
        not_run = [p.value for p in table if p not in caps.phases]
        if not_run:
            errors.append(f"{key}={not_run} (supported: phases listed in phases={fmt_set(caps.phases)})")
    for key, table in (("graph", caps.graph), ("phase_fill", caps.phase_fill)):
        if Phase.PREFILL in table:
            errors.append(f"{key}=prefill (supported: {fmt_set(GRAPH_PHASES)}; prefill has a variable token count)")
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
        except PlatformSpecError as exc:
            errors.append(f"min_arch.{vendor.value}: {exc}")
    if errors:
        raise ValueError(f"backend {caps.name!r}: " + "; ".join(errors))
    # Each variant alone, and all of them in order, must give a well-formed descriptor.
    for i, variant in enumerate(caps.variants):
        try:
            _checked(_apply_variants(caps, [variant], strict=True))
        except ValueError as exc:
            raise ValueError(f"backend {caps.name!r}: variants[{i}] (when {variant.when}): {exc}") from None
    if len(caps.variants) > 1:
        _checked(_apply_variants(caps, caps.variants, strict=True))


def _checked(caps: BackendCapabilities) -> None:
    """Run the full construction checks on a resolved descriptor."""
    replace(caps, variants=())


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
    model: ModelKind | None = None

    @property
    def context(self) -> RequestContext:
        return RequestContext(model=self.model, dtype=self.dtype, kv_dtype=self.kv_dtype,
                              head_size=self.head_size, page_size=self.page_size)


def not_supported_reasons(
    caps: BackendCapabilities, request: AttentionRequest, platform: Platform
) -> list[Reason]:
    """Every reason ``caps`` cannot serve ``request`` on ``platform``; empty means supported.

    Variants are resolved against the platform and the request first.
    """
    if caps.variants:
        caps = caps.resolve(Facts.of(platform, request.context))
    return caps.platform_reasons(platform) + request_reasons(caps, request)


def request_reasons(caps: BackendCapabilities, request: AttentionRequest) -> list[Reason]:
    """The request checks of :func:`not_supported_reasons` (no platform, no variants resolved)."""
    out: list[Reason] = []
    checks: list[tuple[ReasonCode, str, object, Iterable[object]]] = [
        (ReasonCode.PHASE, "phase", request.phase, caps.phases),
        (ReasonCode.MODEL, "model", request.model, caps.models or ()),
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
