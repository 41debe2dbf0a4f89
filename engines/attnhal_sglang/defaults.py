"""The attention backend SGLang picks when the user gives none (release 0.5.23).

SGLang fills ``--attention-backend`` during its argument resolution, before the page-size
rules run: a DeepSeek-family MLA checkpoint on SM100 gets ``trtllm_mla`` from its model
override (``arg_groups/model_overrides/deepseek_v2.py``, only when no backend flag at all is
given), then ``get_default_attn_backend`` (``arg_groups/model_override_base.py``) picks per
attention kind, GPU arch and speculative settings. attnhal takes the model *kind* only, so
the checkpoint facts SGLang also reads (architecture, KV heads, attention sinks, asymmetric
K/V widths) are stated as assumptions in :attr:`DefaultBackend.assumes`, never hidden.

Platform facts are lookups keyed by vendor (the platform layer owns vendor comparisons).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnhal.engines.flags import EngineArgError
from attnhal.platform import Platform, Vendor, arch_sets
from attnhal.spec import ModelKind

__all__ = ["DefaultBackend", "base_backend", "default_backend", "needs_default"]

#: ``is_hopper_with_cuda_12_3``: compute capability 9.x (a CUDA >= 12.3 toolkit assumed).
_HOPPER = arch_sets({"cuda": ("sm90..sm99",)})
#: ``is_sm100``: compute capability 10.x (utils/common.py).
_SM100 = arch_sets({"cuda": ("sm100..sm109",)})
#: SGLang's branch for a GPU that is neither Hopper nor SM100, per vendor and attention kind
#: (SGLang asks whether the GPU is AMD: aiter; CUDA: flashinfer for MHA/GQA, triton for MLA).
_OTHER: Mapping[Vendor, Mapping[bool, str]] = {Vendor.HIP: {False: "aiter", True: "aiter"},
                                               Vendor.CUDA: {False: "flashinfer", True: "triton"}}
_BACKEND_FLAGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
_SOURCE = "arg_groups/model_override_base.py get_default_attn_backend"


@dataclass(frozen=True)
class DefaultBackend:
    """SGLang's pick for ``--attention-backend``, the rule that chose it, and what attnhal assumed."""

    name: str
    rule: str  # why SGLang picks it (for the output: "set by SGLang ...")
    assumes: str = ""  # checkpoint facts SGLang reads that attnhal cannot ("" : none)

    def __str__(self) -> str:
        text = f"attention backend: {self.name} (set by SGLang: {self.rule})"
        return text + (f"; assumes {self.assumes}" if self.assumes else "")


def _no_tree(values: Mapping[str, Any]) -> bool:
    """``is_no_spec_infer_or_topk_one``: no EAGLE topk given, or topk 1 with no page size above 1
    (it reads the flags as given, before the speculative defaults are filled)."""
    topk = values.get("speculative_eagle_topk")
    return topk is None or (topk == 1 and values.get("page_size") in (None, 1))


def _mha(values: Mapping[str, Any], platform: Platform) -> DefaultBackend:
    on = platform.arch
    if on in _HOPPER.get(platform.vendor, ()) and _no_tree(values):
        return DefaultBackend("fa3", f"Hopper, MHA/GQA model, no EAGLE tree and page size 1 ({_SOURCE})",
                              "a CUDA >= 12.3 toolkit")
    # SM100 takes trtllm_mha only with no tree and, under speculation, an explicit --speculative-eagle-topk.
    topk_given = values.get("speculative_algorithm") is None or "speculative_eagle_topk" in values
    if on in _SM100.get(platform.vendor, ()) and _no_tree(values) and topk_given:
        return DefaultBackend("trtllm_mha", f"SM100, MHA/GQA model, no EAGLE tree ({_SOURCE})",
                              "equal K and V head widths (SGLang picks fa4 otherwise)")
    name = _other(platform, mla=False)
    assumes = ("FlashInfer installed and a model without attention sinks (SGLang picks triton otherwise)"
               if name == "flashinfer" else "")
    return DefaultBackend(name, f"{platform.name}, MHA/GQA model ({_SOURCE})", assumes)


