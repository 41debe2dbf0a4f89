"""The cpu backend's descriptor. Imports no torch.

Every phase runs in the one native kernel (``csrc/attention.cpp``): decode and
draft decode as rows of one query token, draft extend and target verify as rows of
``T`` query tokens, prefill as blocks of :data:`PREFILL_BLOCK` tokens. No phase is
delegated to another backend.
"""

from __future__ import annotations

from attnhal.capabilities import BackendCapabilities, SeqLenFill, SpecLimits, Tolerance
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import Vendor
from attnhal.registry import BackendPlugin

__all__ = ["CAPABILITIES", "NATIVE_PHASES", "PLUGIN", "PREFILL_BLOCK"]

#: Phases the native kernel runs (all of them; the docs' phase table repeats this).
NATIVE_PHASES = frozenset(Phase)
#: Query tokens per prefill block (one kernel row each).
PREFILL_BLOCK = 16

#: Tolerances: the kernel accumulates in fp32 and rounds its output once to the query
#: dtype, like the torch backend, and is checked against the fp64 reference with the
#: same bounds (``backends/attnhal_cpu/tests/test_backend.py`` measures the worst error it sees).
CAPABILITIES = BackendCapabilities(
    name="cpu",
    vendors=frozenset((Vendor.CPU,)),
    phases=NATIVE_PHASES,
    # Graph replay reads lengths, tables, masks and draft paths from tensors inside the
    # kernel; the KV split count is fixed per captured batch size: no spec limit.
    graph=dict.fromkeys(GRAPH_PHASES, SpecLimits()),
    multi_step=SpecLimits(),
    dtypes=frozenset(("float32", "float16", "bfloat16")),
    head_sizes=frozenset((64, 80, 96, 128, 256)),
    # Any page size works (slot = page * P + pos % P); these are the ones the tests run.
    page_sizes=frozenset((1, 16, 32, 64, 128)),
    features=frozenset((Feature.CUSTOM_MASK,)),
    # Rows of any length >= 0 are safe: a row that attends nothing outputs zeros.
    seq_len_fill=SeqLenFill(base=1),
    tolerances={dtype: Tolerance(atol=bound, rtol=bound)
                for dtype, bound in (("float32", 1e-5), ("float16", 1e-3), ("bfloat16", 8e-3))},
)

#: What the ``attnhal.backends`` entry point ``cpu`` names: this descriptor, and the class
#: (imported only when the backend is selected or run).
PLUGIN = BackendPlugin(CAPABILITIES, "attnhal_cpu.backend:CpuBackend")
