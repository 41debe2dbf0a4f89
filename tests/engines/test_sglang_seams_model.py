"""attnhal_sglang.seams without SGLang: the catalogue tables read, bad tables refused by
field, the two decisions and the plan's line (SGLang's executed side: sglang/test_sglang_seams.py)."""

from __future__ import annotations

import pytest

import attnhal_sglang as sglang
from attnhal_sglang import seams
from attnhal_sglang.seams import _parse
from attnhal.errors import InvalidValue
from attnhal.platform import as_platform

GOOD = {"supports_ragged_verify_graph": False, "supports_draft_extend_metadata_staging": False,
        "draft_extend_metadata_captured_in_graph": False, "glue_target_verify_metadata": "why",
        "glue_draft_metadata": ""}


def test_every_sglang_entry_has_seams_and_flashinfer_one_class_per_model_kind() -> None:
    from attnhal.catalog import entries

    for entry in entries("sglang"):
        assert seams.seams_of(entry.qualified_name), entry.qualified_name
    assert [s.cls for s in seams.seams_of("sglang:flashinfer", "mla")] == ["FlashInferMLAAttnBackend"]
    assert [s.cls for s in seams.seams_of("sglang:flashinfer", "gqa")] == ["FlashInferAttnBackend"]


def test_fa3_stages_draft_extend_metadata_only_for_chains() -> None:
    (fa3,) = seams.seams_of("sglang:fa3")
    assert fa3.stages_draft_extend(1) and not fa3.stages_draft_extend(2)
    assert fa3.single_graph_step(2)  # its metadata is rebuilt inside the graph anyway


@pytest.mark.parametrize("key,value,field", [
    ("supports_ragged_verify_graph", "yes", "supports_ragged_verify_graph"),
    ("supports_draft_extend_metadata_staging", {"max_topk": 0}, "supports_draft_extend_metadata_staging"),
    ("supports_draft_extend_metadata_staging", {"topk": 1}, "supports_draft_extend_metadata_staging"),
    ("glue_draft_metadata", False, "glue_draft_metadata"),
    ("surprise", True, "surprise"),
])
def test_a_bad_seam_table_names_the_field(key: str, value: object, field: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        _parse("sglang:x", "X", {**GOOD, key: value})
    assert caught.value.field == f"sglang:x: catalog.meta.seams.X.{field}"


def test_a_missing_seam_key_is_named() -> None:
    table = dict(GOOD)
    del table["glue_draft_metadata"]
    with pytest.raises(InvalidValue, match="glue_draft_metadata"):
        _parse("sglang:x", "X", table)


def test_multi_layer_runner_follows_flags_and_environment() -> None:
    triton, fa3 = seams.seams_of("sglang:triton") * 2, seams.seams_of("sglang:fa3") * 2
    one, per_step = ("OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner",
                     "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner")
    assert seams.multi_layer_runner(fa3, 1, True, {})[0] == one
    assert seams.multi_layer_runner(triton, 1, True, {})[0] == per_step
    assert seams.multi_layer_runner(fa3, 1, True, {seams.SINGLE_GRAPH_DRAFT: "n"})[0] == per_step
    assert seams.multi_layer_runner(fa3, 1, True, {seams.DRAFT_EXTEND_GRAPH_OFF: "YES"})[0] is None
    assert seams.multi_layer_runner(fa3, 1, False, {})[0] is None
    assert seams.multi_layer_runner(triton, 1, True, {}, device="npu")[0].endswith("NpuGraphRunner")
    # SGLang's EnvBool.get: an invalid value ("on") warns and takes the default (one graph)
    assert seams.multi_layer_runner(fa3, 1, True, {seams.SINGLE_GRAPH_DRAFT: "on"})[0] == one


def test_draft_runner_table_and_out_of_tree_seam() -> None:
    assert seams.draft_runner("draft_extend", "musa") == seams.draft_runner("draft_decode", "musa")
    assert seams.draft_runner("draft_extend", "cuda") == "EAGLEDraftExtendCudaGraphRunner"
    off = seams.OutOfTree(False, {"draft_extend": "Mine"})
    assert seams.draft_runner("draft_extend", out_of_tree=off) is None
    assert seams.draft_runner("draft_extend", out_of_tree=seams.OutOfTree(True, {"draft_extend": "Mine"})) == "Mine"
    with pytest.raises(InvalidValue, match="device='rocm'"):
        seams.draft_runner("draft_extend", "rocm")


SEED = {"attention_backend": "triton", "speculative_algorithm": "EAGLE", "speculative_num_steps": 1,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}


def test_the_plan_for_musa_names_d9_and_every_eagle_plan_says_its_seams() -> None:
    config = sglang.from_server_args(SEED, platform="musa:mp31")
    lines = config.remarks(as_platform("musa:mp31"), config.plan("musa:mp31"))
    assert any("docs/catalog.md D9" in line for line in lines)
    assert any(line.startswith("seams: sglang:triton (TritonAttnBackend): ragged verify graph no") for line in lines)
    off = sglang.from_server_args({**SEED, "disable_cuda_graph": True})
    assert any("no draft-extend runner (decode graphs are off" in line
               for line in off.remarks(as_platform("cuda:sm90"), off.plan("cuda:sm90")))


def test_plan_json_carries_the_seams(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from attnhal.cli import main

    argv = ["plan", "--engine", "sglang", "--json", "--platform", "cuda:sm90", "--", "--attention-backend", "fa3",
            "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"]
    assert main(argv) == 0
    seams_report = json.loads(capsys.readouterr().out)["seams"]
    assert seams_report == {"backend": "sglang:fa3", "class": "FlashAttentionBackend", "ragged_verify_graph": True,
                            "draft_extend_metadata": "rebuilt in the graph",
                            "multi_layer_eagle_runner": "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner",
                            "why": "every step's backend rebuilds its draft-extend metadata in the graph or stages it "
                                   "before replay"}

