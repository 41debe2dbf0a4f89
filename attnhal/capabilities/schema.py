"""The descriptor file schema: each key of a JSON/TOML descriptor and how it is read.

Every key has a converter that checks the value and turns it into the field's
value; unknown keys and bad values raise :class:`DescriptorError` naming the key.
:func:`converted` reads a whole top-level table into the keyword arguments of
:class:`~attnhal.capabilities.BackendCapabilities`. The reference is ``docs/descriptors.md``.

Bounds: a list holds at most :data:`MAX_ITEMS` entries, a head size is at most
:data:`MAX_HEAD_SIZE` and a page size at most :data:`MAX_PAGE_SIZE`, so that a
malformed or hostile file is refused at once instead of running for minutes.

Schema versions: a file without ``schema_version`` is version 1 (the keys of
attnhal 0.1) and keeps loading; the keys added by version 2 (``archs``,
``models``, ``run_limits``, ``phase_fill``, ``variants``) need
``schema_version = 2``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from enum import Enum
from typing import Any

from attnhal.bounds import Bound, FloatBound
from attnhal.capabilities.claims import FILL_BOUND, LIMIT_BOUNDS, TOLERANCE_BOUND
from attnhal.capabilities.claims import FillTerm, SeqLenFill, SpecLimits, Tolerance
from attnhal.capabilities.conditions import VARIANT_FIELDS, IntSet, Variant, When
from attnhal.errors import AttnhalError, InvalidValue
from attnhal.phases import Feature, Phase
from attnhal.platform import ArchSet, Fp8Flavor, PlatformSpecError, Vendor
from attnhal.kv_format import KV_FORMATS
from attnhal.spec import DTYPES, HEAD_SIZE, PAGE_SIZE, ModelKind, SpecAlgorithm

__all__ = ["KEYS", "MAX_HEAD_SIZE", "MAX_ITEMS", "MAX_NAME", "MAX_NOTE", "MAX_PAGE_SIZE", "REQUIRED", "SCHEMA_VERSION",
           "V2_KEYS", "WHEN_BOUND", "DescriptorError", "converted"]

#: The newest descriptor schema this attnhal reads (and writes).
SCHEMA_VERSION = 2
#: The most entries of any list in a file (head sizes, page sizes, variants, ...): every real
#: descriptor needs a few dozen at most.
MAX_ITEMS = 256
#: The largest head size and page size a file may claim: the request context's bounds.
MAX_HEAD_SIZE = HEAD_SIZE.high
MAX_PAGE_SIZE = PAGE_SIZE.high
#: The longest backend name (a name is shown in tables and terminals) and variant note.
MAX_NAME = 64
MAX_NOTE = 200
#: Integers a variant's ``when`` compares (head size, page size, steps, ...): the largest
#: bound of any of them (:data:`MAX_PAGE_SIZE`).
WHEN_BOUND = Bound("when", 0, MAX_PAGE_SIZE)
#: How much of a rejected value a message repeats.
_SHOWN = 60


class DescriptorError(AttnhalError, ValueError):
    """A descriptor file with a missing, unknown or malformed key."""


def _shown(value: object) -> str:
    """``repr(value)``, cut short: a pasted megabyte stays one short line."""
    text = repr(value)
    return text[:_SHOWN] + "..." if len(text) > _SHOWN else text


def _fail(key: str, value: object, allowed: str) -> DescriptorError:
    return DescriptorError(f"{key}={_shown(value)} (supported: {allowed})")


def _list(key: str, value: Any, what: str) -> list[Any]:
    """``value`` as a list of at most :data:`MAX_ITEMS` entries, else an error naming ``key``."""
    if not isinstance(value, list):
        raise _fail(key, value, what)
    if len(value) > MAX_ITEMS:
        raise DescriptorError(f"{key}: a list of {len(value)} entries (supported: at most {MAX_ITEMS})")
    return value


def _enum_list(enum: type[Enum], key: str, non_empty: bool = False) -> Callable[[Any], frozenset[Any]]:
    allowed = ", ".join(m.value for m in enum)

    def convert(value: Any) -> frozenset[Any]:
        _list(key, value, f"a list of {{{allowed}}}")
        if non_empty and not value:
            raise _fail(key, value, f"a non-empty list of {{{allowed}}} (an empty one claims nothing)")
        try:
            return frozenset(enum(str(v).lower()) for v in value)
        except ValueError:
            bad = next(v for v in value if str(v).lower() not in {m.value for m in enum})
            raise _fail(key, bad, allowed) from None
    return convert


def _int_list(key: str, high: int, non_empty: bool = False) -> Callable[[Any], frozenset[int]]:
    """A list of integers in ``1..high`` (with ``non_empty``, at least one)."""
    def convert(value: Any) -> frozenset[int]:
        what = f"a {'non-empty ' if non_empty else ''}list of integers 1..{high}"
        if not all(_is_int(v) and 1 <= v <= high for v in _list(key, value, what)) or (non_empty and not value):
            raise _fail(key, value, what)
        return frozenset(value)
    return convert


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_list(key: str, non_empty: bool = False) -> Callable[[Any], frozenset[str]]:
    def convert(value: Any) -> frozenset[str]:
        what = f"a {'non-empty ' if non_empty else ''}list of strings"
        if not all(isinstance(v, str) for v in _list(key, value, what)) or (non_empty and not value):
            raise _fail(key, value, what)
        return frozenset(value)
    return convert


_LIMIT_KEYS = ("max_topk", "max_num_steps", "max_draft_tokens")


def _limits(key: str, value: Any) -> SpecLimits:
    if not isinstance(value, Mapping):
        raise _fail(key, value, f"a table with keys from {{{', '.join(_LIMIT_KEYS)}}}; {{}} = no limit")
    for k, v in value.items():
        if k not in _LIMIT_KEYS:
            raise _fail(f"{key}.{k}", v, f"keys {{{', '.join(_LIMIT_KEYS)}}}")
        _bounded(LIMIT_BOUNDS[k], f"{key}.{k}", v)
    return SpecLimits(**value)


def _by_phase(key: str, convert: Callable[[str, Any], Any], removable: bool) -> Callable[[Any], dict[Phase, Any]]:
    """A table phase -> value; in a variant, ``false`` removes the phase's entry (None)."""
    def parse(value: Any) -> dict[Phase, Any]:
        if not isinstance(value, Mapping):
            raise _fail(key, value, "a table: phase -> value" + ("; false removes" if removable else ""))
        phases = _enum_list(Phase, key)(list(value))
        return {p: None if removable and value[p.value] is False else convert(f"{key}.{p.value}", value[p.value])
                for p in phases}
    return parse


