"""The graph decisions of SGLang 0.5.23's other speculative workers, executed on each emulated platform.

attnhal has no algorithm for frozen-KV MTP or the block drafters (the adapter refuses them by
name, saying why: ``attnhal_sglang.flags.UNMODELLED``): these tests record what SGLang's own code
decides, so an algorithm added to attnhal can be compared with it. Multi-layer EAGLE is planned
(draft steps as extends), against its executed worker in ``test_sglang_multi_layer.py``. EAGLE, EAGLE3, NEXTN and STANDALONE are in the differential grid
(``test_sglang_executed.py``); NGRAM builds no draft runner (its only graph is the target's
verify graph, also in the grid). DFLASH and DSPARK read the GPU memory free after the target
is loaded: the harness answers their TP-sync query with a given number of GB.
"""

from __future__ import annotations

import harness
import pytest

CASES = [("cuda:sm90", "triton"), ("cuda:sm90", "fa3"), ("cuda:sm100", "trtllm_mla"), ("hip:gfx942", "aiter"),
         ("hip:gfx942", "triton")]
#: fa3 left out for multi-layer EAGLE: its worker asks each backend whether it can stage
#: draft-extend metadata, and fa3's answer reads state its skipped ``__init__`` would set.
MULTI_LAYER_CASES = [case for case in CASES if case[1] != "fa3"]


def _resolve(platform: str, backend: str, steps: int, **extra: object) -> harness.Resolution:
    args = {"attention_backend": backend, "speculative_algorithm": "EAGLE", "speculative_num_steps": steps,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1, **extra}
    resolution = harness.resolve(args, platform, "mla")
    assert resolution.accepted, resolution.error
    return resolution


@pytest.mark.parametrize("platform,backend", MULTI_LAYER_CASES)
@pytest.mark.parametrize("steps", [1, 3])
def test_multi_layer_eagle_captures_draft_extend_on_cuda_and_hip_alike(platform: str, backend: str,
                                                                        steps: int) -> None:
    """multi_layer_eagle_worker_v2: no vendor allowlist; the per-step draft-extend graph is built
    whenever graphs are on, whatever the backend and the step count (unlike eagle_worker_v2's D1/D2)."""
    graphs = harness.multi_layer_eagle_graphs(_resolve(platform, backend, steps, enable_multi_layer_eagle=True),
                                              platform)
    assert graphs.error is None, graphs.error
    assert graphs.runners == {"draft_extend": "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner"}


def test_multi_layer_eagle_draft_extend_graph_off_by_env_and_by_flag() -> None:
    import attnhal_sglang as sglang

    resolution = _resolve("hip:gfx942", "aiter", 3, enable_multi_layer_eagle=True)
    assert harness.multi_layer_eagle_graphs(resolution, "hip:gfx942", env={sglang.DRAFT_EXTEND_GRAPH_OFF: "1"}).runners == {}
    disabled = _resolve("hip:gfx942", "aiter", 3, enable_multi_layer_eagle=True, disable_cuda_graph=True)
    assert harness.multi_layer_eagle_graphs(disabled, "hip:gfx942").runners == {}


@pytest.mark.parametrize("platform,backend", CASES)
def test_frozen_kv_mtp_captures_its_draft_loop_on_cuda_and_hip_alike(platform: str, backend: str) -> None:
    """frozen_kv_mtp_worker_v2: one draft-loop graph whenever graphs are on and the device is
    "cuda" (ROCm's device is "cuda" too), even for one step."""
    for steps in (1, 3):
        graphs = harness.frozen_kv_mtp_graphs(_resolve(platform, backend, steps), platform)
        assert graphs.runners == {"draft_decode": "FrozenKVMTPCudaGraphRunner"}
    disabled = _resolve(platform, backend, 3, disable_cuda_graph=True)
    assert harness.frozen_kv_mtp_graphs(disabled, platform).runners == {}


# --- the block drafters (DFLASH, DSPARK) and UNO ------------------------------------------------

DP_ATTENTION = {"enable_dp_attention": True, "tp_size": 2, "dp_size": 2, "enable_dp_lm_head": True}
DRAFT = {"draft": "draft model runner decode graph"}


def _resolve_algorithm(platform: str, algorithm: str, backend: str = "triton", **extra: object) -> harness.Resolution:
    resolution = harness.resolve({"attention_backend": backend, "speculative_algorithm": algorithm, **extra},
                                 platform, "mha")
    assert resolution.accepted, resolution.error
    return resolution


def test_dflash_resolution_forces_one_step_topk_1_and_a_block_of_draft_tokens() -> None:
    """DFLASH's phases in SGLang's resolution: one draft forward per block (steps and topk forced
    to 1), verified as a chain of the block's tokens (16 without a draft config saying otherwise)."""
    fields = _resolve_algorithm("cuda:sm90", "DFLASH", speculative_num_steps=3, speculative_eagle_topk=4).fields
    assert (fields["speculative_num_steps"], fields["speculative_eagle_topk"]) == (1, 1)
    assert fields["speculative_num_draft_tokens"] == 16
    assert fields["speculative_draft_attention_backend"] == "triton"


