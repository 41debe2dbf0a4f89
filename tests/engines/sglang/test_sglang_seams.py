"""SGLang 0.5.23's capability seams (``attnhal_sglang.seams``) against SGLang's executed code.

- the catalogue's ``[catalog.meta.seams.CLASS]`` tables equal what each backend class answers
  (class attributes, properties and methods called on an instance, ``__init__`` skipped);
- multi-layer EAGLE's draft-extend runner, decided from those answers and the environment,
  equals the runner ``MultiLayerEagleDraftWorker._capture_cuda_graphs`` builds;
- the per-phase runner of ``EagleDraftWorker._capture_cuda_graphs``: the in-tree table per
  device (MUSA emulated: docs/catalog.md D9) and an out-of-tree platform's own seam.
"""

from __future__ import annotations

import importlib
import types

import harness
import pytest

from attnhal_sglang import seams
from attnhal_sglang.classes import BACKEND_CLASSES

SINGLE_STEP = {path: names for path, names in BACKEND_CLASSES.items() if "MultiStep" not in path}


def _answers(cls: type, topk: int) -> dict[str, object]:
    """What an instance of ``cls`` answers (no translating KV index, no SWA pool, ``topk``)."""
    backend = object.__new__(cls)
    backend.kv_index_translator = types.SimpleNamespace(is_translating=False)
    backend.use_sliding_window_kv_pool, backend.topk = False, topk
    return {"ragged": backend.supports_ragged_verify_graph,
            "staging": backend.supports_draft_extend_metadata_staging,
            "in_graph": backend.draft_extend_metadata_captured_in_graph(),
            "glue_target_verify": backend.glue_target_verify_metadata(), "glue_draft": backend.glue_draft_metadata()}


def _modelled(seam: seams.Seams, topk: int) -> dict[str, object]:
    return {"ragged": seam.ragged_verify_graph, "staging": seam.stages_draft_extend(topk),
            "in_graph": seam.metadata_in_graph, "glue_target_verify": seam.glue_target_verify,
            "glue_draft": seam.glue_draft}


@pytest.mark.parametrize("path", sorted(SINGLE_STEP))
def test_catalogue_seams_are_the_backend_class_answers(path: str) -> None:
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    for entry in SINGLE_STEP[path]:
        found = [s for s in seams.seams_of(f"sglang:{entry}") if s.cls == name]
        assert len(found) == 1, f"sglang:{entry} has no [catalog.meta.seams.{name}] table"
        for topk in (1, 2, 4):
            assert _modelled(found[0], topk) == _answers(cls, topk), (entry, topk)


def test_every_catalogued_seam_table_names_a_class_the_entry_is_built_from() -> None:
    """No table for a class the entry does not map to (a stale class name would never be checked)."""
    for path, names in SINGLE_STEP.items():
        for entry in names:
            classes = {s.cls for s in seams.seams_of(f"sglang:{entry}")}
            mapped = {p.rsplit(".", 1)[1] for p, n in SINGLE_STEP.items() if entry in n}
            assert classes == mapped, entry


# --- multi-layer EAGLE ------------------------------------------------------------------------

MULTI_LAYER = [("cuda:sm90", "triton"), ("cuda:sm90", "fa3"), ("cuda:sm100", "trtllm_mla"),
               ("hip:gfx942", "aiter"), ("hip:gfx942", "triton")]
ENVS = [{}, {seams.SINGLE_GRAPH_DRAFT: "0"}, {seams.SINGLE_GRAPH_DRAFT: "no"},
        {seams.DRAFT_EXTEND_GRAPH_OFF: "yes"}, {seams.DRAFT_EXTEND_GRAPH_OFF: "y"}]


@pytest.mark.parametrize("platform,backend", MULTI_LAYER)
@pytest.mark.parametrize("env", ENVS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "default")
def test_multi_layer_eagle_runner_is_decided_from_the_catalogued_seams(platform: str, backend: str,
                                                                       env: dict[str, str]) -> None:
    args = {"attention_backend": backend, "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "enable_multi_layer_eagle": True}
    resolution = harness.resolve(args, platform, "mla")
    assert resolution.accepted, resolution.error
    executed = harness.multi_layer_eagle_graphs(resolution, platform, env=env)
    assert executed.error is None, executed.error
    steps = seams.seams_of(f"sglang:{backend}", "mla") * 3
    modelled, why = seams.multi_layer_runner(steps, 1, True, env)
    assert executed.runners.get("draft_extend") == modelled, why


# --- the per-phase runner seam ----------------------------------------------------------------

def _eagle(platform: str, steps: int) -> harness.Resolution:
    resolution = harness.resolve({"attention_backend": "triton", "speculative_algorithm": "EAGLE",
                                  "speculative_num_steps": steps, "speculative_eagle_topk": 1,
                                  "speculative_num_draft_tokens": steps + 1}, platform, "mha")
    assert resolution.accepted, resolution.error
    return resolution


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942", "musa:mp31"])
@pytest.mark.parametrize("steps", [1, 3])
def test_in_tree_runner_per_phase_and_device(platform: str, steps: int) -> None:
    """The runner class built for each phase that gets one is the table's for the device (triton on
    HIP gets none for draft extend: D2)."""
    device = harness.PLATFORMS[platform].device
    runners = harness.draft_graphs(_eagle(platform, steps), platform).runners
    assert runners or (platform == "hip:gfx942" and steps == 1), platform
    for phase, built in runners.items():
        assert built == seams.draft_runner(phase, device), (platform, phase)


def test_d9_musa_draft_extend_gets_the_draft_decode_runner_and_the_plan_says_so() -> None:
    """docs/catalog.md D9, executed on an emulated MUSA platform: the draft-extend slot holds the
    draft-*decode* runner class (``Device2ExtendCudaGraphRunner["musa"]``), at one step and more."""
    import attnhal_sglang as sglang
    from attnhal_sglang.audit import engine_differs

    for steps in (1, 3):
        runners = harness.draft_graphs(_eagle("musa:mp31", steps), "musa:mp31").runners
        assert runners["draft_extend"] == "EAGLEDraftCudaGraphRunner"
    config = sglang.from_server_args({"attention_backend": "triton", "speculative_algorithm": "EAGLE",
                                      "speculative_num_steps": 1, "speculative_eagle_topk": 1,
                                      "speculative_num_draft_tokens": 2}, platform="musa:mp31")
    assert [d.entry for d in engine_differs(config, "musa:mp31")] == ["D9"]
    assert [d.entry for d in engine_differs(config, "cuda:sm90")] == []


@pytest.mark.parametrize("capture,answers", [
    (False, {"draft_decode": "OotDraftRunner", "draft_extend": "OotExtendRunner"}),
    (True, {"draft_decode": "OotDraftRunner", "draft_extend": "OotExtendRunner"}),
    (True, {"draft_decode": "OotDraftRunner", "draft_extend": None}),
    (True, {"draft_decode": None, "draft_extend": "OotExtendRunner"}),
])
def test_out_of_tree_platform_runner_seam(capture: bool, answers: dict[str, str | None]) -> None:
    """eagle_worker_v2.py:151-161: an out-of-tree platform is asked per phase, and only when its
    capabilities say it captures graphs; its answer (a class or None) is what runs."""
    executed = harness.draft_graphs(_eagle("cuda:sm90", 3), "cuda:sm90", out_of_tree=(capture, answers)).runners
    modelled = {phase: seams.draft_runner(phase, out_of_tree=seams.OutOfTree(capture, answers))
                for phase in seams.DRAFT_RUNNERS}
    assert executed == {phase: name for phase, name in modelled.items() if name is not None}