def _multi_step(value: Any) -> SpecLimits | None:
    if isinstance(value, bool):
        return SpecLimits() if value else None
    return _limits("multi_step", value)


def _by_vendor(key: str, convert: Callable[[Vendor, Any], Any], example: str,
               removable: bool) -> Callable[[Any], dict[Vendor, Any]]:
    def parse(value: Any) -> dict[Vendor, Any]:
        if not isinstance(value, Mapping):
            raise _fail(key, value, f"a table: vendor -> {example}")
        out = {}
        for v in _enum_list(Vendor, key)(list(value)):
            item = value[v.value]
            try:
                out[v] = None if removable and item is False else convert(v, item)
            except PlatformSpecError as exc:
                raise DescriptorError(f"{key}.{v.value}: {exc}") from None
        return out
    return parse


def _arch_set(vendor: Vendor, value: Any) -> ArchSet:
    items = [value] if isinstance(value, str) else value
    if (not isinstance(items, list) or not items or len(items) > MAX_ITEMS
            or not all(isinstance(i, str) for i in items)):
        raise PlatformSpecError(f"archs={_shown(value)} (supported: a list of at most {MAX_ITEMS} archs or "
                                "ranges like 'sm80..sm90')")
    return ArchSet(vendor, tuple(items))


def _min_arch(vendor: Vendor, value: Any) -> str:
    arch = str(value)
    ArchSet(vendor, (arch,))  # validates the notation
    return arch


