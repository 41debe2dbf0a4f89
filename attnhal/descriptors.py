"""Descriptor files: a :class:`BackendCapabilities` written as JSON or TOML.

An engine can describe a backend that is not installed here ("what would happen
on MI300 with my aiter backend?") and hand the file to ``attnhal plan``.
Unknown keys and bad values are errors that name the key. The reference is
``docs/descriptors.md``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from attnhal.capabilities import (
    BackendCapabilities,
    Feature,
    FillTerm,
    Phase,
    SeqLenFill,
    SpecLimits,
    Tolerance,
)
from attnhal.platform import Vendor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["DescriptorError", "dump_descriptor", "load_descriptor", "parse_descriptor"]


class DescriptorError(ValueError):
    """A descriptor file with a missing, unknown or malformed key."""


def _fail(key: str, value: object, allowed: str) -> DescriptorError:
    return DescriptorError(f"{key}={value!r} (supported: {allowed})")


def _enum_list(enum: type[Enum], key: str) -> Callable[[Any], frozenset[Any]]:
    allowed = ", ".join(m.value for m in enum)

    def convert(value: Any) -> frozenset[Any]:
        if not isinstance(value, list):
            raise _fail(key, value, f"a list of {{{allowed}}}")
        try:
            return frozenset(enum(str(v).lower()) for v in value)
        except ValueError:
            bad = next(v for v in value if str(v).lower() not in {m.value for m in enum})
            raise _fail(key, bad, allowed) from None
    return convert


def _int_list(key: str) -> Callable[[Any], frozenset[int]]:
    def convert(value: Any) -> frozenset[int]:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                  for v in value):
            raise _fail(key, value, "a list of positive integers")
        return frozenset(value)
    return convert


def _str_list(key: str) -> Callable[[Any], frozenset[str]]:
    def convert(value: Any) -> frozenset[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _fail(key, value, "a list of strings")
        return frozenset(value)
    return convert


_LIMIT_KEYS = ("max_topk", "max_num_steps", "max_draft_tokens")


def _limits(key: str, value: Any) -> SpecLimits:
    if not isinstance(value, Mapping):
        raise _fail(key, value, f"a table with keys from {{{', '.join(_LIMIT_KEYS)}}}; {{}} = no limit")
    for k, v in value.items():
        if k not in _LIMIT_KEYS:
            raise _fail(f"{key}.{k}", v, f"keys {{{', '.join(_LIMIT_KEYS)}}}")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise _fail(f"{key}.{k}", v, "an integer >= 1")
    return SpecLimits(**value)


def _graph(value: Any) -> dict[Phase, SpecLimits]:
    if not isinstance(value, Mapping):
        raise _fail("graph", value, "a table: phase -> limits table")
    phases = _enum_list(Phase, "graph")(list(value))
    return {p: _limits(f"graph.{p.value}", value[p.value]) for p in phases}


def _multi_step(value: Any) -> SpecLimits | None:
    if isinstance(value, bool):
        return SpecLimits() if value else None
    return _limits("multi_step", value)


def _min_arch(value: Any) -> dict[Vendor, str]:
    if not isinstance(value, Mapping):
        raise _fail("min_arch", value, "a table: vendor -> arch, e.g. {cuda = 'sm80', hip = 'gfx90a'}")
    vendors = _enum_list(Vendor, "min_arch")(list(value))
    return {v: str(value[v.value]) for v in vendors}


def _seq_len_fill(value: Any) -> SeqLenFill:
    if isinstance(value, int) and not isinstance(value, bool):
        return SeqLenFill(base=value)
    terms = ", ".join(t.value for t in FillTerm)
    if not isinstance(value, Mapping) or set(value) - {"base", "plus"}:
        raise _fail("seq_len_fill", value, f"an integer, or {{base = int, plus = one of {{{terms}}}}}")
    try:
        return SeqLenFill(base=int(value.get("base", 1)), plus=FillTerm(value.get("plus", "none")))
    except ValueError:
        raise _fail("seq_len_fill.plus", value.get("plus"), terms) from None


def _tolerances(value: Any) -> dict[str, Tolerance]:
    if not isinstance(value, Mapping):
        raise _fail("tolerances", value, "a table: dtype -> {atol = float, rtol = float}")
    out = {}
    for dtype, tol in value.items():
        if not isinstance(tol, Mapping) or set(tol) != {"atol", "rtol"}:
            raise _fail(f"tolerances.{dtype}", tol, "{atol = float, rtol = float}")
        out[dtype] = Tolerance(float(tol["atol"]), float(tol["rtol"]))
    return out


def _bool(key: str) -> Callable[[Any], bool]:
    def convert(value: Any) -> bool:
        if not isinstance(value, bool):
            raise _fail(key, value, "true or false")
        return value
    return convert


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail("name", value, "a non-empty string")
    return value


#: key -> (BackendCapabilities field, converter). Keys missing from a file take the field's default.
_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "name": ("name", _name),
    "vendors": ("vendors", _enum_list(Vendor, "vendors")),
    "phases": ("phases", _enum_list(Phase, "phases")),
    "graph": ("graph", _graph),
    "multi_step": ("multi_step", _multi_step),
    "min_arch": ("min_arch", _min_arch),
    "dtypes": ("dtypes", _str_list("dtypes")),
    "kv_dtypes": ("kv_dtypes", _str_list("kv_dtypes")),
    "head_sizes": ("head_sizes", _int_list("head_sizes")),
    "page_sizes": ("page_sizes", _int_list("page_sizes")),
    "features": ("features", _enum_list(Feature, "features")),
    "seq_len_fill": ("seq_len_fill", _seq_len_fill),
    "needs_host_seq_lens": ("needs_host_seq_lens", _bool("needs_host_seq_lens")),
    "tolerances": ("tolerances", _tolerances),
    "requires": ("requires", lambda v: tuple(sorted(_str_list("requires")(v)))),
}
_REQUIRED = ("name", "vendors", "phases")


def parse_descriptor(data: Mapping[str, Any]) -> BackendCapabilities:
    """Build a descriptor from a parsed JSON/TOML table."""
    if not isinstance(data, Mapping):
        raise DescriptorError(f"descriptor={type(data).__name__} (supported: a table at the top level)")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise _fail(unknown[0], data[unknown[0]], f"keys {{{', '.join(_KEYS)}}}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise DescriptorError(f"{missing[0]} is missing (required keys: {', '.join(_REQUIRED)})")
    kwargs = {_KEYS[k][0]: _KEYS[k][1](v) for k, v in data.items()}
    try:
        return BackendCapabilities(**kwargs)
    except ValueError as exc:
        raise DescriptorError(str(exc)) from None


def load_descriptor(path: str | Path) -> BackendCapabilities:
    """Read a ``.json`` or ``.toml`` descriptor file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise DescriptorError(f"file={str(path)!r} (supported: .json or .toml)")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DescriptorError(f"{path}: {exc}") from None
    try:
        return parse_descriptor(data)
    except DescriptorError as exc:
        raise DescriptorError(f"{path}: {exc}") from None


