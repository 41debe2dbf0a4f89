"""``--model-config`` read as SGLang reads a checkpoint's ``config.json``: the attention backend SGLang
0.5.23's own resolution picks with no backend flag, on each emulated platform, for the tier's models
(``models/mla``: DeepSeek V3, which SGLang's DeepSeek override gives ``trtllm_mla`` on SM100;
``models/mla-v2``: DeepSeek V2, MLA the override does not take, so flashinfer there; ``models/mha``),
is attnhal's from the same file (``attnhal_sglang.model``), and so is the model's attention kind."""

from __future__ import annotations

import harness
import pytest
from tier_summary import LINES as SUMMARY

import attnhal_sglang as sglang
from attnhal.engines.model_config import read
from attnhal_sglang.model import facts_of

EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": 2}


@pytest.mark.parametrize("platform", ["cuda:sm100", "cuda:sm90", "hip:gfx942"])
@pytest.mark.parametrize("model", ["mla", "mla-v2", "mha"])
def test_sglangs_default_backend_from_the_model_config_is_attnhals(model: str, platform: str) -> None:
    config = read(f"{harness.model_dir(model)}/config.json")
    engine = harness.resolve(EAGLE, platform, model)
    assert engine.error is None, engine.error
    ours = sglang.from_server_args(EAGLE, platform=platform, model_config=config)
    assert ours.roles["draft_extend"] == engine.fields["attention_backend"], (model, platform, engine.fields)
    from sglang.srt.configs.model_config import ModelConfig

    use_mla = ModelConfig.from_server_args(engine.server_args).attention_arch.name == "MLA"
    assert (facts_of(config).kind.value == "mla") is use_mla
    SUMMARY.append(f"--model-config {model} on {platform}: SGLang and attnhal pick {ours.roles['draft_extend']}")
