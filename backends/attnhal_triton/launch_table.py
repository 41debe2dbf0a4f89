"""Launch settings of every Triton kernel, as data.

One :class:`~attnhal_triton.launch_row.LaunchRow` per (kernel, vendor, arch family, head size, dtype); ``None``
in ``head_size`` or ``dtype`` matches any value, and :func:`lookup` picks the most
specific matching row. Settings that exist on one vendor only (AMD's
``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``; NVIDIA's ``maxnreg``) live in
that vendor's rows' ``extra`` and reach the launch as ``**row.launch_options``: the launcher never asks
which vendor it runs on.

An arch family with no row for a kernel takes the best :data:`FALLBACK` row
(small tiles, no vendor-only options) with a warning naming the arch.
The ``("cpu", "cpu")`` rows serve the Triton interpreter (``TRITON_INTERPRET=1``),
which ignores warps and stages; their blocks keep interpreted tests fast.

This module imports neither torch nor triton.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from attnhal.platform import Platform
from attnhal_triton.device_fill import GPU_SPLITS, PROGRAMS_PER_UNIT, fill_programs, with_l2_domains
from attnhal_triton.launch_row import (EXTEND_VARIANTS, KERNELS, MLA_KERNELS, UNCAPPED, LaunchRow, decode_launch,
                                       decode_uncapped)

__all__ = [
    "ALIASES",
    "EXTEND_VARIANTS",
    "FALLBACK",
    "KERNELS",
    "MLA_KERNELS",
    "TABLE",
    "UNCAPPED",
    "LaunchRow",
    "NoLaunchRowWarning",
    "best_row",
    "decode_launch",
    "decode_uncapped",
    "fallback_row",
    "hip_options",
    "lookup",
    "rows_for",
]

#: Arch families served by another family's rows (the rows compile spill-free for
#: them, checked by the compile check): sm86/sm89 (consumer Ampere/Ada, less shared
#: memory than sm80 but the sm80 rows fit), sm100 (datacenter Blackwell) takes the sm90
#: rows. sm120 (consumer Blackwell) has rows of its own: the sm90 128x64 extend tiles
#: spill under its ptxas, and so does the sm80 decode row at head size 64.
ALIASES: Mapping[tuple[str, str], str] = MappingProxyType({
    ("cuda", "sm86"): "sm80", ("cuda", "sm89"): "sm80", ("cuda", "sm100"): "sm90",
})


class NoLaunchRowWarning(UserWarning):
    """No launch row for this arch family: the fallback row is used."""


# --- the table -----------------------------------------------------------------------
# Chosen so that every row compiles with 0 register spills and within shared memory
# for every supported head size and dtype (``python -m attnhal_triton.compile_check
# --fallback``). They are starting points, not benchmarks: no GPU was available to
# time them. Row order breaks specificity ties (dtype rows come before head-size rows).
# A spec's kernel ``"extend"`` stands for every extend variant; the split variants
# (verify, tree verify, draft extend) take the family's split settings.

_HIP = {"waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}
#: HIP options an arch family's compiler no longer takes: CDNA4's (gfx950) has dropped ``kpack``
#: (Triton warns at every such compile and sets 1), so its rows say what runs and warn nobody.
_HIP_DROPPED: dict[str, tuple[str, ...]] = {"gfx95": ("kpack",)}


def hip_options(family: str) -> dict[str, Any]:
    """The HIP launch options of an arch family's rows."""
    return {k: v for k, v in _HIP.items() if k not in _HIP_DROPPED.get(family, ())}


