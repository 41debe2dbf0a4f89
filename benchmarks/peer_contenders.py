"""The contenders of the peers benchmark, each prepared over one :class:`peer_cases.Case`.

Every ``prepare_*`` does its setup (metadata, its own K/V layout filled with the case's
stored bytes, scratch buffers) outside the timed call and returns a :class:`Prepared`
whose ``run()`` is the one call an engine makes per layer:

* ``attnhal``: :class:`attnhal_triton.backend.TritonBackend` through the backend contract
  (``forward(q, None, None, layer, batch)``), launch rows overridable (:func:`override_launch`).
* ``sglang``: SGLang's ``decode_attention_fwd`` with its split count computed as its
  Triton backend computes it (``get_num_kv_splits_triton``) over page-size-1
  ``kv_indptr``/``kv_indices``, at its default ``max_kv_splits`` (the
  ``--triton-attention-num-kv-splits`` its users turn) and swept over :data:`SGLANG_SPLITS`;
  for target_verify its ``extend_attention_fwd`` with the custom mask its backend builds (the
  same tree as attnhal's; from the installed engine or the peer cache, like its decode).
* ``vllm``: vLLM's ``unified_attention`` as its TRITON_ATTN backend calls it (block 16,
  K and V interleaved per block) at its defaults (16 softmax segments, its 2D/3D
  threshold) and swept over :data:`VLLM_SEGMENTS_SWEEP` x :data:`VLLM_THRESHOLDS`; causal
  only, so the 8-token tree runs causal (checked against a causal reference).
* ``sdpa``: ``scaled_dot_product_attention`` over contiguous ``[bs, KV, L, D]`` K/V,
  query heads of a KV head folded into the query length (a boolean mask for verify), at
  SDPA's own choice of backend and with each backend forced (flash, efficient, cuDNN);
  uniform lengths only.

Each contender is a list of *settings* (its default first): the referee checks every one,
times every one and keeps the fastest, reporting the default's speed beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from peer_cases import KV_HEADS, Case, allowed, gather
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
#: The sweeps: SGLang's max KV splits; vLLM's softmax segments and 2D/3D thresholds (its
#: default, 0 = always 2D, a large one = always 3D for decode).
SGLANG_SPLITS = (2, 4, 8, 16, 32, 64)
VLLM_SEGMENTS_SWEEP = (8, 16, 32)
VLLM_THRESHOLDS = (VLLM_MIN_GRID_2D // KV_HEADS, 0, 1 << 20)
#: SDPA's backends forced one at a time, beside its own choice ("default").
SDPA_BACKENDS = ("flash", "efficient", "cudnn")


class NotApplicable(Exception):
    """This contender does not serve this shape (reported as ``n/a`` with the reason)."""


@dataclass
class Prepared:
    """``run()`` -> the contender's output; ``tokens(out)`` -> ``[bs * T, heads, v_head]`` for the check.

    causal_only: the contender ran a tree shape causally; it is checked against a causal reference.
    fp8_dot: it multiplies in fp8 (q cast to the K/V's fp8 dtype), which the Triton interpreter
        computes wrongly (a 16 x 16 e4m3 ``tl.dot`` there was off by 20 %): not checked there.
    """

    run: Callable[[], torch.Tensor]
    tokens: Callable[[torch.Tensor], torch.Tensor] = lambda out: out
    note: str = ""
    setting: str = "default"  # which of the contender's settings this is
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
    # merged: constexprs the encoding leaves out keep the base row's (MLA's L2_DOMAINS)
    return dataclasses.replace(base, blocks={**base.blocks, **constexprs}, dot_precision=precision,
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


def prepare_attnhal(case: Case, launch: Mapping[str, Any] | None = None) -> list[Prepared]:
    from attnhal_triton.backend import TritonBackend

    backend = TritonBackend(case.config, case.pool)
    if launch:
        override_launch(backend, launch)
    backend.init_forward_metadata(case.batch)
    return [Prepared(lambda: backend.forward(case.q, None, None, 0, case.batch), keep=[backend],
                     setting="launch override" if launch else "default")]


def prepare_sglang(case: Case, peer: LoadedPeer) -> list[Prepared]:
    """SGLang's decode kernel at its default split cap, then at each of :data:`SGLANG_SPLITS`;
    its verify kernel (extend + custom mask) for target_verify."""
    if case.shape.phase is Phase.TARGET_VERIFY:
        return [_sglang_verify(case, peer)]
    if case.shape.phase is not Phase.DECODE:
        raise NotApplicable("SGLang's Triton backend is benchmarked here for decode and target_verify")
    default = sglang_max_kv_splits()
    return [_sglang(case, peer, n, "default" if n == default else f"max_kv_splits {n}")
            for n in (default, *(n for n in SGLANG_SPLITS if n != default))]


def _sglang(case: Case, peer: LoadedPeer, splits: int, setting: str, scratch: torch.Tensor | None = None) -> Prepared:
    """SGLang's ``decode_attention_fwd`` at ``max_kv_splits = splits`` (MLA rows: ``has_mla``, as
    its Triton backend passes it); ``scratch``: fp32 storage for its partials, shared by the
    settings of a row (they run one after another), else its own."""
    attention = peer.module("sglang.kernels.ops.attention.decode_attention")
    metadata = peer.module("sglang.kernels.ops.attention.metadata")
    s, dev = case.shape, case.device
    bs, heads, v_head = s.bs, s.heads, s.v_head
    seq_lens = case.batch.seq_lens
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
    torch.cumsum(seq_lens, 0, dtype=torch.int32, out=kv_indptr[1:])
    kv_indices = case.kv_indices()
    size = bs * heads * splits * v_head
    logits = (scratch[:size] if scratch is not None else torch.empty(size, dtype=torch.float32, device=dev)).view(
        bs, heads, splits, v_head)
    lse = torch.empty((bs, heads, splits), dtype=torch.float32, device=dev)
    num_splits = torch.empty(bs, dtype=torch.int32, device=dev)
    uneven = torch.zeros(1, dtype=torch.int32, device=dev)
    cores = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 0
    if cores <= 0:  # SGLang without a device core count: every row takes max_kv_splits
        num_splits.fill_(splits)
    else:
        schedule = 256 if bs < 256 else 1 << (bs - 1).bit_length()
        metadata.get_num_kv_splits_triton[(1,)](num_splits, seq_lens, bs, 1, heads, s.kv_heads, splits, cores,
                                                MAX_NUM_SEQ=schedule, uneven_batch_ptr=uneven)
    out = case.q.new_empty(case.q.shape[0], heads, v_head)
    pool = case.pool
    k_scale, v_scale = (float(pool.k_scale[0]), float(pool.v_scale[0])) if pool.kv_format.scaled else (1.0, 1.0)

    def run() -> torch.Tensor:
        attention.decode_attention_fwd(case.q, pool.k[0], pool.v[0], out, kv_indptr, kv_indices, logits, lse,
                                       num_splits, splits, case.config.sm_scale, k_scale, v_scale,
                                       has_mla=s.mla, uneven_batch=uneven)
        return out

    split_counts = sorted(set(num_splits.tolist()))
    return Prepared(run, note=f"max_kv_splits {splits}, splits {split_counts}", fp8_dot=pool.kv_format.scaled,
                    setting=setting, keep=[kv_indptr, kv_indices, logits, lse, num_splits, uneven])


def _sglang_verify(case: Case, peer: LoadedPeer) -> Prepared:
    """SGLang's ``extend_attention_fwd`` as its Triton backend runs target_verify: the prefix
    through ``kv_indptr``/``kv_indices`` (every prefix key visible), the draft tokens' K/V
    given, and a per-request ``[T, prefix + T]`` custom mask (the tree, or causal for a chain)."""
    extend = peer.module("sglang.kernels.ops.attention.extend_attention")
    s, dev, pool = case.shape, case.device, case.pool
    bs, t = s.bs, s.tokens
    prefix = [n - t for n in s.lens]
    kv_indptr = torch.tensor([0, *itertools.accumulate(prefix)], dtype=torch.int32, device=dev)
    kv_indices = torch.cat([case.slots[r, :p] for r, p in enumerate(prefix)]).to(torch.int64)
    new = case.batch.out_cache_loc
    k_new, v_new = (gather(c, new).contiguous() for c in (pool.k[0], pool.v[0]))
    draft = case.draft_mask if case.draft_mask is not None else torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    mask = torch.cat([torch.cat([torch.ones(t, p, dtype=torch.bool, device=dev), draft], 1).flatten()
                      for p in prefix])
    mask_indptr = torch.tensor([0, *itertools.accumulate(t * (p + t) for p in prefix)], dtype=torch.int32, device=dev)
    qo_indptr = torch.arange(bs + 1, dtype=torch.int32, device=dev) * t
    out = case.q.new_empty(case.q.shape[0], s.heads, s.v_head)

    def run() -> torch.Tensor:
        extend.extend_attention_fwd(case.q, k_new, v_new, out, pool.k[0], pool.v[0], qo_indptr, kv_indptr,
                                    kv_indices, mask, True, mask_indptr, t, 1.0, 1.0,
                                    sm_scale=case.config.sm_scale)
        return out

    return Prepared(run, note="extend_attention_fwd, custom mask", setting="default",
                    keep=[kv_indptr, kv_indices, k_new, v_new, mask, mask_indptr, qo_indptr])


def _vllm_cache(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ``[blocks, KV, 16, 2 * D]`` cache with the case's bytes (block 0 unused; row ``r``
    in blocks ``1 + r * max_len / 16 ...``) and its ``[blocks, 16, KV, D]`` K and V views."""
    s, pool, d = case.shape, case.pool, case.shape.head
    blocks = s.bs * s.max_len // VLLM_BLOCK + 1
    cache = torch.empty((blocks, KV_HEADS, VLLM_BLOCK, 2 * d), dtype=pool.dtype, device=case.device)
    raw = cache.view(torch.uint8) if pool.kv_format.scaled else cache  # fp8 copies move bytes
    k_raw, v_raw = raw.transpose(1, 2).split(d, dim=-1)
    for dst, src in ((k_raw, pool.k[0]), (v_raw, pool.v[0])):
        rows = gather(src, case.slots.flatten())
        dst[1:].copy_((rows.view(torch.uint8) if pool.kv_format.scaled else rows).view(blocks - 1, VLLM_BLOCK, KV_HEADS, d))
    k, v = cache.transpose(1, 2).split(d, dim=-1)
    return cache, k, v


