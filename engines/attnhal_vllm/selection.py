"""vLLM's own choice of attention backend when ``--attention-backend`` is not given (0.33.0 and 0.34.0
share the rule: ``platforms/cuda.py`` and ``v1/attention/backend.py`` differ in nothing it reads).

vLLM's CUDA platform (``platforms/cuda.py:420-519``, ``get_attn_backend_cls``) walks a priority list
that depends on the device's major compute capability and on whether the model is MLA
(``_get_backend_priorities``, 84-181), asks each backend's ``validate_configuration``
(``v1/attention/backend.py:279-370``: head size, dtype, KV-cache dtype, MLA or not, sparse or not,
compute capability, ``supports_combination``) and takes the first one with no reason against it.
:func:`select` does the same for the inputs attnhal has: the platform, the model's shape
(:class:`ModelShape`: from ``--model-config``, else a stated assumption), a causal text decoder with
vLLM's default KV cache (``auto``: the model's dtype) and no ``--block-size``. Not modelled, and said
so: sparse-attention models (their index), multimodal prefix attention, non-causal drafters
(DFlash), per-model overrides (Gemma 4 forces ``TRITON_ATTN``), other vendors' selectors.
The tier checks the lists and each verdict against vLLM's executed code
(``tests/engines/vllm/test_vllm_default_backend.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attnhal.catalog import CatalogError, load
from attnhal.engines.flags import EngineArgError
from attnhal.platform import Platform, Vendor

__all__ = ["Candidate", "ModelShape", "Selection", "priorities", "select"]


@dataclass(frozen=True)
class ModelShape:
    """What vLLM's selection reads of the model: MLA or not, the attention head size it validates
    (MLA: ``kv_lora_rank + qk_rope_head_dim``), the query heads, MLA's ``qk_nope_head_dim`` and the
    dtype; ``source`` says where they come from (a ``config.json``, or the assumption made)."""

    mla: bool
    head_size: int
    num_heads: int
    dtype: str = "bfloat16"
    qk_nope_head_dim: int | None = None
    source: str = ""


#: The shapes assumed without ``--model-config``: a Llama-like GQA model (head 128, 32 heads) and
#: DeepSeek V3/R1's MLA (576 = 512 + 64, 128 heads, qk_nope 128).
ASSUMED = {False: ModelShape(False, 128, 32, source="assumed: head size 128, 32 heads, bfloat16 "
                                                     "(--model-config PATH reads the model's)"),
           True: ModelShape(True, 576, 128, qk_nope_head_dim=128,
                            source="assumed: DeepSeek V3/R1's MLA (head size 576, 128 heads, qk_nope 128, "
                                   "bfloat16; --model-config PATH reads the model's)")}

#: Sparse MLA backends: each refuses a dense model ("non-sparse not supported", backend.py:321-325).
SPARSE = frozenset({"FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE",
                    "FLASHINFER_MLA_SPARSE_SM90", "FLASHINFER_MLA_SPARSE_SM120"})


def priorities(major: int, shape: ModelShape) -> tuple[str, ...]:
    """vLLM's priority list for a dense causal text decoder with an ``auto`` KV cache
    (``platforms/cuda.py:84-181``)."""
    if shape.mla:
        if major == 10:
            sparse = (("FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE")
                      if shape.num_heads <= 16 else ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"))
            return ("FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA",
                    *sparse)
        if major == 12:
            return ("TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120")
        tail = ["FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"]
        tail.insert(0 if shape.head_size == 512 else 2, "FLASHINFER_MLA_SPARSE_SM90")
        return ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", *tail)
    first = ("FLASHINFER", "FLASH_ATTN") if major == 10 else ("FLASH_ATTN", "FLASHINFER")
    return (*first, "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT")


#: Head sizes each backend takes (``supports_head_size``): FA ``flash_attn.py:425-436``, FlashInfer
#: ``flashinfer.py:691-693``, Triton ``triton_attn.py:379-380``, FlexAttention and TurboQuant any; the MLA
#: backends 320/512/576 (``mla_attention.py:1623-1624``; FlashAttention MLA 576 only, ``flashattn_mla.py:108-109``;
#: Triton MLA any, ``triton_mla.py:110-111``).
_MLA_HEADS = frozenset({320, 512, 576})
HEAD_SIZES: Mapping[str, Callable[[int], bool]] = {
    "FLASH_ATTN": lambda h: h % 8 == 0 and h <= 256,
    "FLASHINFER": lambda h: h in (64, 128, 256, 512),
    "TRITON_ATTN": lambda h: h >= 32,
    "FLEX_ATTENTION": lambda h: True,
    "TURBOQUANT": lambda h: h > 0,
    "FLASH_ATTN_MLA": lambda h: h == 576,
    "TRITON_MLA": lambda h: True,
}
#: Backends that refuse vLLM's default KV cache (``auto``): TokenSpeed MLA takes fp8 only
#: (``tokenspeed_mla.py:103-106``), TurboQuant its own ``turboquant_*`` formats (``turboquant_attn.py:184-187``).
NO_AUTO_KV = {"TOKENSPEED_MLA": "fp8", "TURBOQUANT": "turboquant_*"}


@dataclass(frozen=True)
class Candidate:
    """One backend of the priority list and vLLM's reasons against it (none: it is valid)."""

    name: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Selection:
    """The backend vLLM picks, the list it walked (in order, with each one's reasons) and why."""

    backend: str  # vllm:NAME
    candidates: tuple[Candidate, ...]
    shape: ModelShape
    platform: str

    def why(self) -> str:
        before = [c for c in self.candidates if c.reasons and self.candidates.index(c) < self._index()]
        skipped = "; ".join(f"{c.name}: {', '.join(c.reasons)}" for c in before)
        kind = "MLA" if self.shape.mla else "non-MLA"
        return (f"vLLM's default choice (no --attention-backend): the first valid backend of its priority list for "
                f"{self.platform}, {kind}, head size {self.shape.head_size}, {self.shape.dtype}"
                + (f" (before it: {skipped})" if skipped else ""))

    def _index(self) -> int:
        return [c.name for c in self.candidates].index(self.backend.removeprefix("vllm:"))

    def to_dict(self) -> dict[str, object]:
        return {"backend": self.backend, "by": "vLLM's default choice", "model": self.shape.source,
                "candidates": [{"name": c.name, "reasons": list(c.reasons)} for c in self.candidates]}


