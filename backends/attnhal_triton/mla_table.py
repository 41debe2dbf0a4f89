"""MLA's launch rows, the form serving each phase, and how a batch's launch is sized.

The rows are :class:`~attnhal_triton.launch_table.LaunchRow` values like the GQA kernels'
(one per MLA form, vendor and arch family; ``head_size`` 576, any dtype unless a row says),
chosen so that every form compiles with 0 spills for cuda:80/90/100 and gfx942/gfx950
(``python -m attnhal_triton.mla_compile_check``). They are starting points, not benchmarks:
no GPU was available to time them.

Why these tiles: one program accumulates ``BLOCK_M x 512`` fp32 outputs (its q rows times
the latent width) and holds ``BLOCK_M x 576`` query values, so ``BLOCK_M`` is what the
register file bounds; ``BLOCK_N`` positions of the 576-wide row go through shared memory.
A block of ``BLOCK_M`` q rows reads each latent row of its KV range once: decode with up to
``BLOCK_M`` heads reads the latent stream once per (row, split) for all heads; more heads
take ``ceil(H / BLOCK_M)`` blocks, each reading it (see docs/triton.md, MLA).

This module imports neither torch nor triton.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from attnhal.phases import Phase
from attnhal.platform import Platform
from attnhal_triton.device_fill import UNITS, with_l2_domains
from attnhal_triton.launch_table import (
    MLA_KERNELS,
    LaunchRow,
    NoLaunchRowWarning,
    best_row,
    hip_options,
    rows_for,
)
from attnhal_triton.work import Launch, batch_splits, query_block

__all__ = ["MLA_FALLBACK", "MLA_SPLIT", "MLA_TABLE", "mla_kernel_of", "mla_lookup", "mla_programs"]

#: The MLA head: q/k 576 = latent 512 + rope 64; V and the output are the latent 512.
MLA_HEAD = 576

#: Programs per SM/CU the split MLA forms fill (each program is ~8x a GQA decode program's
#: work per position: 576-wide rows for up to BLOCK_M heads): 2 per unit.
_PER_UNIT = 2
_SPLITS = 64


def _rows(vendor: str | None, family: str | None, specs: Iterable[tuple[str, str | None, dict[str, int], int, int]],
          units: int, splits: int = _SPLITS, split_len: int = 256, **common: object) -> list[LaunchRow]:
    """Rows from ``(kernel, dtype, blocks, num_warps, num_stages)``; ``"mla"`` stands for every
    MLA form (prefill takes no splits). A family dealing programs over several L2s adds
    ``L2_DOMAINS`` (:func:`~attnhal_triton.device_fill.with_l2_domains`): the kernel numbers
    its programs so that the head blocks of a (row, split) share an L2."""
    out = []
    for kernel, dtype, blocks, warps, stages in specs:
        blocks = with_l2_domains(blocks, family)
        for name in MLA_KERNELS if kernel == "mla" else (kernel,):
            split = name != "mla_prefill"
            out.append(LaunchRow(name, vendor, family, blocks, num_warps=warps, num_stages=stages,
                                 head_size=MLA_HEAD, dtype=dtype, kv_splits=splits if split else 1,
                                 split_len=split_len, fill_programs=units * _PER_UNIT if split else 0,
                                 **common))  # type: ignore[arg-type]
    return out


def _nvidia(family: str) -> list[LaunchRow]:
    # 8 warps: 32 q rows x 512 fp32 outputs are 64 registers a thread; the 16-position
    # tiles of the 576-wide row leave room for the fp8 widening (<= 241 registers, sm90).
    # 4 warps spill (fp8), and so do 64 q rows at 8 warps (255 registers, 1-3 KB).
    return _rows("cuda", family, [
        ("mla", None, {"BLOCK_M": 32, "BLOCK_N": 16}, 8, 1),
    ], UNITS[family]) + _rows("cuda", family, [
        # fp32 dots on FMA units: ptxas caps 8 warps at 128 registers and spills 24-32 bytes
        # (sm90/sm100); with maxnreg 255 it takes ~150 and spills nothing.
        ("mla", "float32", {"BLOCK_M": 16, "BLOCK_N": 16}, 8, 1),
    ], UNITS[family], extra={"maxnreg": 255})


def _amd(family: str) -> list[LaunchRow]:
    # 16 q rows, 16 positions, 4 waves: the only shape found spill-free with an fp8 cache on
    # gfx942 (32 q rows spill at 4 and 8 waves, 16 rows at 8 waves). No waves_per_eu: the
    # accumulators take the AGPRs too.
    return _rows("hip", family, [
        ("mla", None, {"BLOCK_M": 16, "BLOCK_N": 16}, 4, 1),
    ], UNITS[family], extra={k: v for k, v in hip_options(family).items() if k != "waves_per_eu"})


MLA_TABLE: tuple[LaunchRow, ...] = (
    *_nvidia("sm80"), *_nvidia("sm90"), *_nvidia("sm120"),
    *_amd("gfx90"), *_amd("gfx94"), *_amd("gfx95"),
    # The interpreter: 64 q rows (16 heads x 4 tokens, or 64 heads) per program and 64
    # positions per tile keep the sequentially run programs few; short splits so that the
    # tests' short rows split.
    *_rows("cpu", "cpu", [("mla", None, {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 1)], 1 << 19,
           splits=4, split_len=64),
)
#: Rows for an arch family the table does not know: the smallest tiles.
MLA_FALLBACK: tuple[LaunchRow, ...] = tuple(_rows(None, None, [
    ("mla", None, {"BLOCK_M": 16, "BLOCK_N": 16}, 4, 1)], 128, splits=16))


#: ``BLOCK_M`` at most, when V is as wide as K (a 576 head that is not MLA): the tail
#: accumulator costs 32 more fp32 registers a thread at 32 rows (fp8 tree verify spilled 52
#: bytes on sm90).
V_TAIL_BLOCK_M = 16


def mla_lookup(kernel: str, platform: Platform, dtype: str, v_tail: bool = False,
               table: Iterable[LaunchRow] = MLA_TABLE) -> LaunchRow:
    """The row of MLA form ``kernel`` for ``platform`` and compute ``dtype`` (warns and takes
    the fallback row for an unknown arch family); ``v_tail``: V as wide as K."""
    if kernel not in MLA_KERNELS:
        raise ValueError(f"kernel={kernel!r} (supported: {', '.join(MLA_KERNELS)})")
    family = rows_for(kernel, platform.vendor.value, platform.arch_family, table)
    if family:
        row = best_row(family, MLA_HEAD, dtype)
    else:
        row = best_row([r for r in MLA_FALLBACK if r.kernel == kernel], MLA_HEAD, dtype)
        warnings.warn(f"attnhal_triton: no MLA launch settings for arch={platform.arch} "
                      f"(family {platform.arch_family}); using the fallback row {row.key()}",
                      NoLaunchRowWarning, stacklevel=2)
    if v_tail and row.blocks["BLOCK_M"] > V_TAIL_BLOCK_M:
        row = replace(row, blocks={**row.blocks, "BLOCK_M": V_TAIL_BLOCK_M})
    return row


#: The forms that may split a row's KV range (all but prefill's one pass).
MLA_SPLIT = tuple(k for k in MLA_KERNELS if k != "mla_prefill")

_BY_PHASE: Mapping[Phase, str] = MappingProxyType({
    Phase.DECODE: "mla_decode", Phase.DRAFT_DECODE: "mla_decode", Phase.PREFILL: "mla_prefill",
    Phase.TARGET_VERIFY: "mla_verify", Phase.DRAFT_EXTEND: "mla_draft"})


def mla_kernel_of(phase: Phase, tree: bool) -> str:
    """The MLA form serving ``phase`` (``tree``: target verify with a tree mask)."""
    return "mla_verify_tree" if phase is Phase.TARGET_VERIFY and tree else _BY_PHASE[phase]


def mla_programs(kernel: str, row: LaunchRow, batch_size: int, query_tokens: int,
                 num_q_heads: int, num_kv_heads: int) -> Launch:
    """The launch of MLA form ``kernel`` for ``batch_size`` rows of ``query_tokens`` query
    tokens (1 for decode and prefill, whose grid follows the longest row instead):
    grid ``(m_blocks, rows, num_kv_heads * splits)``.

    Split forms size ``BLOCK_M`` to the row's (token, head) pairs
    (:func:`~attnhal_triton.work.query_block`) and split until the launch fills the device;
    prefill keeps the row's ``BLOCK_M`` and one split.
    """
    group = num_q_heads // num_kv_heads
    if kernel == "mla_prefill":
        block_m = row.blocks["BLOCK_M"]
        return Launch((-(-query_tokens * group // block_m), batch_size, num_kv_heads), 1, row.blocks)
    block_m = query_block(row, query_tokens * group)
    m_blocks = -(-query_tokens * group // block_m)
    splits = batch_splits(row, m_blocks * batch_size * num_kv_heads)
    return Launch((m_blocks, batch_size, num_kv_heads * splits), splits, {**row.blocks, "BLOCK_M": block_m})