def prepare_vllm(case: Case, peer: LoadedPeer) -> list[Prepared]:
    """vLLM's kernel at its defaults, then every other (segments, 3D threshold) of the sweep."""
    cache = _vllm_cache(case)
    default = (VLLM_SEGMENTS, VLLM_THRESHOLDS[0])
    grid = [default, *((n, th) for n in VLLM_SEGMENTS_SWEEP for th in VLLM_THRESHOLDS if (n, th) != default)]
    return [_vllm(case, peer, cache, n, th, "default" if (n, th) == default else f"segments {n}, 3D below {th}")
            for n, th in grid]


def _vllm(case: Case, peer: LoadedPeer, cache: tuple[torch.Tensor, ...], segments: int, threshold: int,
          setting: str) -> Prepared:
    unified = peer.module("vllm.v1.attention.ops.triton_unified_attention").unified_attention
    quant = peer.module("vllm.v1.kv_cache_interface").KVQuantMode
    s, dev, pool = case.shape, case.device, case.pool
    bs, t, heads, d = s.bs, s.tokens, s.heads, s.head
    _, k, v = cache
    pages = s.max_len // VLLM_BLOCK
    block_table = (1 + torch.arange(bs * pages, device=dev, dtype=torch.int32)).view(bs, pages)
    cu_q = torch.arange(bs + 1, device=dev, dtype=torch.int32) * t
    seq_lens = case.batch.seq_lens
    rows_3d = max(1, min(threshold, bs)) * min(t, VLLM_MAX_3D_QUERY)  # its scratch: rows it may run 3D
    segm_out = torch.empty((rows_3d, heads, segments, d), dtype=torch.float32, device=dev)
    segm_max = torch.empty((rows_3d, heads, segments), dtype=torch.float32, device=dev)
    segm_sum = torch.empty_like(segm_max)
    k_descale, v_descale = (x[:1].expand(bs, KV_HEADS) for x in (pool.k_scale, pool.v_scale))
    out = torch.empty_like(case.q)

    def run() -> torch.Tensor:
        unified(q=case.q, k=k, v=v, out=out, cu_seqlens_q=cu_q, max_seqlen_q=t, seqused_k=seq_lens,
                max_seqlen_k=s.max_len, softmax_scale=case.config.sm_scale, causal=True, window_size=(-1, -1),
                block_table=block_table, softcap=0, q_descale=None, k_descale=k_descale, v_descale=v_descale,
                seq_threshold_3D=threshold, num_par_softmax_segments=segments,
                softmax_segm_output=segm_out, softmax_segm_max=segm_max, softmax_segm_expsum=segm_sum,
                kv_quant_mode=quant.FP8_PER_TENSOR if pool.kv_format.scaled else quant.NONE)
        return out

    note = "ran causal: TRITON_ATTN has no tree mask" if s.tree else ""
    return Prepared(run, note=note, causal_only=s.tree, setting=setting,
                    keep=[*cache, block_table, cu_q, segm_out, segm_max, segm_sum])


