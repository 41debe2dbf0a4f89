"""A model's ``config.json`` (``--model-config``) read the way SGLang 0.5.23 reads it.

SGLang keys on ``architectures``: a model is MLA when its class is one of ``ModelConfig``'s MLA
architectures (``configs/model_config.py:1367-1512``; some only with ``kv_lora_rank`` set), and
on SM100 with no backend flag the DeepSeek override (``arg_groups/model_overrides/deepseek_v2.py``:
registered for the first architecture, 37-50) sets ``trtllm_mla`` unless the model is DeepSeek
sparse attention (``is_deepseek_dsa``, ``configs/model_config.py:191-211``: an ``index_topk``),
whose ``dsa`` backend attnhal does not model. Any other MLA model on SM100 gets SGLang's generic
default (``get_default_attn_backend``: flashinfer).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnhal.engines.flags import EngineArgError
from attnhal.engines.model_config import FLAG, HFConfig
from attnhal.spec import ModelKind

__all__ = ["ModelFacts", "facts_of"]

#: MLA whatever the config says (configs/model_config.py:1367-1395, 1445-1512).
MLA_ARCHS = frozenset("""
DeepseekV2ForCausalLM DeepseekV32ForCausalLM DeepseekV3ForCausalLM DeepseekV3ForCausalLMNextN Glm4MoeLiteForCausalLM
Glm4MoeLiteForCausalLMNextN GlmMoeDsaForCausalLM GlmMoeDsaForCausalLMNextN Glm5NextForConditionalGeneration
Glm5NextForConditionalGenerationNextN LongcatFlashForCausalLM LongcatFlashForCausalLMNextN HYV4ForCausalLM
HYV4ForCausalLMNextN DotsVLMForCausalLM Dots3NoteForCausalLM Dots3NoteForCausalLMNextN MistralLarge3ForCausalLM
MistralLarge3ForCausalLMEagle KimiK25ForConditionalGeneration Eagle3DeepseekV2ForCausalLM GigaChat35ForCausalLM
GigaChat35ForCausalLMNextN MiniCPM3ForCausalLM KimiVLForConditionalGeneration KimiLinearForCausalLM
KimiK3LinearForCausalLM KimiK3ForConditionalGeneration BailingMoeV2_5ForCausalLM BailingMoeV3ForCausalLM
BailingMoeV3VLForConditionalGeneration
""".split())
#: MLA only with ``kv_lora_rank`` set (Pixtral as Mistral Large 3, DeepSeek-VL2, Bailing's NextN drafter).
MLA_IF_LORA = frozenset({"PixtralForConditionalGeneration", "DeepseekVL2ForCausalLM", "BailingMoeForCausalLMNextN"})
#: The first architectures the DeepSeek override is registered for (deepseek_v2.py:37-50).
DEEPSEEK_OVERRIDE = frozenset("""
DeepseekV3ForCausalLM DeepseekV32ForCausalLM KimiK25ForConditionalGeneration MistralLarge3ForCausalLM
PixtralForConditionalGeneration GlmMoeDsaForCausalLM Glm5NextForConditionalGeneration HYV4ForCausalLM
HYV4ForCausalLMNextN LongcatFlashForCausalLM LongcatFlashForCausalLMNextN Dots3NoteForCausalLM
""".split())
#: ``is_deepseek_dsa``'s architectures (with ``index_topk`` set).
DSA_ARCHS = frozenset("""
DeepseekV3ForCausalLM DeepseekV32ForCausalLM DeepseekV3ForCausalLMNextN MistralLarge3ForCausalLM
PixtralForConditionalGeneration GlmMoeDsaForCausalLM GlmMoeDsaForCausalLMNextN Glm5NextForConditionalGenerationNextN
Glm5NextForConditionalGeneration LongcatFlashForCausalLM LongcatFlashForCausalLMNextN Dots3NoteForCausalLM
Dots3NoteForCausalLMNextN HYV4ForCausalLM HYV4ForCausalLMNextN
""".split())


@dataclass(frozen=True)
class ModelFacts:
    """What SGLang's defaults read of the model: its kind, and whether the DeepSeek override applies."""

    kind: ModelKind
    deepseek_override: bool
    source: str


def facts_of(config: HFConfig) -> ModelFacts:
    """SGLang's reading of ``config``. DeepSeek sparse attention is refused naming ``index_topk``."""
    arch = config.architecture
    mla = arch in MLA_ARCHS or (arch in MLA_IF_LORA and config.get("kv_lora_rank") is not None)
    if arch in DSA_ARCHS and config.get("index_topk") is not None:
        raise EngineArgError(FLAG, f"{FLAG} {config.path}: index_topk={config.get('index_topk')} with "
                                   f"architectures[0]={arch} (DeepSeek sparse attention: SGLang's dsa backends are "
                                   "not modelled; supported: dense models)")
    if mla:
        kind = ModelKind.MLA
    else:
        heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
        kind = ModelKind.GQA if kv is not None and heads is not None and kv < heads else ModelKind.MHA
    return ModelFacts(kind, arch in DEEPSEEK_OVERRIDE, f"{config.path} ({arch})")
