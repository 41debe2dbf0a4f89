"""vLLM's start-up graph report and strict mode (``ATTNHAL_VLLM=strict``), from one mode resolution.

The plugin hands in the groups' levels vLLM's builders reported, the requested and resolved
mode, and the capture sizes; this module builds :mod:`attnhal.engines.report`'s table (a row
per phase the mode decides: decode, mixed prefill+decode batches, target verify with speculation;
when vLLM has set up the drafter, a second table: draft decode and draft extend). The rows are the
ones ``attnhal plan --engine vllm`` reports and prints as ``engine_outcome`` (:func:`report_rows`,
``VllmConfig.outcome``). In strict mode it refuses where attnhal's reading of the same backends
captures decode graphs vLLM does not (a level attnhal gives them, on this platform).
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

__all__ = ["MODE_VAR", "TITLE", "at_drafter", "at_start", "attnhal_mode", "drafter_rows", "refuse_eager", "report",
           "report_rows", "target_rows"]

TITLE = "attnhal graph report"
#: The plugin's mode variable (``attnhal_vllm.plugin.ENV_VAR``): ``strict`` refuses here.
MODE_VAR = "ATTNHAL_VLLM"
log = logging.getLogger("vllm.attnhal")
_REPORTED: list[str] = []  # each table ("target", "drafter") is logged once per process
#: The weakest backend, the capture sizes and the platform's name of the target's resolution.
_STARTED: list[object] = []
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
                requested: GraphMode | None = None, draft_decodes: bool = True) -> list[GraphRow]:
    """The report's rows for the weakest ``backend`` at ``level``: :func:`target_rows`, then, given the
    ``drafter``'s mode, :func:`drafter_rows` (none where vLLM refuses the mode: it starts no drafter)."""
    rows = target_rows(backend, level, resolved, query_len, sizes, error, requested)
    if drafter is not None and resolved is not None:
        rows.extend(drafter_rows(backend, drafter, resolved, sizes, draft_decodes))
    return rows


def target_rows(backend: str, level: CGSupport, resolved: GraphMode | None, query_len: int,
                sizes: Sequence[int] | str, error: str | None = None,
                requested: GraphMode | None = None) -> list[GraphRow]:
    """The target's rows (what the plugin logs when vLLM resolved the mode): decode, mixed batches,
    target verify (``query_len > 1``); ``sizes``: the capture sizes, or text where they are decided
    at start (``attnhal plan``); ``requested``: the mode asked for (a graph it leaves out is said as
    asked, not as a downgrade)."""
    if resolved is None:
        return [GraphRow("all", "-", "refused", backend, f"vLLM refuses the mode: {error}", _MODE_FLAG)]
    shown = _shown(sizes)
    why = f"weakest level {level.name}"

    def not_full(graph: str, asked: str | None, downgrade: str) -> str:
        """Why a routine's graph is not full: the requested mode asks for it, or the level's downgrade."""
        if graph == "FULL":
            return "-"
        if requested is not None and asked == graph:
            return f"cudagraph_mode {requested.value} asks for it"
        return downgrade

    # With speculation every uniform batch is a target verify (1 + k tokens): its row is target_verify,
    # as in the plan, where decode does not run; without it the uniform batch is decode.
    rows = [] if query_len > 1 else [
        GraphRow("decode", shown if resolved.decode != "NONE" else "-", resolved.decode.lower(), backend,
                 not_full(resolved.decode, requested and requested.decode, why),
                 _MODE_FLAG if resolved.decode != "FULL" else "-")]
    rows.append(GraphRow("prefill+decode", shown if resolved.mixed != "NONE" else "-", resolved.mixed.lower(),
                         backend, not_full(resolved.mixed, requested and requested.mixed,
                                           f"{why}: full graphs of mixed batches need ALWAYS"),
                         _MODE_FLAG if resolved.mixed != "FULL" else "-"))
    if query_len > 1:
        full = resolved.decode == "FULL"
        rows.append(GraphRow("target_verify", shown if full else "-", "full" if full else resolved.decode.lower(),
                             backend, "-" if full else f"{why}: spec decode needs UNIFORM_BATCH",
                             "-" if full else "--attention-backend (one graded UNIFORM_BATCH or ALWAYS)"))
    return rows


def drafter_rows(backend: str, drafter: DrafterMode, resolved: GraphMode, sizes: Sequence[int] | str,
                 draft_decodes: bool = True) -> list[GraphRow]:
    """The drafter's rows (what the plugin logs when vLLM set up the drafter), from the runner's
    rule (:mod:`~attnhal_vllm.drafter`) for the target's ``resolved`` mode: draft decode (where
    ``draft_decodes``: more than one speculative token) in the drafter's mode, and draft extend
    (the draft prefill, uniform batches): ``full`` exactly when the drafter captures its attention;
    else on the V2 runner the decode routine of the target's mode, which its prefill manager takes
    (``piecewise``, ``none``), on the V1 runner the proposer's one mode."""
    captured = drafter.captures_attention
    why, change = ("-", "-") if captured else (drafter.why, drafter.change or _MODE_FLAG)
    rows = [GraphRow("draft_decode", _shown(sizes) if drafter.mode != "NONE" else "-", drafter.mode.lower(), backend,
                     why, change)] if draft_decodes else []
    if captured:
        extend, extend_why = "full", "-"
    elif drafter.runner == "V2" and resolved.decode != "FULL":
        extend = resolved.decode.lower()
        extend_why = (f"the draft prefill takes the target's mode {resolved.value}, which has no FULL graphs "
                      "for uniform batches")
    else:
        extend, extend_why = drafter.mode.lower(), drafter.why
    rows.append(GraphRow("draft_extend", _shown(sizes) if extend != "none" else "-", extend, backend, extend_why,
                         change))
    return rows


def _shown(sizes: Sequence[int] | str) -> str:
    return sizes if isinstance(sizes, str) else sizes_text(sizes)


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
    """The plugin's step after vLLM resolved the mode: the target's table (once per process, rank 0)
    and, with ``ATTNHAL_VLLM=strict``, the refusal."""
    _STARTED[:] = [_weakest(groups)[1], tuple(sizes), platform.name]
    if "target" not in _REPORTED and _rank0():
        _REPORTED.append("target")
        log.info("attnhal: %s", report(f"vLLM on {platform.name}", groups, resolved, query_len, sizes, error,
                                       requested))
    if os.environ.get(MODE_VAR, "").strip().lower() == "strict":
        refuse_eager(groups, requested, resolved, query_len, split, platform)


def at_drafter(drafter: DrafterMode, resolved: GraphMode, draft_decodes: bool) -> None:
    """The plugin's step after vLLM set up the drafter: the drafter's table (:func:`drafter_rows`,
    once per process, rank 0), with the backend and capture sizes of the target's resolution."""
    backend, sizes, where = _STARTED or ["-", (), "this platform"]
    if "drafter" not in _REPORTED and _rank0():
        _REPORTED.append("drafter")
        rows = drafter_rows(str(backend), drafter, resolved, tuple(sizes), draft_decodes)
        log.info("attnhal: %s", format_report(f"{TITLE}: vLLM on {where}, the drafter", rows))


def _rank0() -> bool:
    """Rank 0 of the process group (or no group): the one process that logs the table."""
    try:
        import torch.distributed as dist

        return not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0
    except Exception:  # a rank we cannot read: log rather than stay silent
        return True