def _sdpa_backend(name: str) -> Any:
    """SDPA's own choice (``"default"``), or one backend forced."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    forced = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION}
    return sdpa_kernel(forced[name]) if name in forced else contextlib.nullcontext()


def prepare_sdpa(case: Case) -> list[Prepared]:
    """SDPA at its own choice, then each of :data:`SDPA_BACKENDS` forced (a backend that does
    not serve the inputs raises when checked and is reported with the others)."""
    s = case.shape
    if s.fp8:
        raise NotApplicable("SDPA reads no fp8 K/V")
    if s.ragged:
        raise NotApplicable("contiguous SDPA takes uniform lengths")
    bs, t, group, heads, d, kv, dv = s.bs, s.tokens, s.group, s.heads, s.head, s.kv_heads, s.v_head
    # [bs, KV, L, D] and [bs, KV, L, Dv]: MLA's V is a contiguous copy of the latent's first 512
    k, v = (gather(c, case.slots).permute(0, 2, 1, 3).contiguous() for c in (case.pool.k[0], case.pool.v[0]))
    if s.phase is Phase.PREFILL:  # causal per token: heads unfolded, K/V repeated per query head
        q = case.q.view(t, heads, d).transpose(0, 1)[None].contiguous()
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        kwargs: dict[str, Any] = {"is_causal": True}
        tokens: Callable[[torch.Tensor], torch.Tensor] = lambda o: o[0].transpose(0, 1)
    else:  # query heads of one KV head folded into the query length: row g * T + i is head g, token i
        q = case.q.view(bs, t, kv, group, d).permute(0, 2, 3, 1, 4).reshape(bs, kv, group * t, d)
        kwargs = {} if s.phase is Phase.DECODE else {"attn_mask": allowed(case, slice(None), case.draft_mask)
                                                     .repeat(group, 1)}  # [group * T, ctx]
        tokens = lambda o: o.view(bs, kv, group, t, dv).permute(0, 3, 1, 2, 4).reshape(bs * t, heads, dv)

    def variant(name: str) -> Prepared:
        def run() -> torch.Tensor:
            with _sdpa_backend(name):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        return Prepared(run, tokens, note="masked" if "attn_mask" in kwargs else "", setting=name,
                        keep=[q, k, v, *kwargs.values()])
    return [variant(name) for name in ("default", *SDPA_BACKENDS)]


def prepare(name: str, case: Case, peers: Mapping[str, LoadedPeer],
            launch: Mapping[str, Any] | None = None) -> list[Prepared]:
    """Contender ``name`` of :data:`CONTENDERS` over ``case``: its settings, default first
    (:class:`NotApplicable` if it does not serve the shape). The engines' MLA rows are
    :func:`peer_mla.prepare`'s, which calls this for the rest."""
    if name == "attnhal":
        return prepare_attnhal(case, launch)
    if name == "sdpa":
        return prepare_sdpa(case)
    peer = peers[name]
    if not peer.available:
        raise NotApplicable(peer.source)
    return {"sglang": prepare_sglang, "vllm": prepare_vllm}[name](case, peer)
