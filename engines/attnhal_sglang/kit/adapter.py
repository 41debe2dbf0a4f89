"""One SGLang attention backend behind attnhal's backend contract.

:class:`SGLangAttention` is an :class:`~attnhal.backend.AttentionBackend` whose
``capabilities`` are a catalogue entry's and whose every forward runs SGLang's own class
(``TorchNativeAttnBackend``, ``TritonAttnBackend``, and ``TritonMultiStepDraftBackend`` for
``draft_decode``) through a real ``RadixAttention`` over SGLang's pools, which share the
attnhal pool's K/V tensors. SGLang's backend is built per speculative shape (it reads
``topk``, ``num_steps`` and the draft width from its server arguments at construction), on
the first batch that needs it.

The two metadata contracts, side by side:

=================================  ===========================================================
attnhal                            SGLang 0.5.23, as the adapter calls it
=================================  ===========================================================
``init_forward_metadata``          ``init_forward_metadata(fb)``
``init_graph_state``               ``init_cuda_graph_state(max_bs, max_num_tokens)`` (at the
                                   first capture: the speculative shape is known then)
``init_capture_metadata``          ``init_forward_metadata_out_graph(fb, in_capture=True)``, then
                                   ``init_forward_metadata_in_graph(fb)``; ``fb`` is built over
                                   static buffers of the adapter, one per capture size
``init_replay_metadata``           the static buffers rewritten from the batch, then
                                   ``init_forward_metadata_out_graph(fb)`` (one recorded step, see
                                   :mod:`~attnhal_sglang.kit.launch`)
``forward`` in a graph             one recorded launch with the capture-time ``ForwardMetadata``
=================================  ===========================================================

``draft_path`` is read when a draft-decode forward runs (attnhal's contract: a draft tree
re-parents its branches between forwards); SGLang fixes each branch's slots before the
draft, so the adapter writes the paths into SGLang's layout and reruns SGLang's own
index kernel (``common_template``) right before each step's attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch, KVPool, UnsupportedPhase
from attnhal.backend.validate import maybe_validate_forward
from attnhal.capabilities import BackendCapabilities
from attnhal_sglang.kit import batches, launch, runtime
from attnhal.phases import Phase
from attnhal.platform import Platform
from attnhal.reasons import Reason, ReasonCode

__all__ = ["SGLangAttention", "adapter_class"]


@dataclass
class _Engine:
    """SGLang's objects for one speculative shape: runner shim, token table, backend."""

    fields: runtime.ServerFields
    runner: Any
    table: batches.TokenTable
    backend: Any
    multi_step: bool
    graph_ready: bool = False


@dataclass
class _Captured:
    """One capture size: SGLang's batch over static buffers and what a replay rewrites."""

    engine: _Engine
    fb: Any
    statics: batches.Derived
    batch: ForwardBatch
    token: torch.Tensor
    pending: ForwardBatch | None = None
    prep: launch.Launch | None = None


