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

from attnhal_triton.launch_table import decode_launch

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


def _check_last_dim(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name}.stride(-1)={t.stride(-1)} (supported: 1, a contiguous head dim)")


def _dot_f32(dtype: torch.dtype) -> bool:
    """Run the dots in fp32: only for bf16 under the interpreter (see kernels.py)."""
    return bool(_kernels().INTERPRETED and dtype == torch.bfloat16)


# --- decode, stage 1 ----------------------------------------------------------------

@torch.library.custom_op("attnhal_triton::decode_partial", mutates_args=("mid_o", "mid_lse"))
def decode_partial(
    mid_o: torch.Tensor, mid_lse: torch.Tensor, q: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    extra_slots: Optional[torch.Tensor], num_extra: int, sm_scale: float, launch: str,
) -> None:
    """Split-KV partial attention of one query token per row.

    Parameters
    ----------
    mid_o: ``[>= rows, Hq, S, D]`` fp32, written: each split's normalised output.
    mid_lse: ``[>= rows, Hq, S]`` fp32, written: each split's base-2 log-sum-exp.
    q: ``[rows, Hq, D]``.
    k_cache, v_cache: ``[slots, Hkv, D]``.
    req_to_token: ``[reqs, ctx]`` int32 slot of each position.
    req_pool_indices: ``[rows]`` int64; seq_lens: ``[rows]`` int32 prefix lengths.
    extra_slots: ``[rows, >= num_extra]`` slots attended after the prefix, or None.
    num_extra: how many ``extra_slots`` columns each row attends.
    """
    rows, num_q_heads, head_dim = q.shape
    if rows == 0:
        return
    _check_last_dim(q=q, k_cache=k_cache, v_cache=v_cache, mid_o=mid_o)
    group = num_q_heads // k_cache.shape[1]
    constexprs, options = _launch(launch)
    block_h = min(constexprs["BLOCK_H"], max(16, triton_next_pow2(group)))
    head_blocks = -(-group // block_h)
    splits = mid_o.shape[2]
    extra = extra_slots if extra_slots is not None else seq_lens.view(-1, 1)
    grid = (rows, k_cache.shape[1] * head_blocks, splits)
    _kernels().decode_partial_kernel[grid](
        q, k_cache, v_cache, mid_o, mid_lse, req_to_token, req_pool_indices, seq_lens, extra,
        sm_scale * _LN2_INV, num_extra, splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        req_to_token.stride(0), extra.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_N=constexprs["BLOCK_N"],
        DOT_F32=_dot_f32(q.dtype), DOT_PRECISION=constexprs["DOT_PRECISION"], **options,
    )


@decode_partial.register_fake
def _(mid_o, mid_lse, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,  # type: ignore[no-untyped-def]
      extra_slots, num_extra, sm_scale, launch) -> None:
    return None


# --- decode, stage 2 ----------------------------------------------------------------

@torch.library.custom_op("attnhal_triton::decode_reduce", mutates_args=("out",))
def decode_reduce(out: torch.Tensor, mid_o: torch.Tensor, mid_lse: torch.Tensor, launch: str) -> None:
    """Merge the splits: ``out`` ``[rows, Hq, D]`` from ``mid_o``/``mid_lse`` (first ``rows``)."""
    rows, num_q_heads, head_dim = out.shape
    if rows == 0:
        return
    _check_last_dim(out=out, mid_o=mid_o)
    _, options = _launch(launch)
    splits = mid_o.shape[2]
    _kernels().decode_reduce_kernel[(rows, num_q_heads)](
        mid_o, mid_lse, out, splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_S=triton_next_pow2(splits), **options,
    )


@decode_reduce.register_fake
def _(out, mid_o, mid_lse, launch) -> None:  # type: ignore[no-untyped-def]
    return None


# --- extend ---------------------------------------------------------------------------

@torch.library.custom_op("attnhal_triton::extend", mutates_args=("out",))
def extend(
    out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    qo_indptr: Optional[torch.Tensor], ext_lens: Optional[torch.Tensor],
    mask: Optional[torch.Tensor], q_per_row: int, max_q: int, sm_scale: float, launch: str,
) -> None:
    """Extend attention over the paged cache (prefill, target_verify, draft_extend).

    Parameters
    ----------
    out, q: ``[tokens, Hq, D]``; ``out`` is written.
    k_cache, v_cache: ``[slots, Hkv, D]``; req_to_token: ``[reqs, ctx]`` int32.
    req_pool_indices: ``[rows]`` int64; seq_lens: ``[rows]`` int32 KV lengths.
    qo_indptr: ``[rows + 1]`` int32 query offsets (packed prefill), or None for the
        uniform layout of ``q_per_row`` tokens per row.
    ext_lens: ``[rows]`` int32 new tokens per row, or None (= query tokens per row).
    mask: ``[rows, T, T]`` bool/uint8 tree mask with ``T = q_per_row``, or None (causal).
    max_q: the largest query count of a row (sizes the grid).
    """
    rows = req_pool_indices.shape[0]
    if rows == 0 or q.shape[0] == 0:
        return
    _check_last_dim(q=q, k_cache=k_cache, v_cache=v_cache, out=out)
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k_cache.shape[1]
    constexprs, options = _launch(launch)
    block_m = constexprs["BLOCK_M"]
    grid = (rows, k_cache.shape[1], -(-max_q * group // block_m))
    dummy = seq_lens
    mask_u8 = mask.view(torch.uint8) if mask is not None else dummy
    _kernels().extend_kernel[grid](
        q, k_cache, v_cache, out, req_to_token, req_pool_indices, seq_lens,
        qo_indptr if qo_indptr is not None else dummy,
        ext_lens if ext_lens is not None else dummy, mask_u8,
        sm_scale * _LN2_INV, q_per_row,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
        req_to_token.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=constexprs["BLOCK_N"],
        PACKED=qo_indptr is not None, HAS_EXT_LENS=ext_lens is not None,
        USE_MASK=mask is not None, DOT_F32=_dot_f32(q.dtype),
        DOT_PRECISION=constexprs["DOT_PRECISION"], **options,
    )


@extend.register_fake
def _(out, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,  # type: ignore[no-untyped-def]
      qo_indptr, ext_lens, mask, q_per_row, max_q, sm_scale, launch) -> None:
    return None


def triton_next_pow2(n: int) -> int:
    """Smallest power of two >= n (triton.next_power_of_2 without importing triton)."""
    return 1 << max(0, int(n) - 1).bit_length()