_SPLIT_EXTEND = ("extend_verify", "extend_verify_tree", "extend_draft")
# fp32 extend where fp32 dots run on FMA units (NVIDIA, and the fallback): 16x16 tiles,
# 2 warps up to head size 64, 4 above (ptxas spills a few bytes otherwise).
_FP32_EXTEND = (
    ("extend", None, "float32", {"BLOCK_M": 16, "BLOCK_N": 16}, 2, 1),
    ("extend", 128, "float32", {"BLOCK_M": 16, "BLOCK_N": 16}, 4, 1),
    ("extend", 256, "float32", {"BLOCK_M": 16, "BLOCK_N": 16}, 4, 1),
)
# NVIDIA fp32 extend at head size 256: 8 warps. On NVIDIA every fp32 extend row carries
# ``maxnreg`` 255: left to itself ptxas caps these programs' registers (72-80 at 2 warps for
# heads 16-128, 128 at 4 warps and 64-80 at 8 for 256) and spills 8-48 bytes; a cap of 128
# still spilled tree verify (920-1064 bytes at head 64; 8-16 over an fp8 cache at 256), and 168
# 8-16 bytes over a bf16 cache at 256. Under 255: 29-232 registers, no spill (the fp32
# matrix, heads 16-256 on cuda:80/86/89/90/100/120, 2026-12-07).
_FP32_EXTEND_256 = ("extend", 256, "float32", {"BLOCK_M": 16, "BLOCK_N": 16}, 8, 1)
# NVIDIA fp32 decode: 8 warps, 1 stage, ``maxnreg`` 128. Two stages pipelined an fp8 cache's
# loads into 860 bytes of spill at head 128 and 15 KB at 256 (ptxas then held 32 registers);
# one stage alone left ptxas capping head 64 at 64 registers (24 bytes of spill); with the
# cap lifted to 128, 68-112 registers and no spill for every cache format (2026-12-07).
_FP32_DECODE = ("decode", None, "float32", {"BLOCK_N": 32, "BLOCK_H": 16}, 8, 1, {"maxnreg": 128})


def _rows(vendor: str | None, family: str | None, specs: Iterable[tuple[Any, ...]],
          splits: int = 1, split_len: int = 256, fill: Mapping[str, int] = MappingProxyType({}),
          **common: Any) -> list[LaunchRow]:
    """Rows from ``(kernel, head_size, dtype, blocks, num_warps, num_stages)`` tuples.

    ``splits``/``split_len``/``fill`` go to the rows of the split kernels (decode and the
    split extend variants); ``"extend"`` expands to one row per extend variant.
    """
    rows = []
    for kernel, head, dtype, blocks, warps, stages, *options in specs:  # options: the row's own extra
        for name in EXTEND_VARIANTS if kernel == "extend" else (kernel,):
            split = name == "decode" or name in _SPLIT_EXTEND
            extra = {**common.get("extra", {}), **(options[0] if options else {})}
            rows.append(LaunchRow(name, vendor, family, blocks, num_warps=warps, num_stages=stages,
                                  head_size=head, dtype=dtype, kv_splits=splits if split else 1,
                                  split_len=split_len, fill_programs=fill.get(name, 0),
                                  **{**common, "extra": extra}))
    return rows


def _nvidia(family: str, d128: Mapping[str, int], d256: Mapping[str, int], w256: int,
            prefill_verify: Mapping[str, int] | None = None,
            overrides: Iterable[tuple[Any, ...]] = ()) -> list[LaunchRow]:
    # fp32 operands take the FMA path (tf32 would break the fp32 tolerance, and
    # 3xTF32 needs more registers still): small tiles keep it spill-free.
    # Order matters where rows are equally specific (the first wins): the 8-warp fp32 row
    # at 256 before the shared fp32 rows' 4-warp one, ``overrides`` after the decode and fp32 rows
    # (so a head-size decode override leaves fp32 to its row) and before the general
    # extend rows.
    splits, fill = GPU_SPLITS, fill_programs(family)
    big = {"BLOCK_M": 64, "BLOCK_N": 64}
    wide = [(kernel, head, None, prefill_verify, 8, 2) for kernel in ("extend_prefill", "extend_verify")
            for head in (None, 128)] if prefill_verify else []
    fp32 = _rows("cuda", family, [_FP32_EXTEND_256, *_FP32_EXTEND], splits=splits, fill=fill, extra={"maxnreg": 255})
    return _uncapped_small_heads(fp32 + _rows("cuda", family, [
        _FP32_DECODE,
        ("decode", None, None, {"BLOCK_N": 64, "BLOCK_H": 16}, 4, 2),
        ("decode", 256, None, {"BLOCK_N": 32, "BLOCK_H": 16}, 4, 2),
        ("decode_reduce", None, None, {}, 4, 1),
        *overrides,
        *wide,
        ("extend", None, None, big, 8, 2),
        ("extend", 128, None, d128, 8, 2),
        ("extend", 256, None, d256, w256, 2),
    ], splits=splits, fill=fill))