class SGLangAttention(AttentionBackend):
    """Base of the per-entry adapter classes made by :func:`adapter_class`."""

    capabilities: ClassVar[BackendCapabilities]
    #: SGLang's name of the backend (``--attention-backend``).
    sglang_name: ClassVar[str]

    @classmethod
    def runtime_reasons(cls, platform: Platform) -> list[Reason]:
        why = runtime.engine_reasons() + runtime.interpreter_reasons(cls.sglang_name, platform.torch_device)
        return [Reason(ReasonCode.RUNTIME, w) for w in why]

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        super().__init__(config, pool, **kwargs)
        self._layers = [runtime.radix_layer(config, i) for i in range(pool.num_layers)]
        self._engine: _Engine | None = None
        self._eager: tuple[_Engine, Any] | None = None
        self._graph_sizes: tuple[int, int] | None = None
        self._captured: dict[int, _Captured] = {}
        self._current: _Captured | None = None

    # --- SGLang's objects, per speculative shape -----------------------------------------------
    def _fields(self, batch: ForwardBatch) -> runtime.ServerFields:
        base = runtime.ServerFields(self.sglang_name, self.pool.page_size)
        if batch.spec is None or batch.phase in (Phase.PREFILL, Phase.DECODE):
            return base
        spec = batch.spec
        width = spec.draft_extend_len if batch.phase is Phase.DRAFT_EXTEND else spec.num_draft_tokens
        steps = batch.spec.draft_path.shape[1] if batch.spec.draft_path is not None else max(1, width - 1)
        return replace(base, topk=spec.topk, num_steps=steps, num_draft_tokens=width)

    def _engine_for(self, batch: ForwardBatch) -> _Engine:
        """SGLang's objects for ``batch``'s shape: reused while the shape holds (SGLang's backends
        read it at construction), rebuilt when it changes."""
        fields = self._fields(batch)
        multi = batch.phase is Phase.DRAFT_DECODE
        graph_bs = self._graph_sizes[0] if self._graph_sizes is not None else 0
        if (self._engine is not None and self._engine.fields == fields and self._engine.multi_step == multi
                and self._engine.runner.req_to_token_pool.size >= graph_bs):
            runtime.published(fields)
            return self._engine
        room = batches.draft_room(fields.topk, fields.num_steps, self.pool.page_size) if multi else 0
        tokens_per_req = fields.num_draft_tokens if batch.phase is Phase.TARGET_VERIFY else 1
        runner = runtime.new_runner(fields, self.config, self.pool, self.pool.max_context_len + room,
                                    tokens_per_req, graph_bs)
        classes = runtime.backend_factory(self.sglang_name)
        backend = (classes["multi_step"](runner, fields.topk, fields.num_steps) if multi
                   else classes["single"](runner))
        table = batches.TokenTable(self.pool, runner.req_to_token_pool.req_to_token)
        self._engine = _Engine(fields, runner, table, backend, multi)
        self._captured.clear()
        return self._engine

    def _refuse(self, phase: Phase) -> None:
        if phase not in self.capabilities.phases:
            supported = ", ".join(sorted(p.value for p in self.capabilities.phases))
            raise UnsupportedPhase(f"backend {self.capabilities.name!r}: phase={phase.value} (supported: {supported})")

    def _spec_info(self, d: batches.Derived, batch: ForwardBatch) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput

        if batch.phase is Phase.TARGET_VERIFY:
            spec, bs, t = batch._spec(), d.batch_size, d.tokens_per_req
            index = torch.arange(t, dtype=torch.long, device=d.seq_lens.device).repeat(bs, 1)
            return EagleVerifyInput(
                draft_token=torch.zeros(bs * t, dtype=torch.int64, device=index.device), custom_mask=d.custom_mask,
                positions=d.positions, retrieve_index=index, retrieve_next_token=torch.full_like(index, -1),
                retrieve_next_sibling=torch.full_like(index, -1),
                retrieve_cum_len=torch.arange(bs + 1, dtype=torch.int32, device=index.device) * t,
                spec_steps=max(0, t - 1), topk=spec.topk, draft_token_num=t,
                capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None, seq_lens_cpu=None)
        if batch.phase is Phase.DRAFT_EXTEND:
            info = EagleDraftInput(num_tokens_per_req=d.tokens_per_req)
            info.extend_seq_lens_tensor = d.accepted  # read by the graph path of DRAFT_EXTEND_V2
            return info
        if batch.phase is Phase.DRAFT_DECODE:
            return EagleDraftInput(num_tokens_per_req=1)
        return None

    def _sglang_batch(self, engine: _Engine, d: batches.Derived, spec_info: Any) -> Any:
        fb = batches.sglang_batch(d, spec_info)
        engine.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    def _step_backend(self, engine: _Engine, batch: ForwardBatch) -> Any:
        return engine.backend.attn_backends[batch._spec().draft_step] if engine.multi_step else engine.backend

    # --- eager -----------------------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._refuse(batch.phase)
        self._current = None
        engine = self._engine_for(batch)
        engine.table.refresh()
        d = batches.derive(batch)
        if engine.multi_step:
            batches.write_draft_paths(engine.table.table, batch, engine.fields.num_steps, self.pool.page_size)
        fb = self._sglang_batch(engine, d, self._spec_info(d, batch))
        engine.backend.init_forward_metadata(fb)
        self._eager = (engine, fb)

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                layer: int, batch: ForwardBatch) -> torch.Tensor:
        """SGLang writes the new K/V itself (``set_kv_buffer`` into the shared pool), then attends."""
        self._refuse(batch.phase)
        maybe_validate_forward(q, k, v, layer, batch, self.pool, self.config)
        if self._current is not None:
            return self._graph_forward(self._current, q, k, v, layer)
        if self._eager is None:
            raise RuntimeError(f"backend {self.capabilities.name!r}: forward before init_forward_metadata")
        engine, fb = self._eager
        if engine.multi_step:  # draft_path is read now: the tree may have re-parented since the metadata
            batches.write_draft_paths(engine.table.table, batch, engine.fields.num_steps, self.pool.page_size)
            fb.spec_info = self._spec_info(batches.derive(batch), batch)
            engine.backend.init_forward_metadata(fb)
        return self._attend(self._step_backend(engine, batch), fb, q, k, v, layer)

    def _attend(self, sglang_backend: Any, fb: Any, q: torch.Tensor, k: torch.Tensor | None,
                v: torch.Tensor | None, layer: int) -> torch.Tensor:
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        tokens, heads = q.shape[0], self.config.num_q_heads
        # SGLang's layers run without autograd (its model runner's forward is under no_grad).
        with torch.no_grad(), forward_context(ForwardContext(attn_backend=sglang_backend)):
            out = self._layers[layer](q.reshape(tokens, heads * self.config.head_size), k, v, fb)
        return out.view(tokens, heads, self.config.out_head_size)

    # --- graphs ------------------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self._graph_sizes = (max_bs, max_num_tokens)
        self._captured.clear()
        if self._engine is not None:
            self._engine.graph_ready = False

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        self._refuse(batch.phase)
        if self._graph_sizes is None:
            raise RuntimeError(f"backend {self.capabilities.name!r}: init_capture_metadata before init_graph_state")
        engine = self._engine_for(batch)
        if not engine.graph_ready:
            engine.backend.init_cuda_graph_state(*self._graph_sizes)
            engine.graph_ready = True
        statics = batches.derive(batch)  # the capture size's own buffers, rewritten at each replay
        spec_info = self._spec_info(statics, batch)
        fb = self._sglang_batch(engine, statics, spec_info)
        engine.table.refresh()
        if engine.multi_step:
            batches.write_draft_paths(engine.table.table, batch, engine.fields.num_steps, self.pool.page_size)
        engine.backend.init_forward_metadata_out_graph(fb, in_capture=True)
        engine.backend.init_forward_metadata_in_graph(fb)
        cap = _Captured(engine, fb, statics, batch, torch.zeros(1, device=self.pool.device))
        cap.prep = launch.keep(self, launch.Launch(lambda: self._prepare(cap), host_work=True))
        self._captured[batch.batch_size] = cap
        self._current = cap

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        cap = self._captured.get(batch.batch_size)
        if cap is None:
            raise RuntimeError(f"backend {self.capabilities.name!r}: no capture of batch size {batch.batch_size} "
                               f"(captured: {sorted(self._captured)})")
        runtime.published(cap.engine.fields)
        cap.pending, self._current = batch, cap
        assert cap.prep is not None
        launch.run(cap.prep, cap.token)

    def _prepare(self, cap: _Captured) -> None:
        """SGLang's pre-replay step: the static buffers from the batch, then its out-of-graph metadata."""
        batch = cap.pending
        assert batch is not None
        new, old = batches.derive(batch), cap.statics
        for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions", "extend_prefix_lens",
                     "extend_seq_lens", "accepted"):
            target = getattr(old, name)
            if target is not None:
                target.copy_(getattr(new, name))
        cap.engine.table.refresh()
        if cap.engine.multi_step:
            batches.write_draft_paths(cap.engine.table.table, batch, cap.engine.fields.num_steps, self.pool.page_size)
        if batch.phase is Phase.TARGET_VERIFY:
            cap.fb.spec_info.custom_mask = new.custom_mask
        # The replay's host values (seq_lens_sum, ...) as SGLang's runner passes them; the
        # captured launch keeps its own batch, as a graph keeps its arguments.
        replay_fb = self._sglang_batch(cap.engine, old, cap.fb.spec_info)
        cap.engine.backend.init_forward_metadata_out_graph(replay_fb, in_capture=False)

    def _graph_forward(self, cap: _Captured, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                       layer: int) -> torch.Tensor:
        engine, batch = cap.engine, cap.batch
        step = self._step_backend(engine, batch)
        metadata = step.forward_metadata  # what the captured kernels read: frozen with the launch
        out = torch.empty((q.shape[0], self.config.num_q_heads, self.config.out_head_size), dtype=q.dtype,
                          device=q.device)

        def work() -> None:
            if engine.multi_step:  # the draft tree may have re-parented inside the graph
                batches.write_draft_paths(engine.table.table, batch, engine.fields.num_steps, self.pool.page_size)
                engine.backend.common_template(cap.fb, None, None)
            step.forward_metadata = metadata
            out.copy_(self._attend(step, cap.fb, q, k, v, layer))

        launch.run(launch.keep(self, launch.Launch(work)), out)
        return out


def adapter_class(caps: BackendCapabilities, sglang_name: str) -> type[SGLangAttention]:
    """The adapter class of one catalogue entry (``caps``: the descriptor the kit checks)."""
    name = "SGLang" + "".join(part.title() for part in sglang_name.split("_")) + "Attention"
    return type(name, (SGLangAttention,), {"capabilities": caps, "sglang_name": sglang_name,
                                           "__module__": __name__})
