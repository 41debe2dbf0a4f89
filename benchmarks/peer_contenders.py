"""The contenders of the peers benchmark, each prepared over one :class:`peer_cases.Case`.

Every ``prepare_*`` does its setup (metadata, its own K/V layout filled with the case's
stored bytes, scratch buffers) outside the timed call and returns a :class:`Prepared`
whose ``run()`` is the one call an engine makes per layer:

* ``attnhal``: :class:`attnhal_triton.backend.TritonBackend` through the backend contract
  (``forward(q, None, None, layer, batch)``), launch rows overridable (:func:`override_launch`).
* ``sglang``: SGLang's ``decode_attention_fwd`` with its split count computed as its
  Triton backend computes it (``get_num_kv_splits_triton``, ``max_kv_splits`` = its
  default) over page-size-1 ``kv_indptr``/``kv_indices``; decode only.
* ``vllm``: vLLM's ``unified_attention`` as its TRITON_ATTN backend calls it (block 16,
  K and V interleaved per block, 16 softmax segments, its 2D/3D threshold); causal
  only, so the 8-token tree runs causal (checked against a causal reference).
* ``sdpa``: ``scaled_dot_product_attention`` over contiguous ``[bs, KV, L, D]`` K/V,
  query heads of a KV head folded into the query length (flash forced on a GPU for
  decode and prefill; a boolean mask for verify).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from peer_cases import HEAD, HEADS, KV_HEADS, Case, allowed, gather
from peer_kernels import LoadedPeer
from peer_standins import sglang_max_kv_splits

from attnhal.phases import Phase

__all__ = ["CONTENDERS", "ENGINES", "NotApplicable", "Prepared", "launch_row", "override_launch", "prepare"]

#: The engines' kernels (a ratio's denominator is the faster of them); SDPA is a baseline.
ENGINES = ("sglang", "vllm")
CONTENDERS = ("attnhal", *ENGINES, "sdpa")
VLLM_BLOCK = 16
VLLM_SEGMENTS = 16  # NUM_PAR_SOFTMAX_SEGMENTS of vLLM 0.33's TRITON_ATTN
VLLM_MIN_GRID_2D = 128  # MIN_LAUNCH_GRID_SIZE_2D: the 2D kernel below this many programs goes 3D
VLLM_MAX_3D_QUERY = 8


class NotApplicable(Exception):
    """This contender does not serve this shape (reported as ``n/a`` with the reason)."""


@dataclass
class Prepared:
    """``run()`` -> the contender's output; ``tokens(out)`` -> ``[bs * T, HEADS, HEAD]`` for the check.

    causal_only: the contender ran a tree shape causally; it is checked against a causal reference.
    fp8_dot: it multiplies in fp8 (q cast to the K/V's fp8 dtype), which the Triton interpreter
        computes wrongly (a 16 x 16 e4m3 ``tl.dot`` there was off by 20 %): not checked there.
    """

    run: Callable[[], torch.Tensor]
    tokens: Callable[[torch.Tensor], torch.Tensor] = lambda out: out
    note: str = ""
    causal_only: bool = False
    fp8_dot: bool = False
    keep: list[Any] = field(default_factory=list)  # buffers the run reads, kept alive with it


#: Row fields a tuning setting may carry beside the launch (benchmarks/triton_sweep.py adds them).
_SPLIT_FIELDS = ("kv_splits", "split_len", "fill_programs")


def launch_row(base: Any, encoded: str) -> Any:
    """``base`` (a ``LaunchRow``) with the settings of ``encoded``: ``LaunchRow.encode()``
    form, plus the split fields ``kv_splits``, ``split_len`` and ``fill_programs``."""
    from attnhal_triton.launch_table import decode_launch

    constexprs, options = decode_launch(encoded)
    precision = constexprs.pop("DOT_PRECISION", base.dot_precision)
    split = {k: int(options.pop(k)) for k in _SPLIT_FIELDS if k in options}
    return dataclasses.replace(base, blocks=constexprs, dot_precision=precision,
                               num_warps=options.pop("num_warps", base.num_warps),
                               num_stages=options.pop("num_stages", base.num_stages), extra=options,
                               **split)


def override_launch(backend: Any, settings: Mapping[str, Any]) -> None:
    """Serve kernels of a constructed ``TritonBackend`` with other launch rows (tuning sweeps).

    ``settings``: kernel name -> a ``LaunchRow``, or an encoded string applied to the
    backend's row for that kernel (:func:`launch_row`). Run ``init_forward_metadata`` after it.
    """
    unknown = sorted(set(settings) - set(backend.rows))
    if unknown:
        raise ValueError(f"launch kernels {unknown} (supported: {', '.join(sorted(backend.rows))})")
    backend.use_launch_rows({k: launch_row(backend.rows[k], s) if isinstance(s, str) else s
                             for k, s in settings.items()})


def prepare_attnhal(case: Case, launch: Mapping[str, Any] | None = None) -> Prepared:
    from attnhal_triton.backend import TritonBackend

    backend = TritonBackend(case.config, case.pool)
    if launch:
        override_launch(backend, launch)
    backend.init_forward_metadata(case.batch)
    return Prepared(lambda: backend.forward(case.q, None, None, 0, case.batch), keep=[backend])


def prepare_sglang(case: Case, peer: LoadedPeer) -> Prepared:
    s = case.shape
    if s.phase is not Phase.DECODE:
        raise NotApplicable("SGLang's decode kernel serves decode only")
    attention = peer.module("sglang.kernels.ops.attention.decode_attention")
    metadata = peer.module("sglang.kernels.ops.attention.metadata")
    dev, bs, splits = case.device, s.bs, sglang_max_kv_splits()
    seq_lens = case.batch.seq_lens
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
    torch.cumsum(seq_lens, 0, dtype=torch.int32, out=kv_indptr[1:])
    kv_indices = case.slots.flatten().to(torch.int64)
    logits = torch.empty((bs, HEADS, splits, HEAD), dtype=torch.float32, device=dev)
    lse = torch.empty((bs, HEADS, splits), dtype=torch.float32, device=dev)
    num_splits = torch.empty(bs, dtype=torch.int32, device=dev)
    uneven = torch.zeros(1, dtype=torch.int32, device=dev)
    cores = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 0
    if cores <= 0:  # SGLang without a device core count: every row takes max_kv_splits
        num_splits.fill_(splits)
    else:
        schedule = 256 if bs < 256 else 1 << (bs - 1).bit_length()
        metadata.get_num_kv_splits_triton[(1,)](num_splits, seq_lens, bs, 1, HEADS, KV_HEADS, splits, cores,
                                                MAX_NUM_SEQ=schedule, uneven_batch_ptr=uneven)
    out = torch.empty_like(case.q)
    pool = case.pool
    k_scale, v_scale = (float(pool.k_scale[0]), float(pool.v_scale[0])) if pool.kv_format.scaled else (1.0, 1.0)

    def run() -> torch.Tensor:
        attention.decode_attention_fwd(case.q, pool.k[0], pool.v[0], out, kv_indptr, kv_indices, logits, lse,
                                       num_splits, splits, case.config.sm_scale, k_scale, v_scale,
                                       uneven_batch=uneven)
        return out

    split_counts = sorted(set(num_splits.tolist()))
    return Prepared(run, note=f"max_kv_splits {splits}, splits {split_counts}", fp8_dot=pool.kv_format.scaled,
                    keep=[kv_indptr, kv_indices, logits, lse, num_splits, uneven])


def _vllm_cache(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ``[blocks, KV, 16, 2 * D]`` cache with the case's bytes (block 0 unused) and its
    ``[blocks, 16, KV, D]`` K and V views, as TRITON_ATTN splits them."""
    s, pool = case.shape, case.pool
    blocks = s.bs * s.ctx // VLLM_BLOCK + 1
    cache = torch.empty((blocks, KV_HEADS, VLLM_BLOCK, 2 * HEAD), dtype=pool.dtype, device=case.device)
    raw = cache.view(torch.uint8) if pool.kv_format.scaled else cache  # fp8 copies move bytes
    k_raw, v_raw = raw.transpose(1, 2).split(HEAD, dim=-1)
    for dst, src in ((k_raw, pool.k[0]), (v_raw, pool.v[0])):
        rows = gather(src, case.slots.flatten())
        stored = rows.view(torch.uint8) if pool.kv_format.scaled else rows
        dst[1:].copy_(stored.view(blocks - 1, VLLM_BLOCK, KV_HEADS, HEAD))
    k, v = cache.transpose(1, 2).split(HEAD, dim=-1)
    return cache, k, v


def prepare_vllm(case: Case, peer: LoadedPeer) -> Prepared:
    unified = peer.module("vllm.v1.attention.ops.triton_unified_attention").unified_attention
    quant = peer.module("vllm.v1.kv_cache_interface").KVQuantMode
    s, dev, pool = case.shape, case.device, case.pool
    bs, t = s.bs, s.tokens
    cache, k, v = _vllm_cache(case)
    pages = s.ctx // VLLM_BLOCK
    block_table = (1 + torch.arange(bs * pages, device=dev, dtype=torch.int32)).view(bs, pages)
    cu_q = torch.arange(bs + 1, device=dev, dtype=torch.int32) * t
    seq_lens = case.batch.seq_lens
    rows_3d = VLLM_MIN_GRID_2D // KV_HEADS * min(t, VLLM_MAX_3D_QUERY)  # its scratch: threshold x query len
    segm_out = torch.empty((rows_3d, HEADS, VLLM_SEGMENTS, HEAD), dtype=torch.float32, device=dev)
    segm_max = torch.empty((rows_3d, HEADS, VLLM_SEGMENTS), dtype=torch.float32, device=dev)
    segm_sum = torch.empty_like(segm_max)
    k_descale, v_descale = (x[:1].expand(bs, KV_HEADS) for x in (pool.k_scale, pool.v_scale))
    out = torch.empty_like(case.q)

    def run() -> torch.Tensor:
        unified(q=case.q, k=k, v=v, out=out, cu_seqlens_q=cu_q, max_seqlen_q=t, seqused_k=seq_lens,
                max_seqlen_k=s.ctx, softmax_scale=case.config.sm_scale, causal=True, window_size=(-1, -1),
                block_table=block_table, softcap=0, q_descale=None, k_descale=k_descale, v_descale=v_descale,
                seq_threshold_3D=VLLM_MIN_GRID_2D // KV_HEADS, num_par_softmax_segments=VLLM_SEGMENTS,
                softmax_segm_output=segm_out, softmax_segm_max=segm_max, softmax_segm_expsum=segm_sum,
                kv_quant_mode=quant.FP8_PER_TENSOR if pool.kv_format.scaled else quant.NONE)
        return out

    note = "ran causal: TRITON_ATTN has no tree mask" if s.tree else ""
    return Prepared(run, note=note, causal_only=s.tree,
                    keep=[cache, block_table, cu_q, segm_out, segm_max, segm_sum])


def _forced_flash(flash: bool) -> Any:
    """Flash forced on a GPU with 16-bit inputs; SDPA's own choice otherwise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION) if flash else contextlib.nullcontext()


def prepare_sdpa(case: Case) -> Prepared:
    s = case.shape
    if s.fp8:
        raise NotApplicable("SDPA reads no fp8 K/V")
    bs, t, group = s.bs, s.tokens, HEADS // KV_HEADS
    k, v = (gather(c, case.slots).permute(0, 2, 1, 3).contiguous() for c in (case.pool.k[0], case.pool.v[0]))
    flash = case.device.type != "cpu" and case.dtype.itemsize == 2  # flash: 16-bit inputs on a GPU
    if s.phase is Phase.PREFILL:  # causal per token: heads unfolded, K/V repeated per query head
        q = case.q.view(t, HEADS, HEAD).transpose(0, 1)[None].contiguous()
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))

        def prefill() -> torch.Tensor:
            with _forced_flash(flash):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return Prepared(prefill, lambda o: o[0].transpose(0, 1), note="flash" if flash else "",
                        keep=[q, k, v])
    # query heads of one KV head folded into the query length: row g * T + i is head g, token i
    q = case.q.view(bs, t, KV_HEADS, group, HEAD).permute(0, 2, 3, 1, 4).reshape(bs, KV_HEADS, group * t, HEAD)
    unfold: Callable[[torch.Tensor], torch.Tensor] = (
        lambda o: o.view(bs, KV_HEADS, group, t, HEAD).permute(0, 3, 1, 2, 4).reshape(bs * t, HEADS, HEAD))
    if s.phase is Phase.DECODE:
        def decode() -> torch.Tensor:
            with _forced_flash(flash):
                return F.scaled_dot_product_attention(q, k, v)
        return Prepared(decode, unfold, note="flash" if flash else "", keep=[q, k, v])
    mask = allowed(case, slice(None), case.draft_mask).repeat(group, 1)  # [group * T, ctx]
    return Prepared(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), unfold, note="masked",
                    keep=[q, k, v, mask])


def prepare(name: str, case: Case, peers: Mapping[str, LoadedPeer],
            launch: Mapping[str, Any] | None = None) -> Prepared:
    """Contender ``name`` of :data:`CONTENDERS` over ``case`` (:class:`NotApplicable` if it does not serve it)."""
    if name == "attnhal":
        return prepare_attnhal(case, launch)
    if name == "sdpa":
        return prepare_sdpa(case)
    peer = peers[name]
    if not peer.available:
        raise NotApplicable(peer.source)
    return {"sglang": prepare_sglang, "vllm": prepare_vllm}[name](case, peer)
