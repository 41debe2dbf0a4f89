"""The engine releases attnhal supports, in one table, and what ``attnhal info`` says of them.

The catalogue and the adapters describe the first release of each row (``attnhal.catalog.ENGINES``);
the plugins hook every release of the row (vLLM: ``attnhal.engines.vllm.plugin.RELEASES``), and
say once, at start, that another installed release is left alone. Reading the installed
releases imports no engine (``importlib.metadata``).
"""

from __future__ import annotations

from types import MappingProxyType

from attnhal.engines.plugin_gate import installed

__all__ = ["SUPPORTED", "engine_rows"]

#: Engine (distribution name) -> the releases attnhal's plugin hooks and its tiers execute.
SUPPORTED = MappingProxyType({"sglang": ("0.5.23",), "vllm": ("0.33.0", "0.34.0")})


def engine_rows() -> list[tuple[str, str, str, str]]:
    """(engine, supported releases, installed release, what attnhal's plugin does with it)."""
    rows = []
    for engine, releases in SUPPORTED.items():
        found = installed(engine)
        if found is None:
            plugin = "-"
        elif found in releases:
            plugin = "hooks it"
        else:
            plugin = "stays off (another release; one warning at start)"
        rows.append((engine, ", ".join(releases), found or "not installed", plugin))
    return rows
