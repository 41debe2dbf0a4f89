"""The torch backend's descriptor: what it runs, captures and how precisely. Imports no torch.

Tolerances are measured against the fp64 reference of :mod:`attnhal.testing.oracle`
with ``benchmarks/tolerances_torch.py`` (100 random cases over all phases, head
configs, head sizes 16-256, contexts up to ~230): the smallest ``tol`` with
``|out - ref| <= tol * (1 + |ref|)`` was 8.2e-7 (fp32), 2.6e-4 (fp16) and 2.4e-3
(bf16). The backend computes in fp32 and rounds its output to the query dtype
once, so fp16 / bf16 errors are bounded by half an output ulp (2^-11, 2^-8
relative) plus fp32 noise; the declared values keep about 2x over those bounds,
and fp32 leaves room for long contexts.

KV dtypes (same script, 60 cases per pair, page sizes 1/16/64 and a random mix of window,
soft-cap and sinks, 2026-12-01): an fp8 cache (e4m3fn, e4m3fnuz, e5m2; scales 0.25 and 1)
needed 7.1e-7 (fp32 compute), 3.2e-4 (fp16) and 2.5e-3 (bf16) — no more than the compute
dtype alone (5.5e-7, 3.1e-4, 2.6e-3). The reference reads the same quantized bytes and
the backend dequantizes exactly in fp32, so fp8 adds no error of its own: the declared
fp8 tolerances are fp32's, and the compute dtype's (looser) tolerance governs.
"""

from __future__ import annotations

from attnhal.capabilities import BackendCapabilities, SeqLenFill, SpecLimits, Tolerance
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import Vendor
from attnhal.registry import BackendPlugin

__all__ = ["CAPABILITIES", "PLUGIN"]

CAPABILITIES = BackendCapabilities(
    name="torch",
    vendors=frozenset((Vendor.CUDA, Vendor.HIP, Vendor.CPU)),
    phases=frozenset(Phase),
    # Every graph phase runs on static buffers sized in init_graph_state over the
    # pool's full max_context_len, with no speculative limit.
    graph=dict.fromkeys(GRAPH_PHASES, SpecLimits()),
    multi_step=SpecLimits(),
    dtypes=frozenset(("float32", "float16", "bfloat16")),
    # fp8 KV in either e4m3 flavour (torch has both dtypes) and e5m2, dequantized in fp32.
    kv_dtypes=frozenset(("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")),
    # 576: MLA's absorbed q/k head (latent 512 + rope 64; V and the output are 512).
    head_sizes=frozenset((16, 32, 64, 80, 96, 128, 256, 576)),
    page_sizes=frozenset((1, 16, 32, 64, 128)),
    features=frozenset(Feature),
    # Padded rows may carry any seq len >= 0: layouts clamp positions into the row.
    seq_len_fill=SeqLenFill(base=1),
    needs_host_seq_lens=False,
    tolerances={
        "float32": Tolerance(atol=1e-5, rtol=1e-5),
        "float16": Tolerance(atol=1e-3, rtol=1e-3),
        "bfloat16": Tolerance(atol=8e-3, rtol=8e-3),
        "fp8_e4m3": Tolerance(atol=1e-5, rtol=1e-5),
        "fp8_e5m2": Tolerance(atol=1e-5, rtol=1e-5),
    },
)

#: What the ``attnhal.backends`` entry point ``torch`` names: this descriptor, and the class
#: (imported only when the backend is selected or run).
PLUGIN = BackendPlugin(CAPABILITIES, "attnhal_torch.backend:TorchBackend")
