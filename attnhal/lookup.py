"""Backend references: the one grammar for naming a backend, and its two resolvers.

A *backend reference* is the string a user gives wherever attnhal takes a backend:
``attnhal plan/explain --backend``, ``attnhal conformance NAME``, ``pytest
--attnhal-backend NAME``, a conformance class's ``backend_cls`` and
``SpecWorker(backend=...)``. It has one of four shapes, recognised in this order:

====================  ==============================  ==============================================
shape                 example                         names
====================  ==============================  ==============================================
descriptor file       ``my.toml``, ``conf/b.json``    a descriptor file (``docs/descriptors.md``):
                                                      ends in ``.toml`` or ``.json``, or contains ``/``
catalogue name        ``sglang:aiter``                ``ENGINE:NAME`` with ``ENGINE`` one of
                                                      :data:`attnhal.catalog.ENGINES`: an engine's
                                                      backend, described here, implemented elsewhere
``module:attr``       ``attnhal_torch:TorchBackend``  any other ``a:b``: an importable
                                                      :class:`~attnhal.backend.AttentionBackend`
                                                      subclass, :class:`~attnhal.registry.BackendPlugin`
                                                      or :class:`~attnhal.capabilities.BackendCapabilities`
registered name       ``torch``                       no colon: an implementation in the
                                                      :class:`~attnhal.registry.Registry`
====================  ==============================  ==============================================

The engine prefixes are reserved: ``sglang:x`` is always the catalogue, never a module
named ``sglang``. A file that exists under a bare name (``torch`` in the working
directory) does not hide the registered name.

:func:`describe` takes every shape and returns the descriptor, to plan with.
:func:`backend_class` takes ``module:attr`` and registered names and returns the class,
to run or check; a file or a catalogue name there is :class:`NotAnImplementation`.

Errors: :class:`UnknownBackend` (nothing by that reference; the message lists what is
supported) and :class:`NotAnImplementation`, both
:class:`~attnhal.registry.BackendUnavailable` (a ``LookupError``) with ``reasons``; a
registered backend or object that fails to load is a ``BackendUnavailable`` with its
load error; :class:`DescriptorFileError` (a ``ValueError``) for a file that cannot be
read or parsed.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from attnhal import catalog
from attnhal.capabilities import BackendCapabilities
from attnhal.capabilities.files import DescriptorError, load_descriptor
from attnhal.platform import Platform
from attnhal.reasons import Reason, ReasonCode
from attnhal.registry import (
    GROUP,
    BackendEntry,
    BackendPlugin,
    BackendUnavailable,
    Registry,
    default_registry,
    import_object,
)

if TYPE_CHECKING:
    from attnhal.backend import AttentionBackend

__all__ = ["DescriptorFileError", "NotAnImplementation", "RefShape", "UnknownBackend", "backend_class",
           "describe", "shape"]

_FILE_SUFFIXES = (".toml", ".json")

#: What a resolver accepts, as the "supported" part of an error (computed only on error:
#: listing the registered names loads the registry's entry points).
Supported = Callable[["Registry | None"], str]


class RefShape(str, Enum):
    """The four shapes of a backend reference (module docstring)."""

    FILE = "descriptor file"
    CATALOGUE = "catalogue name"
    MODULE_ATTR = "module:attr"
    REGISTERED = "registered name"


class UnknownBackend(BackendUnavailable):
    """A reference that names nothing of its shape; the message lists what is supported."""

    def __init__(self, ref: str, message: str) -> None:
        # One reason that names the reference itself: the message alone, on one line.
        self.name, self.reasons = ref, [Reason(ReasonCode.NO_BACKEND, message)]
        LookupError.__init__(self, message)


class NotAnImplementation(UnknownBackend):
    """A descriptor (a file, a catalogue name, a ``BackendCapabilities``) given where a class is needed."""


class DescriptorFileError(DescriptorError):
    """A descriptor file that cannot be read or parsed; ``detail`` is the cause on one line."""

    def __init__(self, ref: str, detail: str) -> None:
        self.ref, self.detail = ref, detail
        super().__init__(f"backend={ref}: {detail}")


def shape(ref: str) -> RefShape:
    """Which of the four shapes ``ref`` has (by its spelling only: nothing is read or imported)."""
    if not isinstance(ref, str):
        raise TypeError(f"backend={ref!r} (supported: a str backend reference; backend_class also takes a class)")
    if ref.endswith(_FILE_SUFFIXES) or "/" in ref:
        return RefShape.FILE
    if catalog.is_catalog_name(ref):
        return RefShape.CATALOGUE
    if ":" in ref:
        return RefShape.MODULE_ATTR
    return RefShape.REGISTERED


def describe(ref: str, platform: Platform | None = None, *, registry: Registry | None = None) -> BackendCapabilities:
    """The descriptor ``ref`` names, in any of the four shapes, to plan with.

    A registered name with one descriptor per vendor gives ``platform``'s (the first one
    without a platform). Reading a registered backend's descriptor imports its
    :class:`~attnhal.registry.BackendPlugin` module only, not its implementation.
    """
    kind = shape(ref)
    if kind is RefShape.FILE:
        return _read_file(ref)
    if kind is RefShape.CATALOGUE:
        try:
            return catalog.load(ref).descriptor
        except catalog.CatalogError as exc:
            raise UnknownBackend(ref, str(exc)) from None
    if kind is RefShape.MODULE_ATTR:
        obj = _import(ref, _describable, registry)
        if isinstance(obj, BackendCapabilities):
            return obj
        if isinstance(obj, BackendPlugin):
            return obj.descriptor
        caps = getattr(obj, "capabilities", None)
        if isinstance(obj, type) and isinstance(caps, BackendCapabilities):
            return caps
        raise UnknownBackend(ref, f"backend={ref} (supported: module:attr naming a BackendCapabilities, a "
                                  "BackendPlugin or a class with class attribute capabilities: BackendCapabilities)")
    entry = _registered(ref, platform, registry, _describable)
    if entry.capabilities is None:
        raise BackendUnavailable(ref, entry.unavailable_reasons())
    return entry.capabilities


def backend_class(ref: str | type[AttentionBackend], platform: Platform | None = None, *,
                  registry: Registry | None = None) -> type[AttentionBackend]:
    """The :class:`~attnhal.backend.AttentionBackend` subclass ``ref`` names, to run or check.

    ``ref``: a class (validated and returned), ``module:attr`` (a class or a
    :class:`~attnhal.registry.BackendPlugin`) or a registered name (``platform``'s entry
    when the name has one per vendor). A file or a catalogue name is
    :class:`NotAnImplementation`: a descriptor to plan with, not an implementation.
    """
    if isinstance(ref, type):
        return _checked_class(ref, ref.__qualname__)
    kind = shape(ref)
    if kind is RefShape.FILE:
        raise NotAnImplementation(ref, _no_implementation(ref, f"{ref} is a descriptor file", registry))
    if kind is RefShape.CATALOGUE:
        engine = ref.partition(":")[0]
        raise NotAnImplementation(ref, _no_implementation(
            ref, f"{ref} is in the {engine} engine catalogue (ENGINE:NAME with ENGINE in "
                 f"{{{', '.join(catalog.ENGINES)}}} is never read as module:attr)", registry))
    if kind is RefShape.MODULE_ATTR:
        obj = _import(ref, _runnable, registry)
        if isinstance(obj, BackendCapabilities):
            raise NotAnImplementation(ref, _no_implementation(ref, f"{ref} is a BackendCapabilities", registry))
        if isinstance(obj, BackendPlugin):
            obj = _load_plugin(ref, obj)
        return _checked_class(obj, ref)
    entry = _registered(ref, platform, registry, _runnable)
    cls = entry.backend
    if cls is None:
        raise BackendUnavailable(ref, entry.unavailable_reasons())
    return _checked_class(cls, ref)


# --- helpers ---------------------------------------------------------------------------------

def _names(registry: Registry | None) -> str:
    return ", ".join((registry or default_registry()).names()) or "none registered"


def _describable(registry: Registry | None) -> str:
    return (f"a registered name ({_names(registry)}), ENGINE:NAME with ENGINE in {{{', '.join(catalog.ENGINES)}}} "
            "(attnhal catalog), module:attr, or a .toml/.json descriptor file")


def _runnable(registry: Registry | None) -> str:
    return f"a registered name ({_names(registry)}) or module:attr naming an AttentionBackend subclass or BackendPlugin"


def _no_implementation(ref: str, what: str, registry: Registry | None) -> str:
    return (f"backend={ref} (supported: {_runnable(registry)}): {what}, a descriptor to plan with, not an "
            f"implementation; plan with it (attnhal plan --backend {ref}) or name a class that implements it")


def _read_file(ref: str) -> BackendCapabilities:
    try:
        return load_descriptor(ref)
    except DescriptorError as exc:  # every read or parse failure, naming the file
        detail = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
        raise DescriptorFileError(ref, detail) from None


def _import(ref: str, supported: Supported, registry: Registry | None) -> object:
    """The object ``module:attr`` names. Not importable: :class:`UnknownBackend`, listing
    ``supported(registry)``; the module raising anything else while importing: its load error."""
    try:
        return import_object(ref)
    except (ImportError, AttributeError) as exc:
        raise UnknownBackend(ref, f"backend={ref} (supported: {supported(registry)}): "
                                  f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing: say so, with its error
        raise BackendUnavailable(ref, [Reason(ReasonCode.LOAD_ERROR, f"load={ref} failed: "
                                                                     f"{type(exc).__name__}: {exc}")]) from None


def _load_plugin(ref: str, plugin: BackendPlugin) -> object:
    try:
        return plugin.load()
    except Exception as exc:  # noqa: BLE001 - the plugin's implementation failed to load: say so, with its error
        raise BackendUnavailable(ref, [Reason(ReasonCode.LOAD_ERROR, f"load={plugin.implementation} failed: "
                                                                     f"{type(exc).__name__}: {exc}")]) from None


def _registered(ref: str, platform: Platform | None, registry: Registry | None, supported: Supported) -> BackendEntry:
    try:
        return (registry or default_registry()).get(ref, platform)
    except BackendUnavailable:
        raise UnknownBackend(ref, f"backend={ref} (supported: {supported(registry)}){_module_hint(ref)}") from None


def _module_hint(ref: str) -> str:
    """What to write instead when ``ref`` is a module or package name, not a backend name: the
    names its ``attnhal.backends`` entry points register, else ``module:Class``."""
    import importlib.util
    from importlib.metadata import entry_points

    try:
        found = importlib.util.find_spec(ref) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return ""
    names = sorted(ep.name for ep in entry_points(group=GROUP)
                   if ep.value.partition(":")[0] == ref or ep.value.startswith(ref + "."))
    if names:
        return (f"; {ref} is a module: backends go by their entry-point name, here {', '.join(names)} "
                f"(attnhal conformance {names[0]})")
    return (f"; {ref} is a module that registers no attnhal.backends entry point: name its backend class "
            f"as {ref}:ClassName")


def _checked_class(obj: object, ref: str) -> type[AttentionBackend]:
    from attnhal.backend import AttentionBackend  # lazily: the contract imports torch

    if not (isinstance(obj, type) and issubclass(obj, AttentionBackend)
            and isinstance(getattr(obj, "capabilities", None), BackendCapabilities)):
        raise UnknownBackend(ref, f"backend={ref} (supported: an AttentionBackend subclass with class attribute "
                                  "capabilities: BackendCapabilities)")
    return obj
