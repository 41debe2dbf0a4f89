"""One torch custom op per Triton launch.

Graph capture (real or emulated), ``torch.compile`` and the dispatcher see each
launch as one op that writes into tensors it was given (``mutates_args``) and
returns nothing, so a captured graph re-runs the kernel on the same buffers.
Every scalar argument is recorded by value at capture; everything that changes
between replays is read from tensors.

``launch`` is :meth:`LaunchRow.encode` of the kernel's row: the op knows nothing
about vendors, it only spreads the row's options into the launch.

This module imports torch but not triton; the kernels are imported at the first
launch.
"""

# No ``from __future__ import annotations``: custom_op infers its schema from the
# annotations at decoration time and needs real types.
import functools
import types
from typing import Any, Optional

import torch

from attnhal_triton import spill_relief
from attnhal_triton.arg_devices import on_one_device
from attnhal_triton.launch_forms import decode_constexprs, extend_constexprs, kv_flags, reduce_constexprs
from attnhal_triton.launch_table import decode_launch, decode_uncapped

__all__ = ["decode_partial", "decode_reduce", "extend"]

_LN2_INV = 1.4426950408889634  # log2(e): the kernels use exp2


def _kernels() -> types.ModuleType:
    try:
        from attnhal_triton import kernels
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] != "triton":
            raise
        raise ModuleNotFoundError(
            "the attnhal triton backend needs triton to run its kernels: "
            "pip install 'attnhal[triton]' (on ROCm, triton comes with the ROCm torch wheels)",
            name="triton") from exc
    return kernels


@functools.lru_cache(maxsize=256)
def _launch(encoded: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return decode_launch(encoded)


@functools.lru_cache(maxsize=256)
def _uncapped(encoded: str) -> dict[str, Any]:
    return decode_uncapped(encoded)


def _run(kernel: Any, grid: tuple[int, int, int], args: tuple[Any, ...], constexprs: dict[str, Any],
         options: dict[str, Any], launch: str) -> None:
    """``kernel[grid](*args, **constexprs, **options)`` in the form :mod:`attnhal_triton.spill_relief`
    chooses for it on this device (the row's own unless its compile spills)."""
    spill_relief.launch(kernel, grid, args, constexprs, options, _uncapped(launch), not _kernels().INTERPRETED)


def _check_last_dim(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name}.stride(-1)={t.stride(-1)} (supported: 1, a contiguous head dim)")


def _dot_f32(dtype: torch.dtype) -> bool:
    """Run the dots in fp32: only for bf16 under the interpreter (see kernels.py)."""
    return bool(_kernels().INTERPRETED and dtype == torch.bfloat16)


def _scores(sm_scale: float, softcap: float) -> tuple[float, float]:
    """(qk_scale, softcap) kernel arguments: base-2 scores, soft-capped when ``softcap > 0``.

    With a cap the kernels compute ``(cap * log2 e) * tanh(q.k * (sm_scale / cap))``.
    """
    if softcap > 0:
        return sm_scale / softcap, softcap * _LN2_INV
    return sm_scale * _LN2_INV, 0.0


def _check_contiguous(**tensors: torch.Tensor) -> None:
    """The extend kernel derives these tensors' strides from their shapes."""
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name}.stride()={t.stride()} (supported: contiguous)")


# --- decode, stage 1 ----------------------------------------------------------------

