"""``attnhal advise --engine vllm``: the ``--attention-backend`` that captures the most, before the engine starts.

vLLM runs the target and its drafter on one attention backend, so the choice is one
flag: each catalogued backend that fits the platform and model kind (pruned before planning)
goes through the adapter (:func:`~attnhal_vllm.from_engine_args`: the builder's level on
this platform, the graph mode vLLM resolves) and the planner. A backend for which vLLM's mode
resolution raises is refused at startup and not proposed; each downgrade of the requested
``cudagraph_mode`` is a cost.
"""

from __future__ import annotations

from dataclasses import replace

from collections.abc import Callable, Collection, Mapping
from typing import Any

from attnhal.capabilities import AttentionRequest, not_supported_reasons
from attnhal.catalog import entries, load
from attnhal.engines.advice import (MAX_COMBINATIONS, PRIORITY, Advice, Option, changes, check_size, frontier,
                                    model_of, rank_key, served_kinds)
from attnhal.engines.flags import EngineArgError, check, model_kind
from attnhal_vllm.config import VllmConfig, from_engine_args
from attnhal_vllm.flags import FLAGS, HARMLESS, VLLM_VERSION
from attnhal_vllm.selection import ModelShape
from attnhal.phases import Phase
from attnhal.platform import Platform, as_platform
from attnhal.spec import ModelKind

#: Engine arguments -> a :class:`~attnhal_vllm.config.VllmConfig` of the release advised for:
#: ``from_engine_args(args, platform, trtllm_cubins, model)`` with the release fixed.
Translate = Callable[[Mapping[str, Any], Platform, bool, ModelKind], VllmConfig]

__all__ = ["advise"]

_NOT_GIVEN = ("--attention-backend not given: vLLM picks one per platform and model, which attnhal models on CUDA "
              "platforms only (every catalogued backend that fits is compared)")


def _fitting(model: ModelKind, platform: Platform, named: str | None,
             among: Collection[str] | None) -> list[str]:
    """The catalogued backends serving ``model`` on ``platform``; a model-specific one only where named."""
    request = AttentionRequest(model=model)
    return [e.qualified_name for e in entries("vllm")
            if (among is None or e.name in among) and (not e.meta.get("model_specific") or e.qualified_name == named)
            and not not_supported_reasons(e.descriptor, request, platform)]


def _evaluate(translate: Translate, flags: Mapping[str, Any], given: Mapping[str, Any], platform: Platform,
              model: ModelKind, trtllm_cubins: bool) -> Option | None:
    """The option (``None``: vLLM raises resolving its graph mode, or attnhal cannot plan it)."""
    config = translate(flags, platform, trtllm_cubins, model)
    if config.resolution.error is not None:
        return None
    result = config.plan(platform)
    if not result.valid:
        return None
    runs = frozenset(p for p in PRIORITY if result[p].runs)
    level = config.level.support.name if config.level is not None else "?"
    mode = config.resolution.mode.value if config.resolution.mode else "-"
    eager = {p: _eager_reason(config, p, "; ".join(str(r) for r in result[p].reasons), mode, level)
             for p in PRIORITY if p in runs and not result[p].capture}
    return Option(flags=flags, label=f"{config.backend.split(':', 1)[1]} (AttentionCGSupport {level}, "
                                     f"cudagraph_mode {mode})",
                  changes=changes(given, flags, ("attention_backend",)), runs=runs,
                  captured=frozenset(p for p in runs if result[p].capture), eager=eager,
                  costs=tuple(f"cudagraph_mode downgrade: {step}" for step in config.resolution.steps))


def _eager_reason(config: VllmConfig, phase: Phase, reasons: str, mode: str, level: str) -> str:
    """Why ``phase`` runs eagerly, in vLLM's terms: the resolved mode has no full graphs, or the
    release's drafter captures no attention; else the planner's reasons."""
    if not config.policy.enabled:
        return f"cudagraph_mode resolves to {mode} with AttentionCGSupport {level}: attention runs eagerly"
    if phase in config.policy.disabled_phases and config.drafter is not None:
        return f"vLLM {config.drafter.release}'s drafter runs {config.drafter.mode}: {config.drafter.why}"
    return reasons


