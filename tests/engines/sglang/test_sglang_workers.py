"""The graph decisions of SGLang 0.5.23's other speculative workers, executed on each emulated platform.

attnhal has no algorithm yet for multi-layer EAGLE or frozen-KV MTP (the adapter refuses
them by name): these tests record what SGLang's own code decides, so the algorithms added to
attnhal can be compared with it. EAGLE, EAGLE3, NEXTN and STANDALONE are in the
differential grid (``test_sglang_executed.py``); NGRAM builds no draft runner (its only
graph is the target's verify graph, also in the grid). DFLASH is not executed here: its
decision (``DFlashWorkerV2.init_cuda_graphs``) reads the live GPU memory and the draft
worker's state, which a shell worker cannot give without inventing them.
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
    from attnhal.engines import sglang

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
