"""``--enable-multi-layer-eagle``: attnhal's plan against SGLang 0.5.23's executed multi-layer worker.

Over a grid of catalogued backends x emulated platforms x model kinds x (num_steps, topk), plus the
other algorithms, graphs off and the draft-extend switch, each cell is executed on SGLang's side:
``ServerArgs.resolve_once()`` with and without the flag, the target backend's creator,
``SpeculativeAlgorithm.create_worker`` (which worker class runs the draft), and the multi-layer
draft worker's ``init_attention_backend()`` + ``_capture_cuda_graphs()``
(``harness.multi_layer_eagle_graphs``). attnhal's side is the public adapter: the layout, the
roles, the plan and the report rows (``EngineConfig.outcome``). They must agree on:

- whether SGLang takes the flags at all (the flag changes none of SGLang's refusals);
- the worker: ``MultiLayerEagleWorkerV2`` exactly where attnhal's layout runs draft steps as extends;
- the phases: no draft-decode backend or runner (attnhal: draft_decode not run, no role);
- the draft-extend backend class SGLang's factory builds (attnhal: the class the role's catalogue
  seams name), and SGLang's refusal to build one (attnhal: the plan is invalid at draft_extend);
- the draft-extend graph: SGLang builds a runner exactly where attnhal's report row says captured
  (by SGLang, naming that runner class) or "fails at start" (a catalogued late failure);
- the target-verify graph (the target's decode runner): captured on both sides or on neither (where
  attnhal's plan says the target cannot verify, a catalogued engine decision must say why, as in
  the single-layer grid).
"""

from __future__ import annotations

import itertools
from typing import Any

import harness
import pytest
import sglang_grid as grid

import attnhal_sglang as sglang
from attnhal.engines.flags import EngineArgError
from attnhal.phases import DraftSteps
from attnhal.platform import parse
from attnhal_sglang.audit import SHOWN, engine_differs
from attnhal_sglang.seams import seams_of

STEPS_TOPK = ((1, 1), (3, 1), (2, 2), (3, 4))
#: The draft-extend graph switched off by SGLang's environment variable (a grid column: ``more["env"]``).
OFF = {sglang.DRAFT_EXTEND_GRAPH_OFF: "1"}


def _cases() -> list[tuple[str, str, str, int, int, dict[str, Any]]]:
    out = []
    for vendor, names in grid.backends_by_vendor().items():
        for name, platform in itertools.product(names, grid.VENDOR_PLATFORMS[vendor]):
            for model, (steps, topk) in itertools.product(grid.models_of(name), STEPS_TOPK):
                out.append((name, platform, model, steps, topk, {}))
    extra: list[dict[str, Any]] = [{"speculative_algorithm": a} for a in ("EAGLE3", "NEXTN", "STANDALONE")]
    extra += [{"disable_cuda_graph": True}, {"cuda_graph_backend_decode": "disabled"}, {"env": OFF}]
    for more, (platform, name) in itertools.product(extra, (("cuda:sm90", "triton"), ("hip:gfx942", "aiter"))):
        out.append((name, platform, "mha", 3, 1, more))
    return out


def _args(name: str, steps: int, topk: int, more: dict[str, Any]) -> dict[str, Any]:
    return {"attention_backend": name, "speculative_algorithm": "EAGLE", "speculative_num_steps": steps,
            "speculative_eagle_topk": topk, "speculative_num_draft_tokens": steps + 1,
            "enable_multi_layer_eagle": True, **more}


def _worker_class(resolution: harness.Resolution, platform: str) -> str:
    from sglang.srt import runtime_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    with harness.emulate(platform), runtime_context.use_context(resolution.context):
        algorithm = SpeculativeAlgorithm.from_string(resolution.fields["speculative_algorithm"])
        return algorithm.create_worker(resolution.server_args).__name__


CASES = _cases()


@pytest.mark.parametrize("name,platform,model,steps,topk,more", CASES,
                         ids=[f"{c[1]}-{c[0]}-{c[2]}-s{c[3]}k{c[4]}" + "".join(f"-{k}" for k in c[5])
                              for c in CASES])
def test_multi_layer_plan_is_what_sglangs_multi_layer_worker_does(name: str, platform: str, model: str, steps: int,
                                                                  topk: int, more: dict[str, Any]) -> None:
    env = more.get("env", {})
    args = _args(name, steps, topk, {k: v for k, v in more.items() if k != "env"})
    resolution = harness.resolve(args, platform, model)
    without = harness.resolve({k: v for k, v in args.items() if k != "enable_multi_layer_eagle"}, platform, model)
    assert resolution.accepted == without.accepted, (resolution.error, without.error)
    try:
        config = sglang.from_server_args(args, env, model=model, platform=platform)
    except EngineArgError as exc:
        pytest.fail(f"attnhal refuses flags SGLang's multi-layer worker takes: {exc}")
    if not resolution.accepted:
        return  # the flag changes none of SGLang's refusals: the single-layer grid checks them
    try:
        harness.target_backend(resolution, platform)
    except Exception:  # a backend creator's own check (fa3's SM check, MLA-only backends): the grid's
        return
    multi = config.layout.draft_steps is DraftSteps.EXTEND
    worker = _worker_class(resolution, platform)
    assert (worker == "MultiLayerEagleWorkerV2") == multi, (worker, config.layout)
    if not multi:
        return
    result = config.plan(platform)
    rows = {row.phase: row for row in config.outcome(parse(platform), result)}
    graphs = harness.multi_layer_eagle_graphs(resolution, platform, env=env)
    assert not result["draft_decode"].runs and config.roles["draft_decode"] is None
    assert "draft_decode" not in graphs.runners
    if graphs.error is not None:  # SGLang's factory refuses the backend for EAGLE
        assert not result.valid and result["draft_extend"].blocking, graphs.error
        return
    classes = {s.cls for s in seams_of(f"sglang:{config.roles['draft_extend']}", model)}
    assert graphs.draft_extend_backend in classes, (graphs.draft_extend_backend, classes)
    extend = rows["draft_extend"]
    built = graphs.runners.get("draft_extend")
    if built is None:
        assert extend.graph == "eager" and extend.by == "SGLang", extend
    elif extend.graph == "captured":
        assert extend.by == "SGLang" and built in extend.why, (built, extend)
    else:  # a catalogued late failure inside the draft-extend capture
        assert extend.graph == "fails at start", (built, extend)
    verify, row = harness.target_verify_graph(resolution, platform), rows["target_verify"]
    if row.graph == "cannot run":  # the target's verify, as without the flag: a catalogued D-entry says why
        assert {SHOWN[d.entry][0].value for d in engine_differs(config, platform) if d.entry in SHOWN} >= {
            "target_verify"}, row
    else:
        assert (row.graph == "captured") == verify, row