def advise(args: Mapping[str, Any], platform: Platform | str, model: ModelKind | str | None = None, *,
           trtllm_cubins: bool = True, top: int = 3, among: Collection[str] | None = None,
           limit: int = MAX_COMBINATIONS, release: str = VLLM_VERSION,
           env: Mapping[str, str] | None = None, shape: ModelShape | None = None) -> Advice:
    """The vLLM ``--attention-backend`` values that capture the most on ``platform`` for this model,
    ranked (:func:`attnhal.engines.advice.rank_key`), against the user's engine arguments ``args``.

    ``among``: the backend names it may propose (``FLASH_ATTN``; default every catalogued one that
    fits); ``trtllm_cubins``: FlashInfer's assumption (:func:`~attnhal_vllm.support_on`);
    ``release``: the vLLM release modelled (named in the advice); ``env``: vLLM's runner switch
    (:func:`~attnhal_vllm.runner.select_runner`); ``shape``: the model as vLLM's own backend choice
    reads it (``--model-config``; :mod:`attnhal_vllm.model`).
    Raises :class:`EngineArgError` naming the flag for bad arguments, as the adapter does.
    """
    where = as_platform(platform)

    def translate(flags: Mapping[str, Any], on: Platform, cubins: bool, kind: ModelKind) -> VllmConfig:
        return from_engine_args(flags, on, cubins, kind, release, env, shape)

    raw = {k: v for k, v in dict(args).items() if v is not None}
    converted, _ = check(raw, FLAGS, HARMLESS, "attnhal_vllm.HARMLESS")
    given = raw  # vLLM's values convert to other forms (``vllm:NAME``, parsed JSON): the flags stay as typed
    named = converted.get("attention_backend")
    kind = model_of(model_kind(model), [load(named).descriptor] if named else [])
    names = _fitting(kind, where, named, among)
    if not names:
        raise EngineArgError("--model", f"--model={kind.value} on platform={where.name}: no catalogued vLLM backend "
                                        f"serves it (supported: {served_kinds('vllm', where)})")
    check_size(len(names), ("attention_backend",), limit)
    current = Option(flags=given, label="(vLLM's pick)", blocked=_NOT_GIVEN)
    picked = _default_pick(translate, given, where, kind, trtllm_cubins) if not named else None
    if picked is not None:  # vLLM's own choice (attnhal_vllm.selection), evaluated as if it were named
        current = _evaluate(translate, given, given, where, kind, trtllm_cubins) or current
        current = replace(current, label=f"{current.label}, vLLM's default choice")
        named = picked
    elif named:
        current = _evaluate(translate, given, given, where, kind, trtllm_cubins) or Option(
            flags=given, label=named, blocked=f"refused: {_refusal(translate, given, where, kind, trtllm_cubins)}")
    options = [o for name in names if name != named
               for o in [_evaluate(translate, {**given, "attention_backend": name.split(":", 1)[1]}, given, where,
                                   kind, trtllm_cubins)] if o]
    ranked = sorted(options, key=rank_key)
    recommended = frontier(o for o in ranked if rank_key(o) < rank_key(current))[:top]
    return Advice(f"vLLM {release}", where.name, kind.value, current, recommended, (), len(names))


def _default_pick(translate: Translate, given: Mapping[str, Any], platform: Platform, model: ModelKind,
                  trtllm_cubins: bool) -> str | None:
    """The backend vLLM picks without ``--attention-backend`` (``vllm:NAME``; None where attnhal does not
    model the choice: another vendor)."""
    try:
        return translate(given, platform, trtllm_cubins, model).backend
    except EngineArgError:
        return None


def _refusal(translate: Translate, given: Mapping[str, Any], platform: Platform, model: ModelKind,
             trtllm_cubins: bool) -> str:
    config = translate(given, platform, trtllm_cubins, model)
    if config.resolution.error is not None:
        return f"vLLM raises resolving cudagraph_mode: {config.resolution.error}"
    result = config.plan(platform)
    return "; ".join(sorted({str(r) for d in result.phases.values() if d.blocking for r in d.reasons}))
