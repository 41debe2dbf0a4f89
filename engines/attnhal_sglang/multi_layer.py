"""SGLang 0.5.23's multi-layer EAGLE (``--enable-multi-layer-eagle``) as attnhal's step layout.

What SGLang's worker does (``speculative/multi_layer_eagle_worker_v2.py``, executed in the
SGLang tier: ``tests/engines/sglang/test_sglang_multi_layer.py``):

- ``SpeculativeAlgorithm.create_worker`` picks ``MultiLayerEagleWorkerV2`` for EAGLE, EAGLE3 and
  NEXTN (an alias of EAGLE) with the flag (``speculative/spec_info.py:354-359``); STANDALONE and
  NGRAM keep their own workers, so the flag changes no attention phase of theirs;
- one draft layer per draft step, each an **extend** over the accepted chain on its own
  draft-extend backend (``init_attention_backend``: ``DraftBackendFactory(...)
  .create_draft_extend_backend()`` per step, lines 381-415, the same choice as EAGLE's draft
  extend); there is **no draft decode**: ``draft()`` only organises the layers' top-k
  (lines 469-574) and ``cuda_graph_runner`` stays ``None`` (line 418);
- the draft-extend graph is built whenever decode graphs are on and
  ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH`` is unset, with no vendor or backend allowlist
  (lines 417-457): one graph for all the draft steps, or one per step, as
  :func:`attnhal_sglang.seams.multi_layer_runner` restates;
- its ``__init__`` asserts ``speculative_num_draft_tokens == speculative_num_steps + 1``
  (lines 150-154), for trees too (SGLang sets it for chains itself).

In attnhal's words that is the layout ``StepLayout(DraftSteps.EXTEND)``: draft_extend runs once per
draft step, draft_decode does not run; the planner reads that as data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from attnhal.engines.base import EngineConfig
from attnhal.engines.flags import EngineArgError
from attnhal.engines.report import GraphRow, sizes_text
from attnhal.phases import DEFAULT_LAYOUT, DraftSteps, Phase, StepLayout
from attnhal.planner import GraphPlan, GraphPolicy
from attnhal.platform import Platform
from attnhal.spec import SpecConfig

__all__ = ["FLAG", "MULTI_LAYER", "MULTI_LAYER_ALGORITHMS", "draft_extend_row", "enabled", "layout", "runner"]

#: The server argument (``arg_groups/fields/spec.py:230``) and how the command line spells it.
FLAG = "enable_multi_layer_eagle"
#: The algorithms whose worker the flag turns into ``MultiLayerEagleWorkerV2`` (``is_eagle()``; NEXTN
#: is EAGLE after the resolution, ``arg_groups/speculative_hook.py:109, 162``).
MULTI_LAYER_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
#: The layout of the multi-layer worker: each draft step an extend, no draft decode.
MULTI_LAYER = StepLayout(DraftSteps.EXTEND)


def enabled(values: Mapping[str, Any]) -> bool:
    """Whether these server arguments run SGLang's multi-layer EAGLE worker."""
    return bool(values.get(FLAG)) and values.get("speculative_algorithm") in MULTI_LAYER_ALGORITHMS


def layout(values: Mapping[str, Any], spec: SpecConfig, notes: list[str]) -> StepLayout:
    """The step layout SGLang's worker runs for ``values``; a note where the flag changes nothing.

    Raises :class:`EngineArgError` naming ``--speculative-num-draft-tokens`` where the multi-layer
    worker's ``__init__`` would fail its assertion (a tree verifying other than ``num_steps + 1``).
    """
    if not values.get(FLAG):
        return DEFAULT_LAYOUT
    algorithm = values.get("speculative_algorithm")
    if algorithm not in MULTI_LAYER_ALGORITHMS:
        notes.append(f"--enable-multi-layer-eagle with {'no --speculative-algorithm' if algorithm is None else algorithm}"
                     f": SGLang's multi-layer worker runs for {', '.join(MULTI_LAYER_ALGORITHMS)} only "
                     "(speculative/spec_info.py:354); no attention phase changes")
        return DEFAULT_LAYOUT
    if spec.num_draft_tokens != spec.num_steps + 1:
        raise EngineArgError("--speculative-num-draft-tokens",
                             f"--speculative-num-draft-tokens={spec.num_draft_tokens} (supported: "
                             f"{spec.num_steps + 1} = --speculative-num-steps + 1 with --enable-multi-layer-eagle: "
                             "MultiLayerEagleDraftWorker asserts it at start-up, "
                             "speculative/multi_layer_eagle_worker_v2.py:150-154)")
    return MULTI_LAYER


def runner(extend: str | None, model: str | None, topk: int, policy: GraphPolicy,
           platform_device: str | None) -> tuple[str | None, str]:
    """The draft-extend graph runner SGLang's multi-layer worker builds, and why (``(None, why)``:
    none): every draft step runs on the same draft-extend backend ``extend`` (SGLang name)."""
    from attnhal_sglang.env import DRAFT_EXTEND_GRAPH_OFF
    from attnhal_sglang.seams import multi_layer_runner, seams_of

    if platform_device is None:
        return None, "no SGLang device graph on this platform (the worker captures nothing on CPU)"
    found = seams_of(f"sglang:{extend}", model) if extend is not None else ()
    env = {DRAFT_EXTEND_GRAPH_OFF: "1"} if Phase.DRAFT_EXTEND in policy.disabled_phases else {}
    # Each class the entry may build (the model kind picks one): one answer, or say it depends.
    answers = [multi_layer_runner([seam], topk, policy.enabled, env, platform_device) for seam in found]
    if answers and len({name for name, _ in answers}) == 1:
        return answers[0]
    built, why = multi_layer_runner([], topk, policy.enabled, env, platform_device)  # graphs off, the switch
    if built is None:
        return built, why
    return "a multi-layer draft-extend runner", ("one graph for all draft steps or one per step: give --model"
                                                 if found else "the backend's seams are not catalogued")


def draft_extend_row(row: GraphRow, config: EngineConfig, platform: Platform, result: GraphPlan) -> GraphRow:
    """The report's draft_extend row under multi-layer EAGLE: the graph SGLang's multi-layer worker
    builds (by ``SGLang``, its own rule: no backend allowlist), where the phase can run at all."""
    from attnhal_sglang.seams import device_of

    decision = result[Phase.DRAFT_EXTEND]
    if not decision.runs or decision.blocking or row.graph not in ("captured", "eager"):
        return row  # attnhal's plan says the backend cannot run it (a late failure says when)
    model = config.context.model.value if config.context.model is not None else None
    built, why = runner(config.roles.get("draft_extend"), model, config.spec.topk, config.policy, device_of(platform))
    said = f"{built} ({why})" if built is not None else why
    steps = f"{config.spec.num_steps} draft step{'s' * (config.spec.num_steps != 1)} as extends; "
    if built is None:
        return replace(row, sizes="-", graph="eager", why=steps + said, by="SGLang", capture_sizes=())
    sizes = decision.capture_sizes or config.policy.capture_sizes_for(Phase.DRAFT_EXTEND, config.spec)
    return replace(row, sizes=sizes_text(sizes), graph="captured", why=steps + said, change="-", by="SGLang",
                   capture_sizes=tuple(sizes))
