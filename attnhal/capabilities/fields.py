"""The descriptor file's keys as data for their reference table: type, bounds, default.

``attnhal docs`` renders :data:`FIELDS` as ``docs/descriptor_fields.md``; the bounds are the
schema's own objects (:mod:`attnhal.capabilities.schema`, :mod:`attnhal.capabilities.claims`),
so the table cannot disagree with what a file is checked against, and a test fails when a
key of the schema has no row here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnhal.capabilities.claims import FILL_BOUND, LIMIT_BOUNDS, TOLERANCE_BOUND, FillTerm
from attnhal.capabilities.schema import (
    MAX_HEAD_SIZE,
    MAX_ITEMS,
    MAX_NAME,
    MAX_NOTE,
    MAX_PAGE_SIZE,
    REQUIRED,
    SCHEMA_VERSION,
    V2_KEYS,
    WHEN_BOUND,
)
from attnhal.phases import Feature, Phase
from attnhal.platform import Vendor
from attnhal.spec import DTYPES, KV_DTYPES, ModelKind

__all__ = ["FIELDS", "KeyDoc", "rows"]


@dataclass(frozen=True)
class KeyDoc:
    """One key of a descriptor file: its TOML/JSON type, what values it takes, its default."""

    key: str
    type: str
    bounds: str
    default: str


def _of(values: Iterable[object]) -> str:
    return "{" + ", ".join(str(getattr(v, "value", v)) for v in values) + "}"


_LIMITS = ", ".join(f"`{name}` {bound}" for name, bound in LIMIT_BOUNDS.items())
_FILL = (f"integer {FILL_BOUND}, or a table `base`, `at_least` ({FILL_BOUND}), `plus`, `at_least_plus` "
         f"(one of {_of(FillTerm)})")
_LIST = f"at most {MAX_ITEMS} entries"

#: Every key of a descriptor file, in the order the reference lists them.
FIELDS: tuple[KeyDoc, ...] = (
    KeyDoc("schema_version", "integer", f"1..{SCHEMA_VERSION}", "1"),
    KeyDoc("name", "string", f"printable, 1..{MAX_NAME} characters (no control characters)", ""),
    KeyDoc("vendors", "list of strings", f"non-empty, from {_of(Vendor)}", ""),
    KeyDoc("phases", "list of strings", f"non-empty, from {_of(Phase)}", ""),
    KeyDoc("graph", "table: phase -> limits", f"phases listed in `phases`, not prefill; limits {_LIMITS}", "{}"),
    KeyDoc("multi_step", "boolean or limits table", f"limits {_LIMITS}", "false"),
    KeyDoc("min_arch", "table: vendor -> arch", "an arch in the vendor's notation (sm80, gfx90a)", "{}"),
    KeyDoc("dtypes", "list of strings", f"non-empty, from {_of(DTYPES)}", "all three"),
    KeyDoc("kv_dtypes", "list of strings", f"non-empty, from {_of(KV_DTYPES)}", "= dtypes"),
    KeyDoc("head_sizes", "list of integers", f"non-empty, 1..{MAX_HEAD_SIZE}, {_LIST}", "[64, 128, 256]"),
    KeyDoc("page_sizes", "list of integers", f"non-empty, 1..{MAX_PAGE_SIZE}, {_LIST}", "[1]"),
    KeyDoc("features", "list of strings", f"from {_of(Feature)}", "[]"),
    KeyDoc("seq_len_fill", "integer or table", _FILL, "1"),
    KeyDoc("needs_host_seq_lens", "boolean", "true or false", "false"),
    KeyDoc("tolerances", "table: dtype -> {atol, rtol}", f"dtype from {_of(KV_DTYPES)}; atol, rtol finite "
           f"{TOLERANCE_BOUND}, and the conformance kit's ceiling per dtype bounds them further",
           "fp32 1e-4, fp16 2e-3, bf16 1.6e-2"),
    KeyDoc("requires", "list of strings", f"importable module names, {_LIST}", "[]"),
    KeyDoc("archs", "table: vendor -> list", f"archs or ordered ranges (`sm80..sm90`, `sm100..`), {_LIST}", "{}"),
    KeyDoc("models", "list of strings", f"non-empty, from {_of(ModelKind)}", "mha, gqa (+ mla with feature mla)"),
    KeyDoc("run_limits", "table: phase -> limits", f"phases listed in `phases`; limits {_LIMITS}", "{}"),
    KeyDoc("phase_fill", "table: phase -> fill", f"graph phases; fill: {_FILL}", "{}"),
    KeyDoc("variants", "list of tables", f"{_LIST}; `when` integers {WHEN_BOUND}, ranges ordered (min <= max); "
           f"`note` printable, at most {MAX_NOTE} characters; an empty list is a change there", "[]"),
)


def rows() -> list[tuple[str, str, str, str, str]]:
    """``(key, type, values, default, schema)`` per key: required keys and the keys of schema 2
    marked from the schema's own lists."""
    return [(f"`{f.key}`", f.type, f.bounds, "required" if f.key in REQUIRED else f.default,
             "2" if f.key in V2_KEYS else "1") for f in FIELDS]
