"""Backend registry: plugins found through the ``attnhal.backends`` entry points.

The reference backends register through the same entry-point route a
third-party package uses; the core never imports them. Entry points are loaded
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

    @property
    def capabilities(self) -> BackendCapabilities | None:
        return self.backend.capabilities if self.backend is not None else None

    def unavailable_reasons(self) -> list[Reason]:
        """Why the backend cannot be used here at all (load failure, missing modules)."""
        if self.load_error is not None:
            return [Reason(ReasonCode.LOAD_ERROR, f"load={self.source} failed: {self.load_error}")]
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


class Registry:
    """Backends by name, from entry points and :meth:`register`."""

    def __init__(self, discover: Callable[[], Iterable[EntryPoint]] | None = None) -> None:
        self._discover = discover or (lambda: entry_points(group=GROUP))
        self._entries: dict[str, BackendEntry] | None = None
        self._registered: dict[str, BackendEntry] = {}

    def register(self, backend: BackendClass) -> None:
        """Register a backend class programmatically (wins over an entry point of the same name)."""
        name = backend.capabilities.name
        self._registered[name] = BackendEntry(name, f"{backend.__module__}.{backend.__qualname__}", backend)

    def entries(self) -> list[BackendEntry]:
        """All backends, loaded on first use; failed loads are included with their error."""
        if self._entries is None:
            self._entries = {}
            for ep in self._discover():
                entry = _load(ep)
                self._entries.setdefault(entry.name, entry)
        return list({**self._entries, **self._registered}.values())

    def get(self, name: str) -> BackendEntry:
        """The entry named ``name``; raises :class:`BackendUnavailable` listing the known names."""
        for entry in self.entries():
            if entry.name == name:
                return entry
        known = ", ".join(sorted(e.name for e in self.entries())) or "none registered"
        raise BackendUnavailable(name, [Reason(ReasonCode.NO_BACKEND, f"backend={name} (supported: {known})")])

    def ordered(self, platform: Platform) -> list[BackendEntry]:
        """Entries in this platform's default priority order."""
        priority = DEFAULT_PRIORITY.get(platform.vendor, ())
        rank = {name: i for i, name in enumerate(priority)}
        return sorted(self.entries(), key=lambda e: (rank.get(e.name, len(rank)), e.name))

    def select(self, platform: Platform, request: AttentionRequest | None = None,
               name: str | None = None) -> BackendEntry:
        """The backend to use: ``name`` if given (validated), else the first that fits.

        An explicit choice that does not fit raises with all its reasons — never a
        silent substitute. When nothing fits, one error lists every candidate.
        """
        request = request or AttentionRequest()
        if name is not None:
            entry = self.get(name)
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
