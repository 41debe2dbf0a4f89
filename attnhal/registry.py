"""Backend registry: plugins found through the ``attnhal.backends`` entry points.

The reference backends register through the same entry-point route a
third-party package uses; the core never imports them. One name may carry a
different descriptor per vendor (the same engine backend name is a different
implementation on CUDA and on HIP): entries of one name with disjoint
``vendors`` coexist, and lookups with a platform take the one for its vendor. Entry points are loaded
lazily, one at a time: a plugin that fails to import is listed as unavailable,
with its error as the reason, and does not affect the others.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from attnhal.capabilities import (
    AttentionRequest,
    BackendCapabilities,
    Reason,
    ReasonCode,
    not_supported_reasons,
)
from attnhal.platform import Platform, Vendor

if TYPE_CHECKING:
    from attnhal.backend import AttentionBackend

__all__ = [
    "DEFAULT_PRIORITY",
    "BackendEntry",
    "BackendUnavailable",
    "NoBackendFits",
    "Registry",
    "default_registry",
]

GROUP = "attnhal.backends"

#: Default selection order per vendor. Backends not named here come after, by name.
DEFAULT_PRIORITY: dict[Vendor, tuple[str, ...]] = {
    Vendor.CUDA: ("triton", "torch"),
    Vendor.HIP: ("triton", "torch"),
    Vendor.CPU: ("cpu", "torch"),
}


class BackendUnavailable(LookupError):
    """An explicitly chosen backend that is missing or does not fit; ``reasons`` say why."""

    def __init__(self, name: str, reasons: list[Reason]) -> None:
        self.name, self.reasons = name, reasons
        lines = "\n".join(f"  - {r}" for r in reasons)
        super().__init__(f"backend {name!r} cannot be used:\n{lines}")


class NoBackendFits(LookupError):
    """No registered backend fits; ``candidates`` maps each name to its reasons."""

    def __init__(self, candidates: dict[str, list[Reason]]) -> None:
        self.candidates = candidates
        lines = [f"  {name}:" + "".join(f"\n    - {r}" for r in reasons)
                 for name, reasons in candidates.items()] or ["  (no backends registered)"]
        super().__init__("no attention backend fits:\n" + "\n".join(lines))


BackendClass = type["AttentionBackend"]


@dataclass
class BackendEntry:
    """One registered backend: its class (once loaded) or why it could not be loaded."""

    name: str
    source: str
    backend: BackendClass | None = None
    load_error: str | None = None
    #: A descriptor with no implementation here (the engine catalogue, attnhal.catalog).
    descriptor: BackendCapabilities | None = None

    @property
    def capabilities(self) -> BackendCapabilities | None:
        return self.backend.capabilities if self.backend is not None else self.descriptor

    def unavailable_reasons(self) -> list[Reason]:
        """Why the backend cannot be used here at all (load failure, missing modules)."""
        if self.load_error is not None:
            return [Reason(ReasonCode.LOAD_ERROR, f"load={self.source} failed: {self.load_error}")]
        if self.backend is None and self.descriptor is not None:
            return [Reason(ReasonCode.NO_BACKEND, f"backend={self.name} (supported: installed backends; "
                                                  f"{self.source} is a descriptor to plan with, not an implementation)")]
        assert self.capabilities is not None
        return [Reason(ReasonCode.MODULE_MISSING, f"module={mod} (supported: importable; pip install {mod})")
                for mod in self.capabilities.requires if importlib.util.find_spec(mod) is None]

    @property
    def available(self) -> bool:
        return not self.unavailable_reasons()

    def reasons(self, request: AttentionRequest, platform: Platform) -> list[Reason]:
        """Every reason this backend cannot serve ``request`` on ``platform``."""
        out = self.unavailable_reasons()
        if self.backend is not None:
            out += not_supported_reasons(self.backend.capabilities, request, platform)
            if not out:
                out += self.backend.runtime_reasons(platform)
        return out


def _load(ep: EntryPoint) -> BackendEntry:
    source = f"{ep.value} (entry point {ep.name!r})"
    try:
        cls = ep.load()
        caps = getattr(cls, "capabilities", None)
        if not isinstance(caps, BackendCapabilities):
            raise TypeError(f"{ep.value} has no class attribute capabilities: BackendCapabilities")
    except Exception as exc:  # noqa: BLE001 - any plugin failure becomes a reason, never a crash
        return BackendEntry(ep.name, source, load_error=f"{type(exc).__name__}: {exc}")
    return BackendEntry(caps.name, source, backend=cls)


def _clash(a: BackendEntry, b: BackendEntry) -> bool:
    """Same name and not told apart by vendor (a failed load cannot be told apart)."""
    if a.name != b.name:
        return False
    if a.capabilities is None or b.capabilities is None:
        return True
    return bool(a.capabilities.vendors & b.capabilities.vendors)


def _add(entries: list[BackendEntry], entry: BackendEntry) -> list[BackendEntry]:
    """``entries`` plus ``entry``, which replaces the entries it clashes with."""
    return [e for e in entries if not _clash(e, entry)] + [entry]


class Registry:
    """Backends by name (one per vendor at most), from entry points and :meth:`register`."""

    def __init__(self, discover: Callable[[], Iterable[EntryPoint]] | None = None) -> None:
        self._discover = discover or (lambda: entry_points(group=GROUP))
        self._entries: list[BackendEntry] | None = None
        self._registered: list[BackendEntry] = []

    def register(self, backend: BackendClass) -> None:
        """Register a backend class programmatically (wins over an entry point of the same
        name and an overlapping vendor set)."""
        name = backend.capabilities.name
        entry = BackendEntry(name, f"{backend.__module__}.{backend.__qualname__}", backend)
        self._registered = _add(self._registered, entry)

    def entries(self) -> list[BackendEntry]:
        """All backends, loaded on first use; failed loads are included with their error.

        Of two entry points with one name and overlapping vendors the first is kept.
        """
        if self._entries is None:
            self._entries = []
            for ep in self._discover():
                entry = _load(ep)
                if not any(_clash(e, entry) for e in self._entries):
                    self._entries.append(entry)
        out = list(self._entries)
        for entry in self._registered:
            out = _add(out, entry)
        return out

    def get(self, name: str, platform: Platform | None = None) -> BackendEntry:
        """The entry named ``name`` (for ``platform``'s vendor when given and the name has one
        descriptor per vendor); raises :class:`BackendUnavailable` listing the known names.
        ``ENGINE:NAME`` (``sglang:aiter``) is a descriptor of the engine catalogue."""
        from attnhal import catalog  # lazily: the catalogue reads package data

        if catalog.is_catalog_name(name):
            return catalog.registry_entry(name)
        named = [e for e in self.entries() if e.name == name]
        if not named:
            known = ", ".join(sorted({e.name for e in self.entries()})) or "none registered"
            raise BackendUnavailable(name, [Reason(ReasonCode.NO_BACKEND, f"backend={name} (supported: {known})")])
        if platform is not None:
            for entry in named:
                if entry.capabilities is not None and platform.vendor in entry.capabilities.vendors:
                    return entry
        return named[0]

    def ordered(self, platform: Platform) -> list[BackendEntry]:
        """One entry per name (the one for this platform's vendor), in its default priority order."""
        priority = DEFAULT_PRIORITY.get(platform.vendor, ())
        rank = {name: i for i, name in enumerate(priority)}
        names = sorted({e.name for e in self.entries()}, key=lambda n: (rank.get(n, len(rank)), n))
        return [self.get(name, platform) for name in names]

    def select(self, platform: Platform, request: AttentionRequest | None = None,
               name: str | None = None) -> BackendEntry:
        """The backend to use: ``name`` if given (validated), else the first that fits.

        An explicit choice that does not fit raises with all its reasons — never a
        silent substitute. When nothing fits, one error lists every candidate.
        """
        request = request or AttentionRequest()
        if name is not None:
            entry = self.get(name, platform)
            reasons = entry.reasons(request, platform)
            if reasons:
                raise BackendUnavailable(name, reasons)
            return entry
        candidates: dict[str, list[Reason]] = {}
        for entry in self.ordered(platform):
            reasons = entry.reasons(request, platform)
            if not reasons:
                return entry
            candidates[entry.name] = reasons
        raise NoBackendFits(candidates)


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry over installed entry points."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Registry()
    return _DEFAULT
