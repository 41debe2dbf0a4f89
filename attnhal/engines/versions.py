"""The supported engine releases: one table, from the registered adapters' own data.

An adapter may declare ``versions`` (the releases its flags, catalogue and plugin are tested
against; default: its ``version`` alone) and ``distribution`` (the package whose installed
release is read; default: its ``name``). ``attnhal info`` prints :func:`table`; the plugins
apply :func:`attnhal.engines.plugin_gate.plugin_mode` to the same releases: on another release
they audit only, and say so once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnhal.engines import registry
from attnhal.engines.plugin_gate import installed as installed_release
from attnhal.engines.releases import modelled

if TYPE_CHECKING:
    from attnhal.engines.base import EngineAdapter

__all__ = ["EngineVersions", "supported", "table"]


def supported(adapter: EngineAdapter) -> tuple[str, ...]:
    """The releases ``adapter`` is tested against (its ``versions``, else its ``version``)."""
    return tuple(getattr(adapter, "versions", None) or (adapter.version,))


@dataclass(frozen=True)
class EngineVersions:
    """One engine's row: the releases attnhal supports and the one installed here."""

    engine: str
    distribution: str
    supported: tuple[str, ...]
    installed: str | None  # None: not installed
    #: What the engine's plugin does on another release (the adapter's ``other_release``).
    other: str = "audits only"
    #: The release numbers that name a series (the adapter's ``series_digits``): a patch, pre- or
    #: post-release of a supported release is modelled as it (:mod:`attnhal.engines.releases`).
    digits: int = 3
    #: Why the registered adapter cannot be used (:func:`attnhal.engines.registry.unavailable`), or None.
    error: str | None = None

    @property
    def status(self) -> str:
        """``supported``, ``supported as R`` (a release of R's series), ``not installed``, what the
        plugin does on another release, or why the adapter is unavailable."""
        if self.error is not None:
            return f"unavailable: {self.error}"
        if self.installed is None:
            return "not installed"
        same = modelled(self.installed, self.supported, self.digits)
        if same is not None:
            return "supported" if same.exact else f"supported as {same.release}"
        return f"another release: the plugin {self.other}"

    def to_dict(self) -> dict[str, object]:
        return {"engine": self.engine, "distribution": self.distribution, "supported": list(self.supported),
                "installed": self.installed, "status": self.status, "error": self.error}


def table(installed: Callable[[str], str | None] = installed_release) -> list[EngineVersions]:
    """Every registered engine's row, in name order (``installed``: distribution -> release); an
    adapter that cannot be used is a row saying why."""
    rows = []
    for adapter in registry.adapters():
        distribution = str(getattr(adapter, "distribution", None) or adapter.name)
        rows.append(EngineVersions(adapter.name, distribution, supported(adapter), installed(distribution),
                                   str(getattr(adapter, "other_release", None) or "audits only"),
                                   int(getattr(adapter, "series_digits", 3))))
    rows += [EngineVersions(name, name, (), None, error=why) for name, why in registry.unavailable().items()]
    return sorted(rows, key=lambda row: row.engine)
