"""The compiled forms of the MLA kernel: every constexpr set an MLA launch can take.

As :mod:`attnhal_triton.launch_forms` does for the GQA kernels: :func:`mla_constexprs` builds
the constexprs of every MLA launch (:func:`attnhal_triton.mla_ops.mla_attend` calls it), and
:func:`mla_forms` enumerates them through the same sizing (:func:`~attnhal_triton.mla_table.mla_lookup`,
:func:`~attnhal_triton.mla_table.mla_programs`) over the batches the backend can meet, so the
compile check (``python -m attnhal_triton.mla_compile_check --enumerated``) builds exactly
what can launch.

The q heads (``NUM_Q_HEADS``, 16 with TP 8 to 128 with TP 1: MLA has one KV head, so
``GROUP`` is the same number) are constexprs and enumerated: 16, 32, 64, 128 (a 576-wide V:
groups 1..16 over 8 KV heads). As run-time arguments (one binary for every head count) they
cost +2-6 SGPRs a form on gfx942 and made the one-pass tree verify spill 56-120 bytes on
cuda:90/100 (docs/triton_mla.md), so they stay constexprs. Taken at one value: the page size
(16; a constexpr used only in the slot's address) and the soft-cap (on); sinks are on where
the form takes them (one pass). Everything else is enumerated: ``BLOCK_M`` as the sizing
gives it for the heads and ``T`` draft tokens, the phase's inputs, split or one pass, V
inside K's rows (``latent``) or its own tensor (``sepv``), a 576-wide V (``vtail``: a 576 head
that is not MLA), the tree's mask words (``T``: 1 or 2), compute dtype x KV format (a 16-bit
query over an fp32 cache runs fp32 dots: :func:`fp32_dots`).

This module imports neither torch nor triton.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from attnhal.platform import Platform
from attnhal_triton import work
from attnhal_triton.launch_forms import PAGE_SIZE, QUERY_TOKENS, Form, dtype_pairs, kv_flags
from attnhal_triton.mla_table import MLA_HEAD, mla_lookup, mla_programs

__all__ = ["MLA_HEADS", "MLA_INPUTS", "V_FORMS", "fp32_dots", "head_split", "mla_constexprs", "mla_forms"]

#: Per phase form: the launch-table kernel and the input flags the backend gives it
#: (draft decode reads its path's slots after the table: ``HAS_EXTRA``).
MLA_INPUTS: Mapping[str, tuple[str, Mapping[str, bool]]] = MappingProxyType({
    "decode": ("mla_decode", {}),
    "draft_decode": ("mla_decode", {"HAS_EXTRA": True}),
    "prefill": ("mla_prefill", {"PACKED": True, "HAS_EXT_LENS": True}),
    "verify": ("mla_verify", {}),
    "verify_tree": ("mla_verify_tree", {"USE_MASK": True}),
    "draft_extend": ("mla_draft", {"HAS_EXT_LENS": True}),
})
_NO_INPUTS = {"PACKED": False, "HAS_EXT_LENS": False, "HAS_EXTRA": False, "USE_MASK": False}
#: V's layouts: (V head size, V inside K's rows).
V_FORMS: Mapping[str, tuple[int, bool]] = MappingProxyType({
    "latent": (512, True), "sepv": (512, False), "vtail": (576, False)})
#: q heads of an MLA model per rank: 128 (TP 1) down to 16 (TP 8).
MLA_HEADS = (16, 32, 64, 128)
#: A batch large enough that no split form is split (its launch fills any device).
_FULL_BATCH = 1 << 16
#: Groups of a 576 head that is not MLA (V 576): the GQA kernels' range, over 8 KV heads
#: (taken at one value, as :mod:`attnhal_triton.launch_forms` does: they set only the cache's
#: row stride). MLA itself has one KV head: its group is its q heads.
VTAIL_GROUPS, VTAIL_KV_HEADS = tuple(range(1, 17)), 8


def head_split(head_size: int, v_head_size: int) -> tuple[int, int, bool] | None:
    """``(main, tail, v_tail)``: the q/k head as a power-of-two ``main`` tile plus a
    power-of-two ``tail`` (>= 16, a ``tl.dot`` minimum), V being ``main`` wide or (``v_tail``)
    as wide as K; ``None`` when the sizes do not split so (576/512: ``(512, 64, False)``)."""
    main = 1 << (head_size.bit_length() - 1)
    tail = head_size - main
    if tail < 16 or tail & (tail - 1) or v_head_size not in (main, head_size):
        return None
    return main, tail, v_head_size == head_size


def fp32_dots(dtype: str, kv_dtype: str) -> bool:
    """``DOT_F32`` of a GPU launch: a 16-bit query over an fp32 cache takes the fp32 rows
    (:func:`~attnhal_triton.work.row_dtype`) and their fp32 dots (the tiles are fp32 already);
    16-bit dots over its converted tiles spilled 40-68 bytes on cuda:80/90/100 (one pass)."""
    return dtype != "float32" and work.row_dtype(dtype, kv_dtype) == "float32"


def mla_constexprs(row: Mapping[str, Any], num_q_heads: int, group: int, head_dim: int, v_head_dim: int,
                   page_size: int,
                   inputs: Mapping[str, bool], split: bool, softcap: bool, sinks: bool, v_in_k: bool,
                   kv: Mapping[str, bool], dot_f32: bool, mask_words: int) -> dict[str, Any]:
    """Constexprs of ``mla_kernel``; ``row``: the launch's decoded row constexprs (its
    ``BLOCK_M`` sized by :func:`~attnhal_triton.mla_table.mla_programs`); ``inputs``: a subset
    of ``PACKED``, ``HAS_EXT_LENS``, ``HAS_EXTRA``, ``USE_MASK`` (the others off)."""
    dims = head_split(head_dim, v_head_dim)
    if dims is None:
        raise ValueError(f"q/out head sizes={head_dim}/{v_head_dim} (supported: a power of two plus a "
                         "power of two >= 16, e.g. 576 = 512 + 64, with out the first or all of it)")
    main, tail, v_tail = dims
    return dict(NUM_Q_HEADS=num_q_heads, GROUP=group, D_MAIN=main, D_TAIL=tail, V_IN_K=v_in_k, V_TAIL=v_tail,
                BLOCK_M=row["BLOCK_M"], BLOCK_N=row["BLOCK_N"], L2_DOMAINS=row.get("L2_DOMAINS", 1),
                PAGE_SIZE=page_size, **{**_NO_INPUTS, **inputs},
                MASK_WORDS=mask_words, SPLIT=split, HAS_SOFTCAP=softcap, HAS_SINKS=sinks, **kv, DOT_F32=dot_f32,
                DOT_PRECISION=row["DOT_PRECISION"])


def _phase_forms(platform: Platform, phase: str, dtype: str, kv_dtype: str, v_form: str) -> Iterable[Form]:
    kernel, inputs = MLA_INPUTS[phase]
    v_head, v_in_k = V_FORMS[v_form]
    row = mla_lookup(kernel, platform, work.row_dtype(dtype, kv_dtype), v_head == MLA_HEAD)
    kv = kv_flags(kv_dtype, 4 if dtype == "float32" else 2)
    one_token = phase in ("decode", "draft_decode", "prefill")
    kv_heads = VTAIL_KV_HEADS if v_form == "vtail" else 1
    for group in VTAIL_GROUPS if v_form == "vtail" else MLA_HEADS:
        heads = kv_heads * group
        for tokens in (1,) if one_token else QUERY_TOKENS:
            words = -(-tokens // 32) if inputs.get("USE_MASK") else 1
            for batch in (1, _FULL_BATCH):
                launch = mla_programs(kernel, row, batch, tokens, heads, kv_heads)
                split = launch.splits > 1
                constexprs = mla_constexprs({**row.constexprs, **launch.blocks}, heads, group, MLA_HEAD, v_head,
                                            PAGE_SIZE,
                                            inputs, split, True, not split, v_in_k, kv, fp32_dots(dtype, kv_dtype),
                                            words)
                yield Form(f"{phase}_{v_form}", "mla_kernel", dtype, kv_dtype, MLA_HEAD, row, constexprs,
                           (heads, tokens, batch))


def mla_forms(platform: Platform, dtypes: Iterable[str] = (), kv_dtypes: Iterable[str] = (),
              phases: Iterable[str] = tuple(MLA_INPUTS), v_forms: Iterable[str] = tuple(V_FORMS)) -> list[Form]:
    """Every distinct MLA form the backend can launch on ``platform`` (its MLA launch rows),
    for compute ``dtypes`` x KV formats ``kv_dtypes`` (defaults: what the Triton descriptor
    claims) x phase forms x V layouts. ``Form.kernel`` names the phase form and V layout
    (``verify_tree_latent``); ``example``: (q heads, query tokens per row, batch size).
    fp8 formats whose storage the platform lacks are left out, as the backend refuses them."""
    seen: dict[tuple[Any, ...], Form] = {}
    for dtype, kv_dtype in dtype_pairs(platform, dtypes, kv_dtypes):
        for phase in phases:
            for v_form in v_forms:
                for form in _phase_forms(platform, phase, dtype, kv_dtype, v_form):
                    seen.setdefault(form.key(), form)
    return list(seen.values())