@torch.library.custom_op("attnhal_triton::decode_partial", mutates_args=("mid_o", "mid_lse"))
@on_one_device("q")
def decode_partial(
    mid_o: torch.Tensor, mid_lse: torch.Tensor, q: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_page: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, num_splits: torch.Tensor,
    extra_slots: Optional[torch.Tensor], k_scale: torch.Tensor, v_scale: torch.Tensor,
    kv_dtype: str, num_extra: int, page_size: int, sm_scale: float, softcap: float, window: int,
    launch: str,
) -> None:
    """Split-KV partial attention of one query token per row.

    Parameters
    ----------
    mid_o: ``[>= rows, Hq, S, D]`` fp32, written: each non-empty split's normalised output.
    mid_lse: ``[>= rows, Hq, S]`` fp32, written: each split's base-2 log-sum-exp
        (``-inf`` for an empty split; splits ``>= num_splits[r]`` are not written).
    q: ``[rows, Hq, D]``.
    k_cache, v_cache: ``[slots, Hkv, D]`` stored in the KV format named ``kv_dtype``.
    req_to_page: ``[reqs, pages]`` int32 page of each ``page_size`` positions.
    req_pool_indices: ``[rows]`` int64; seq_lens: ``[rows]`` int32 prefix lengths.
    num_splits: ``[rows]`` int32 in ``[1, S]``: KV splits of each row.
    extra_slots: ``[rows, >= num_extra]`` slots attended after the prefix, or None.
    k_scale, v_scale: ``[1]`` fp32 dequantisation scales (read when the format is scaled).
    kv_dtype: the cache's KV format (:func:`attnhal.kv_format.kv_format`).
    num_extra: how many ``extra_slots`` columns each row attends.
    softcap: logit soft-cap, 0 for none; window: left window, -1 for none.
    """
    rows, num_q_heads, head_dim = q.shape
    if rows == 0:
        return
    _check_last_dim(q=q, k_cache=k_cache, v_cache=v_cache, mid_o=mid_o)
    group = num_q_heads // k_cache.shape[1]
    constexprs, options = _launch(launch)
    block_h = constexprs["BLOCK_H"]  # the group's heads per program, as work.head_block sizes it
    head_blocks = -(-group // block_h)
    extra = extra_slots if extra_slots is not None else seq_lens.view(-1, 1)
    qk_scale, cap = _scores(sm_scale, softcap)
    grid = (rows, k_cache.shape[1] * head_blocks, mid_o.shape[2])
    _run(_kernels().decode_partial_kernel, grid, (
        q, k_cache, v_cache, mid_o, mid_lse, req_to_page, req_pool_indices, seq_lens, num_splits,
        extra, k_scale, v_scale, qk_scale, cap, window, num_extra,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        req_to_page.stride(0), extra.stride(0)),
        decode_constexprs(constexprs, group, head_dim, page_size, cap > 0,
                          kv_flags(kv_dtype, q.element_size()), _dot_f32(q.dtype)), options, launch)


@decode_partial.register_fake
@on_one_device("q", "decode_partial")
def _(mid_o, mid_lse, q, k_cache, v_cache, req_to_page, req_pool_indices, seq_lens,  # type: ignore[no-untyped-def]
      num_splits, extra_slots, k_scale, v_scale, kv_dtype, num_extra, page_size, sm_scale, softcap,
      window, launch) -> None:
    return None


# --- stage 2: merge the splits ---------------------------------------------------------

@torch.library.custom_op("attnhal_triton::decode_reduce", mutates_args=("out",))
@on_one_device("out")
def decode_reduce(out: torch.Tensor, mid_o: torch.Tensor, mid_lse: torch.Tensor, num_splits: torch.Tensor,
           sinks: Optional[torch.Tensor], rows_per_entry: int, launch: str) -> None:
    """Merge the splits: ``out`` ``[rows, Hq, D]`` from ``mid_o``/``mid_lse`` (first ``rows``).

    Row ``r`` has ``num_splits[r // rows_per_entry]`` splits (one entry per batch row:
    ``rows_per_entry`` is 1 for decode, the tokens per row for the split extend);
    ``sinks``: ``[Hq]`` fp32 sink logits, or None.
    """
    rows, num_q_heads, head_dim = out.shape
    if rows == 0:
        return
    _check_last_dim(out=out, mid_o=mid_o)
    _, options = _launch(launch)
    _run(_kernels().decode_reduce_kernel, (rows, num_q_heads, 1), (
        mid_o, mid_lse, out, num_splits, sinks if sinks is not None else mid_lse, rows_per_entry,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1)),
        reduce_constexprs(head_dim, mid_o.shape[2], sinks is not None), options, launch)


@decode_reduce.register_fake
@on_one_device("out", "decode_reduce")
def _(out, mid_o, mid_lse, num_splits, sinks, rows_per_entry, launch) -> None:  # type: ignore[no-untyped-def]
    return None


# --- extend ---------------------------------------------------------------------------

