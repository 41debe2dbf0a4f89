"""MultiStepDraft: the draft-decode forwards of a multi-step draft, for any backend.

With ``num_steps`` draft steps the draft model runs ``num_steps - 1`` draft-decode
forwards (its first token comes from draft extend). Forward ``s`` (``0 <= s <
num_steps - 1``) feeds each branch's token ``s``: it writes that token's K/V to
``draft_path[:, s]`` and attends the committed prefix plus ``draft_path[:, :s + 1]``.

One generic container replaces a per-backend wrapper class: it holds one
backend instance per forward (all on the same KV pool), derives the per-step
batches, and prepares the metadata of *all* steps in each ``init_*`` call. The
caller (a model) runs its own layers per step with ``backend(s)`` and
``step_batches(batch)[s]``; this class owns attention metadata only.

One graph for all steps: ``init_capture_metadata`` / ``init_replay_metadata``
prepare every step before the graph runs, each step backend keeps its own
metadata buffers, and the step batches are views of the batch's tensors
(``out_cache_loc`` of step ``s`` *is* ``draft_path[:, s]``), so a runner can
capture the whole ``for s in range(num_forwards)`` loop as one graph and a
rewrite of ``draft_path`` before a replay reaches every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from attnhal.backend.batch import ForwardBatch
from attnhal.backend.config import AttentionConfig
from attnhal.backend.contract import AttentionBackend, new_backend
from attnhal.backend.kv_pool import KVPool
from attnhal.capabilities import BackendCapabilities
from attnhal.errors import AttnhalError
from attnhal.phases import Phase
from attnhal.platform import Platform
from attnhal.reasons import Reason, ReasonCode, reason
from attnhal.spec import SpecConfig

__all__ = ["MultiStepDraft", "MultiStepUnsupported", "multi_step_reasons"]


class MultiStepUnsupported(AttnhalError, ValueError):
    """A backend or spec config the multi-step draft cannot run; ``reasons`` say why."""

    def __init__(self, reasons: Sequence[Reason]) -> None:
        self.reasons = tuple(reasons)
        super().__init__("; ".join(str(r) for r in self.reasons))


def multi_step_reasons(caps: BackendCapabilities, spec: SpecConfig) -> list[Reason]:
    """Why a backend with descriptor ``caps`` cannot run the multi-step draft of ``spec``."""
    out: list[Reason] = []
    if not spec.speculative:
        out.append(reason(ReasonCode.PHASE_NOT_RUN, "algorithm", spec.algorithm,
                          "draft_decode runs with speculative decoding"))
    if spec.num_steps == 1:
        out.append(reason(ReasonCode.PHASE_NOT_RUN, "num_steps", 1,
                          "> 1; draft_decode does not run when num_steps == 1 "
                          "(the first draft token comes from draft_extend)"))
    if Phase.DRAFT_DECODE not in caps.phases:
        out.append(reason(ReasonCode.PHASE, "phase", Phase.DRAFT_DECODE,
                          "{" + ", ".join(sorted(p.value for p in caps.phases)) + "}"
                          f" of backend {caps.name!r}"))
    if caps.multi_step is None:
        out.append(reason(ReasonCode.MULTI_STEP, "multi_step", None,
                          f"backend {caps.name!r} declares no multi-step draft support"))
    else:
        out += caps.multi_step.violations(spec, ReasonCode.MULTI_STEP, f"multi-step draft of {caps.name!r}")
    return out


class MultiStepDraft:
    """The ``num_steps - 1`` draft-decode forwards of one multi-step draft.

    Parameters
    ----------
    backend_cls: any :class:`AttentionBackend` subclass whose descriptor declares
        ``multi_step``; others are refused with :class:`MultiStepUnsupported`.
    config, pool: the draft model's attention config and KV pool (shared by all steps).
    spec: the speculative config (``num_steps > 1``, within the backend's limits).
    platform: the platform every step's backend is built for (:func:`~attnhal.backend.new_backend`);
        None: the contract's default for the pool.
    backend_kwargs: passed to every step's backend constructor.

    Batches: the ``batch`` given to every method is the draft-decode batch of
    step 0 — ``rows`` = requests × ``topk`` branches, ``seq_lens`` the committed
    prefix of each row, ``spec.draft_path`` ``[rows, num_steps]`` int64 the slots of
    each branch's draft tokens, ``spec.draft_step == 0``.
    """

    def __init__(self, backend_cls: type[AttentionBackend], config: AttentionConfig, pool: KVPool,
                 spec: SpecConfig, *, platform: Platform | None = None, **backend_kwargs: Any) -> None:
        caps = backend_cls.capabilities
        why = multi_step_reasons(caps, spec)
        if why:
            raise MultiStepUnsupported(why)
        self.spec, self.config, self.pool = spec, config, pool
        self.capabilities = caps
        self.platform = platform
        self._steps = [new_backend(backend_cls, config, pool, platform, **backend_kwargs)
                       for _ in range(spec.num_steps - 1)]
        self._batches: tuple[ForwardBatch, list[ForwardBatch]] | None = None

    @property
    def num_forwards(self) -> int:
        """Draft-decode forwards per draft: ``num_steps - 1``."""
        return len(self._steps)

    def backend(self, step: int) -> AttentionBackend:
        """The backend that runs forward ``step`` (``0 <= step < num_forwards``)."""
        if not 0 <= step < self.num_forwards:
            raise IndexError(f"step={step} (supported: 0..{self.num_forwards - 1})")
        return self._steps[step]

    def step_batches(self, batch: ForwardBatch) -> list[ForwardBatch]:
        """The batch of each forward: same rows, ``draft_step = s``, ``out_cache_loc = draft_path[:, s]``.

        Views of ``batch``'s tensors, no copy; the same list is returned for the
        same ``batch`` object, so the metadata prepared for it matches the
        batches the forwards receive.
        """
        if self._batches is not None and self._batches[0] is batch:
            return self._batches[1]
        spec = self._check(batch)
        path = spec.draft_path
        assert path is not None
        steps = [replace(batch, out_cache_loc=path[:, s], spec=replace(spec, draft_step=s))
                 for s in range(self.num_forwards)]
        self._batches = (batch, steps)
        return steps

    def _check(self, batch: ForwardBatch) -> Any:
        if batch.phase is not Phase.DRAFT_DECODE:
            raise ValueError(f"batch.phase={batch.phase.value} (supported: draft_decode)")
        spec = batch._spec()
        path = spec.draft_path
        if path is None or path.dim() != 2 or path.shape[1] < self.num_forwards:
            shape = None if path is None else list(path.shape)
            raise ValueError(f"spec.draft_path.shape={shape} (supported: [rows, n] with "
                             f"n >= num_steps - 1 = {self.num_forwards})")
        if spec.draft_step != 0:
            raise ValueError(f"spec.draft_step={spec.draft_step} (supported: 0, the first forward; "
                             "step_batches derives the others)")
        return spec

    # --- metadata of all steps ----------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager: metadata of every step."""
        for backend, step_batch in zip(self._steps, self.step_batches(batch)):
            backend.init_forward_metadata(step_batch)

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Size static buffers once for all steps; ``max_bs`` counts rows (requests × topk).

        Step backends after the first may share the first one's scratch buffers
        (:meth:`AttentionBackend.share_graph_state`): the steps run one after another.
        """
        leader = self._steps[0]
        leader.init_graph_state(max_bs, max_num_tokens)
        for backend in self._steps[1:]:
            backend.share_graph_state(leader)
            backend.init_graph_state(max_bs, max_num_tokens)

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        """Before capturing all steps (in one graph or one graph per step)."""
        for backend, step_batch in zip(self._steps, self.step_batches(batch)):
            backend.init_capture_metadata(step_batch)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        """Before a replay: every step's static metadata; no allocation, no host sync."""
        for backend, step_batch in zip(self._steps, self.step_batches(batch)):
            backend.init_replay_metadata(step_batch)

    def graph_seq_len_fill_value(self, spec: SpecConfig | None = None) -> int:
        return self._steps[0].graph_seq_len_fill_value(spec if spec is not None else self.spec, Phase.DRAFT_DECODE)
