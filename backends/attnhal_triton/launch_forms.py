"""The compiled forms of the Triton kernels: every constexpr set a launch can take.

A *form* is what Triton compiles once: a kernel function, its argument dtypes and its
constexprs (block sizes from the launch row as :mod:`attnhal_triton.work` sizes them, the
group, the head size, the phase's input flags, the split, the KV format's flags) plus the
row's launch options. :mod:`attnhal_triton.ops` builds every launch's constexprs with the
``*_constexprs`` functions here, and :func:`forms` enumerates them through the same sizing
(:func:`work.programs`) over the batch shapes the backend can meet, so the compile check
(``python -m attnhal_triton.compile_check --forms``) builds exactly what can launch.

Taken at one value (run-time numbers inside the kernels, or the heavier of two branches):
the page size (16; a constexpr used only in the slot's address), the soft-cap (on), sinks
(on where the form may take them), the KV heads (8: the extend form's ``NUM_Q_HEADS`` is
``8 * group``, which only sets the cache's row stride) and the tree's mask words (what
``T`` gives). Everything else is enumerated.

This module imports neither torch nor triton.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnhal.kv_format import kv_format
from attnhal.platform import Platform
from attnhal_triton import work
from attnhal_triton.launch_table import KERNELS, LaunchRow, lookup

__all__ = ["EXTEND_INPUTS", "Form", "decode_constexprs", "dtype_pairs", "extend_constexprs", "forms",
           "reduce_constexprs"]

#: The input flags of each extend form: which tensors the backend hands the op
#: (``metadata.make_meta``): prefill packs its queries and gives new lengths, draft
#: extend gives accepted lengths, the tree verify its mask.
EXTEND_INPUTS: Mapping[str, Mapping[str, bool]] = {
    "extend_prefill": {"PACKED": True, "HAS_EXT_LENS": True, "USE_MASK": False},
    "extend_verify": {"PACKED": False, "HAS_EXT_LENS": False, "USE_MASK": False},
    "extend_verify_tree": {"PACKED": False, "HAS_EXT_LENS": False, "USE_MASK": True},
    "extend_draft": {"PACKED": False, "HAS_EXT_LENS": True, "USE_MASK": False},
}
#: The enumeration's fixed values (see the module docstring).
PAGE_SIZE, KV_HEADS, MAX_GROUP = 16, 8, 16
#: Draft tokens per row of a verify / draft extend: ``T`` sets the extend's ``BLOCK_M``
#: (with the group) and the tree's mask words; these reach every block size and 1-2 words.
QUERY_TOKENS = (2, 3, 4, 5, 8, 16, 33, 64)
#: A batch large enough that no split form is split (its launch fills any device).
_FULL_BATCH = 1 << 16


def kv_flags(kv_dtype: str, dtype_bytes: int) -> dict[str, bool]:
    """``KV_SCALED`` (the format's row is scaled) and ``KV_F16`` (an fp8 cache under a
    16-bit query: dots in fp16, where fp8 values are exact)."""
    fmt = kv_format(kv_dtype)
    return {"KV_SCALED": fmt.scaled, "KV_F16": fmt.fp8 is not None and dtype_bytes == 2}


def decode_constexprs(row: Mapping[str, Any], group: int, head_dim: int, page_size: int,
                      softcap: bool, kv: Mapping[str, bool], dot_f32: bool) -> dict[str, Any]:
    """Constexprs of ``decode_partial_kernel``; ``row``: the launch's decoded row constexprs
    (its ``BLOCK_H`` already sized by :func:`work.head_block`)."""
    return dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_H=row["BLOCK_H"], BLOCK_N=row["BLOCK_N"],
                PAGE_SIZE=page_size, HAS_SOFTCAP=softcap, **kv, DOT_F32=dot_f32,
                DOT_PRECISION=row["DOT_PRECISION"])


def extend_constexprs(row: Mapping[str, Any], num_q_heads: int, group: int, head_dim: int,
                      page_size: int, inputs: Mapping[str, bool], mask_words: int, split: bool,
                      softcap: bool, sinks: bool, kv: Mapping[str, bool], dot_f32: bool) -> dict[str, Any]:
    """Constexprs of ``extend_kernel``; ``inputs``: ``PACKED``, ``HAS_EXT_LENS``, ``USE_MASK``."""
    return dict(NUM_Q_HEADS=num_q_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_M=row["BLOCK_M"],
                BLOCK_N=row["BLOCK_N"], L2_DOMAINS=row.get("L2_DOMAINS", 1), PAGE_SIZE=page_size, **inputs,
                MASK_WORDS=mask_words,
                SPLIT=split, HAS_SOFTCAP=softcap, HAS_SINKS=sinks, **kv, DOT_F32=dot_f32,
                DOT_PRECISION=row["DOT_PRECISION"])


def reduce_constexprs(head_dim: int, max_splits: int, sinks: bool) -> dict[str, Any]:
    """Constexprs of ``decode_reduce_kernel`` over partials of ``max_splits`` splits."""
    return dict(HEAD_DIM=head_dim, BLOCK_S=1 << max(0, max_splits - 1).bit_length(), HAS_SINKS=sinks)


@dataclass(frozen=True)
class Form:
    """One compiled form: ``function`` of :mod:`attnhal_triton.kernels` with ``constexprs``,
    Q/Out in ``dtype`` and K/V stored as ``kv_dtype``, launched with ``row``'s options.
    ``kernel`` is the launch-table kernel; ``example`` a batch that launches it
    (group, query tokens per row, batch size)."""

    kernel: str
    function: str
    dtype: str
    kv_dtype: str
    head_size: int
    row: LaunchRow
    constexprs: Mapping[str, Any] = field(hash=False)
    example: tuple[int, int, int] = field(hash=False, compare=False)

    def key(self) -> tuple[Any, ...]:
        return (self.function, self.dtype, self.kv_dtype, tuple(sorted(self.constexprs.items())),
                tuple(sorted(self.row.launch_options.items())))


def _extend_forms(kernel: str, row: LaunchRow, dtype: str, kv_dtype: str, head: int, group: int,
                  kv: Mapping[str, bool]) -> Iterator[tuple[dict[str, Any], tuple[int, int, int]]]:
    hq = KV_HEADS * group
    tokens = (1,) if kernel == "extend_prefill" else QUERY_TOKENS
    for t in tokens:
        words = -(-t // 32) if EXTEND_INPUTS[kernel]["USE_MASK"] else 1
        for bs in (1, _FULL_BATCH):
            launch = work.programs(kernel, row, bs, t, hq, KV_HEADS)
            split = launch.splits > 1
            yield extend_constexprs({**row.constexprs, **launch.blocks}, hq, group, head, PAGE_SIZE,
                                    EXTEND_INPUTS[kernel], words, split, True, not split, kv,
                                    False), (group, t, bs)


def _row_forms(kernel: str, row: LaunchRow, dtype: str, kv_dtype: str, head: int,
               groups: Iterable[int], max_splits: int
               ) -> Iterator[tuple[str, dict[str, Any], tuple[int, int, int]]]:
    kv = kv_flags(kv_dtype, 4 if dtype == "float32" else 2)
    if kernel == "decode_reduce":  # over the partials of any split cap of decode / split extend
        for splits in range(1, max_splits + 1):
            for sinks in (False, True):
                yield "decode_reduce_kernel", reduce_constexprs(head, splits, sinks), (1, 1, 1)
        return
    for group in groups:
        if kernel == "decode":
            launch = work.programs("decode", row, 1, 1, KV_HEADS * group, KV_HEADS)
            yield "decode_partial_kernel", decode_constexprs(
                {**row.constexprs, **launch.blocks}, group, head, PAGE_SIZE, True, kv, False), (group, 1, 1)
        else:
            for constexprs, example in _extend_forms(kernel, row, dtype, kv_dtype, head, group, kv):
                yield "extend_kernel", constexprs, example


def dtype_pairs(platform: Platform, dtypes: Iterable[str] = (), kv_dtypes: Iterable[str] = ()
                ) -> Iterator[tuple[str, str]]:
    """(compute dtype, KV format) pairs of ``dtypes`` x ``kv_dtypes`` (defaults: what the Triton
    descriptor claims) that ``platform`` can store: an fp8 format whose storage the platform
    lacks (e4m3 without a flavour) is left out, as the backend refuses it."""
    from attnhal_triton.descriptor import CAPABILITIES as caps

    for dtype in tuple(dtypes) or tuple(sorted(caps.dtypes)):
        for kv_dtype in tuple(kv_dtypes) or tuple(sorted(caps.kv_dtypes or ())):
            fmt = kv_format(kv_dtype)
            if not fmt.needs_flavor or platform.fp8_flavor in fmt.by_flavor:
                yield dtype, kv_dtype


def forms(platform: Platform, kernels: Iterable[str] = KERNELS, dtypes: Iterable[str] = (),
          kv_dtypes: Iterable[str] = (), head_sizes: Iterable[int] = (),
          groups: Iterable[int] = range(1, MAX_GROUP + 1)) -> list[Form]:
    """Every distinct form the backend can launch on ``platform`` (its launch rows), for
    compute ``dtypes`` x KV formats ``kv_dtypes`` x ``head_sizes`` x ``groups`` (defaults:
    everything the Triton descriptor claims for its GQA kernels, groups 1..16). fp8 formats whose storage the
    platform lacks (e4m3 without a flavour) are left out, as the backend refuses them."""
    from attnhal_triton.descriptor import CAPABILITIES as caps

    # A head that is not a power of two (576, MLA's) launches the MLA kernel, whose forms
    # attnhal_triton.mla_forms enumerates.
    gqa_heads = tuple(sorted(h for h in caps.head_sizes if h & (h - 1) == 0))
    heads, groups = tuple(head_sizes) or gqa_heads, tuple(groups)
    seen: dict[tuple[Any, ...], Form] = {}
    for kernel in kernels:
        for dtype, kv_dtype in dtype_pairs(platform, dtypes, kv_dtypes):
            for head in heads:
                tiles = work.row_dtype(dtype, kv_dtype)
                row = lookup(kernel, platform, head, tiles)
                max_splits = max(lookup(k, platform, head, tiles).kv_splits for k in KERNELS)
                for function, constexprs, example in _row_forms(kernel, row, dtype, kv_dtype, head, groups,
                                                                max_splits):
                    reads_kv = function != "decode_reduce_kernel"
                    form = Form(kernel, function, dtype, kv_dtype if reads_kv else dtype, head, row,
                                constexprs, example)
                    seen.setdefault(form.key(), form)
    return list(seen.values())