@torch.library.custom_op("attnhal_triton::extend", mutates_args=("out", "mid_o", "mid_lse"))
@on_one_device("q")
def extend(
    out: torch.Tensor, mid_o: Optional[torch.Tensor], mid_lse: Optional[torch.Tensor],
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    req_to_page: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    num_splits: Optional[torch.Tensor], qo_indptr: Optional[torch.Tensor],
    ext_lens: Optional[torch.Tensor], tree: Optional[torch.Tensor], k_scale: torch.Tensor,
    v_scale: torch.Tensor, kv_dtype: str, sinks: Optional[torch.Tensor], q_per_row: int, max_q: int,
    page_size: int, sm_scale: float, softcap: float, window: int, launch: str,
) -> None:
    """Extend attention over the paged cache (prefill, target_verify, draft_extend).

    Parameters
    ----------
    out, q: ``[tokens, Hq, D]``; ``out`` (contiguous) is written unless ``mid_o`` is given.
    mid_o, mid_lse: ``[>= tokens, Hq, S, D]`` / ``[>= tokens, Hq, S]`` fp32, contiguous: with them the
        KV range is split (``num_splits`` ``[rows]`` int32 in ``[1, S]``) and the partials
        written for :func:`decode_reduce` (which adds the sinks); None: one pass into ``out``.
    k_cache, v_cache: ``[slots, Hkv, D]``; req_to_page: ``[reqs, pages]`` int32.
    req_pool_indices: ``[rows]`` int64; seq_lens: ``[rows]`` int32 KV lengths.
    qo_indptr: ``[rows + 1]`` int32 query offsets (packed prefill), or None for the
        uniform layout of ``q_per_row`` tokens per row.
    ext_lens: ``[rows]`` int32 new tokens per row, or None (= query tokens per row).
    tree: ``[rows, T, W + 1]`` int32 with ``W = ceil(T / 32)``: bit ``j % 32`` of word
        ``j // 32`` of query ``i`` set when ``i`` attends draft ``j`` (``T = q_per_row``),
        word ``W`` the depth of draft ``i``; None: causal.
    k_scale, v_scale: ``[1]`` fp32 dequantisation scales (read when the format is scaled).
    kv_dtype: the cache's KV format (:func:`attnhal.kv_format.kv_format`).
    sinks: ``[Hq]`` fp32 sink logits (one pass only), or None.
    max_q: the largest query count of a row (sizes the grid).
    softcap: logit soft-cap, 0 for none; window: left window, -1 for none.
    """
    rows = req_pool_indices.shape[0]
    if rows == 0 or q.shape[0] == 0:
        return
    _check_last_dim(q=q, k_cache=k_cache, v_cache=v_cache, out=out)
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k_cache.shape[1]
    constexprs, options = _launch(launch)
    block_m = constexprs["BLOCK_M"]
    split = mid_o is not None
    if split and (mid_lse is None or num_splits is None or sinks is not None):
        raise ValueError("a split extend (mid_o given) needs mid_lse and num_splits, and leaves "
                         "sinks to decode_reduce")
    # Without a split the output stands in for the partials' pointers (never written).
    part_o, part_lse = (mid_o, mid_lse) if mid_o is not None and mid_lse is not None else (out, out)
    max_splits = part_o.shape[2] if split else 1
    _check_contiguous(out=out, mid_o=part_o, mid_lse=part_lse, k_cache=k_cache, v_cache=v_cache)
    dummy = seq_lens
    qk_scale, cap = _scores(sm_scale, softcap)
    words = tree.shape[-1] - 1 if tree is not None else 1
    inputs = {"PACKED": qo_indptr is not None, "HAS_EXT_LENS": ext_lens is not None,
              "USE_MASK": tree is not None}
    grid = (-(-max_q * group // block_m), rows, k_cache.shape[1] * max_splits)
    _run(_kernels().extend_kernel, grid, (
        q, k_cache, v_cache, out, part_o, part_lse, req_to_page, req_pool_indices, seq_lens,
        *(t if t is not None else dummy for t in (num_splits, qo_indptr, ext_lens, tree)),
        k_scale, v_scale, sinks if sinks is not None else dummy,
        qk_scale, cap, window, q_per_row, max_splits, q.stride(0), q.stride(1),
        req_to_page.stride(0)),
        extend_constexprs(constexprs, num_q_heads, group, head_dim, page_size, inputs, words, split,
                          cap > 0, sinks is not None, kv_flags(kv_dtype, q.element_size()),
                          _dot_f32(q.dtype)), options, launch)


@extend.register_fake
@on_one_device("q", "extend")
def _(out, mid_o, mid_lse, q, k_cache, v_cache, req_to_page, req_pool_indices,  # type: ignore[no-untyped-def]
      seq_lens, num_splits, qo_indptr, ext_lens, tree, k_scale, v_scale, kv_dtype, sinks,
      q_per_row, max_q, page_size, sm_scale, softcap, window, launch) -> None:
    return None