_FILL_KEYS = ("base", "plus", "at_least", "at_least_plus")


def _seq_len_fill(key: str, value: Any) -> SeqLenFill:
    if _is_int(value):
        return SeqLenFill(base=_bounded(FILL_BOUND, key, value))
    terms = ", ".join(t.value for t in FillTerm)
    if not isinstance(value, Mapping) or set(value) - set(_FILL_KEYS):
        raise _fail(key, value, f"an integer, or a table {{base = int, plus = term, at_least = int, "
                                f"at_least_plus = term}}, term one of {{{terms}}}")
    for k in ("base", "at_least"):
        _bounded(FILL_BOUND, f"{key}.{k}", value.get(k, 0))
    for k in ("plus", "at_least_plus"):
        if value.get(k, "none") not in {t.value for t in FillTerm}:
            raise _fail(f"{key}.{k}", value.get(k), terms)
    return SeqLenFill(base=value.get("base", 1), plus=FillTerm(value.get("plus", "none")),
                      at_least=value.get("at_least", 0), at_least_plus=FillTerm(value.get("at_least_plus", "none")))


def _tolerances(value: Any) -> dict[str, Tolerance]:
    if not isinstance(value, Mapping):
        raise _fail("tolerances", value, "a table: dtype -> {atol = float, rtol = float}")
    out = {}
    for dtype, tol in value.items():
        if not isinstance(tol, Mapping) or set(tol) != {"atol", "rtol"}:
            raise _fail(f"tolerances.{dtype}", tol, "{atol = float, rtol = float}")
        out[dtype] = Tolerance(*(_bounded(TOLERANCE_BOUND, f"tolerances.{dtype}.{k}", tol[k])
                                 for k in ("atol", "rtol")))
    return out


def _bounded(bound: Bound | FloatBound, key: str, value: Any) -> Any:
    """``value`` within ``bound``, else a :class:`DescriptorError` naming ``key``."""
    try:
        return bound.check(value, key)
    except InvalidValue as exc:
        raise _fail(exc.field, exc.value, exc.supported) from None


def _bool(key: str) -> Callable[[Any], bool]:
    def convert(value: Any) -> bool:
        if not isinstance(value, bool):
            raise _fail(key, value, "true or false")
        return value
    return convert


def _printable(key: str, value: Any, longest: int) -> str:
    """A string of printable characters (no newline, tab or terminal escape: it is shown in
    tables and terminals) of at most ``longest`` characters."""
    allowed = f"printable text of 1..{longest} characters (no control characters)"
    if not isinstance(value, str) or not value or len(value) > longest or not value.isprintable():
        raise _fail(key, value, allowed)
    return value


def _name(value: Any) -> str:
    return _printable("name", value, MAX_NAME)