#: Head sizes whose NVIDIA rows lift ptxas's register cap (see ``_uncapped_small_heads``).
_SMALL_HEADS = (16, 32)


def _uncapped_small_heads(rows: list[LaunchRow]) -> list[LaunchRow]:
    """``rows`` plus, for head sizes 16 and 32, a copy of the general row of decode,
    prefill, causal verify and draft extend with ``maxnreg`` 255.

    Left to itself ptxas caps these small programs at 96-128 registers and spills 8-40
    bytes (decode with fp8 on sm89; prefill, verify and draft extend on sm80..sm120);
    uncapped they take 140-160 and spill nothing. The tree form keeps its cap: it does not
    spill under it, and uncapped it reaches 255 and spills with fp8 on sm120. Appended
    last, so fp32 keeps its own (equally specific, earlier) rows.
    """
    extra: list[LaunchRow] = []
    for kernel in ("decode", "extend_prefill", "extend_verify", "extend_draft"):
        for head in _SMALL_HEADS:
            # As best_row (defined below) picks it for a 16-bit dtype.
            general = max((r for r in rows if r.kernel == kernel and r.matches(head, "bfloat16")),
                          key=lambda r: r.specificity)
            if general.head_size is None:
                extra.append(replace(general, head_size=head, extra={**general.extra, "maxnreg": 255}))
    return rows + extra


def _amd(family: str) -> list[LaunchRow]:
    # One stage: the AMD stream pipeliner gains little here and costs LDS; 16x16 MFMA with
    # kpack=2 (where the compiler takes it) suits these fp16/bf16 tiles; fp32 runs on fp32
    # MFMA. The extend forms take the family's L2_DOMAINS (device_fill.with_l2_domains: a
    # row's query blocks are dealt to one XCD's L2).
    rows = [
        *_rows("hip", family, [
            # fp32 K/V blocks of 64 hit 256 VGPRs and spill with page reads and the soft-cap.
            ("decode", None, "float32", {"BLOCK_N": 32, "BLOCK_H": 16}, 4, 1),
            ("decode", 256, "float32", {"BLOCK_N": 16, "BLOCK_H": 16}, 4, 1),
            ("decode", None, None, {"BLOCK_N": 64, "BLOCK_H": 16}, 4, 1),
            ("decode", 256, None, {"BLOCK_N": 32, "BLOCK_H": 16}, 4, 1),
            # The tree mask's word loads and depths cost registers: 64x32 spills, and
            # so does 32x32 in fp32 at head size 256 (3 VGPRs on gfx942).
            ("extend_verify_tree", None, None, {"BLOCK_M": 32, "BLOCK_N": 32}, 4, 1),
            ("extend_verify_tree", 256, None, {"BLOCK_M": 32, "BLOCK_N": 16}, 4, 1),
            ("extend_verify_tree", 256, "float32", {"BLOCK_M": 32, "BLOCK_N": 16}, 4, 1),
            # fp32 tiles (an fp32 cache: work.row_dtype) at 256: 32x32 spilled 47-462 under a bf16 query.
            ("extend", 256, "float32", {"BLOCK_M": 32, "BLOCK_N": 16}, 4, 1),
            ("extend", None, None, {"BLOCK_M": 64, "BLOCK_N": 32}, 4, 1),
            # 64x32 at head size 256 fills all 256 VGPRs with an fp8 cache (split forms
            # spill one); 64x16 needs ~190.
            ("extend", 256, None, {"BLOCK_M": 64, "BLOCK_N": 16}, 8, 1),
        ], splits=GPU_SPLITS, fill=fill_programs(family), extra=hip_options(family)),
        *_rows("hip", family, [("decode_reduce", None, None, {}, 4, 1)]),
    ]
    return [replace(r, blocks=with_l2_domains(r.blocks, family)) if r.kernel in EXTEND_VARIANTS else r for r in rows]