@pytest.mark.parametrize("platform", ["cuda:sm90", "cuda:sm100"])
def test_dflash_captures_its_draft_on_cuda_only_with_a_gigabyte_free(platform: str) -> None:
    resolution = _resolve_algorithm(platform, "DFLASH")
    assert harness.dflash_graphs(resolution, platform, available_gb=40.0).runners == DRAFT
    assert harness.dflash_graphs(resolution, platform, available_gb=1.0).runners == DRAFT
    assert harness.dflash_graphs(resolution, platform, available_gb=0.99).runners == {}
    assert harness.target_verify_graph(resolution, platform)  # the target's graph runner captures the verify


def test_dflash_on_hip_skips_the_memory_check() -> None:
    """The memory rule is behind ``is_cuda()``: on ROCm the draft graph is captured whatever is free."""
    resolution = _resolve_algorithm("hip:gfx942", "DFLASH")
    assert harness.dflash_graphs(resolution, "hip:gfx942", available_gb=0.0).runners == DRAFT


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
def test_dflash_no_draft_graph_with_decode_graphs_off_or_dp_attention(platform: str) -> None:
    disabled = _resolve_algorithm(platform, "DFLASH", disable_cuda_graph=True)
    assert harness.dflash_graphs(disabled, platform).runners == {}
    assert not harness.target_verify_graph(disabled, platform)
    dp = _resolve_algorithm(platform, "DFLASH", **DP_ATTENTION)
    assert harness.dflash_graphs(dp, platform).runners == {}
    assert harness.target_verify_graph(dp, platform)  # only the draft runs eager under dp attention


def test_dflash_out_of_tree_platform_captures_only_if_it_can() -> None:
    resolution = _resolve_algorithm("cuda:sm90", "DFLASH")
    assert harness.dflash_graphs(resolution, "cuda:sm90", out_of_tree_capture=False).runners == {}
    assert harness.dflash_graphs(resolution, "cuda:sm90", out_of_tree_capture=True).runners == DRAFT


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
def test_dspark_needs_a_gigabyte_free_on_cuda_and_hip_alike_and_keeps_its_graph_under_dp(platform: str) -> None:
    """dspark_components/dspark_worker_v2.py (a shipped worker: ``SpeculativeAlgorithm.DSPARK``):
    its memory rule is behind ``is_cuda_alike()``, unlike DFLASH's; dp attention leaves it on."""
    resolution = _resolve_algorithm(platform, "DSPARK")
    assert harness.dspark_graphs(resolution, platform, available_gb=40.0).runners == DRAFT
    assert harness.dspark_graphs(resolution, platform, available_gb=0.5).runners == {}
    assert harness.dspark_graphs(_resolve_algorithm(platform, "DSPARK", **DP_ATTENTION), platform).runners == DRAFT
    disabled = _resolve_algorithm(platform, "DSPARK", disable_cuda_graph=True)
    assert harness.dspark_graphs(disabled, platform).runners == {}


UNO = {"uno_lora_path": harness.model_dir("mha"), "speculative_num_steps": 3}


def test_uno_requires_fa3_and_captures_its_tree_draft_only_in_tree_mode() -> None:
    """uno_worker_v2.py (a shipped worker: ``SpeculativeAlgorithm.UNO``): FA3 only (its
    resolution refuses the rest); the private tree-draft graph exists for ``topk > 1`` when the
    target has decode graphs, none for a linear (topk 1) UNO."""
    refused = harness.resolve({"attention_backend": "triton", "speculative_algorithm": "UNO", **UNO,
                               "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}, "cuda:sm90", "mha")
    assert not refused.accepted and "UNO requires FA3" in (refused.error or "")
    tree = _resolve_algorithm("cuda:sm90", "UNO", "fa3", **UNO, speculative_eagle_topk=2, speculative_num_draft_tokens=6)
    assert harness.uno_graphs(tree, "cuda:sm90").runners == {"draft_decode": "UnoDecodeCudaGraphRunner"}
    linear = _resolve_algorithm("cuda:sm90", "UNO", "fa3", **UNO, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    assert harness.uno_graphs(linear, "cuda:sm90").runners == {}
    off = _resolve_algorithm("cuda:sm90", "UNO", "fa3", **UNO, speculative_eagle_topk=2, speculative_num_draft_tokens=6,
                             disable_cuda_graph=True)
    assert harness.uno_graphs(off, "cuda:sm90").runners == {}


@pytest.mark.parametrize("algorithm", ["DFLASH", "DSPARK", "UNO"])
def test_the_adapter_refuses_the_algorithms_these_workers_run_saying_why(algorithm: str) -> None:
    import attnhal_sglang as sglang

    with pytest.raises(sglang.EngineArgError, match=f"^--speculative-algorithm='?{algorithm}'? is not modelled: "):
        sglang.from_server_args({"attention_backend": "fa3", "speculative_algorithm": algorithm})