def _mla(values: Mapping[str, Any], platform: Platform, deepseek: bool | None) -> DefaultBackend:
    on = platform.arch
    # The DeepSeek override runs first and only when no backend flag at all is given; ``deepseek``:
    # whether the model's architecture takes it (None: not known, assumed and said).
    no_flag = not any(values.get(f) is not None for f in _BACKEND_FLAGS)
    if on in _SM100.get(platform.vendor, ()) and no_flag and deepseek is not False:
        return DefaultBackend("trtllm_mla", "SM100, DeepSeek-V3-family MLA model "
                              "(arg_groups/model_overrides/deepseek_v2.py)",
                              "" if deepseek else "a DeepSeek V3/R1 architecture (other MLA models get flashinfer, "
                              "DeepSeek V3.2 dsa; --model-config PATH reads it)")
    if on in _HOPPER.get(platform.vendor, ()):
        return DefaultBackend("fa3", f"Hopper, MLA model ({_SOURCE})", "a CUDA >= 12.3 toolkit; "
                              "not DeepSeek V3.2 (its DSA attention gets dsa)")
    if on in _SM100.get(platform.vendor, ()):
        why = "with a split backend flag" if not no_flag else "whose architecture the DeepSeek override does not take"
        return DefaultBackend("flashinfer", f"SM100, MLA model {why} ({_SOURCE})")
    name = _other(platform, mla=True)
    assumes = "16 or 128 KV heads per TP rank (SGLang picks triton otherwise)" if name == "aiter" else ""
    return DefaultBackend(name, f"{platform.name}, MLA model ({_SOURCE})", assumes)


def _other(platform: Platform, mla: bool) -> str:
    picks = _OTHER.get(platform.vendor)
    if picks is None:
        raise EngineArgError("--attention-backend", f"--attention-backend not given on platform={platform.name!r} "
                                                    "(attnhal models SGLang's default on CUDA and HIP GPUs only: "
                                                    "give --attention-backend)")
    return picks[mla]


def default_backend(values: Mapping[str, Any], model: ModelKind | None, platform: Platform | None,
                    deepseek: bool | None = None) -> DefaultBackend:
    """SGLang's ``--attention-backend`` when ``values`` (converted server arguments) name none.

    It depends on the model's attention kind and the platform: without either it is an
    :class:`EngineArgError` naming the flag that would settle it. ``deepseek``: whether the model's
    architecture takes SGLang's DeepSeek override (:mod:`attnhal_sglang.model`; None: not known).
    """
    if model is None:
        raise EngineArgError("--model", "--attention-backend not given: SGLang's default depends on the model's "
                                        "attention kind; give --model (mha, gqa, mla) or --attention-backend")
    if platform is None:
        raise EngineArgError("--attention-backend", "--attention-backend not given: SGLang's default depends on "
                                                    "the GPU; plan for a platform or give --attention-backend")
    return _mla(values, platform, deepseek) if model is ModelKind.MLA else _mha(values, platform)


def needs_default(values: Mapping[str, Any]) -> bool:
    """Whether SGLang fills ``attention_backend``: none given, and no equal prefill/decode pair
    (SGLang takes that pair's backend as the base one)."""
    if values.get("attention_backend") is not None:
        return False
    prefill, decode = values.get("prefill_attention_backend"), values.get("decode_attention_backend")
    return not (prefill is not None and prefill == decode)


def base_backend(values: Mapping[str, Any], model: ModelKind | None, platform: Platform | None,
                 deepseek: bool | None = None) -> DefaultBackend | None:
    """What SGLang sets ``attention_backend`` to (``None``: it keeps the flag as given): its
    default when none is given, then fa3's fp8 fallback (fa3 reads fp8 KV as e4m3 only:
    ``arg_groups/overrides.py`` ``_attention_backend_fa3_fp8_fallback``)."""
    pick = default_backend(values, model, platform, deepseek) if needs_default(values) else None
    name = pick.name if pick is not None else values.get("attention_backend")
    if name == "fa3" and values.get("kv_cache_dtype") == "fp8_e5m2":
        return DefaultBackend("triton", "fa3 takes fp8 KV as e4m3 only (arg_groups/overrides.py "
                                        "_attention_backend_fa3_fp8_fallback)", pick.assumes if pick else "")
    return pick
