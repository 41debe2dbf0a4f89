"""Backend registry: implementations found through the ``attnhal.backends`` entry points.

The reference backends register through the same entry-point route a
third-party package uses; the core never imports them. An entry point names
either a :class:`BackendPlugin` (a descriptor plus where the class lives; the
registry reads the descriptor and imports the class only when it is needed) or an
:class:`~attnhal.backend.AttentionBackend` subclass directly (loaded when the
registry is first listed). One name may carry a different descriptor per vendor
(the same engine backend name is a different implementation on CUDA and on HIP):
entries of one name with disjoint ``vendors`` coexist, and lookups with a platform
take the one for its vendor. A plugin that fails to load is listed as unavailable,
with its error as the reason, and does not affect the others.

The registry holds implementations only. Descriptors without one (files, the
engine catalogue) and ``module:attr`` references are resolved by :mod:`attnhal.lookup`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnhal.capabilities import AttentionRequest, BackendCapabilities, not_supported_reasons
from attnhal.errors import AttnhalError
from attnhal.platform import Platform, Vendor
from attnhal.reasons import Reason, ReasonCode

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from attnhal.backend import AttentionBackend

__all__ = [
    "DEFAULT_PRIORITY",
    "GROUP",
    "BackendEntry",
    "BackendPlugin",
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


class BackendUnavailable(AttnhalError, LookupError):
    """An explicitly chosen backend that is missing or does not fit; ``reasons`` say why."""

    def __init__(self, name: str, reasons: list[Reason]) -> None:
        self.name, self.reasons = name, reasons
        lines = "\n".join(f"  - {r}" for r in reasons)
        super().__init__(f"backend {name!r} cannot be used:\n{lines}")


class NoBackendFits(AttnhalError, LookupError):
    """No registered backend fits; ``candidates`` maps each name to its reasons."""

    def __init__(self, candidates: dict[str, list[Reason]]) -> None:
        self.candidates = candidates
        lines = [f"  {name}:" + "".join(f"\n    - {r}" for r in reasons)
                 for name, reasons in candidates.items()] or ["  (no backends registered)"]
        super().__init__("no attention backend fits:\n" + "\n".join(lines))


BackendClass = type["AttentionBackend"]


def import_object(reference: str) -> object:
    """The object ``module:attr`` names (``attr`` may be dotted); ImportError/AttributeError as raised."""
    module, _, attr = reference.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _is_reference(text: str) -> bool:
    module, sep, attr = text.partition(":")
    return bool(sep and module and attr) and ":" not in attr


@dataclass(frozen=True)
class BackendPlugin:
    """The registration record an ``attnhal.backends`` entry point names.

    Put it in a module of the backend package that imports no torch (the shipped
    backends use ``<pkg>/descriptor.py``), so that the registry can list every
    backend's claims, and the planner plan with them, without importing any
    implementation::

        PLUGIN = BackendPlugin(CAPABILITIES, "my_package.backend:MyBackend")

    Attributes
    ----------
    descriptor: the backend's claims, exactly the class's ``capabilities``.
    implementation: ``"module:Class"`` of the :class:`~attnhal.backend.AttentionBackend`
        subclass, imported by :meth:`load` on first use (selection, conformance, running).
    """

    descriptor: BackendCapabilities
    implementation: str

    def __post_init__(self) -> None:
        if not isinstance(self.descriptor, BackendCapabilities):
            raise TypeError(f"descriptor={type(self.descriptor).__name__} (supported: BackendCapabilities)")
        if not isinstance(self.implementation, str) or not _is_reference(self.implementation):
            raise ValueError(f"implementation={self.implementation!r} (supported: 'module:Class')")

    def load(self) -> BackendClass:
        """Import the implementation; raises when it is missing or its ``capabilities`` is not
        :attr:`descriptor` (the planner would plan with one descriptor and run another)."""
        cls = import_object(self.implementation)
        caps = getattr(cls, "capabilities", None)
        if not isinstance(cls, type) or not isinstance(caps, BackendCapabilities):
            raise TypeError(f"implementation={self.implementation} (supported: a class with class attribute "
                            "capabilities: BackendCapabilities)")
        if caps != self.descriptor:
            raise TypeError(f"implementation={self.implementation} has capabilities {caps.name!r} that differ "
                            f"from the plugin's descriptor {self.descriptor.name!r} (supported: the same descriptor)")
        return cls


@dataclass
class BackendEntry:
    """One registered backend: its descriptor, and its class (imported on first use of :attr:`backend`).

    ``capabilities`` is None only when the entry point itself failed to load (``load_error``
    says why); a class that fails to import later leaves the descriptor readable.
    """

    name: str
    source: str
    capabilities: BackendCapabilities | None = None
    load_error: str | None = None
    plugin: BackendPlugin | None = None
    _class: BackendClass | None = field(default=None, repr=False)

    @classmethod
    def of(cls, backend: BackendClass, source: str | None = None) -> BackendEntry:
        """An entry for a loaded backend class."""
        caps = backend.capabilities
        return cls(caps.name, source or f"{backend.__module__}.{backend.__qualname__}", caps, _class=backend)

    @property
    def backend(self) -> BackendClass | None:
        """The implementing class, imported on first access; None (and ``load_error`` set) if that fails."""
        if self._class is None and self.load_error is None and self.plugin is not None:
            try:
                self._class = self.plugin.load()
            except Exception as exc:  # noqa: BLE001 - a failing plugin becomes a reason, never a crash
                self.load_error = f"{type(exc).__name__}: {exc}"
        return self._class

    def unavailable_reasons(self) -> list[Reason]:
        """Why the backend cannot be used here at all (load failure, missing modules).

        Asking loads the class when the required modules are there: a class that does
        not import is unavailable too.
        """
        if self.capabilities is not None:
            missing = [Reason(ReasonCode.MODULE_MISSING, f"module={mod} (supported: importable; pip install {mod})")
                       for mod in self.capabilities.requires if importlib.util.find_spec(mod) is None]
            if missing:
                return missing
            self.backend  # noqa: B018 - loads the class; a failure sets load_error
        if self.load_error is not None:
            return [Reason(ReasonCode.LOAD_ERROR, f"load={self.source} failed: {self.load_error}")]
        return []

    @property
    def available(self) -> bool:
        return not self.unavailable_reasons()

    def reasons(self, request: AttentionRequest, platform: Platform) -> list[Reason]:
        """Every reason this backend cannot serve ``request`` on ``platform``."""
        out = self.unavailable_reasons()
        if self.capabilities is not None:
            out += not_supported_reasons(self.capabilities, request, platform)
        if not out and self.backend is not None:
            out += self.backend.runtime_reasons(platform)
        return out

    def require(self, request: AttentionRequest, platform: Platform) -> BackendEntry:
        """This entry, or :class:`BackendUnavailable` with every reason it cannot serve ``request``."""
        reasons = self.reasons(request, platform)
        if reasons:
            raise BackendUnavailable(self.name, reasons)
        return self


def _installed() -> Iterable[EntryPoint]:
    """The installed ``attnhal.backends`` entry points (``importlib.metadata`` is imported here, when
    the registry is first read, not with ``import attnhal``: a usage error does not wait for it)."""
    from importlib.metadata import entry_points

    return entry_points(group=GROUP)


def _load(ep: EntryPoint) -> BackendEntry:
    source = f"{ep.value} (entry point {ep.name!r})"
    try:
        obj = ep.load()
        if isinstance(obj, BackendPlugin):
            return BackendEntry(obj.descriptor.name, f"{obj.implementation} via {source}", obj.descriptor,
                                plugin=obj)
        caps = getattr(obj, "capabilities", None)
        if not isinstance(obj, type) or not isinstance(caps, BackendCapabilities):
            raise TypeError(f"{ep.value} is not a BackendPlugin and has no class attribute capabilities: "
                            "BackendCapabilities")
    except Exception as exc:  # noqa: BLE001 - any plugin failure becomes a reason, never a crash
        return BackendEntry(ep.name, source, load_error=f"{type(exc).__name__}: {exc}")
    return BackendEntry.of(obj, source)


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
    """Backend implementations by name (one per vendor at most), from entry points and :meth:`register`."""

    def __init__(self, discover: Callable[[], Iterable[EntryPoint]] | None = None) -> None:
        self._discover = discover or _installed
        self._entries: list[BackendEntry] | None = None
        self._registered: list[BackendEntry] = []

    def register(self, backend: BackendClass | BackendPlugin) -> None:
        """Register a backend class or plugin programmatically (wins over an entry point of the
        same name and an overlapping vendor set)."""
        if isinstance(backend, BackendPlugin):
            entry = BackendEntry(backend.descriptor.name, backend.implementation, backend.descriptor, plugin=backend)
        else:
            entry = BackendEntry.of(backend)
        self._registered = _add(self._registered, entry)

    def entries(self) -> list[BackendEntry]:
        """All backends, their entry points loaded on first use; failed loads are included with
        their error. A :class:`BackendPlugin`'s class is not imported here.

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

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted({e.name for e in self.entries()})

    def get(self, name: str, platform: Platform | None = None) -> BackendEntry:
        """The entry registered as ``name`` (for ``platform``'s vendor when given and the name has
        one descriptor per vendor); raises :class:`BackendUnavailable` listing the known names.
        Other kinds of backend reference (files, ``ENGINE:NAME``, ``module:attr``): :mod:`attnhal.lookup`."""
        named = [e for e in self.entries() if e.name == name]
        if not named:
            known = ", ".join(self.names()) or "none registered"
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
        names = sorted(self.names(), key=lambda n: (rank.get(n, len(rank)), n))
        return [self.get(name, platform) for name in names]

    def select(self, platform: Platform, request: AttentionRequest | None = None,
               name: str | None = None) -> BackendEntry:
        """The backend to use: ``name`` if given (validated), else the first that fits.

        An explicit choice that does not fit raises with all its reasons — never a
        silent substitute. When nothing fits, one error lists every candidate.
        """
        request = request or AttentionRequest()
        if name is not None:
            return self.get(name, platform).require(request, platform)
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
