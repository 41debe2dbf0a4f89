"""The torch backend's descriptor: what it runs, captures and how precisely.

Tolerances are measured against the fp64 reference of ``tests/reference.py``
(``benchmarks/tolerances_torch.py`` re-measures them): the backend computes in
fp32 and rounds its output to the query dtype once, so fp16 / bf16 errors are
that final rounding (half an ulp of the output) plus fp32 noise.
"""

from __future__ import annotations

from attnhal.capabilities import (
    BackendCapabilities,
    Feature,
    Phase,
    SeqLenFill,
    SpecLimits,
    Tolerance,
)
from attnhal.platform import Vendor

__all__ = ["CAPABILITIES"]

CAPABILITIES = BackendCapabilities(
    name="torch",
    vendors=frozenset((Vendor.CUDA, Vendor.HIP, Vendor.CPU)),
    phases=frozenset(Phase),
    # Every graph phase runs on static buffers sized in init_graph_state over the
    # pool's full max_context_len, with no speculative limit.
    graph={
        Phase.DECODE: SpecLimits(),
        Phase.TARGET_VERIFY: SpecLimits(),
        Phase.DRAFT_DECODE: SpecLimits(),
        Phase.DRAFT_EXTEND: SpecLimits(),
    },
    multi_step=SpecLimits(),
    dtypes=frozenset(("float32", "float16", "bfloat16")),
    head_sizes=frozenset((16, 32, 64, 80, 96, 128, 256)),
    page_sizes=frozenset((1,)),
    features=frozenset((Feature.CUSTOM_MASK,)),
    # Padded rows may carry any seq len >= 0: layouts clamp positions into the row.
    seq_len_fill=SeqLenFill(base=1),
    needs_host_seq_lens=False,
    tolerances={
        "float32": Tolerance(atol=1e-5, rtol=1e-5),
        "float16": Tolerance(atol=1e-3, rtol=1e-3),
        "bfloat16": Tolerance(atol=8e-3, rtol=8e-3),
    },
)
