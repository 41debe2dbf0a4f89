"""A model's ``config.json`` (``--model-config``) read the way vLLM reads it, for its backend choice.

vLLM calls a model MLA by its ``model_type`` with ``kv_lora_rank`` set
(``transformers_utils/model_arch_config_convertor.py`` ``is_deepseek_mla``: 0.33.0 294-330, 0.34.0
adds ``mistral_large_4``); its attention head size is then ``kv_lora_rank + qk_rope_head_dim``,
else ``head_dim``, else ``hidden_size / num_attention_heads`` (``get_head_size``, 91-117). FlashInfer
MLA reads ``qk_nope_head_dim`` (1 when absent). Sparse MLA (an ``index_topk``: DeepSeek V3.2, GLM 5)
and DeepSeek V4's compressed attention are not modelled: refused naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnhal.engines.flags import EngineArgError
from attnhal.engines.model_config import FLAG, HFConfig
from attnhal.spec import ModelKind
from attnhal_vllm.selection import ModelShape

__all__ = ["MLA_TYPES", "kind_of", "shape_of"]

_MLA_033 = ("axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots3_note",
            "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite",
            "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash", "pangu_ultra_moe", "pangu_ultra_moe_mtp",
            "bailing_hybrid", "bailing_hybrid_mtp", "bailing_hybrid_v3_mtp", "hy_v4", "hy_v4_mtp")
#: Release -> the ``model_type`` values vLLM reads as MLA (with ``kv_lora_rank`` set).
MLA_TYPES: Mapping[str, frozenset[str]] = {"0.33.0": frozenset(_MLA_033),
                                           "0.34.0": frozenset((*_MLA_033, "mistral_large_4"))}
#: The model dtypes vLLM's selection is modelled for (``torch_dtype``; absent: bfloat16 assumed).
_DTYPES = ("bfloat16", "float16")


def _mla(config: HFConfig, release: str) -> bool:
    return config.model_type in MLA_TYPES[release] and config.get("kv_lora_rank") is not None


def kind_of(config: HFConfig, release: str) -> ModelKind:
    """The attention kind vLLM gives the model: MLA, else GQA where it has fewer KV heads than query heads."""
    if _mla(config, release):
        return ModelKind.MLA
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    return ModelKind.GQA if kv is not None and heads is not None and kv < heads else ModelKind.MHA


def shape_of(config: HFConfig, release: str) -> ModelShape:
    """What vLLM's backend choice reads of the model (:class:`~attnhal_vllm.selection.ModelShape`)."""
    if config.get("index_topk") is not None:
        raise EngineArgError(FLAG, f"{FLAG} {config.path}: index_topk={config.get('index_topk')} (sparse MLA: "
                                   "vLLM's sparse backends are not modelled; supported: dense models, or "
                                   "--attention-backend)")
    heads = config.get("num_attention_heads") or 0
    dtype = config.dtype or "bfloat16"
    if dtype not in _DTYPES:
        raise EngineArgError(FLAG, f"{FLAG} {config.path}: torch_dtype={dtype!r} (supported: {', '.join(_DTYPES)}; "
                                   "vLLM's choice for other dtypes is not modelled: give --attention-backend)")
    source = f"{config.path} ({config.model_type or config.architecture})"
    if _mla(config, release):
        rope = config.get("qk_rope_head_dim")
        if rope is None:
            raise EngineArgError(FLAG, f"{FLAG} {config.path}: qk_rope_head_dim=None (supported: a positive "
                                       "integer: vLLM's MLA head size is kv_lora_rank + qk_rope_head_dim)")
        return ModelShape(True, (config.get("kv_lora_rank") or 0) + rope, heads, dtype,
                          config.get("qk_nope_head_dim") or 1, source)
    head = config.get("head_dim") or ((config.get("hidden_size") or 0) // heads if heads else 0)
    if head <= 0:
        raise EngineArgError(FLAG, f"{FLAG} {config.path}: head_dim=None, hidden_size="
                                   f"{config.get('hidden_size')} (supported: head_dim, or hidden_size with "
                                   "num_attention_heads)")
    return ModelShape(False, head, heads, dtype, None, source)
