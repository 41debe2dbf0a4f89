"""vLLM's graph-mode resolution explained: which attention group set the level, each downgrade and
its cause, and where attnhal's reading (the catalogue, the adapter's :func:`resolve_mode`) differs.

Pure: the plugin (:mod:`attnhal.engines.vllm.plugin`) hands in what vLLM decided; the lines
returned are what it logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnhal.catalog import CatalogError, load
from attnhal.engines.vllm.resolution import CGSupport, GraphMode, min_support, resolve_mode

__all__ = ["GroupLevel", "ModeAudit", "audit_mode"]


@dataclass(frozen=True)
class GroupLevel:
    """One attention backend of one KV-cache group, and the level vLLM's builder gave it."""

    group: int
    backend: str  # vLLM's backend name ("FLASHINFER")
    level: CGSupport


@dataclass(frozen=True)
class ModeAudit:
    """What vLLM resolved and attnhal's reading of it."""

    lines: tuple[str, ...]
    differs: bool


def _catalogued(backend: str) -> tuple[CGSupport | None, str]:
    """The catalogue's level for ``vllm:BACKEND`` and its conditions (``None``: not catalogued)."""
    try:
        entry = load(f"vllm:{backend}")
    except CatalogError:
        return None, ""
    return CGSupport[entry.meta["cg_support"]], str(entry.meta.get("cg_conditions", ""))


def audit_mode(groups: Sequence[GroupLevel], requested: GraphMode, resolved: GraphMode | None,
               query_len: int = 1, attention_split: bool = True, error: str | None = None) -> ModeAudit:
    """Explain vLLM's ``cudagraph_mode`` resolution.

    ``groups``: each (KV-cache group, backend) with the level vLLM's builder reported;
    ``requested``: the mode before resolution; ``resolved``: after (``None`` with ``error``:
    vLLM refused); ``query_len``: ``1 + num_speculative_tokens``.
    """
    level, setter = min_support({f"{g.backend} (KV-cache group {g.group})": g.level for g in groups})
    lines = ["attention groups: " + ", ".join(f"group {g.group} {g.backend} {g.level.name}" for g in groups)]
    lines.append(f"level {level.name}, set by {setter}" if setter else f"level {level.name} (no attention group)")
    ours = resolve_mode(requested, level, query_len, attention_split)
    vllm = resolved.value if resolved is not None else f"refused ({error})"
    lines.append(f"cudagraph_mode: {requested.value} -> {vllm}")
    lines.extend(f"downgrade {step}" for step in ours.steps)
    differs = (ours.mode is None) != (resolved is None) or (resolved is not None and ours.mode is not resolved)
    if differs:
        lines.append(f"differs: attnhal's resolution of the same level gives "
                     f"{ours.mode.value if ours.mode else 'refused'}, vLLM {vllm}")
    for group in groups:
        catalogued, conditions = _catalogued(group.backend)
        if catalogued is None:
            lines.append(f"{group.backend}: not in attnhal's catalogue (vllm:{group.backend}); its level is vLLM's")
            continue
        if catalogued is not group.level:
            differs = True
            # The minimum over the groups, with this group at the catalogue's level.
            others = [g.level for g in groups if g is not group]
            with_catalogue = resolve_mode(requested, min([catalogued, *others]), query_len, attention_split)
            mode = with_catalogue.mode.value if with_catalogue.mode else "refused"
            lines.append(f"differs: vllm:{group.backend} is catalogued {catalogued.name}, vLLM graded it "
                         f"{group.level.name} here (conditions: {conditions or 'none recorded'}); with the "
                         f"catalogue's level the mode would be {mode}")
    return ModeAudit(tuple(lines), differs)
