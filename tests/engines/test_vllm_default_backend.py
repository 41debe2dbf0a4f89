"""vLLM's own backend choice without ``--attention-backend`` (:mod:`attnhal_vllm.selection`), in the
main suite: the picks per platform and model shape, the refusals, and what the plan says. The
tier (``tests/engines/vllm/test_vllm_default_backend.py``) checks the lists and verdicts against
vLLM's executed selection."""

from __future__ import annotations

import pytest

import attnhal_vllm
from attnhal.engines.flags import EngineArgError
from attnhal.platform import as_platform
from attnhal_vllm.selection import ASSUMED, ModelShape, select

EAGLE = {"spec_method": "eagle", "spec_tokens": "3", "spec_model": "M"}


@pytest.mark.parametrize(("platform", "shape", "picked"), [
    ("cuda:sm90", ASSUMED[False], "FLASH_ATTN"),
    ("cuda:sm100", ASSUMED[False], "FLASHINFER"),  # SM 10.x puts FlashInfer first (platforms/cuda.py:154-164)
    ("cuda:sm100", ModelShape(False, 96, 32), "FLASH_ATTN"),  # FlashInfer takes 64/128/256/512 only
    ("cuda:sm75", ASSUMED[False], "TRITON_ATTN"),  # FA and FlashInfer need 8.0
    ("cuda:sm90", ModelShape(False, 24, 8), "FLASH_ATTN"),  # a multiple of 8, up to 256
    ("cuda:sm75", ModelShape(False, 24, 8), "FLEX_ATTENTION"),  # no FA/FlashInfer below 8.0; Triton needs >= 32
    ("cuda:sm90", ASSUMED[True], "FLASH_ATTN_MLA"),
    ("cuda:sm100", ASSUMED[True], "FLASHINFER_MLA"),
    ("cuda:sm100", ModelShape(True, 576, 128, qk_nope_head_dim=96), "CUTLASS_MLA"),
    ("cuda:sm120", ASSUMED[True], "TRITON_MLA"),
    ("cuda:sm89", ASSUMED[True], "TRITON_MLA"),
])
def test_vllms_pick(platform: str, shape: ModelShape, picked: str) -> None:
    assert select(as_platform(platform), shape).backend == f"vllm:{picked}"


def test_the_plan_says_the_backend_was_vllms_default_choice() -> None:
    config = attnhal_vllm.from_engine_args(EAGLE, "cuda:sm100", version="0.34.0")
    assert config.backend == "vllm:FLASHINFER"
    lines = "\n".join(config.summary(as_platform("cuda:sm100")))
    assert "vLLM's default choice (no --attention-backend)" in lines and "head size 128" in lines
    assert config.report(as_platform("cuda:sm100"))["backend_choice"]["by"] == "vLLM's default choice"


@pytest.mark.parametrize(("args", "platform", "flag"), [
    ({}, "hip:gfx942", "--attention-backend"),
    ({}, None, "--attention-backend"),
    ({"dtype": "float32"}, "cuda:sm90", "--dtype"),
])
def test_what_attnhal_does_not_model_is_refused_by_name(args: dict[str, str], platform: str | None,
                                                        flag: str) -> None:
    with pytest.raises(EngineArgError) as caught:
        attnhal_vllm.from_engine_args(args, platform)
    assert caught.value.flag == flag


def test_a_named_backend_is_not_vllms_choice() -> None:
    config = attnhal_vllm.from_engine_args({"attention_backend": "TRITON_ATTN"}, "cuda:sm90")
    assert config.selection is None and config.report(as_platform("cuda:sm90"))["backend_choice"] == {
        "by": "--attention-backend"}
