"""The engine adapters, found through the ``attnhal.engines`` entry-point group; failing soft.

An entry point's name is the engine's name (``--engine NAME``, ``NAME:BACKEND`` in the
catalogue); its value names an object satisfying :class:`~attnhal.engines.base.EngineAdapter`
(``attnhal_sglang.adapter:ADAPTER``). attnhal's own adapters register exactly as a third
party's does: there is no built-in list.

Listing (:func:`names`) reads the entry points' names only. An adapter is loaded when it is
first asked for (:func:`get`); one that fails to import, is not an adapter, or is registered
under another name than its own is **unavailable**: :func:`get` raises
:class:`EngineUnavailable` with the cause, :func:`adapters` leaves it out and
:func:`unavailable` says why (``attnhal info``), so one broken adapter costs only itself,
as a failing backend plugin does in :mod:`attnhal.registry`.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from attnhal.errors import AttnhalError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from attnhal.engines.base import EngineAdapter

__all__ = ["GROUP", "EngineUnavailable", "UnknownEngine", "adapters", "clear", "get", "names", "unavailable"]

GROUP = "attnhal.engines"

#: What an object registered as an adapter must have (the protocol's isinstance check, by hand:
#: :class:`~attnhal.engines.base.EngineAdapter` lives above this module's layer).
_ADAPTER_ATTRIBUTES = ("name", "version", "flags", "harmless", "own_flags", "field_flags", "catalog", "parse",
                       "resolve")


class UnknownEngine(AttnhalError, LookupError):
    """No adapter is registered under the name."""


class EngineUnavailable(AttnhalError, LookupError):
    """An adapter is registered under the name but cannot be used: it failed to import, is not
    an adapter, or is registered under another name than its own. ``reason`` says which."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"--engine={name!r} is unavailable: {reason}")


@cache
def _entry_points() -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points  # when an engine is first asked for, not at import

    return dict(sorted((ep.name, ep) for ep in entry_points(group=GROUP)))


def names() -> list[str]:
    """The registered engines' names, sorted (no adapter is loaded)."""
    return list(_entry_points())


@cache
def _load(name: str) -> EngineAdapter | EngineUnavailable:
    found = _entry_points()[name]
    try:
        adapter = found.load()
    except Exception as exc:  # any failure of a third party's import: this engine only is unavailable
        return EngineUnavailable(name, f"{found.value} failed to import ({type(exc).__name__}: {exc})")
    missing = [a for a in _ADAPTER_ATTRIBUTES if not hasattr(adapter, a)]
    if missing:
        return EngineUnavailable(name, f"{found.value} is not an EngineAdapter (it lacks {', '.join(missing)}; "
                                       "supported: an object with the attributes and methods of "
                                       "attnhal.engines.base.EngineAdapter)")
    if adapter.name != name:
        return EngineUnavailable(name, f"{found.value} is the adapter named {adapter.name!r}, registered as "
                                       f"{name!r} (supported: an entry point named as its adapter)")
    return adapter


def get(name: str) -> EngineAdapter:
    """The adapter registered as ``name``: :class:`UnknownEngine` lists the registered ones,
    :class:`EngineUnavailable` says why a registered one cannot be used."""
    if name not in _entry_points():
        raise UnknownEngine(f"--engine={name!r} (supported: {', '.join(names()) or 'no engine is registered'})")
    loaded = _load(name)
    if isinstance(loaded, EngineUnavailable):
        raise loaded
    return loaded


def adapters() -> list[EngineAdapter]:
    """Every registered adapter that loads, in name order (the unavailable ones: :func:`unavailable`)."""
    return [a for a in map(_load, names()) if not isinstance(a, EngineUnavailable)]


def unavailable() -> dict[str, str]:
    """Registered engine -> why its adapter cannot be used, for each one that cannot."""
    return {e.name: e.reason for e in map(_load, names()) if isinstance(e, EngineUnavailable)}


def clear() -> None:
    """Forget what was found (a test that registers an engine calls it)."""
    _entry_points.cache_clear()
    _load.cache_clear()
