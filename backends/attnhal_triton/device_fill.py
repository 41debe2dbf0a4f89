"""How many programs fill a device: the split launch rows' targets, as data.

A split kernel's row is split until its launch reaches ``UNITS[family] x
PROGRAMS_PER_UNIT[kernel]`` programs (:mod:`attnhal_triton.launch_table`'s GQA rows,
:mod:`attnhal_triton.mla_table`'s with their own count per unit; :mod:`attnhal_triton.work`
sizes the split).

This module imports neither torch nor triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["GPU_SPLITS", "L2_DEAL", "L2_DOMAINS", "PROGRAMS_PER_UNIT", "UNITS", "fill_programs",
           "with_l2_domains"]

#: SMs (NVIDIA) or CUs (AMD) of each family's reference part: A100, H100/H200, RTX 5090,
#: MI250X (one GCD), MI300X, MI355X. The split rows fill :data:`PROGRAMS_PER_UNIT` programs
#: on each; a part with fewer units is filled sooner, one with more a little later.
UNITS: Mapping[str, int] = MappingProxyType({
    "sm80": 108, "sm90": 132, "sm120": 170, "gfx90": 110, "gfx94": 304, "gfx95": 256,
})
#: L2 caches of each family's reference part across which the hardware deals consecutive
#: programs round-robin (program ``w`` of a launch runs behind L2 ``w % n``): the 8 XCDs of an
#: MI300X/MI325X (gfx942) and an MI355X (gfx950), each with its own 4 MB L2, joined by the
#: Infinity Cache. Families not listed count as one L2 (NVIDIA documents no such dealing).
#: A part with fewer XCDs (MI300A: 6, or a partitioned MI300X) still gets a correct launch,
#: with less sharing (:mod:`attnhal_triton.kv_reuse`).
L2_DOMAINS: Mapping[str, int] = MappingProxyType({"gfx94": 8, "gfx95": 8})
#: Most consecutive programs dealt to one of those L2s at a time (a kernel dealing a row's head
#: blocks together, :mod:`attnhal_triton.kv_reuse`): enough for MLA decode's 8 head blocks
#: (128 heads / 16) with room, few enough that a long prefill row (thousands of blocks) is
#: still spread over every L2 instead of keeping one XCD busy while seven idle.
L2_DEAL = 16
#: Programs per SM/CU that each split kernel is split up to. Measured on an H200
#: (benchmarks/triton_sweep.py, docs/triton.md): decode's small programs want 4 per SM, causal
#: verify's 2, the tree's (more work per position) 1. Draft extend takes verify's count, and
#: other families take these counts, unmeasured.
PROGRAMS_PER_UNIT: Mapping[str, int] = MappingProxyType({
    "decode": 4, "extend_verify": 2, "extend_verify_tree": 1, "extend_draft": 2,
})
#: Most KV splits of a row on a GPU: the partial buffers are sized by the work
#: (:func:`attnhal_triton.work.partial_slots`), not by this, so it can be generous.
GPU_SPLITS = 64


def fill_programs(family: str) -> dict[str, int]:
    """Programs that fill ``family``'s reference part, per split kernel."""
    return {kernel: UNITS[family] * n for kernel, n in PROGRAMS_PER_UNIT.items()}


def with_l2_domains(blocks: Mapping[str, int], family: str | None) -> dict[str, int]:
    """``blocks`` plus ``L2_DOMAINS`` where ``family`` deals programs over several L2s (the
    kernels whose grid keeps a row's query blocks on axis 0 take it; 1, the default, is left
    out)."""
    domains = L2_DOMAINS.get(family or "", 1)
    return {**blocks, "L2_DOMAINS": domains} if domains > 1 else dict(blocks)
