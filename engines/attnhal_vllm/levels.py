"""The ``AttentionCGSupport`` level a vLLM builder reports for one configuration.

The catalogue records each backend's level (``meta.cg_support``) and, in words, what it
depends on (``meta.cg_conditions``). For the backends whose builder decides per
configuration, the rules below follow vLLM 0.33.0's code: the platform's compute
capability, whether speculative decoding is on, and whether FlashInfer's trtllm-gen cubins
are available — which vLLM learns at run time (``utils/flashinfer.py:647-672``:
``flashinfer-cubin`` installed, or NVIDIA's artifactory reachable) and attnhal cannot see,
so it is an assumption the caller states (``trtllm_cubins``) and the result repeats.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attnhal_vllm.modes import CGSupport, catalog_support
from attnhal.platform import ArchSet, Platform, Vendor

__all__ = ["Level", "RULES", "support_on"]


@dataclass(frozen=True)
class Level:
    """The level, and what it rests on (a condition met, or an assumption made)."""

    support: CGSupport
    because: str = ""  # empty: the catalogue's level, nothing in the configuration changes it
    assumes: str = ""  # an assumption about the environment the level rests on

    def to_dict(self) -> dict[str, str]:
        return {"level": self.support.name, "because": self.because, "assumes": self.assumes}


def _archs(*items: str) -> ArchSet:
    return ArchSet(Vendor.CUDA, items)


#: FA3 on SM 9.x, FA4 on SM 10.x, FA2 elsewhere (v1/attention/backends/fa_utils.py:98-107).
_FA3, _FA4 = _archs("sm90..sm99"), _archs("sm100..sm109")
#: trtllm-gen attention: XQA decode on SM90 and SM12x, full kernels on SM100/SM103 (utils/flashinfer.py:690-697).
_TRTLLM = _archs("sm90", "sm100..sm109", "sm120..sm129")
_CUBINS = ("trtllm-gen cubins available: flashinfer-cubin installed or NVIDIA's artifactory reachable "
           "(utils/flashinfer.py:647-672, 686-688); say --trtllm-cubins no (trtllm_cubins=False) if not")
_NO_CUBINS = ("no trtllm-gen cubins: neither flashinfer-cubin installed nor NVIDIA's artifactory reachable "
              "(utils/flashinfer.py:647-672, 686-688)")


def _flash_attn(platform: Platform, spec_tokens: int, cubins: bool) -> Level:
    """ALWAYS with FlashAttention 3/4, UNIFORM_BATCH with FA2 (v1/attention/backends/flash_attn.py:619-623)."""
    if platform.arch in _FA3 or platform.arch in _FA4:
        version = 3 if platform.arch in _FA3 else 4
        return Level(CGSupport.ALWAYS, f"FlashAttention {version} on {platform.arch}")
    return Level(CGSupport.UNIFORM_BATCH, f"FlashAttention 2 on {platform.arch} (FA3 needs SM 9.x, FA4 SM 10.x)")


def _flashinfer(platform: Platform, spec_tokens: int, cubins: bool) -> Level:
    """v1/attention/backends/flashinfer.py:1174-1225, for a causal model with standard heads and
    no decode context parallelism: below SM90 FA2 native decode takes uniform batches (118-120);
    from SM90 uniform batches need trtllm-gen decode, hence its cubins."""
    if not platform.arch_at_least("sm90"):
        return Level(CGSupport.UNIFORM_BATCH, f"FA2 native decode below SM90 ({platform.arch})")
    if platform.arch not in _TRTLLM:
        return Level(CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, f"no trtllm-gen decode on {platform.arch}")
    if not cubins:
        return Level(CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "without trtllm-gen cubins", _NO_CUBINS)
    return Level(CGSupport.UNIFORM_BATCH, f"trtllm-gen decode on {platform.arch}", _CUBINS)


def _hpc_attn(platform: Platform, spec_tokens: int, cubins: bool) -> Level:
    """UNIFORM_BATCH under speculative decoding, else UNIFORM_SINGLE_TOKEN_DECODE
    (v1/attention/backends/hpc_attn.py:106-109, 168-181)."""
    if spec_tokens > 0:
        return Level(CGSupport.UNIFORM_BATCH, "with speculative decoding")
    return Level(CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "without speculative decoding")


#: Per vendor, the backends whose builder decides per configuration -> the rule (platform,
#: speculative tokens, cubins). All three read CUDA compute capabilities.
RULES: Mapping[Vendor, Mapping[str, Callable[[Platform, int, bool], Level]]] = {
    Vendor.CUDA: {"vllm:FLASH_ATTN": _flash_attn, "vllm:FLASHINFER": _flashinfer, "vllm:HPC_ATTN": _hpc_attn},
}


def support_on(name: str, platform: Platform | None, num_speculative_tokens: int = 0,
               trtllm_cubins: bool = True) -> Level:
    """The level ``name`` (``vllm:NAME``) reports on ``platform`` with that many speculative tokens.

    The platform's vendor picks the rule of :data:`RULES`; without one (or without a rule) the
    catalogue's level stands. ``trtllm_cubins`` is the assumption of FLASHINFER's rule.
    """
    rule = RULES.get(platform.vendor, {}).get(name) if platform is not None else None
    if rule is not None and platform is not None:
        return rule(platform, num_speculative_tokens, trtllm_cubins)
    decides = any(name in rules for rules in RULES.values())
    return Level(catalog_support(name), "the catalogue's level (no CUDA platform given)" if decides else "")
