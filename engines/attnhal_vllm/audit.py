"""vLLM's graph-mode resolution explained: which attention group set the level, each downgrade and
its cause, and where attnhal's reading differs: the level attnhal gives the backend on this platform
(:func:`~attnhal_vllm.levels.support_on`: the catalogue, and vLLM's per-configuration rules)
and its resolution of the mode (:func:`~attnhal_vllm.resolve_mode`).

Pure: the plugin (:mod:`attnhal_vllm.plugin`) hands in what vLLM decided; the lines
returned are what it logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnhal.catalog import CatalogError
from attnhal_vllm.levels import Level, support_on
from attnhal_vllm.modes import CGSupport, GraphMode, min_support, resolve_mode
from attnhal.platform import Platform

__all__ = ["GroupLevel", "ModeAudit", "audit_mode"]


@dataclass(frozen=True)
class GroupLevel:
    """One attention backend of one KV-cache group, and the level vLLM's builder gave it."""

    group: int
    backend: str  # vLLM's backend name ("FLASHINFER")
    level: CGSupport
    spec: str = ""  # the group's KV-cache spec class ("FullAttentionSpec", "MLAAttentionSpec", ...)

    @property
    def where(self) -> str:
        return f"KV-cache group {self.group}" + (f", {self.spec}" if self.spec else "")


@dataclass(frozen=True)
class ModeAudit:
    """What vLLM resolved and attnhal's reading of it."""

    lines: tuple[str, ...]
    differs: bool


def _attnhal_level(backend: str, platform: Platform | None, spec_tokens: int) -> Level | None:
    """attnhal's level for ``vllm:BACKEND`` here (``None``: not catalogued)."""
    try:
        return support_on(f"vllm:{backend}", platform, spec_tokens)
    except CatalogError:
        return None


def _why(level: Level) -> str:
    parts = [level.because or "the catalogue's level", *([f"assumes {level.assumes}"] if level.assumes else [])]
    return "; ".join(parts)


def _level_line(level: CGSupport, setter: str | None, groups: Sequence[GroupLevel]) -> str:
    """Which group set the level; when none is below ALWAYS, the backends that all are."""
    if setter is not None:
        return f"level {level.name}, set by {setter}"
    if not groups:
        return f"level {level.name} (no attention group)"
    return f"level {level.name}: every attention group is ({', '.join(f'{g.backend} ({g.where})' for g in groups)})"


def audit_mode(groups: Sequence[GroupLevel], requested: GraphMode, resolved: GraphMode | None,
               query_len: int = 1, attention_split: bool = True, error: str | None = None,
               platform: Platform | None = None) -> ModeAudit:
    """Explain vLLM's ``cudagraph_mode`` resolution.

    ``groups``: each (KV-cache group, backend) with the level vLLM's builder reported;
    ``requested``: the mode before resolution; ``resolved``: after (``None`` with ``error``:
    vLLM refused); ``query_len``: ``1 + num_speculative_tokens``; ``platform``: where attnhal
    reads the backends' levels (``None``: the catalogue's).
    """
    level, setter = min_support({f"{g.backend} ({g.where})": g.level for g in groups})
    lines = ["attention groups: " + ", ".join(f"{g.backend} {g.level.name} ({g.where})" for g in groups)]
    lines.append(_level_line(level, setter, groups))
    ours = resolve_mode(requested, level, query_len, attention_split)
    vllm = resolved.value if resolved is not None else f"refused ({error})"
    lines.append(f"cudagraph_mode: {requested.value} -> {vllm}")
    lines.extend(f"downgrade {step}" for step in ours.steps)
    differs = (ours.mode is None) != (resolved is None) or (resolved is not None and ours.mode is not resolved)
    if differs:
        lines.append(f"differs: attnhal's resolution of the same level gives "
                     f"{ours.mode.value if ours.mode else 'refused'}, vLLM {vllm}")
    for group in groups:
        ours_level = _attnhal_level(group.backend, platform, query_len - 1)
        if ours_level is None:
            lines.append(f"{group.backend}: not in attnhal's catalogue (vllm:{group.backend}); its level is vLLM's")
            continue
        if ours_level.support is not group.level:
            differs = True
            # The minimum over the groups, with this group at attnhal's level.
            others = [g.level for g in groups if g is not group]
            with_ours = resolve_mode(requested, min([ours_level.support, *others]), query_len, attention_split)
            mode = with_ours.mode.value if with_ours.mode else "refused"
            lines.append(f"differs: attnhal reads vllm:{group.backend} as {ours_level.support.name} "
                         f"({_why(ours_level)}), vLLM graded it {group.level.name} here; with attnhal's level "
                         f"the mode would be {mode}")
    return ModeAudit(tuple(lines), differs)
