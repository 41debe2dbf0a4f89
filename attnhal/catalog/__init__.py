"""The engine catalogue: descriptors of real engines' attention backends, shipped as data.

Each engine adapter (:mod:`attnhal.engines.registry`) may name a package whose folder holds
its catalogue (``attnhal/catalog/<engine>/<name>.toml`` for SGLang and vLLM). Each file is an
ordinary descriptor file (see ``docs/descriptors.md``) plus one ``[catalog]`` table with what the catalogue
itself needs: the engine release it describes and a one-line summary. Every claim
in a file carries a comment citing ``path.py:LINE`` of that release. The
descriptor says what the backend *can* do; where the engine's own code decides
otherwise, ``docs/catalog.md`` lists the discrepancy.

Backends are addressed as ``ENGINE:NAME`` (``sglang:aiter``, ``vllm:FLASH_ATTN``)
wherever attnhal takes a descriptor (:func:`attnhal.lookup.describe`). They have no
implementation here: they are descriptors to plan with, not backends to run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from attnhal.capabilities import BackendCapabilities
from attnhal.capabilities.files import DescriptorError, parse_descriptor, toml_parser
from attnhal.engines import registry
from attnhal.errors import AttnhalError

__all__ = ["ENGINES", "CatalogEntry", "CatalogError", "Citation", "citations", "entries", "is_catalog_name", "load"]


class _Engines(Mapping[str, str]):
    """Engine name -> the release its catalogue describes, for each registered adapter that loads and
    names a catalogue. Read on use: listing it loads the adapters, importing this module does not."""

    def _found(self) -> dict[str, str]:
        return {a.name: a.version for a in registry.adapters() if a.catalog is not None}

    def __getitem__(self, name: str) -> str:
        try:
            adapter = registry.get(name)
        except LookupError:  # not registered, or unavailable (attnhal info says why)
            raise KeyError(name) from None
        if adapter.catalog is None:
            raise KeyError(name)
        return adapter.version

    def __iter__(self) -> Iterator[str]:
        return iter(self._found())

    def __len__(self) -> int:
        return len(self._found())

    def __repr__(self) -> str:
        return f"ENGINES({self._found()!r})"


#: Engines with a catalogue, and the release each one describes (from the registered adapters).
ENGINES: Mapping[str, str] = _Engines()

#: Keys of the ``[catalog]`` table. ``meta`` holds engine-specific facts the adapters read.
_CATALOG_KEYS = ("engine", "version", "summary", "meta")


class CatalogError(AttnhalError, LookupError):
    """An unknown catalogue name, or a malformed catalogue file."""


@dataclass(frozen=True)
class CatalogEntry:
    """One catalogued engine backend: its descriptor and where it comes from."""

    engine: str
    name: str  # the engine's own name: "aiter", "FLASH_ATTN"
    version: str
    summary: str
    descriptor: BackendCapabilities
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def qualified_name(self) -> str:
        return f"{self.engine}:{self.name}"


def is_catalog_name(name: str) -> bool:
    """Whether ``name`` addresses the catalogue (``ENGINE:NAME``)."""
    engine, sep, _ = name.partition(":")
    return bool(sep) and engine in ENGINES


def _files(engine: str) -> dict[str, Any]:
    package = registry.get(engine).catalog
    if package is None:
        raise CatalogError(f"engine={engine} has no catalogue (supported: {', '.join(ENGINES)})")
    folder = resources.files(package)
    return {f.name.removesuffix(".toml"): f for f in folder.iterdir() if f.name.endswith(".toml")}


def _parse(engine: str, name: str, text: str) -> CatalogEntry:
    where = f"{str(registry.get(engine).catalog).replace('.', '/')}/{name}.toml"
    tomllib = toml_parser()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{where}: {exc}") from None
    meta = data.pop("catalog", None)
    if not isinstance(meta, dict):
        raise CatalogError(f"{where}: catalog={meta!r} (supported: a [catalog] table with {', '.join(_CATALOG_KEYS)})")
    unknown = sorted(set(meta) - set(_CATALOG_KEYS))
    if unknown:
        raise CatalogError(f"{where}: catalog.{unknown[0]} (supported: keys {', '.join(_CATALOG_KEYS)})")
    if meta.get("engine") != engine or meta.get("version") != ENGINES[engine]:
        raise CatalogError(f"{where}: catalog.engine/version={meta.get('engine')}/{meta.get('version')} "
                           f"(supported: {engine}/{ENGINES[engine]})")
    if data.get("name") != f"{engine}:{name}":
        raise CatalogError(f"{where}: name={data.get('name')!r} (supported: {engine}:{name!r})")
    try:
        caps = parse_descriptor(data)
    except DescriptorError as exc:
        raise CatalogError(f"{where}: {exc}") from None
    return CatalogEntry(engine, name, meta["version"], str(meta.get("summary", "")), caps,
                        MappingProxyType(dict(meta.get("meta", {}))))


@cache
def _entries(engine: str) -> dict[str, CatalogEntry]:
    return {name: _parse(engine, name, f.read_text(encoding="utf-8"))
            for name, f in sorted(_files(engine).items())}


def entries(engine: str | None = None) -> list[CatalogEntry]:
    """Every catalogued backend (of one engine, or of all), sorted by engine and name."""
    engines = [engine] if engine is not None else list(ENGINES)
    for e in engines:
        if e not in ENGINES:
            raise CatalogError(f"engine={e} (supported: {', '.join(ENGINES)})")
    return [entry for e in engines for entry in _entries(e).values()]


def load(name: str) -> CatalogEntry:
    """The catalogue entry ``ENGINE:NAME``; the error lists the engine's names."""
    engine, _, short = name.partition(":")
    if engine not in ENGINES:
        raise CatalogError(f"backend={name} (supported: ENGINE:NAME with ENGINE in {{{', '.join(ENGINES)}}})")
    found = _entries(engine)
    if short not in found:
        known = ", ".join(f"{engine}:{n}" for n in found)
        raise CatalogError(f"backend={name} (supported: {known})")
    return found[short]



@dataclass(frozen=True)
class Citation:
    """One comment of a catalogue file: the key it stands beside (``graph.decode``; ``(file)``
    for the file's opening lines) and its text, which cites the engine's source."""

    key: str
    text: str


def citations(name: str) -> list[Citation]:
    """The comments of entry ``ENGINE:NAME``'s file, in file order, each with its key: a
    comment on a key's line, or on the lines just above it, is that key's."""
    entry = load(name)
    text = _files(entry.engine)[entry.name].read_text(encoding="utf-8")
    out: list[Citation] = []
    pending: list[str] = []
    table = ""
    for line in text.splitlines():
        code, _, comment = line.partition(" #") if not line.lstrip().startswith("#") else ("", "", line)
        comment = comment.strip().lstrip("#").strip()
        code = code.strip()
        if not code:
            if comment:
                pending.append(comment)
            continue
        if code.startswith("["):
            table = code.strip("[]").strip()
            key = table
        else:
            key = ".".join(filter(None, (table, code.split("=")[0].strip())))
        out += [Citation(key if out or table else "(file)", c) for c in pending]
        pending = []
        if comment:
            out.append(Citation(key, comment))
    return out
