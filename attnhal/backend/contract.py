"""The attention backend contract every backend (ours or a third party's) implements.

Lifecycle (FlashInfer-style plan/run split):

* eager: ``init_forward_metadata(batch)`` once per batch, then ``forward(...)`` per layer;
* graphs: ``init_graph_state(max_bs, max_num_tokens)`` once, sizing every static
  buffer; ``init_capture_metadata(batch)`` before capturing a batch size (never
  for prefill); ``init_replay_metadata(batch)`` before each replay — it only
  writes into the static buffers, never allocates, never syncs with the host.

The base class owns the rules every backend shares, in two template methods:
:meth:`AttentionBackend.forward` (the phase is listed, debug validation, the K/V
write, then the phase's method) and :meth:`AttentionBackend.init_capture_metadata`
(prefill is never captured, debug validation, then the backend's hook).

Names are vendor-neutral: nothing here says "cuda".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from attnhal.backend.batch import ForwardBatch
from attnhal.backend.config import AttentionConfig, dtype_name
from attnhal.backend.kv_pool import KVPool
from attnhal.backend.validate import maybe_validate_batch, maybe_validate_forward
from attnhal.capabilities import BackendCapabilities
from attnhal.errors import AttnhalError
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.platform import Platform
from attnhal.reasons import Reason, ReasonCode, fmt_set, reason

if TYPE_CHECKING:
    from attnhal.spec import SpecConfig

# AttentionConfig and dtype_name live in attnhal.backend.config; importable from here as before.
__all__ = ["AttentionBackend", "AttentionConfig", "UnsupportedFeature", "UnsupportedPhase", "config_reasons",
           "dtype_name"]

class UnsupportedPhase(AttnhalError, NotImplementedError):
    """A backend was asked to run a phase its descriptor does not list (or to capture prefill)."""


class UnsupportedFeature(UnsupportedPhase):
    """A backend was given a feature, page size or KV dtype its descriptor does not claim.

    Raised at construction: a backend never runs a model whose attention it would
    compute differently (e.g. full attention for a window it ignores).
    """


class AttentionBackend:
    """Base class of every attention backend.

    Subclasses set the class attribute ``capabilities`` and implement every phase it
    lists, in one of two ways (or both):

    * ``attend(q, layer, batch)``: one method for every phase (a single kernel that reads
      the phase from ``batch``);
    * ``forward_<phase>(q, layer, batch)`` for a phase that needs its own; a phase without
      one runs ``attend``.

    Tensor shapes:

    * ``q``: ``[num_tokens, num_q_heads, head_size]``
    * ``k``: ``[num_tokens, num_kv_heads, head_size]``, ``v``: ``[num_tokens, num_kv_heads,
      v_head_size]`` — the new tokens' K/V, which the base :meth:`forward` writes to
      ``batch.out_cache_loc`` of layer ``layer`` before attending (quantized by the pool
      when it stores fp8); the per-phase methods and ``attend`` get ``q`` only
    * returns ``[num_tokens, num_q_heads, v_head_size]`` in ``q``'s dtype

    The base ``__init__`` refuses (:class:`UnsupportedFeature`) a config feature, page
    size or KV dtype the descriptor does not claim; subclasses call it first. It keeps
    ``self.config`` with every config tensor (``sinks``) on ``pool.device``
    (:meth:`AttentionConfig.on_device`), so kernels never get a host tensor beside a
    device pool. For graphs,
    a backend overrides :meth:`build_capture_metadata`, not :meth:`init_capture_metadata`,
    which refuses prefill for every backend before calling it.
    """

    capabilities: ClassVar[BackendCapabilities]

    def __init__(self, config: AttentionConfig, pool: KVPool) -> None:
        reasons = config_reasons(self.capabilities, config, pool)
        if reasons:
            raise UnsupportedFeature(f"backend {self.capabilities.name!r}: " + "; ".join(r.message for r in reasons))
        self.config = config.on_device(pool.device)  # kernels read config tensors beside the pool's
        self.pool = pool

    @classmethod
    def runtime_reasons(cls, platform: Platform) -> list[Reason]:
        """Why this process cannot run the backend on ``platform`` although the descriptor fits.

        The descriptor says what the hardware can do; this says what *this process*
        can do (e.g. a Triton backend on a simulated platform, whose tensors live on
        the CPU, needs the Triton interpreter). Default: nothing stands in the way.
        """
        return []

    @classmethod
    def build_info(cls) -> str | None:
        """What native code this backend built or loaded in this process, and how long it took
        (``attnhal info --build`` prints it); ``None``: the backend has no native build step."""
        return None

    # --- metadata -------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager: prepare whatever ``forward`` needs for ``batch`` (called once per batch).

        A backend that reads the batch here calls :func:`~attnhal.backend.maybe_validate_batch`
        first, so debug mode names a malformed field before the metadata trips over it.
        """

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate every static buffer graph capture and replay will use, once."""

    def share_graph_state(self, leader: AttentionBackend) -> None:
        """Optionally reuse ``leader``'s graph scratch buffers; called before ``init_graph_state``.

        ``leader`` runs in the same graph, never concurrently (the steps of a
        :class:`~attnhal.backend.MultiStepDraft`). Default: share nothing.
        """

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        """Before capturing ``batch`` (whose tensors are the graph runner's static buffers).

        Refuses prefill (:class:`UnsupportedPhase`): its token count varies per batch, so no
        graph of it could be replayed. Then validates ``batch`` in debug mode and calls
        :meth:`build_capture_metadata`, the backend's hook.
        """
        if batch.phase is Phase.PREFILL:
            raise UnsupportedPhase(f"backend {self.capabilities.name!r}: phase=prefill for graphs "
                                   f"(supported: {', '.join(p.value for p in GRAPH_PHASES)}; "
                                   "prefill has a variable token count)")
        maybe_validate_batch(batch, self.pool, self.config)  # outside the capture: runs in debug mode
        self.build_capture_metadata(batch)

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        """The backend's capture hook: fill the static metadata of ``batch``, a batch of a
        capturable phase. Default: the eager metadata (:meth:`init_forward_metadata`)."""
        self.init_forward_metadata(batch)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Before replaying ``batch``: only write into static buffers; no allocation, no host sync."""

    def graph_seq_len_fill_value(self, spec: SpecConfig | None = None, phase: Phase | None = None) -> int:
        """The seq len this descriptor asks for in padded rows of a captured ``phase`` batch.

        ``phase``'s own rule (``capabilities.fill_for(phase)``), else ``seq_len_fill``;
        variants are not resolved here. A :class:`~attnhal.graphs.GraphRunner` pads with
        the plan's ``PhasePlan.seq_len_fill`` — this rule resolved against the plan's
        platform, context and spec — and asks this only for a hand-built plan without one.
        """
        rule = self.capabilities.fill_for(phase) if phase is not None else self.capabilities.seq_len_fill
        return rule.value(spec, phase)

    # --- compute ----------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Attention of ``batch.phase``; ``k``/``v`` None means "already in the pool".

        Refuses a phase the descriptor does not list (:class:`UnsupportedPhase`), validates
        in debug mode, writes ``k``/``v`` to the pool, then runs ``forward_<phase>``.
        """
        phase = batch.phase
        if phase not in self.capabilities.phases:
            supported = ", ".join(sorted(p.value for p in self.capabilities.phases))
            raise UnsupportedPhase(f"backend {self.capabilities.name!r}: phase={phase.value} "
                                   f"(supported: {supported})")
        maybe_validate_forward(q, k, v, layer, batch, self.pool, self.config)  # debug only; no-op in graphs
        if k is not None and v is not None:
            self.pool.write(layer, batch.out_cache_loc, k, v)
        method = getattr(self, f"forward_{phase.value}")
        out: torch.Tensor = method(q, layer, batch)
        return out

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Attention of ``q`` over the pool for any phase without a ``forward_<phase>`` of its own.

        A single-kernel backend defines this instead of five per-phase methods. Default:
        :class:`UnsupportedPhase` (the backend lists a phase it implements neither way).
        """
        raise UnsupportedPhase(f"backend {self.capabilities.name!r} lists phase={batch.phase.value} "
                               f"but implements neither forward_{batch.phase.value} nor attend")

    # The per-phase methods: override one where a phase needs its own code.
    def forward_prefill(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Prefill attention (packed rows of ``extend_lens`` new tokens); default :meth:`attend`."""
        return self.attend(q, layer, batch)

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Decode attention (one query per row); default :meth:`attend`."""
        return self.attend(q, layer, batch)

    def forward_draft_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Draft decode attention (one query per branch, plus its draft path); default :meth:`attend`."""
        return self.attend(q, layer, batch)

    def forward_draft_extend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Draft extend attention (``draft_extend_len`` padded queries per row); default :meth:`attend`."""
        return self.attend(q, layer, batch)

    def forward_target_verify(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Target verify attention (``num_draft_tokens`` queries per row, tree or chain); default
        :meth:`attend`."""
        return self.attend(q, layer, batch)


def config_reasons(caps: BackendCapabilities, config: AttentionConfig, pool: KVPool) -> list[Reason]:
    """Why ``caps`` cannot serve ``config`` over ``pool``: unclaimed features, page size, KV dtype."""
    out = [reason(ReasonCode.FEATURE, "feature", f.value, fmt_set(caps.features))
           for f in sorted(config.features - caps.features, key=lambda f: f.value)]
    if pool.page_size not in caps.page_sizes:
        out.append(reason(ReasonCode.PAGE_SIZE, "page_size", pool.page_size, fmt_set(caps.page_sizes)))
    kv_dtypes = caps.kv_dtypes or frozenset()
    if pool.kv_dtype not in kv_dtypes:
        out.append(reason(ReasonCode.KV_DTYPE, "kv_dtype", pool.kv_dtype, fmt_set(kv_dtypes)))
    return out
