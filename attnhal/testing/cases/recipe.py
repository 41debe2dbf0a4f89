"""The case record: :class:`CaseRecipe`, everything that defines one attention forward.

A recipe is a small frozen record (phase, dtype, head config, lengths per request,
speculative shape, tree, draft path, slot layout, seeds, input variations, features)
that validates itself on construction and prints as valid Python showing only what
differs from the defaults, so a shrunk counterexample reads as one short line that
:func:`~attnhal.testing.cases.build_case` rebuilds exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from attnhal import phases
from attnhal.backend import COMPUTE_DTYPES, kv_storage_dtype
from attnhal.phases import Phase
from attnhal.platform import Fp8Flavor
from attnhal.spec import SpecConfig
from attnhal.testing.cases.unowned import UNOWNED

__all__ = ["MAX_EXACT_QK", "QKV_LAYOUTS", "TORCH_DTYPES", "CaseRecipe"]

#: Descriptor dtype names -> torch dtypes.
TORCH_DTYPES = COMPUTE_DTYPES
#: How q, k, v may lie in memory (see ``CaseRecipe.qkv_layout``).
QKV_LAYOUTS = ("contiguous", "fused", "strided")
#: Largest integer q/k magnitude whose products and sums (head size <= 256) every dtype
#: and an fp32 accumulator hold exactly (bf16 holds integers up to 256).
MAX_EXACT_QK = 32


@dataclass(frozen=True)
class CaseRecipe:
    """Everything that defines one forward of ``phase``; :func:`~attnhal.testing.cases.build_case` builds it.

    Attributes
    ----------
    phase: the phase of the batch.
    dtype: compute and KV dtype by name (``"float16"``).
    num_q_heads, num_kv_heads, head_size: attention shape (MHA, GQA or MQA).
    prefix_lens: per request, tokens already in the cache before this forward
        (``draft_decode``: the committed prefix ``seq_lens``).
    new_lens: per request, ``prefill`` new tokens (``0`` allowed) or ``draft_extend``
        accepted tokens (``1..draft_extend_len``); unused by the other phases.
    spec: the speculative config of the spec phases (``T`` of ``target_verify`` and
        ``draft_extend``, ``topk`` and ``num_steps`` of ``draft_decode``).
    tree_parents: ``target_verify`` only: per request, the parent of each draft token
        (the root has ``-1``, every other parent comes earlier); ``()`` = causal chain.
    draft_picks: ``draft_decode`` only: per request, per branch, for each step
        ``j < draft_step`` which of the ``topk`` tokens of step ``j`` is the branch's
        ancestor (branches may share ancestors); ``()`` = branch ``b`` descends from token ``b``.
    draft_step: ``draft_decode`` step ``s``.
    reparent: for a multi-step draft (``draft_step == 0``, run through
        :class:`~attnhal.backend.MultiStepDraft`): before forward ``s >= 1``, per request,
        the branch each branch re-parents to — its ``draft_path[:, :s]`` becomes that
        branch's, as a draft tree rewrites the path in place; ``()`` = no re-parenting.
    num_layers, layer: pool layers and the layer this forward runs.
    slot_seed: ``0`` lays each request's tokens out in consecutive slots; any other
        value scatters them through the pool (a seeded permutation).
    seed: seeds the K/V in the pool, the stale table entries and ``q``, ``k``, ``v``.
    host_seq_lens: also give ``seq_lens_cpu`` (for backends declaring ``needs_host_seq_lens``).

    Input variations (how the kit reaches a kernel's numerics and memory-layout edges):

    scale: explicit softmax scale of the attention config; ``None`` = ``head_size ** -0.5``.
    qk_magnitude: ``> 1``: q and every K (new and cached) are integers in
        ``[-qk_magnitude, qk_magnitude]`` — logits of hundreds that every dtype holds
        exactly, so a kernel that skips the max-subtraction or accumulates q·k in a narrow
        type shows, while a correct one is exact up to its softmax.
    v_magnitude: ``!= 1``: every V (new and cached) uniform in ``[-v_magnitude, v_magnitude]``:
        values near the dtype's range.
    qkv_layout: ``"contiguous"``; ``"fused"``: q, k, v are views of one ``[n, H + 2 KV, D]``
        tensor (a fused qkv projection); ``"strided"``: every other head of a tensor twice as
        wide (head stride ``2 D``). The last dimension stays contiguous.

    Features (see :class:`~attnhal.backend.AttentionConfig` and :mod:`attnhal.backend.kv_pool`):

    page_size: tokens per KV page; requests own whole pages (scattered with ``slot_seed``).
    kv_dtype: the KV-cache dtype name; ``None`` = ``dtype``. ``fp8_e4m3`` is stored in
        ``fp8_flavor`` (``"e4m3fn"`` or ``"e4m3fnuz"``, the simulated platform's).
    kv_scale: ``k_scale`` of every layer (``v_scale`` is twice it) for fp8 caches.
    sliding_window, logit_softcap: as in the attention config (a window per layer as a tuple).
    sinks: give seeded random sink logits ``[num_layers, num_q_heads]``.
    v_head_size: head size of V and the output (MLA: 512 with ``head_size`` 576).

    unowned: what fills memory the batch does not own (:mod:`~attnhal.testing.cases.unowned`):
        ``"nan"`` (NaN/inf K/V; past each row's end the table names free pages, NaN too),
        ``"pad"`` (NaN/inf K/V, ``-1`` past each row's end) or ``"stale"`` (old finite K/V,
        out-of-range pages past each row's end).
    """

    phase: Phase
    dtype: str = "float32"
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 16
    prefix_lens: tuple[int, ...] = (3,)
    new_lens: tuple[int, ...] = ()
    spec: SpecConfig | None = None
    tree_parents: tuple[tuple[int, ...], ...] = ()
    draft_picks: tuple[tuple[tuple[int, ...], ...], ...] = ()
    draft_step: int = 0
    reparent: tuple[tuple[tuple[int, ...], ...], ...] = ()
    num_layers: int = 1
    layer: int = 0
    slot_seed: int = 0
    seed: int = 0
    host_seq_lens: bool = False
    # --- input variations: softmax scale, value magnitudes, memory layout of q/k/v ----------
    scale: float | None = None
    qk_magnitude: int = 1
    v_magnitude: float = 1.0
    qkv_layout: str = "contiguous"
    # --- features: page table, KV storage, per-layer attention options ----------------------
    page_size: int = 1
    kv_dtype: str | None = None
    fp8_flavor: str = "e4m3fn"
    kv_scale: float = 1.0
    sliding_window: int | tuple[int | None, ...] | None = None
    logit_softcap: float | None = None
    sinks: bool = False
    v_head_size: int | None = None
    # --- memory the batch does not own (attnhal.testing.cases.unowned) ------------------
    unowned: str = "nan"

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", Phase(self.phase))
        for why in self._errors():
            raise ValueError(f"CaseRecipe: {why}")

    def __repr__(self) -> str:
        # Valid Python showing only what differs from the defaults: a shrunk
        # counterexample stays short and can be pasted back into build_case().
        shown = [f"Phase.{self.phase.name}"]
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                shown.append(f"{f.name}={_spec_repr(value) if f.name == 'spec' else repr(value)}")
        return f"CaseRecipe({', '.join(shown)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # hypothesis prints counterexamples with IPython-style pretty printers
        printer.text(repr(self))

    @property
    def requests(self) -> int:
        return len(self.prefix_lens)

    @property
    def topk(self) -> int:
        return self.spec.topk if self.spec is not None else 1

    @property
    def rows(self) -> int:
        """ForwardBatch rows: requests, times ``topk`` branches for ``draft_decode``."""
        return self.requests * (self.topk if self.phase is Phase.DRAFT_DECODE else 1)

    @property
    def tokens_per_row(self) -> int | None:
        """Query tokens per row of the uniform phases; None for packed ``prefill``."""
        return phases.tokens_per_row(self.phase, self.spec)

    def seq_lens(self) -> list[int]:
        """Per request: the KV length after this forward writes its tokens."""
        if self.phase in (Phase.PREFILL, Phase.DRAFT_EXTEND):
            added = list(self.new_lens)
        elif self.phase is Phase.TARGET_VERIFY:
            added = [self.required_spec().num_draft_tokens] * self.requests
        else:  # decode writes its one token into the row; draft tokens live in draft_path
            added = [1 if self.phase is Phase.DECODE else 0] * self.requests
        return [p + n for p, n in zip(self.prefix_lens, added)]

    def required_spec(self) -> SpecConfig:
        """``spec``, which the spec phases require (a ValueError naming the phase without it)."""
        if self.spec is None:
            raise ValueError(f"spec=None (supported: a SpecConfig for phase={self.phase.value})")
        return self.spec

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV pool's storage dtype."""
        return kv_storage_dtype(self.kv_dtype or self.dtype, Fp8Flavor(self.fp8_flavor))

    def _errors(self) -> list[str]:
        out = []
        if self.dtype not in TORCH_DTYPES:
            out.append(f"dtype={self.dtype} (supported: {', '.join(TORCH_DTYPES)})")
        out += self._input_errors()
        try:
            self.cache_dtype
        except ValueError as exc:
            out.append(str(exc))
        if self.page_size < 1 or not self.kv_scale > 0:
            out.append(f"page_size, kv_scale={self.page_size}, {self.kv_scale} (supported: >= 1, > 0)")
        if self.num_kv_heads < 1 or self.num_q_heads % self.num_kv_heads:
            out.append(f"num_q_heads/num_kv_heads={self.num_q_heads}/{self.num_kv_heads} "
                       "(supported: num_kv_heads >= 1 dividing num_q_heads)")
        if not self.prefix_lens or min(self.prefix_lens) < 0:
            out.append(f"prefix_lens={self.prefix_lens} (supported: one length >= 0 per request)")
        if not 0 <= self.layer < self.num_layers:
            out.append(f"layer={self.layer} (supported: 0..{self.num_layers - 1})")
        if self.phase in (Phase.PREFILL, Phase.DRAFT_EXTEND) and len(self.new_lens) != self.requests:
            out.append(f"new_lens={self.new_lens} (supported: one per request for {self.phase.value})")
        if self.phase in (Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE) and self.spec is None:
            out.append(f"spec=None (supported: a SpecConfig for {self.phase.value})")
        if self.spec is not None:
            out += self._speculative_errors(self.spec)
        if self.tree_parents and (len(self.tree_parents) != self.requests or any(
                _bad_tree(p, self.tokens_per_row or 0) for p in self.tree_parents)):
            out.append(f"tree_parents={self.tree_parents} (supported: per request, parent < token "
                       "for each draft token, -1 for the root token 0)")
        return out

    def _speculative_errors(self, spec: SpecConfig) -> list[str]:
        """The draft fields (accepted lengths, draft step, picks, re-parenting) against ``spec``."""
        out = []
        if self.phase is Phase.DRAFT_EXTEND and any(not 1 <= n <= spec.draft_extend_len for n in self.new_lens):
            out.append(f"new_lens={self.new_lens} (supported: 1..{spec.draft_extend_len} accepted tokens "
                       "per request)")
        if self.phase is Phase.DRAFT_DECODE and not 0 <= self.draft_step < spec.num_steps:
            out.append(f"draft_step={self.draft_step} (supported: 0..{spec.num_steps - 1})")
        if self.draft_picks and (len(self.draft_picks) != self.requests or any(
                len(branches) != spec.topk or any(len(p) < self.draft_step or
                                                  any(not 0 <= x < spec.topk for x in p) for p in branches)
                for branches in self.draft_picks)):
            out.append(f"draft_picks={self.draft_picks} (supported: per request, per branch, "
                       f"draft_step={self.draft_step} picks in 0..topk-1)")
        if self.reparent and (len(self.reparent) != max(spec.num_steps - 2, 0) or any(
                len(per_req) != self.requests or any(
                    len(parents) != spec.topk or any(not 0 <= x < spec.topk for x in parents)
                    for parents in per_req)
                for per_req in self.reparent)):
            out.append(f"reparent={self.reparent} (supported: per forward 1..num_steps-2, per request, "
                       "a parent branch in 0..topk-1 for each branch)")
        return out

    def _input_errors(self) -> list[str]:
        out = []
        if self.scale is not None and not self.scale > 0:
            out.append(f"scale={self.scale} (supported: None or > 0)")
        if not 1 <= self.qk_magnitude <= MAX_EXACT_QK:
            out.append(f"qk_magnitude={self.qk_magnitude} (supported: 1..{MAX_EXACT_QK}, exact in every dtype)")
        if not self.v_magnitude > 0:
            out.append(f"v_magnitude={self.v_magnitude} (supported: > 0)")
        if self.unowned not in UNOWNED:
            out.append(f"unowned={self.unowned!r} (supported: {', '.join(UNOWNED)})")
        if self.qkv_layout not in QKV_LAYOUTS:
            out.append(f"qkv_layout={self.qkv_layout} (supported: {', '.join(QKV_LAYOUTS)})")
        return out


def _spec_repr(spec: SpecConfig) -> str:
    if not spec.speculative:
        return "SpecConfig()"
    return f"SpecConfig.eagle({spec.num_steps}, topk={spec.topk}, num_draft_tokens={spec.num_draft_tokens})"


def _bad_tree(parents: Sequence[int], tokens: int) -> bool:
    return (len(parents) != tokens or (tokens > 0 and parents[0] != -1)
            or any(not 0 <= p < j for j, p in enumerate(parents) if j))
