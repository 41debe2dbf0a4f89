"""vLLM's start-up graph report and strict mode (``ATTNHAL_VLLM=strict``), from one mode resolution.

The plugin hands in the groups' levels vLLM's builders reported, the requested and resolved
mode, and the capture sizes; this module builds :mod:`attnhal.engines.report`'s table (a row
per phase the mode decides: decode, mixed prefill+decode batches, target verify with speculation)
and, in strict mode, refuses where attnhal's reading of the same backends captures decode
graphs vLLM does not (a level attnhal gives them, on this platform).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from attnhal.engines.report import GraphRow, StrictRefusal, format_report, sizes_text
from attnhal_vllm.audit import GroupLevel, _attnhal_level
from attnhal_vllm.drafter import DrafterMode
from attnhal_vllm.modes import CGSupport, GraphMode, min_support, resolve_mode
from attnhal.platform import Platform

__all__ = ["MODE_VAR", "TITLE", "at_start", "attnhal_mode", "refuse_eager", "report", "report_rows"]

TITLE = "attnhal graph report"
#: The plugin's mode variable (``attnhal_vllm.plugin.ENV_VAR``): ``strict`` refuses here.
MODE_VAR = "ATTNHAL_VLLM"
log = logging.getLogger("vllm.attnhal")
_REPORTED: list[bool] = []  # the table is logged once per process
_MODE_FLAG = "--compilation-config '{\"cudagraph_mode\": ...}'"


def attnhal_mode(groups: Sequence[GroupLevel], requested: GraphMode, query_len: int, split: bool,
                 platform: Platform | None) -> GraphMode | None:
    """The mode vLLM's rule gives with attnhal's level for every group (uncatalogued: vLLM's level)."""
    levels = {}
    for index, group in enumerate(groups):
        ours = _attnhal_level(group.backend, platform, query_len - 1)
        levels[f"{group.backend}{index}"] = ours.support if ours is not None else group.level
    return resolve_mode(requested, min_support(levels)[0], query_len, split).mode


def _weakest(groups: Sequence[GroupLevel]) -> tuple[CGSupport, str]:
    level, setter = min_support({g.backend: g.level for g in groups})
    return level, setter or ", ".join(sorted({g.backend for g in groups})) or "-"


def report(head: str, groups: Sequence[GroupLevel], resolved: GraphMode | None, query_len: int,
           sizes: Sequence[int], error: str | None = None, requested: GraphMode | None = None) -> str:
    """The table the plugin logs: per phase vLLM's graph (full, piecewise, none), the capture
    sizes, the backend that decided it (the weakest group's), why, and the flag that changes it."""
    level, backend = _weakest(groups)
    return format_report(f"{TITLE}: {head}", report_rows(backend, level, resolved, query_len, sizes, error,
                                                         requested=requested))


def report_rows(backend: str, level: CGSupport, resolved: GraphMode | None, query_len: int,
                sizes: Sequence[int] | str, error: str | None = None, drafter: DrafterMode | None = None,
                requested: GraphMode | None = None) -> list[GraphRow]:
    """The report's rows for the weakest ``backend`` at ``level``: decode, mixed batches, target
    verify (``query_len > 1``) and, given the ``drafter``'s mode, draft decode; ``sizes``: the
    capture sizes, or text where they are decided at start (``attnhal plan``); ``requested``: the
    mode asked for (a graph it leaves out is said as asked, not as a downgrade)."""
    if resolved is None:
        return [GraphRow("all", "-", "refused", backend, f"vLLM refuses the mode: {error}", _MODE_FLAG)]
    shown = sizes if isinstance(sizes, str) else sizes_text(sizes)
    why = f"weakest level {level.name}"

    def not_full(graph: str, asked: str | None, downgrade: str) -> str:
        """Why a routine's graph is not full: the requested mode asks for it, or the level's downgrade."""
        if graph == "FULL":
            return "-"
        if requested is not None and asked == graph:
            return f"cudagraph_mode {requested.value} asks for it"
        return downgrade

    rows = [GraphRow("decode", shown if resolved.decode != "NONE" else "-", resolved.decode.lower(), backend,
                     not_full(resolved.decode, requested and requested.decode, why),
                     _MODE_FLAG if resolved.decode != "FULL" else "-"),
            GraphRow("prefill+decode", shown if resolved.mixed != "NONE" else "-", resolved.mixed.lower(), backend,
                     not_full(resolved.mixed, requested and requested.mixed,
                              f"{why}: full graphs of mixed batches need ALWAYS"),
                     _MODE_FLAG if resolved.mixed != "FULL" else "-")]
    if query_len > 1:
        full = resolved.decode == "FULL"
        rows.append(GraphRow("target_verify", shown if full else "-", "full" if full else resolved.decode.lower(),
                             backend, "-" if full else f"{why}: spec decode needs UNIFORM_BATCH",
                             "-" if full else "--attention-backend (one graded UNIFORM_BATCH or ALWAYS)"))
    if drafter is not None:
        captured = drafter.captures_attention
        rows.append(GraphRow("draft_decode", shown if drafter.mode != "NONE" else "-", drafter.mode.lower(), backend,
                             "-" if captured else drafter.why, "-" if captured else drafter.change or _MODE_FLAG))
    return rows


def refuse_eager(groups: Sequence[GroupLevel], requested: GraphMode, resolved: GraphMode | None, query_len: int,
                 split: bool, platform: Platform | None) -> None:
    """Strict mode: raise :class:`StrictRefusal` where attnhal's reading captures decode graphs vLLM's does not."""
    ours = attnhal_mode(groups, requested, query_len, split, platform)
    vllm_full = resolved is not None and resolved.decode == "FULL"
    if ours is not None and ours.decode == "FULL" and not vllm_full:
        level, backend = _weakest(groups)
        raise StrictRefusal(f"ATTNHAL_VLLM=strict refuses to start: attnhal plans decode (and target verify) "
                            f"captured with full graphs ({ours.value}), vLLM resolves "
                            f"{resolved.value if resolved else 'nothing'} ({backend} graded {level.name} here; "
                            "the audit's 'differs:' line says why); ATTNHAL_VLLM=audit starts as vLLM decided")


def at_start(groups: Sequence[GroupLevel], requested: GraphMode, resolved: GraphMode | None, query_len: int,
             split: bool, sizes: Sequence[int], error: str | None, platform: Platform) -> None:
    """The plugin's step after vLLM resolved the mode: the table (once per process, rank 0) and,
    with ``ATTNHAL_VLLM=strict``, the refusal."""
    if not _REPORTED and _rank0():
        _REPORTED.append(True)
        log.info("attnhal: %s", report(f"vLLM on {platform.name}", groups, resolved, query_len, sizes, error,
                                       requested))
    if os.environ.get(MODE_VAR, "").strip().lower() == "strict":
        refuse_eager(groups, requested, resolved, query_len, split, platform)


def _rank0() -> bool:
    """Rank 0 of the process group (or no group): the one process that logs the table."""
    try:
        import torch.distributed as dist

        return not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0
    except Exception:  # a rank we cannot read: log rather than stay silent
        return True
