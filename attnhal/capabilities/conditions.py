"""Conditions: claims that hold only under conditions, and the facts they test.

A :class:`Variant` is an ordered ``(when, changes)`` pair on a descriptor: its
:class:`When` tests the :class:`Facts` of one plan (platform, model and KV-cache
context, spec config). Integer conditions are :class:`IntSet` values. The field
tables below say which descriptor fields a variant may change and how each is
normalised; :meth:`~attnhal.capabilities.BackendCapabilities.resolve` applies the
variants, the one place conditions are evaluated.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from types import MappingProxyType
from typing import Any

from attnhal.errors import InvalidValue
from attnhal.phases import Feature, Phase
from attnhal.platform import ArchSet, Fp8Flavor, Platform, Vendor, arch_sets
from attnhal.reasons import fmt_set
from attnhal.kv_format import KV_FORMATS
from attnhal.spec import DTYPES, ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__all__ = ["VARIANT_FIELDS", "Facts", "IntSet", "Variant", "When"]


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
        """The facts of one plan: what ``platform``, ``context`` and ``spec`` say (``None``: not known)."""
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
        if self.min is not None and self.max is not None and self.min > self.max:
            raise InvalidValue("range", f"{self.min}..{self.max}", "an ordered range, min <= max")

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
#: The named facts and what they may be (KV dtypes: the live format rows, so a registered format is valid).
_STR_FACTS: dict[str, Collection[str]] = {"dtype": DTYPES, "kv_dtype": KV_FORMATS.keys()}


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


def _same(value: Any) -> Any:
    return value


def _mapping(enum: type[Enum]) -> Any:
    return lambda table: MappingProxyType({enum(k): v for k, v in table.items()})


#: How each field a variant may change is normalized (the same as in __post_init__).
_NORMALIZE: dict[str, Any] = {
    **{name: _mapping(enum) for name, enum in _MAPPING_FIELDS.items()},
    **{name: (lambda name: lambda items: _elements(name, items))(name) for name in _SET_FIELDS},
}


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
