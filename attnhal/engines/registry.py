"""The engine adapters, found through the ``attnhal.engines`` entry-point group.

An entry point's name is the engine's name (``--engine NAME``, ``NAME:BACKEND`` in the
catalogue); its value names an object satisfying :class:`~attnhal.engines.base.EngineAdapter`
(``attnhal_sglang.adapter:ADAPTER``). Listing the names loads nothing; an adapter is
loaded when it is first asked for. This module imports nothing of attnhal's, so the catalogue
(below the engines) can ask it which engines exist.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from typing import TYPE_CHECKING

from attnhal.errors import AttnhalError

if TYPE_CHECKING:
    from attnhal.engines.base import EngineAdapter

__all__ = ["GROUP", "SHIPPED", "UnknownEngine", "adapters", "clear", "get", "names"]

GROUP = "attnhal.engines"

#: attnhal's own adapters as ``pyproject.toml`` registers them (a test keeps the two equal).
#: Read only where attnhal's installed metadata predates the group (an editable install made
#: before it existed, or a source tree on ``PYTHONPATH``): ``pip install -e .`` makes it moot.
SHIPPED = {"sglang": "attnhal_sglang.adapter:ADAPTER", "vllm": "attnhal_vllm.adapter:ADAPTER"}


class UnknownEngine(AttnhalError, LookupError):
    """No adapter is registered under the name, or the one registered is not an adapter."""


def _declares_group() -> bool:
    try:
        return any(ep.group == GROUP for ep in distribution("attnhal").entry_points)
    except PackageNotFoundError:
        return False


@cache
def _entry_points() -> dict[str, EntryPoint]:
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if not _declares_group():
        for name, value in SHIPPED.items():
            found.setdefault(name, EntryPoint(name, value, GROUP))
    return dict(sorted(found.items()))


def names() -> list[str]:
    """The registered engines' names, sorted (no adapter is loaded)."""
    return list(_entry_points())


@cache
def get(name: str) -> EngineAdapter:
    """The adapter registered as ``name``; :class:`UnknownEngine` lists the registered ones."""
    found = _entry_points().get(name)
    if found is None:
        raise UnknownEngine(f"engine={name!r} (supported: {', '.join(names())})")
    adapter = found.load()
    # The protocol's own isinstance check lives above this module's layer: the same test, by hand.
    if getattr(adapter, "name", None) != name or not all(
            hasattr(adapter, a) for a in ("version", "flags", "harmless", "own_flags", "field_flags", "catalog",
                                          "parse", "resolve")):
        raise UnknownEngine(f"engine={name!r}: {found.value} is not an EngineAdapter named {name!r} "
                            "(supported: an object with the attributes and methods of attnhal.engines.base."
                            "EngineAdapter)")
    return adapter


def adapters() -> list[EngineAdapter]:
    """Every registered adapter, loaded, in name order."""
    return [get(name) for name in names()]


def clear() -> None:
    """Forget what was found (a test that registers an engine calls it)."""
    _entry_points.cache_clear()
    get.cache_clear()
