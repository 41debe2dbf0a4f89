"""The attention backend contract every backend (ours or a third party's) implements.

Lifecycle (FlashInfer-style plan/run split):

* eager: ``init_forward_metadata(batch)`` once per batch, then ``forward(...)`` per layer;
* graphs: ``init_graph_state(max_bs, max_num_tokens)`` once, sizing every static
  buffer; ``init_capture_metadata(batch)`` before capturing a batch size (never
  for prefill); ``init_replay_metadata(batch)`` before each replay — it only
  writes into the static buffers, never allocates, never syncs with the host.

Construction: a backend is built for the platform it runs on (``platform=``); attnhal
builds every backend through :func:`new_backend`, which passes it on as ``platform=``.

The base class owns the rules every backend shares, in two template methods:
:meth:`AttentionBackend.forward` (the phase is listed, debug validation, the K/V
write, then the phase's method) and :meth:`AttentionBackend.init_capture_metadata`
(prefill is never captured, debug validation, then the backend's hook).

Names are vendor-neutral: nothing here says "cuda".
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from attnhal.backend.batch import ForwardBatch
from attnhal.backend.config import AttentionConfig, dtype_name
from attnhal.backend.kv_pool import KVPool
from attnhal.backend.validate import maybe_validate_batch, maybe_validate_forward
from attnhal.capabilities import AttentionRequest, BackendCapabilities, request_reasons
from attnhal.capabilities.conditions import Facts
from attnhal.errors import AttnhalError
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.platform import ENV_VAR, Platform, detect, parse
from attnhal.reasons import Reason, ReasonCode, reason

if TYPE_CHECKING:
    from attnhal.spec import SpecConfig

# AttentionConfig and dtype_name live in attnhal.backend.config; importable from here as before.
__all__ = ["AttentionBackend", "AttentionConfig", "UnsupportedFeature", "UnsupportedPhase", "config_reasons",
           "default_platform", "dtype_name", "new_backend"]

B = TypeVar("B", bound="AttentionBackend")

class UnsupportedPhase(AttnhalError, NotImplementedError):
    """A backend was asked to run a phase its descriptor does not list (or to capture prefill)."""


class UnsupportedFeature(UnsupportedPhase, ValueError):
    """A backend was given a config or pool its descriptor does not claim (feature, dtype,
    KV dtype, head or page size, fp8 flavour).

    Raised at construction: a backend never runs a model whose attention it would
    compute differently (e.g. full attention for a window it ignores). Also a
    ``ValueError``, which is what backends raised for an unclaimed config before the
    contract checked every claim.
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

    Construction, ``__init__(config, pool, *, platform=None)``: ``platform`` is the
    :class:`~attnhal.platform.Platform` the backend runs on (launch rows, fp8 flavour);
    the base keeps it as ``self.platform``. Subclasses call the base ``__init__`` first.
    It refuses (:class:`UnsupportedFeature`) what the descriptor does not claim —
    :func:`config_reasons`, the one claim check of a build: features, dtype, KV dtype,
    head and page size, head ratio, a pool shaped for another config, and a pool whose
    fp8 flavour is not the platform's. It keeps ``self.config`` with every config tensor
    (``sinks``) on ``pool.device`` (:meth:`AttentionConfig.on_device`), so kernels never
    get a host tensor beside a device pool.

    The platform: :func:`new_backend` (how attnhal, its kit and its workers build every
    backend) passes ``platform=``; a subclass takes it as a keyword or passes its
    ``**kwargs`` on to this ``__init__``. Built by hand without one,
    a backend gets :func:`default_platform` of its pool — the only place attnhal
    resolves a missing platform; no backend calls ``detect()``. For graphs,
    a backend overrides :meth:`build_capture_metadata`, not :meth:`init_capture_metadata`,
    which refuses prefill for every backend before calling it.
    """

    capabilities: ClassVar[BackendCapabilities]

    def __init__(self, config: AttentionConfig, pool: KVPool, *, platform: Platform | None = None) -> None:
        platform = platform if platform is not None else default_platform(pool)
        if not isinstance(platform, Platform):
            raise TypeError(f"platform={platform!r} (supported: a Platform, e.g. attnhal.platform.parse('cuda:sm90'))")
        reasons = config_reasons(self.capabilities, config, pool, platform)
        if reasons:
            raise UnsupportedFeature(f"backend {self.capabilities.name!r}: " + "; ".join(r.message for r in reasons))
        self.platform = platform
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


def new_backend(backend_cls: type[B], config: AttentionConfig, pool: KVPool, platform: Platform | None = None,
                **options: Any) -> B:
    """``backend_cls(config, pool, platform=platform, **options)``, for any subclass of the contract.

    The one way attnhal builds a backend (the kit's ``Target``, :class:`MultiStepDraft`,
    the example worker). A subclass's ``__init__`` takes ``platform`` as a keyword (or passes
    its ``**kwargs`` on to the base ``__init__``); ``None``: the pool's :func:`default_platform`.
    """
    return backend_cls(config, pool, **({} if platform is None else {"platform": platform}), **options)


def default_platform(pool: KVPool) -> Platform:
    """The platform of a backend built without one, from where its pool lives.

    A pool on a device: this process's platform (:func:`~attnhal.platform.detect`). A pool
    on the host: the platform ``ATTNHAL_PLATFORM`` simulates (its tensors live on the
    host too), else plain ``cpu`` — a host run on a GPU machine (the interpreter, a
    reference) never gets the GPU's launch rows or fp8 flavour.
    """
    if pool.device.type != "cpu":
        return detect()
    return parse(os.environ.get(ENV_VAR) or "cpu")


def config_reasons(caps: BackendCapabilities, config: AttentionConfig, pool: KVPool,
                   platform: Platform | None = None) -> list[Reason]:
    """Why ``caps`` cannot serve ``config`` over ``pool`` on ``platform``; empty: it can.

    The claim rule ("the claim holds the value") is the capabilities' own
    :func:`~attnhal.capabilities.request_reasons`, applied to the request ``config`` and
    ``pool`` make (dtype, KV dtype, head and page size, heads, features) after the
    descriptor's conditional claims resolve against ``platform``. Beside it: a pool shaped
    for another config, and a pool whose fp8 flavour is not ``platform``'s
    (:meth:`KVPool.platform_reasons`). Vendor and arch are not checked here: they choose a
    backend (the registry, the planner), and a backend may run on a simulated platform.
    """
    request = AttentionRequest.of(config=config, pool=pool)
    if platform is not None and caps.variants:
        caps = caps.resolve(Facts.of(platform, request.context))
    out = request_reasons(caps, request)
    if (pool.num_kv_heads, pool.head_dim) != (config.num_kv_heads, config.head_size):
        out.append(reason(ReasonCode.HEAD_SIZE, "pool.num_kv_heads/head_dim", f"{pool.num_kv_heads}/{pool.head_dim}",
                          f"{config.num_kv_heads}/{config.head_size} as in the attention config"))
    return out + (pool.platform_reasons(platform) if platform is not None else [])
