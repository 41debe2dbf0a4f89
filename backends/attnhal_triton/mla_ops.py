"""The MLA launch as one torch custom op (see :mod:`attnhal_triton.ops` for why custom ops),
and the head split the kernel computes with.

This module imports torch but not triton; the kernel is imported at the first launch.
"""

# No ``from __future__ import annotations``: custom_op infers its schema from the annotations.
import types
from typing import Any, Optional

import torch

from attnhal_triton import ops
from attnhal_triton.arg_devices import on_one_device
from attnhal_triton.launch_forms import kv_flags
from attnhal_triton.mla_forms import fp32_dots, head_split, mla_constexprs
from attnhal_triton.metadata import Meta
from attnhal_triton.ops import _check_contiguous, _check_last_dim, _dot_f32, _launch, _run, _scores

__all__ = ["head_split", "mla_attend", "mla_forward", "v_in_k"]


def _kernels() -> types.ModuleType:
    ops._kernels()  # the clear "needs triton" error, when it is missing
    from attnhal_triton import mla_kernels

    return mla_kernels


def v_in_k(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether ``v_cache`` is a view of ``k_cache``'s first columns (MLA's one latent tensor):
    the kernel then reads V from the K tiles it already loaded. Host metadata only."""
    return (v_cache.data_ptr() == k_cache.data_ptr() and v_cache.dtype == k_cache.dtype
            and v_cache.shape[:2] == k_cache.shape[:2] and v_cache.stride() == k_cache.stride()
            and v_cache.shape[2] <= k_cache.shape[2])


@torch.library.custom_op("attnhal_triton::mla_attend", mutates_args=("out", "mid_o", "mid_lse"))
@on_one_device("q")
def mla_attend(
    out: torch.Tensor, mid_o: Optional[torch.Tensor], mid_lse: Optional[torch.Tensor],
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    req_to_page: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    num_splits: Optional[torch.Tensor], qo_indptr: Optional[torch.Tensor],
    ext_lens: Optional[torch.Tensor], tree: Optional[torch.Tensor], extra_slots: Optional[torch.Tensor],
    k_scale: torch.Tensor, v_scale: torch.Tensor, kv_dtype: str, sinks: Optional[torch.Tensor],
    num_extra: int, q_per_row: int, max_q: int, page_size: int, sm_scale: float, softcap: float,
    window: int, launch: str,
) -> None:
    """MLA attention over the paged latent cache, every phase.

    Parameters
    ----------
    out: ``[tokens, Hq, Dv]`` contiguous, written unless ``mid_o`` is given.
    mid_o, mid_lse: ``[>= tokens, Hq, S, Dv]`` / ``[>= tokens, Hq, S]`` fp32 contiguous: the
        split partials for :func:`attnhal_triton.ops.decode_reduce` (``num_splits``
        ``[rows]`` int32 in ``[1, S]``), or None for one pass into ``out``.
    q: ``[tokens, Hq, D]`` (``D`` = 576: latent 512 + rope 64; last dim contiguous).
    k_cache: ``[slots, Hkv, D]`` contiguous; v_cache: ``[slots, Hkv, Dv]`` (``Dv`` = 512)
        contiguous, or a view of ``k_cache``'s first columns (:func:`v_in_k`), then read from
        its tiles.
    req_to_page, req_pool_indices, seq_lens, qo_indptr, ext_lens, tree, k_scale, v_scale,
        sinks, q_per_row, max_q, softcap, window: as :func:`attnhal_triton.ops.extend`
        (decode: one query per row, ``q_per_row`` 1); seq_lens are the rows' table positions.
    kv_dtype: the cache's KV format (:func:`attnhal.kv_format.kv_format`); its row says whether
        ``k_scale``/``v_scale`` (``[1]`` fp32) are read.
    extra_slots: ``[rows, >= num_extra]`` int64 slots each row attends after its
        ``seq_lens`` table positions (draft decode's path), or None with ``num_extra`` 0.
    """
    rows = req_pool_indices.shape[0]
    if rows == 0 or q.shape[0] == 0:
        return
    _check_last_dim(q=q, k_cache=k_cache, v_cache=v_cache)
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k_cache.shape[1]
    row, options = _launch(launch)
    split = mid_o is not None
    if split and (mid_lse is None or num_splits is None or sinks is not None):
        raise ValueError("a split MLA launch (mid_o given) needs mid_lse and num_splits, and leaves "
                         "sinks to decode_reduce")
    part_o, part_lse = (mid_o, mid_lse) if mid_o is not None and mid_lse is not None else (out, out)
    max_splits = part_o.shape[2] if split else 1
    latent_v = v_in_k(k_cache, v_cache)
    _check_contiguous(out=out, mid_o=part_o, mid_lse=part_lse, k_cache=k_cache,
                      **({} if latent_v else {"v_cache": v_cache}))
    if (extra_slots is None) != (num_extra == 0):
        raise ValueError(f"extra_slots/num_extra={'None' if extra_slots is None else 'given'}/{num_extra} "
                         "(supported: both, or None with 0)")
    dummy = seq_lens
    extra = extra_slots if extra_slots is not None else seq_lens.view(-1, 1)
    qk_scale, cap = _scores(sm_scale, softcap)
    inputs = {"PACKED": qo_indptr is not None, "HAS_EXT_LENS": ext_lens is not None,
              "HAS_EXTRA": extra_slots is not None, "USE_MASK": tree is not None}
    constexprs = mla_constexprs(row, num_q_heads, group, head_dim, out.shape[2], page_size, inputs, split, cap > 0,
                                sinks is not None,
                                latent_v, kv_flags(kv_dtype, q.element_size()),
                                _dot_f32(q.dtype) or fp32_dots(str(q.dtype).removeprefix("torch."), kv_dtype),
                                tree.shape[-1] - 1 if tree is not None else 1)
    grid = (-(-max_q * group // constexprs["BLOCK_M"]), rows, k_cache.shape[1] * max_splits)
    _run(_kernels().mla_kernel, grid, (
        q, k_cache, v_cache, out, part_o, part_lse, req_to_page, req_pool_indices, seq_lens,
        *(t if t is not None else dummy for t in (num_splits, qo_indptr, ext_lens, tree)),
        extra, k_scale, v_scale, sinks if sinks is not None else dummy,
        qk_scale, cap, window, q_per_row, max_splits, num_extra, q.stride(0), q.stride(1),
        req_to_page.stride(0), extra.stride(0)), constexprs, options, launch)


@mla_attend.register_fake
@on_one_device("q", "mla_attend")
def _(out, mid_o, mid_lse, q, k_cache, v_cache, req_to_page, req_pool_indices,  # type: ignore[no-untyped-def]
      seq_lens, num_splits, qo_indptr, ext_lens, tree, extra_slots, k_scale, v_scale, kv_dtype, sinks,
      num_extra, q_per_row, max_q, page_size, sm_scale, softcap, window, launch) -> None:
    return None


def mla_forward(q: torch.Tensor, meta: Meta, layer_args: dict[str, Any], sinks: Optional[torch.Tensor],
                reduce_launch: str, out_head_size: int, extra: Optional[torch.Tensor] = None,
                num_extra: int = 0) -> torch.Tensor:
    """``q`` ``[tokens, Hq, D]`` -> ``[tokens, Hq, Dv]`` for any phase: one MLA launch, then for
    a split batch the GQA reduce (per power-of-two part of ``Dv``: 512, or 512 + 64)."""
    out = q.new_empty((*q.shape[:2], out_head_size))
    split = meta.mid_o is not None
    mla_attend(out, meta.mid_o, meta.mid_lse, q, req_pool_indices=meta.req_pool_indices,
               seq_lens=meta.seq_lens, num_splits=meta.num_splits, qo_indptr=meta.qo_indptr,
               ext_lens=meta.ext_lens, tree=meta.tree, extra_slots=extra,
               sinks=None if split else sinks, num_extra=num_extra, q_per_row=meta.q_per_row,
               max_q=meta.max_q, launch=meta.launch, **layer_args)
    if split:
        assert meta.mid_o is not None and meta.mid_lse is not None and meta.num_splits is not None
        dims = head_split(q.shape[2], out_head_size)
        assert dims is not None
        for lo, hi in ((0, dims[0]), (dims[0], out_head_size)):
            if hi > lo:
                ops.decode_reduce(out[..., lo:hi], meta.mid_o[..., lo:hi], meta.mid_lse, meta.num_splits, sinks,
                                  meta.q_per_row, reduce_launch)
    return out
