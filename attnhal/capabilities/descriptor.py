"""The descriptor: what one attention backend can do, as one frozen record.

A descriptor is a :class:`BackendCapabilities`. It says which phases the backend
runs, which it can capture as a graph and under which speculative limits, which
speculative settings it can run at all (run limits), whether it can serve as a
multi-step draft backend, and which archs / model kinds / dtypes / head sizes /
page sizes / features it supports. Conditional claims are variants
(:mod:`attnhal.capabilities.conditions`), applied by :meth:`BackendCapabilities.resolve`.

Construction normalises every field and validates the whole descriptor, each
variant alone and all variants in order; a descriptor that exists is well formed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from attnhal.capabilities.claims import DEFAULT_TOLERANCES, SeqLenFill, SpecLimits, Tolerance
from attnhal.capabilities.conditions import VARIANT_FIELDS, Facts, Variant
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import ArchSet, Platform, PlatformSpecError, Vendor, arch_at_least, arch_sets
from attnhal.reasons import Reason, ReasonCode, fmt_set, reason
from attnhal.kv_format import KV_FORMATS
from attnhal.spec import DTYPES, ModelKind

__all__ = ["BackendCapabilities"]

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
    dtypes, kv_dtypes: compute and KV-cache dtypes by name (see :data:`DTYPES`, :data:`~attnhal.kv_format.KV_FORMATS`).
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
        set_(self, "tolerances", MappingProxyType({**DEFAULT_TOLERANCES, **given}))
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
        """The tolerance declared for ``dtype`` (or the default one)."""
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

def _validate(caps: BackendCapabilities) -> None:
    errors = []
    if not caps.name or not caps.name.isprintable():
        errors.append(f"name={caps.name!r} (supported: a non-empty string of printable characters: it is shown in "
                      "tables and terminals)")
    for key, table in (("graph", caps.graph), ("run_limits", caps.run_limits), ("phase_fill", caps.phase_fill)):
        not_run = [p.value for p in table if p not in caps.phases]
        if not_run:
            errors.append(f"{key}={not_run} (supported: phases listed in phases={fmt_set(caps.phases)})")
    for key, table in (("graph", caps.graph), ("phase_fill", caps.phase_fill)):
        if Phase.PREFILL in table:
            errors.append(f"{key}=prefill (supported: {fmt_set(GRAPH_PHASES)}; prefill has a variable token count)")
    for name, allowed in (("dtypes", DTYPES), ("kv_dtypes", tuple(KV_FORMATS))):
        bad = sorted(set(getattr(caps, name)) - set(allowed))
        if bad:
            errors.append(f"{name}={bad} (supported: {fmt_set(allowed)})")
    bad_tol = sorted(set(caps.tolerances) - set(KV_FORMATS))
    if bad_tol:
        errors.append(f"tolerances={bad_tol} (supported: {fmt_set(KV_FORMATS)})")
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
            _revalidate(_apply_variants(caps, [variant], strict=True))
        except ValueError as exc:
            raise ValueError(f"backend {caps.name!r}: variants[{i}] (when {variant.when}): {exc}") from None
    if len(caps.variants) > 1:
        _revalidate(_apply_variants(caps, caps.variants, strict=True))


def _revalidate(resolved: BackendCapabilities) -> None:
    """Rebuild ``resolved`` through the constructor and discard the result.

    :func:`_with` skips the constructor, so a descriptor made by :func:`_apply_variants`
    has been neither normalised nor checked; rebuilding it (``replace`` re-runs
    ``__post_init__``) raises whatever constructing it directly would raise.
    """
    replace(resolved, variants=())