def _claim_keys(prefix: str, removable: bool) -> dict[str, Callable[[Any], Any]]:
    """Converters of the claim keys (shared by the base table and each variant)."""
    p = prefix
    return {
        # in a variant an empty list is a change ("no phase runs when ..."); at the base it claims nothing
        "vendors": _enum_list(Vendor, f"{p}vendors", non_empty=not removable),
        "phases": _enum_list(Phase, f"{p}phases", non_empty=not removable),
        "graph": _by_phase(f"{p}graph", _limits, removable),
        "multi_step": _multi_step,
        "min_arch": _by_vendor(f"{p}min_arch", _min_arch, "arch, e.g. {cuda = 'sm80', hip = 'gfx90a'}",
                               removable),
        "dtypes": _str_list(f"{p}dtypes", non_empty=not removable),
        "kv_dtypes": _str_list(f"{p}kv_dtypes", non_empty=not removable),
        "head_sizes": _int_list(f"{p}head_sizes", MAX_HEAD_SIZE, non_empty=not removable),
        "page_sizes": _int_list(f"{p}page_sizes", MAX_PAGE_SIZE, non_empty=not removable),
        "features": _enum_list(Feature, f"{p}features"),
        "seq_len_fill": lambda v: _seq_len_fill(f"{p}seq_len_fill", v),
        "needs_host_seq_lens": _bool(f"{p}needs_host_seq_lens"),
        "archs": _by_vendor(f"{p}archs", _arch_set, "a list of archs or ranges, e.g. {cuda = ['sm80..sm90']}",
                            removable),
        "models": _enum_list(ModelKind, f"{p}models", non_empty=not removable),
        "run_limits": _by_phase(f"{p}run_limits", _limits, removable),
        "phase_fill": _by_phase(f"{p}phase_fill", _seq_len_fill, removable),
    }


# --- variants -------------------------------------------------------------------

def _int_set(key: str, value: Any) -> IntSet:
    if _is_int(value):
        return IntSet(frozenset((_bounded(WHEN_BOUND, key, value),)))
    if isinstance(value, list) and value and len(value) <= MAX_ITEMS and all(_is_int(v) for v in value):
        return IntSet(frozenset(_bounded(WHEN_BOUND, key, v) for v in value))
    if isinstance(value, Mapping) and value and not set(value) - {"min", "max"} and all(
            _is_int(v) for v in value.values()):
        low, high = (_bounded(WHEN_BOUND, f"{key}.{k}", value[k]) if k in value else None for k in ("min", "max"))
        if low is not None and high is not None and low > high:
            raise _fail(key, value, "an ordered range, min <= max")  # IntSet refuses it too, without the key
        return IntSet(min=low, max=high)
    raise _fail(key, value, f"an integer, a list of at most {MAX_ITEMS} integers, or a range "
                            "{min = int, max = int}")


def _choices(key: str, allowed: Collection[str]) -> Callable[[Any], frozenset[str]]:
    def convert(value: Any) -> frozenset[str]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            raise _fail(key, value, f"a value or a list from {{{', '.join(allowed)}}}")
        _list(key, items, "a list")
        bad = [i for i in items if i not in allowed]
        if bad:
            raise _fail(key, bad[0], ", ".join(allowed))
        return frozenset(items)
    return convert


def _values(enum: type[Enum]) -> tuple[str, ...]:
    return tuple(m.value for m in enum)


_WHEN: dict[str, Callable[[Any], Any]] = {
    "vendor": _choices("when.vendor", _values(Vendor)),
    "arch": _by_vendor("when.arch", _arch_set, "a list of archs or ranges, e.g. {cuda = ['sm100..']}", False),
    "fp8": _choices("when.fp8", _values(Fp8Flavor)),
    "model": _choices("when.model", _values(ModelKind)),
    "dtype": _choices("when.dtype", DTYPES),
    "kv_dtype": _choices("when.kv_dtype", KV_FORMATS.keys()),
    "algorithm": _choices("when.algorithm", _values(SpecAlgorithm)),
    **{k: (lambda k: lambda v: _int_set(f"when.{k}", v))(k)
       for k in ("head_size", "page_size", "num_steps", "topk", "num_draft_tokens")},
}
_VARIANT_META = ("when", "note", "add", "remove")


def _when(value: Any) -> When:
    if not isinstance(value, Mapping) or not value:
        raise _fail("when", value, f"a non-empty table with keys from {{{', '.join(_WHEN)}}}")
    unknown = sorted(set(value) - set(_WHEN))
    if unknown:
        raise _fail(f"when.{unknown[0]}", value[unknown[0]], f"keys {{{', '.join(_WHEN)}}}")
    return When(**{k: _WHEN[k](v) for k, v in value.items()})