def _cuda(platform: Platform, shape: ModelShape) -> tuple[str, ...]:
    """The CUDA platform's list for the device's major compute capability (``sm103`` -> 10)."""
    return priorities(int(platform.arch.removeprefix("sm")) // 10, shape)


#: Per vendor, vLLM's priority list for a platform (vLLM's other platforms' selectors: not modelled).
SELECTORS: Mapping[Vendor, Callable[[Platform, ModelShape], tuple[str, ...]]] = {Vendor.CUDA: _cuda}


def reasons(name: str, platform: Platform, shape: ModelShape) -> tuple[str, ...]:
    """vLLM's ``validate_configuration`` reasons against ``name`` for these inputs, as its own words."""
    if name in SPARSE:
        return ("non-sparse not supported",)
    try:
        d = load(f"vllm:{name}").descriptor
    except CatalogError:
        return ("not in attnhal's catalogue",)
    out = []
    takes_head = HEAD_SIZES.get(name, (lambda h: h in _MLA_HEADS) if shape.mla else (lambda h: True))
    if not takes_head(shape.head_size):
        out.append("head_size not supported")
    if shape.dtype not in d.dtypes:
        out.append("dtype not supported")
    if name in NO_AUTO_KV:
        out.append("kv_cache_dtype not supported")
    if shape.mla != ("mla" in {m.value for m in d.models or ()}):
        out.append("MLA not supported" if shape.mla else "non-MLA not supported")
    archs = d.archs.get(platform.vendor)
    if archs is not None and platform.arch not in archs:
        out.append("compute capability not supported")
    if name == "FLASHINFER_MLA" and shape.qk_nope_head_dim not in (64, 128, 192):
        # flashinfer_mla.py:228-249: vLLM reads qk_nope_head_dim (1 when the config has none)
        out.append(f"FlashInfer MLA kernel requires qk_nope_head_dim in [64, 128, 192], but got "
                   f"{shape.qk_nope_head_dim or 1}")
    return tuple(out)


def select(platform: Platform | None, shape: ModelShape) -> Selection:
    """The backend vLLM's CUDA platform picks for ``shape`` on ``platform``. Raises
    :class:`EngineArgError` (``--attention-backend``) where attnhal does not model the choice (no
    platform, another vendor) or where vLLM finds no valid backend (its own refusal)."""
    walk = SELECTORS.get(platform.vendor) if platform is not None else None
    if platform is None or walk is None:
        where = "no platform given" if platform is None else f"platform {platform.name}"
        raise EngineArgError("--attention-backend", f"--attention-backend not given and {where}: attnhal models "
                             f"vLLM's default choice on {', '.join(v.value for v in SELECTORS)} platforms only "
                             "(supported: --platform cuda:smNN, or --attention-backend NAME)")
    listed = tuple(Candidate(n, reasons(n, platform, shape)) for n in walk(platform, shape))
    valid = [c for c in listed if not c.reasons]
    if not valid:
        why = "; ".join(f"{c.name}: {', '.join(c.reasons)}" for c in listed)
        raise EngineArgError("--attention-backend", f"--attention-backend not given: vLLM finds no valid attention "
                             f"backend for {platform.name} ({why}); it refuses to start")
    return Selection(f"vllm:{valid[0].name}", listed, shape, platform.name)
