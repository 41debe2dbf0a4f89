"""``--model-config PATH`` (:mod:`attnhal.engines.model_config`, read per engine by
``attnhal_vllm.model`` and ``attnhal_sglang.model``): bad files named by field, and each engine's
reading of the tier's model configs. The tiers check the readings against the engines' own
(``tests/engines/vllm/test_vllm_default_backend.py``, ``tests/engines/sglang/test_sglang_model_config.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import attnhal_sglang as sglang
from attnhal import cli
from attnhal.engines.flags import EngineArgError
from attnhal.engines.model_config import read
from attnhal_sglang.model import facts_of
from attnhal_vllm.model import kind_of, shape_of

MODELS = Path(__file__).resolve().parent / "models"
EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": 2}


def _write(tmp_path: Path, **fields: object) -> str:
    base = json.loads((MODELS / "mla" / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **fields}))
    return str(path)


@pytest.mark.parametrize(("fields", "named"), [
    ({"architectures": []}, "architectures=[]"),
    ({"architectures": "DeepseekV3ForCausalLM"}, "architectures='DeepseekV3ForCausalLM'"),
    ({"num_attention_heads": 0}, "num_attention_heads=0"),
    ({"kv_lora_rank": "512"}, "kv_lora_rank='512'"),
    ({"num_attention_heads": None}, "num_attention_heads=None"),
])
def test_a_bad_field_is_named(tmp_path: Path, fields: dict[str, object], named: str) -> None:
    with pytest.raises(EngineArgError) as caught:
        read(_write(tmp_path, **fields))
    assert caught.value.flag == "--model-config" and named in str(caught.value)


def test_the_tier_models_read_per_engine() -> None:
    mla, v2, mha = (read(str(MODELS / m / "config.json")) for m in ("mla", "mla-v2", "mha"))
    assert [facts_of(c).kind.value for c in (mla, v2, mha)] == ["mla", "mla", "gqa"]
    assert [facts_of(c).deepseek_override for c in (mla, v2)] == [True, False]
    assert [kind_of(c, "0.34.0").value for c in (mla, v2, mha)] == ["mla", "mla", "gqa"]
    assert (shape_of(mla, "0.33.0").head_size, shape_of(mha, "0.33.0").head_size) == (576, 32)


@pytest.mark.parametrize(("model", "picked"), [("mla", "trtllm_mla"), ("mla-v2", "flashinfer")])
def test_sglangs_mla_default_on_sm100_follows_the_architecture(model: str, picked: str) -> None:
    config = sglang.from_server_args(EAGLE, platform="cuda:sm100",
                                     model_config=read(str(MODELS / model / "config.json")))
    assert config.roles["draft_extend"] == picked


def test_a_sparse_model_is_refused_naming_index_topk(tmp_path: Path) -> None:
    path = read(_write(tmp_path, index_topk=2048))
    with pytest.raises(EngineArgError, match="index_topk=2048"):
        facts_of(path)
    with pytest.raises(EngineArgError, match="index_topk=2048"):
        shape_of(path, "0.34.0")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_model_contradicting_model_config_exits_2(engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--attention-backend", "TRITON_ATTN" if engine == "vllm" else "triton"]
    code = cli.main(["plan", "--engine", engine, "--model", "mha", "--model-config", str(MODELS / "mla" / "config.json"),
                     "--", *flags, "--platform", "cuda:sm90"])
    assert code == 2 and "contradicts --model-config" in capsys.readouterr().err


def test_vllm_plans_the_default_backend_for_the_models_head_size(capsys: pytest.CaptureFixture[str]) -> None:
    """The tier's MHA model has head 32, which FlashInfer refuses: vLLM's pick on SM100 is FLASH_ATTN."""
    code = cli.main(["plan", "--engine", "vllm", "--", "--model-config", str(MODELS / "mha" / "config.json"),
                     "--platform", "cuda:sm100"])
    out = capsys.readouterr().out
    assert code == 0 and "vllm:FLASH_ATTN" in out and "FLASHINFER: head_size not supported" in out