def _edits(key: str, value: Any, converters: Mapping[str, Callable[[Any], Any]]) -> dict[str, frozenset[Any]]:
    sets = ("vendors", "phases", "models", "features", "dtypes", "kv_dtypes", "head_sizes", "page_sizes")
    if not isinstance(value, Mapping):
        raise _fail(key, value, f"a table: set key -> list, keys from {{{', '.join(sets)}}}")
    bad = sorted(set(value) - set(sets))
    if bad:
        raise _fail(f"{key}.{bad[0]}", value[bad[0]], f"keys {{{', '.join(sets)}}}")
    return {k: converters[k](v) for k, v in value.items()}


def _variant(i: int, value: Any) -> Variant:
    key = f"variants[{i}]"
    if not isinstance(value, Mapping) or "when" not in value:
        raise _fail(key, value, "a table with `when` and the claims it changes")
    converters = _claim_keys(f"{key}.", removable=True)
    unknown = sorted(set(value) - set(_VARIANT_META) - set(VARIANT_FIELDS))
    if unknown:
        raise _fail(f"{key}.{unknown[0]}", value[unknown[0]],
                    f"keys {{{', '.join((*_VARIANT_META, *VARIANT_FIELDS))}}}")
    note = _printable(f"{key}.note", value["note"], MAX_NOTE) if "note" in value else ""
    try:
        return Variant(
            when=_when(value["when"]),
            changes={k: converters[k](v) for k, v in value.items() if k in VARIANT_FIELDS},
            add=_edits(f"{key}.add", value.get("add", {}), converters),
            remove=_edits(f"{key}.remove", value.get("remove", {}), converters),
            note=note)
    except DescriptorError as exc:
        raise DescriptorError(f"{key}: {exc}") from None
    except ValueError as exc:
        raise DescriptorError(f"{key}: {exc}") from None


def _variants(value: Any) -> tuple[Variant, ...]:
    _list("variants", value, "a list of tables ([[variants]] in TOML)")
    return tuple(_variant(i, v) for i, v in enumerate(value))


#: key -> converter. Keys missing from a file take the field's default.
_KEYS: dict[str, Callable[[Any], Any]] = {
    "name": _name,
    **_claim_keys("", removable=False),
    "tolerances": _tolerances,
    "requires": lambda v: tuple(sorted(_str_list("requires")(v))),
    "variants": _variants,
}
#: Keys that need ``schema_version = 2``, and keys every file gives.
V2_KEYS = ("archs", "models", "run_limits", "phase_fill", "variants")
REQUIRED = ("name", "vendors", "phases")
#: Every key a file may hold.
KEYS = ("schema_version", *_KEYS)


def _schema(data: Mapping[str, Any]) -> int:
    version = data.get("schema_version", 1)
    if not _is_int(version) or not 1 <= version <= SCHEMA_VERSION:
        raise _fail("schema_version", version, f"1..{SCHEMA_VERSION}; a newer file needs a newer attnhal")
    if version < 2:
        newer = [k for k in V2_KEYS if k in data]
        if newer:
            raise DescriptorError(f"{newer[0]} needs schema_version = 2 (this file is version 1: add "
                                  f"`schema_version = 2` at the top to use {', '.join(V2_KEYS)})")
    return int(version)


def converted(data: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~attnhal.capabilities.BackendCapabilities` keyword arguments of a file's
    top-level table: every key known, the schema version fitting the keys, the required
    keys given, each value converted."""
    unknown = sorted(set(data) - set(_KEYS) - {"schema_version"})
    if unknown:
        raise _fail(unknown[0], data[unknown[0]], f"keys {{schema_version, {', '.join(_KEYS)}}}")
    _schema(data)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DescriptorError(f"{missing[0]} is missing (required keys: {', '.join(REQUIRED)})")
    return {k: _KEYS[k](v) for k, v in data.items() if k != "schema_version"}
