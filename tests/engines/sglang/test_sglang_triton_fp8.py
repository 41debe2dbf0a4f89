"""SGLang 0.5.23's triton backend with an fp8 KV cache (``docs/catalog.md``, "triton with fp8 KV"):
SGLang's own resolution accepts ``--kv-cache-dtype fp8_e4m3`` / ``fp8_e5m2`` with EAGLE, its draft
worker builds the draft graph runners its rule builds for triton, and attnhal's plan (the catalogue's
``kv_dtypes``) is valid and captures the same draft phases. Whether SGLang's Triton kernels compute
attention over an fp8 cache correctly is not executed here (the catalogue says so)."""

from __future__ import annotations

import harness
import pytest
from tier_summary import LINES as SUMMARY

import attnhal_sglang as sglang


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize(("steps", "topk"), [(3, 1), (1, 1), (3, 2)])
def test_triton_with_fp8_kv_is_accepted_and_planned_as_sglang_builds_it(platform: str, kv: str, steps: int,
                                                                       topk: int) -> None:
    args = {"attention_backend": "triton", "kv_cache_dtype": kv, "speculative_algorithm": "EAGLE",
            "speculative_num_steps": steps, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": steps + 1 if topk == 1 else steps * topk}
    resolution = harness.resolve(args, platform, "mha")
    assert resolution.error is None, resolution.error
    built = harness.draft_graphs(resolution, platform)
    assert built.error is None, built.error
    plan = sglang.from_server_args(args, model="gqa", platform=platform).plan(platform)
    assert plan.valid, [str(r) for d in plan.phases.values() for r in d.reasons]
    ours = {p.value for p in plan.captured} & {"draft_decode", "draft_extend"}
    explained = {"draft_extend"} if platform.startswith("hip") else set()  # docs/catalog.md D2
    assert ours - explained == set(built.captured) - explained, (ours, built.captured)
    SUMMARY.append(f"triton + {kv} on {platform}, {steps} steps topk {topk}: SGLang builds "
                   f"{sorted(built.captured)}, attnhal captures {sorted(ours)}")
