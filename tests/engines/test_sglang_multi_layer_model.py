"""``--enable-multi-layer-eagle`` in the SGLang adapter, without SGLang (the tier checks it against SGLang's
executed worker: ``tests/engines/sglang/test_sglang_multi_layer.py``)."""

from __future__ import annotations

import json

import pytest

import attnhal_sglang as sglang
from attnhal.cli import main
from attnhal.engines.flags import EngineArgError
from attnhal.phases import DraftSteps
from attnhal.platform import parse
from attnhal_sglang.audit import engine_differs

EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
         "enable_multi_layer_eagle": True}


def test_draft_steps_are_extends_with_no_draft_decode_role() -> None:
    config = sglang.from_server_args({"attention_backend": "triton", **EAGLE})
    assert config.layout.draft_steps is DraftSteps.EXTEND and config.roles["draft_decode"] is None
    result = config.plan("cuda:sm90")
    assert result.valid and not result["draft_decode"].runs and result["draft_extend"].capture
    row = next(r for r in config.outcome(parse("cuda:sm90"), result) if r.phase == "draft_extend")
    assert (row.graph, row.by) == ("captured", "SGLang") and "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner" in row.why


def test_the_hip_rules_of_eagle_worker_v2_do_not_apply_to_the_multi_layer_worker() -> None:
    """D1 (aiter, one step on HIP: draft extend eager) is eagle_worker_v2's rule; the multi-layer
    worker captures draft extend whenever graphs are on."""
    one_step = {"attention_backend": "aiter", **EAGLE, "speculative_num_steps": 1}
    single = sglang.from_server_args({k: v for k, v in one_step.items() if k != "enable_multi_layer_eagle"})
    assert [d.entry for d in engine_differs(single, "hip:gfx942")] == ["D1"]
    assert engine_differs(sglang.from_server_args(one_step), "hip:gfx942") == ()


def test_off_graphs_and_the_switch_leave_draft_extend_eager_by_sglangs_rule() -> None:
    for args, env in (({"disable_cuda_graph": True}, {}), ({}, {sglang.DRAFT_EXTEND_GRAPH_OFF: "1"})):
        config = sglang.from_server_args({"attention_backend": "fa3", **EAGLE, **args}, env)
        row = next(r for r in config.outcome(parse("cuda:sm90"), config.plan("cuda:sm90")) if r.phase == "draft_extend")
        assert (row.graph, row.by) == ("eager", "SGLang"), row


def test_a_tree_must_verify_num_steps_plus_one_and_other_algorithms_are_noted() -> None:
    with pytest.raises(EngineArgError, match=r"--speculative-num-draft-tokens=7 \(supported: 4 = "):
        sglang.from_server_args({"attention_backend": "triton", **EAGLE, "speculative_eagle_topk": 2,
                                 "speculative_num_draft_tokens": 7})
    tree = sglang.from_server_args({"attention_backend": "triton", **EAGLE, "speculative_eagle_topk": 2,
                                    "speculative_num_draft_tokens": 4})
    assert tree.plan("cuda:sm90").valid
    standalone = sglang.from_server_args({"attention_backend": "triton", **EAGLE, "speculative_algorithm": "STANDALONE"})
    assert standalone.layout.draft_steps is DraftSteps.DECODE and standalone.roles["draft_decode"] == "triton"
    assert any("multi-layer worker runs for EAGLE, EAGLE3, NEXTN only" in n for n in standalone.notes)


def test_the_command_line_plans_it(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--engine", "sglang", "--json", "--", "--attention-backend", "fa3", "--speculative-algorithm",
            "EAGLE", "--speculative-num-steps", "3", "--enable-multi-layer-eagle", "--platform", "cuda:sm90"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["layout"] == {"draft_steps": "extend", "graph_groups": {}}
    assert data["roles"]["draft_decode"] is None
    extend = next(r for r in data["engine_outcome"] if r["phase"] == "draft_extend")
    assert extend["decided_by"] == "SGLang" and "OneGraphMultiLayerEagle" in extend["why"]
