"""The engines' own MLA Triton kernels as contenders of the MLA rows (``mla``, ``mla4``, ``mla8``).

Each is called as the engine's Triton MLA backend calls it for DeepSeek-style absorbed MLA
(q ``[tokens, H, 576]``, one latent KV head of 576 whose first 512 columns are V, output 512),
over the case's stored latent rows:

* ``sglang``: decode, SGLang 0.5.23's ``decode_attention_fwd`` with ``has_mla=True``, k_buffer
  the latent ``[slots, 1, 576]`` and v_buffer the view of its first 512 columns (as
  ``MLATokenToKVPool`` hands them), split counts from its ``get_num_kv_splits_triton`` under
  its MLA cap (``peer_standins.sglang_mla_max_kv_splits``: 256 on a 132-SM device) and swept;
  target_verify, what its Triton backend runs for MLA there (DeepSeek's handler picks the
  absorbed path, ``forward_extend`` then ``extend_attention_fwd`` with the custom mask; the
  split-KV verify kernels serve only gfx95 Kimi-K3 / Qwen3.5): ``peer_contenders._sglang_verify``.
* ``vllm``: vLLM 0.33's TRITON_MLA, ``triton_decode_attention.decode_attention_fwd`` as
  ``TritonMLAImpl.forward_mqa`` calls it: cache ``[blocks, 16, 1, 576]``, ``is_mla=True``, its
  ``num_kv_splits`` rule (``next_pow2(max_seq_len // 512)``, at most 2 per SM) and swept; a
  verify block of T tokens flattened to T decode rows, row t seeing ``seq_len - (T - 1 - t)``
  positions (its causal multi-token decode).

attnhal and SDPA serve these rows through :mod:`peer_contenders` unchanged (the case's
config and ``v_in_k`` pool make attnhal take its MLA path; SDPA takes contiguous copies with
V 512 wide). :func:`prepare` is the referee's entry point for every row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import peer_contenders as contenders
import torch
from peer_cases import Case, gather
from peer_contenders import ENGINES, NotApplicable, Prepared
from peer_kernels import LoadedPeer
from peer_standins import sglang_mla_max_kv_splits

from attnhal.phases import Phase

__all__ = ["SCRATCH_CAP", "SPLITS", "prepare", "split_sweep", "vllm_mla_splits"]

#: The split counts swept for both engines (powers of two, as both round theirs).
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Largest fp32 split scratch one setting may take (SGLang's default at 128 heads x 256 rows
#: x 256 splits is 16 GiB: kept; vLLM's verify rows at many splits would need over 100).
SCRATCH_CAP = 20 << 30
MIN_SPLIT_LEN = 32  # a split shorter than one of the engines' 32-position tiles does no more work
VLLM_BLOCK = 16  # TRITON_MLA's block size (its kernel block sizes: multiples of 16)
VLLM_MIN_WORK_PER_SPLIT = 512  # vLLM 0.33 triton_mla._MIN_WORK_PER_SPLIT
VLLM_SPLITS_PER_SM = 2  # vLLM 0.33 triton_mla._SPLIT_OCCUPANCY_MULTIPLIER


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def split_sweep(case: Case, default: int, bytes_per_split: int) -> tuple[list[int], str]:
    """The split counts a contender runs, its ``default`` first, then each of :data:`SPLITS` up
    to ``ctx / 32`` positions a split (rounded up to a power of two); a count whose scratch
    (``bytes_per_split`` each) passes :data:`SCRATCH_CAP` is left out and said in the note."""
    bound = _pow2_at_least(-(-case.shape.max_len // MIN_SPLIT_LEN))
    counts = [default, *(n for n in SPLITS if n <= bound and n != default)]
    over = [n for n in counts if n * bytes_per_split > SCRATCH_CAP]
    note = f"splits {over} left out: scratch over {SCRATCH_CAP >> 30} GiB" if over else ""
    return [n for n in counts if n not in over], note


def _scratch(case: Case, elements: int) -> torch.Tensor:
    """fp32 storage the settings of one row share (they run one after another)."""
    return torch.empty(elements, dtype=torch.float32, device=case.device)


def prepare_sglang_mla(case: Case, peer: LoadedPeer) -> list[Prepared]:
    """SGLang's MLA decode at its default split cap, then the sweep; its verify kernel for the chains."""
    if case.shape.phase is Phase.TARGET_VERIFY:
        return [contenders._sglang_verify(case, peer)]
    s = case.shape
    per_split = s.bs * s.heads * s.v_head * 4
    counts, note = split_sweep(case, sglang_mla_max_kv_splits(), per_split)
    scratch = _scratch(case, max(counts) * per_split // 4)
    out = [contenders._sglang(case, peer, n, "default" if i == 0 else f"max_kv_splits {n}", scratch)
           for i, n in enumerate(counts)]
    out[0].note = "; ".join(filter(None, [out[0].note, note]))
    return out


def vllm_mla_splits(max_seq_len: int, cores: int) -> int:
    """TRITON_MLA's ``num_kv_splits``: one split per 512 positions rounded up to a power of two,
    at most 2 per SM (without a device, no SM cap: vLLM would give 0 there)."""
    ideal = _pow2_at_least(max(1, max_seq_len // VLLM_MIN_WORK_PER_SPLIT))
    return min(ideal, VLLM_SPLITS_PER_SM * cores) if cores > 0 else ideal


def _vllm_cache(case: Case) -> torch.Tensor:
    """vLLM's MLA cache ``[blocks, 16, 576]`` holding the case's latent rows (block 0 unused;
    row ``r`` in blocks ``1 + r * max_len / 16 ...``)."""
    s = case.shape
    blocks = s.bs * s.max_len // VLLM_BLOCK + 1
    cache = torch.empty((blocks, VLLM_BLOCK, s.head), dtype=case.pool.dtype, device=case.device)
    cache[1:].copy_(gather(case.pool.k[0], case.slots.flatten()).view(blocks - 1, VLLM_BLOCK, s.head))
    return cache


def prepare_vllm_mla(case: Case, peer: LoadedPeer) -> list[Prepared]:
    """TRITON_MLA's decode kernel at its own split count, then the sweep; verify as its
    causal multi-token decode (T rows a request, per-row lengths)."""
    if case.pool.kv_format.scaled:
        raise NotApplicable("the MLA rows are 16-bit here")
    decode = peer.module("vllm.v1.attention.ops.triton_decode_attention").decode_attention_fwd
    s, dev = case.shape, case.device
    t, rows, heads, latent = s.tokens, case.q.shape[0], s.heads, s.v_head
    cache = _vllm_cache(case).unsqueeze(2)  # [blocks, 16, 1, 576], as forward_mqa adds the head dim
    pages = s.max_len // VLLM_BLOCK
    block_table = (1 + torch.arange(s.bs * pages, device=dev, dtype=torch.int32)).view(s.bs, pages)
    seq_lens = case.batch.seq_lens.to(torch.int32)
    if t > 1:  # forward_mqa's causal flattening: row t of a block sees its prefix and tokens 0..t
        block_table = block_table.repeat_interleave(t, dim=0)
        offsets = torch.arange(1 - t, 1, device=dev, dtype=seq_lens.dtype)
        seq_lens = (seq_lens[:, None] + offsets).flatten().clamp(min=0)
    cores = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 0
    per_split = rows * heads * (latent + 1) * 4  # its partials carry the LSE in a 513th column
    counts, note = split_sweep(case, vllm_mla_splits(s.max_len, cores), per_split)
    scratch = _scratch(case, max(counts) * per_split // 4)
    one = torch.ones((), dtype=torch.float32, device=dev)  # layer._k_scale, passed for K and V
    out = torch.zeros(rows, heads, latent, dtype=case.q.dtype, device=dev)
    lse = torch.zeros(rows, heads, dtype=case.q.dtype, device=dev)

    def setting(i: int, splits: int) -> Prepared:
        logits = scratch[:rows * heads * splits * (latent + 1)].view(rows, heads, splits, latent + 1)

        def run() -> torch.Tensor:
            decode(case.q, cache, cache[..., :latent], out, lse, block_table, seq_lens, logits, splits,
                   case.config.sm_scale, VLLM_BLOCK, k_scale=one, v_scale=one, is_mla=True)
            return out
        what = "causal multi-token decode, " if t > 1 else ""
        return Prepared(run, note=f"{what}num_kv_splits {splits}" + (f"; {note}" if note and not i else ""),
                        setting="default" if i == 0 else f"num_kv_splits {splits}",
                        keep=[cache, block_table, seq_lens, logits, one, out, lse])
    return [setting(i, n) for i, n in enumerate(counts)]


def prepare(name: str, case: Case, peers: Mapping[str, LoadedPeer],
            launch: Mapping[str, Any] | None = None) -> list[Prepared]:
    """Contender ``name`` over ``case``, its settings default first: the engines' MLA kernels
    on the MLA rows, :func:`peer_contenders.prepare` for every other row and contender."""
    if not (case.shape.mla and name in ENGINES):
        return contenders.prepare(name, case, peers, launch)
    peer = peers[name]
    if not peer.available:
        raise NotApplicable(peer.source)
    return {"sglang": prepare_sglang_mla, "vllm": prepare_vllm_mla}[name](case, peer)