# Ampere's shapes: head size 128 and 256 need narrower tiles; the tree form at 256
# narrower still (32x32 takes all 255 registers on sm89 and spills on sm120 with fp8).
_SM80: dict[str, Any] = {
    "d128": {"BLOCK_M": 32, "BLOCK_N": 64}, "d256": {"BLOCK_M": 32, "BLOCK_N": 32}, "w256": 4,
    "overrides": [("extend_verify_tree", 256, None, {"BLOCK_M": 32, "BLOCK_N": 16}, 4, 2)],
}

TABLE: tuple[LaunchRow, ...] = (
    # Ampere (A100): 108 SMs, 64K registers per SM.
    *_nvidia("sm80", **_SM80),
    # Hopper (H100/H200): 132 SMs, more shared memory per SM; prefill and causal verify
    # take the anchors' 128x64 tiles up to head size 128. At head size 128 (16-bit) the
    # spill-free rows measured fastest on an H200 (benchmarks/triton_sweep.py, 2026-12-04,
    # docs/triton.md): decode's 128-position blocks (an fp8 cache reads 1.4x faster than
    # with 64, bf16 within 12 %), 4 warps and 2 stages for the split forms, prefill 8 warps
    # and 3 stages. Draft extend takes causal verify's row (the same kernel form), unmeasured.
    # The tree form at head 128 takes 8 warps: with 4 its fp8 forms at group 7 (and unsplit at
    # group 4) spilled 16-192 bytes at 255 registers; 8 warps alone were capped at 128 by ptxas
    # in the 16-row forms (compile_forms). Unmeasured on a device.
    *_nvidia("sm90", d128={"BLOCK_M": 64, "BLOCK_N": 64}, d256={"BLOCK_M": 64, "BLOCK_N": 32},
             w256=8, prefill_verify={"BLOCK_M": 128, "BLOCK_N": 64}, overrides=[
                 ("decode", 128, None, {"BLOCK_N": 128, "BLOCK_H": 16}, 4, 2),
                 ("extend_prefill", 128, None, {"BLOCK_M": 128, "BLOCK_N": 64}, 8, 3),
                 ("extend_verify", 128, None, {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 2),
                 ("extend_draft", 128, None, {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 2),
                 ("extend_verify_tree", 128, None, {"BLOCK_M": 32, "BLOCK_N": 64}, 8, 2, {"maxnreg": 255}),
                 # d256: the general 64x32 spilled 120 bytes (fp8, group 15, T 33, unsplit).
                 ("extend_verify_tree", 256, None, {"BLOCK_M": 32, "BLOCK_N": 32}, 8, 2, {"maxnreg": 255})]),
    # Consumer Blackwell (RTX 50): mma.sync and ~100 KB shared memory like sm89, so
    # Ampere's shapes, except decode at head size 64: 64-position blocks in 2 stages
    # spill 44 bytes under sm_120's ptxas (capped at 64 registers), 32 do not.
    *_nvidia("sm120", **{**_SM80, "overrides": [
        *_SM80["overrides"], ("decode", 64, None, {"BLOCK_N": 32, "BLOCK_H": 16}, 4, 2)]}),
    *_amd("gfx90"),  # CDNA2 (MI200)
    *_amd("gfx94"),  # CDNA3 (MI300X)
    *_amd("gfx95"),  # CDNA4 (MI350): as CDNA3 until measured
    # The Triton interpreter on CPU: options are ignored; BLOCK_N >= 64 and few
    # splits keep the number of sequentially interpreted programs small, and a short
    # split length with a fill no test batch reaches makes the tests' short rows use
    # several splits.
    *_rows("cpu", "cpu", [
        ("decode", None, None, {"BLOCK_N": 64, "BLOCK_H": 16}, 4, 1),
        ("decode_reduce", None, None, {}, 4, 1),
        ("extend", None, None, {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 1),
    ], splits=4, split_len=64, fill=dict.fromkeys(PROGRAMS_PER_UNIT, 1 << 20)),
)

#: Rows for an arch family the table does not know (``vendor`` and ``arch_family``
#: None): small tiles, 1 stage, IEEE dots and no vendor-only options, so that they
#: compile spill-free on every target the compile check knows; the fill of a ~128-unit part.
FALLBACK: tuple[LaunchRow, ...] = tuple(_rows(None, None, [
    ("decode", None, "float32", {"BLOCK_N": 32, "BLOCK_H": 16}, 8, 1),
    ("decode", None, None, {"BLOCK_N": 16, "BLOCK_H": 16}, 4, 1),
    ("decode_reduce", None, None, {}, 4, 1),
    *_FP32_EXTEND,
    ("extend", None, None, {"BLOCK_M": 32, "BLOCK_N": 16}, 4, 1),
], splits=16, fill=dict.fromkeys(PROGRAMS_PER_UNIT, 512)))


def rows_for(kernel: str, vendor: str, arch_family: str,
             table: Iterable[LaunchRow] = TABLE) -> list[LaunchRow]:
    """All rows of ``kernel`` for one arch family, or for the family it aliases
    (:data:`ALIASES`); empty if the family is unknown."""
    family = ALIASES.get((vendor, arch_family), arch_family)
    return [r for r in table if r.kernel == kernel and r.vendor == vendor
            and r.arch_family == family]


def best_row(rows: Iterable[LaunchRow], head_size: int, dtype: str) -> LaunchRow:
    """The most specific row matching ``head_size`` and ``dtype``; the first among equals."""
    candidates = [r for r in rows if r.matches(head_size, dtype)]
    if not candidates:
        # Every family (and the fallback) has a general row; none means a broken table.
        raise LookupError(f"launch table has no row for head_size={head_size}, dtype={dtype} "
                          f"among {[r.key() for r in rows]}")
    return max(candidates, key=lambda r: r.specificity)  # max() keeps the first of equals


def fallback_row(kernel: str, head_size: int, dtype: str) -> LaunchRow:
    """The fallback row of ``kernel`` for ``head_size`` and ``dtype``."""
    return best_row([r for r in FALLBACK if r.kernel == kernel], head_size, dtype)


def lookup(kernel: str, platform: Platform, head_size: int, dtype: str,
           table: Iterable[LaunchRow] = TABLE) -> LaunchRow:
    """The launch row of ``kernel`` for ``platform``, ``head_size`` and ``dtype`` (a name).

    Warns (:class:`NoLaunchRowWarning`) and returns a fallback row when the table
    has no row of ``kernel`` for ``platform.arch_family``.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} (supported: {', '.join(KERNELS)})")
    family = rows_for(kernel, platform.vendor.value, platform.arch_family, table)
    if family:
        return best_row(family, head_size, dtype)
    row = fallback_row(kernel, head_size, dtype)
    warnings.warn(
        f"attnhal_triton: no launch settings for arch={platform.arch} "
        f"(family {platform.arch_family}, vendor {platform.vendor.value}) and kernel "
        f"{kernel!r}; using the fallback row {row.key()}",
        NoLaunchRowWarning, stacklevel=2)
    return row
