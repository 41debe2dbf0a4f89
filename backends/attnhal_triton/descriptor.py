"""The Triton backend's descriptor. Imports neither torch nor triton."""

from __future__ import annotations

from attnhal.capabilities import BackendCapabilities, SeqLenFill, SpecLimits
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import Vendor
from attnhal.registry import BackendPlugin

__all__ = ["CAPABILITIES", "PLUGIN"]

#: Every claim here is checked by ``backends/attnhal_triton/tests/test_*.py`` under the interpreter
#: and the CPU graph emulator, and by the cross-target compile check.
CAPABILITIES = BackendCapabilities(
    name="triton",
    vendors=frozenset((Vendor.CUDA, Vendor.HIP)),
    # bf16 tensor-core dots need Ampere / CDNA2; older archs are not compiled for.
    min_arch={Vendor.CUDA: "sm80", Vendor.HIP: "gfx90a"},
    phases=frozenset(Phase),
    # Spec phases read all per-batch values from device tensors and the decode split
    # count is fixed at capture, so any topk / step count / draft token count holds.
    graph=dict.fromkeys(GRAPH_PHASES, SpecLimits()),
    # draft_decode serves every step s (prefix plus draft_path[:, :s + 1]).
    multi_step=SpecLimits(),
    dtypes=frozenset(("float16", "bfloat16", "float32")),
    # fp8 caches are read as stored * per-layer scale in the kernels; an e4m3 pool must
    # be in the platform's flavour (KVPool.platform_reasons).
    kv_dtypes=frozenset(("float16", "bfloat16", "float32", "fp8_e4m3", "fp8_e5m2")),
    # tl.arange needs a power of two; tl.dot needs K >= 16. 576 (MLA's latent 512 + rope 64)
    # runs the MLA kernel (mla_kernels.py) as a 512 tile plus a 64 tile.
    head_sizes=frozenset((16, 32, 64, 128, 256, 576)),
    # Any page size works (slot = page * P + pos % P, P a constexpr); these are the tested ones.
    page_sizes=frozenset((1, 16, 64)),
    # MLA: q/k 576, V = the latent 512, every phase (the MLA kernel), with the other features.
    features=frozenset((Feature.CUSTOM_MASK, Feature.SLIDING_WINDOW, Feature.LOGIT_SOFTCAP,
                        Feature.SINKS, Feature.MLA)),
    # Any length >= 0 is safe in padded rows (empty rows give 0, never NaN).
    seq_len_fill=SeqLenFill(1),
    needs_host_seq_lens=False,
    requires=("triton",),
)

#: What the ``attnhal.backends`` entry point ``triton`` names: this descriptor, and the class
#: (imported only when the backend is selected or run).
PLUGIN = BackendPlugin(CAPABILITIES, "attnhal_triton.backend:TritonBackend")
