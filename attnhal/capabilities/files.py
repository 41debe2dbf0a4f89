"""Descriptor files: a :class:`~attnhal.capabilities.BackendCapabilities` written as JSON or TOML.

An engine can describe a backend that is not installed here ("what would happen
on MI300 with my aiter backend?") and hand the file to ``attnhal plan``.
:func:`load_descriptor` reads a file, :func:`parse_descriptor` a parsed table and
:func:`dump_descriptor` writes the table back. Unknown keys and bad values are
errors that name the key (:mod:`attnhal.capabilities.schema`, which also says
which keys need which ``schema_version``). The reference is ``docs/descriptors.md``.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attnhal.capabilities.claims import SeqLenFill, SpecLimits
from attnhal.capabilities.conditions import IntSet, Variant, When
from attnhal.capabilities.descriptor import BackendCapabilities
from attnhal.capabilities.schema import SCHEMA_VERSION, DescriptorError, converted

__all__ = ["MAX_FILE_BYTES", "SCHEMA_VERSION", "DescriptorError", "dump_descriptor", "load_descriptor",
           "parse_descriptor", "toml_parser"]

#: The largest descriptor file read (the shipped examples are a few KiB).
MAX_FILE_BYTES = 1 << 20


def parse_descriptor(data: Mapping[str, Any]) -> BackendCapabilities:
    """Build a descriptor from a parsed JSON/TOML table."""
    if not isinstance(data, Mapping):
        raise DescriptorError(f"descriptor={type(data).__name__} (supported: a table at the top level)")
    kwargs = converted(data)
    try:
        return BackendCapabilities(**kwargs)
    except ValueError as exc:
        raise DescriptorError(str(exc)) from None


def _read(path: Path) -> str:
    """The file's text; a FIFO, a device or a file over :data:`MAX_FILE_BYTES` is refused before
    reading (a FIFO would block forever, ``/dev/zero`` never end). A UTF-8 byte-order mark, which
    some editors write, marks the encoding and is not part of the text (``utf-8-sig``)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file: a FIFO, socket or device"
            raise DescriptorError(f"{path}: cannot read ({kind}; supported: a .json or .toml file)")
        if info.st_size > MAX_FILE_BYTES:
            raise DescriptorError(f"{path}: {info.st_size} bytes (supported: at most {MAX_FILE_BYTES})")
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DescriptorError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DescriptorError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None


def toml_parser() -> Any:
    """The TOML parser (``tomllib``; ``tomli`` on 3.10), imported when a file is read: a command
    refused before any file is read (a usage error) does not pay for it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    return tomllib


def load_descriptor(path: str | Path) -> BackendCapabilities:
    """Read a ``.json`` or ``.toml`` descriptor file; every failure is a :class:`DescriptorError` naming it."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path={path!r} (supported: a str or pathlib.Path)")
    path = Path(path)
    if path.suffix not in (".json", ".toml"):
        raise DescriptorError(f"file={str(path)!r} (supported: .json or .toml)")
    text = _read(path)
    tomllib = toml_parser()
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DescriptorError(f"{path}: {exc}") from None
    except RecursionError:  # nesting deeper than the parser's recursion: no descriptor nests past 4
        raise DescriptorError(f"{path}: nested too deeply (supported: tables and lists a few levels "
                              "deep)") from None
    try:
        return parse_descriptor(data)
    except DescriptorError as exc:
        raise DescriptorError(f"{path}: {exc}") from None


# --- dump ----------------------------------------------------------------------------

def _dump_values(items: Any) -> list[Any]:
    return sorted(getattr(i, "value", i) for i in items)


def _dump_fill(fill: SeqLenFill) -> dict[str, Any]:
    return {"base": fill.base, "plus": fill.plus.value, "at_least": fill.at_least,
            "at_least_plus": fill.at_least_plus.value}


def _dump_table(table: Mapping[Any, Any], dump: Callable[[Any], Any]) -> dict[str, Any]:
    return {k.value: (False if v is None else dump(v)) for k, v in sorted(table.items())}


_DUMP: dict[str, Callable[[Any], Any]] = {
    "vendors": _dump_values, "phases": _dump_values, "dtypes": _dump_values, "kv_dtypes": _dump_values,
    "head_sizes": sorted, "page_sizes": sorted, "features": _dump_values, "models": _dump_values,
    "graph": lambda t: _dump_table(t, SpecLimits.to_dict),
    "run_limits": lambda t: _dump_table(t, SpecLimits.to_dict),
    "phase_fill": lambda t: _dump_table(t, _dump_fill),
    "multi_step": lambda m: m.to_dict() if m is not None else False,
    "min_arch": lambda t: _dump_table(t, str),
    "archs": lambda t: _dump_table(t, lambda s: list(s.items)),
    "seq_len_fill": _dump_fill,
    "needs_host_seq_lens": bool,
}


def _dump_when(when: When) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, test in when.tests:
        if name == "arch":
            out[name] = {v.value: list(s.items) for v, s in sorted(test.items())}
        elif isinstance(test, IntSet):
            out[name] = sorted(test.values) if test.values else \
                {k: getattr(test, k) for k in ("min", "max") if getattr(test, k) is not None}
        else:
            out[name] = _dump_values(test)
    return out


def _dump_variant(v: Variant) -> dict[str, Any]:
    out: dict[str, Any] = {"when": _dump_when(v.when)}
    if v.note:
        out["note"] = v.note
    out.update({k: _DUMP[k](x) for k, x in v.changes.items()})
    for attr in ("add", "remove"):
        if getattr(v, attr):
            out[attr] = {k: _DUMP[k](x) for k, x in getattr(v, attr).items()}
    return out


def dump_descriptor(caps: BackendCapabilities) -> dict[str, Any]:
    """The JSON-ready table that :func:`parse_descriptor` turns back into ``caps``."""
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "name": caps.name}
    out.update({k: _DUMP[k](getattr(caps, k)) for k in _DUMP})
    out["tolerances"] = {d: {"atol": t.atol, "rtol": t.rtol} for d, t in sorted(caps.tolerances.items())}
    out["requires"] = list(caps.requires)
    out["variants"] = [_dump_variant(v) for v in caps.variants]
    return out
