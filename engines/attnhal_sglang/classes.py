"""SGLang backend classes -> catalogue entries (``sglang:NAME``): the explicit table the plugin reads.

SGLang 0.5.23 builds one object per speculative role: a single-step ``AttentionBackend``
for draft extend and a multi-step container for draft decode
(``speculative/draft_utils.py``). The plugin names the catalogue entry of an object by its
class: the first class of ``type(obj).__mro__`` listed in :data:`BACKEND_CLASSES`. A subclass
an out-of-tree platform registers (``class MyAiter(AiterAttnBackend)``) therefore maps to its
parent's entry — it inherits the parent's abilities, which is what its descriptor would say
unless it registers its own. A class that is neither listed nor a subclass of a listed one
is unknown: the plugin leaves that phase to SGLang and says so.

Keys are dotted paths (``module.QualName``), so the table imports nothing of SGLang.
One SGLang class serves two catalogue names (``FlashAttentionBackend``: fa3 and fa4); there
the name SGLang's draft factory stamps on the object (``prefill_attention_backend_str``,
``draft_utils.py:76``) picks one of the listed names.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["BACKEND_CLASSES", "catalog_name"]

_ATTENTION = "sglang.srt.layers.attention"

#: SGLang class path -> the catalogue names it can be (one, or several told apart by the stamp).
BACKEND_CLASSES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    f"{_ATTENTION}.aiter_backend.AiterAttnBackend": ("aiter",),
    f"{_ATTENTION}.aiter_backend.AiterMultiStepDraftBackend": ("aiter",),
    f"{_ATTENTION}.cutedsl_mla_backend.CuteDslMLABackend": ("cutedsl_mla",),
    f"{_ATTENTION}.cutedsl_mla_backend.CuteDslMLAMultiStepDraftBackend": ("cutedsl_mla",),
    f"{_ATTENTION}.dsa_backend.DeepseekSparseAttnBackend": ("dsa",),
    f"{_ATTENTION}.dsa_backend.DeepseekSparseAttnMultiStepBackend": ("dsa",),
    f"{_ATTENTION}.flashattention_backend.FlashAttentionBackend": ("fa3", "fa4"),
    f"{_ATTENTION}.flashattention_backend.FlashAttentionMultiStepBackend": ("fa3", "fa4"),
    f"{_ATTENTION}.flashinfer_backend.FlashInferAttnBackend": ("flashinfer",),
    f"{_ATTENTION}.flashinfer_backend.FlashInferMultiStepDraftBackend": ("flashinfer",),
    f"{_ATTENTION}.flashinfer_mla_backend.FlashInferMLAAttnBackend": ("flashinfer",),
    f"{_ATTENTION}.flashinfer_mla_backend.FlashInferMLAMultiStepDraftBackend": ("flashinfer",),
    f"{_ATTENTION}.flashmla_backend.FlashMLABackend": ("flashmla",),
    f"{_ATTENTION}.flashmla_backend.FlashMLAMultiStepDraftBackend": ("flashmla",),
    f"{_ATTENTION}.intel_amx_backend.IntelAMXAttnBackend": ("intel_amx",),
    f"{_ATTENTION}.intel_amx_backend.IntelAMXMultiStepDraftBackend": ("intel_amx",),
    f"{_ATTENTION}.torch_native_backend.TorchNativeAttnBackend": ("torch_native",),
    f"{_ATTENTION}.triton_backend.TritonAttnBackend": ("triton",),
    f"{_ATTENTION}.triton_backend.TritonMultiStepDraftBackend": ("triton",),
    f"{_ATTENTION}.trtllm_mha_backend.TRTLLMHAAttnBackend": ("trtllm_mha",),
    f"{_ATTENTION}.trtllm_mha_backend.TRTLLMHAAttnMultiStepDraftBackend": ("trtllm_mha",),
    f"{_ATTENTION}.trtllm_mla_backend.TRTLLMMLABackend": ("trtllm_mla",),
    f"{_ATTENTION}.trtllm_mla_backend.TRTLLMMLAMultiStepDraftBackend": ("trtllm_mla",),
    f"{_ATTENTION}.wave_backend.WaveAttnBackend": ("wave",),
})

#: The attribute SGLang's draft factory stamps with the backend's name.
_STAMP = "prefill_attention_backend_str"


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def catalog_name(obj: object, table: Mapping[str, tuple[str, ...]] | None = None) -> str | None:
    """The catalogue name (``"aiter"``) of an SGLang backend object, by its class or a parent's.

    ``None`` when no class of its MRO is in ``table`` (default :data:`BACKEND_CLASSES`), or
    when the class serves several names and the object's stamp names none of them.
    """
    table = BACKEND_CLASSES if table is None else table
    for cls in type(obj).__mro__:
        names = table.get(_path(cls))
        if names is None:
            continue
        if len(names) == 1:
            return names[0]
        stamp = getattr(obj, _STAMP, None)
        return stamp if stamp in names else None
    return None