def dump_descriptor(caps: BackendCapabilities) -> dict[str, Any]:
    """The JSON-ready table that :func:`parse_descriptor` turns back into ``caps``."""
    values = lambda items: sorted(getattr(i, "value", i) for i in items)  # noqa: E731
    out: dict[str, Any] = {
        "name": caps.name,
        "vendors": values(caps.vendors),
        "phases": values(caps.phases),
        "graph": {p.value: lim.to_dict() for p, lim in sorted(caps.graph.items())},
        "multi_step": caps.multi_step.to_dict() if caps.multi_step is not None else False,
        "min_arch": {v.value: a for v, a in sorted(caps.min_arch.items())},
        "dtypes": values(caps.dtypes),
        "kv_dtypes": values(caps.kv_dtypes or ()),
        "head_sizes": sorted(caps.head_sizes),
        "page_sizes": sorted(caps.page_sizes),
        "features": values(caps.features),
        "seq_len_fill": {"base": caps.seq_len_fill.base, "plus": caps.seq_len_fill.plus.value},
        "needs_host_seq_lens": caps.needs_host_seq_lens,
        "tolerances": {d: {"atol": t.atol, "rtol": t.rtol} for d, t in sorted(caps.tolerances.items())},
        "requires": list(caps.requires),
    }
    return out
