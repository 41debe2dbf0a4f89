"""The static tensors a phase's graphs read, and padding a batch into them.

A phase's graphs are captured from one set of buffers sized for its largest
capture size; each captured size reads views of their leading rows. Running a
batch copies it into those rows and pads the rest up to the captured size;
:func:`unpad` cuts the graph's outputs back to the batch's rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from attnhal import phases
from attnhal.backend.batch import ForwardBatch, SpecInfo
from attnhal.backend.kv_pool import PADDING_REQ, PADDING_SLOT
from attnhal.phases import Phase
from attnhal.spec import SpecConfig

from .step import Inputs, PhaseStep, StepOutputs

__all__ = ["StaticBuffers", "tokens_per_row", "unpad"]


def tokens_per_row(phase: Phase, spec: SpecConfig) -> int:
    """Query tokens per ForwardBatch row of a capturable phase (:func:`attnhal.phases.tokens_per_row`)."""
    per_row = phases.tokens_per_row(phase, spec)
    if per_row is None:
        raise ValueError("phase=prefill (supported: decode, draft_decode, draft_extend, target_verify; "
                         "prefill has a variable token count)")
    return per_row


def _put(name: str, dst: torch.Tensor, src: torch.Tensor, n: int, padded: int, fill: float) -> None:
    """``dst[:n] = src``, ``dst[n:padded] = fill``; exact shapes (``copy_`` would broadcast)."""
    if tuple(src.shape) != tuple(dst[:n].shape):
        raise ValueError(f"{name}.shape={tuple(src.shape)} (supported: {tuple(dst[:n].shape)} for this batch)")
    dst[:n].copy_(src)
    dst[n:padded].fill_(fill)


class StaticBuffers:
    """The static tensors of one phase, sized for the largest capture size.

    Every captured size reads views of their leading rows, so one copy feeds
    whichever graph replays.
    """

    def __init__(self, phase: Phase, spec: SpecConfig, step: PhaseStep, max_rows: int,
                 fill: int, device: torch.device) -> None:
        self.phase, self.spec, self.fill = phase, spec, fill
        self.rows_per_request, self.tpr = step.rows_per_request, tokens_per_row(phase, spec)
        rows, tokens = max_rows, max_rows * self.tpr
        i32, i64 = torch.int32, torch.int64
        self.req_pool_indices = torch.full((rows,), PADDING_REQ, dtype=i64, device=device)
        self.seq_lens = torch.full((rows,), fill, dtype=i32, device=device)
        self.seq_lens_cpu = torch.full((rows,), fill, dtype=i32)  # host metadata, never captured
        self.out_cache_loc = torch.full((tokens,), PADDING_SLOT, dtype=i64, device=device)
        self.extend_lens = (torch.ones(rows, dtype=i32, device=device)
                            if phase is Phase.DRAFT_EXTEND else None)
        # Padded rows get a causal (chain) mask: valid for any backend's tree path.
        self.causal = torch.ones(self.tpr, self.tpr, dtype=torch.bool, device=device).tril()
        self.custom_mask = (self.causal.expand(rows, -1, -1).clone()
                            if phase is Phase.TARGET_VERIFY and spec.topk > 1 else None)
        self.draft_path = (torch.full((rows, spec.num_steps), PADDING_SLOT, dtype=i64, device=device)
                           if phase is Phase.DRAFT_DECODE else None)
        self.input_specs = step.input_specs
        self.inputs = {name: torch.zeros((rows if s.per == "row" else tokens, *s.shape), dtype=s.dtype,
                                         device=device) for name, s in self.input_specs.items()}

    def _count(self, name: str, rows: int) -> int:
        return rows if self.input_specs[name].per == "row" else rows * self.tpr

    def view(self, size: int) -> tuple[ForwardBatch, dict[str, torch.Tensor]]:
        """The static batch and inputs of capture size ``size`` (views; build once per size)."""
        rows = size * self.rows_per_request
        info = None
        if self.phase is not Phase.DECODE:
            info = SpecInfo(topk=self.spec.topk, num_draft_tokens=self.spec.num_draft_tokens,
                            draft_extend_len=self.spec.draft_extend_len,
                            custom_mask=None if self.custom_mask is None else self.custom_mask[:rows],
                            draft_path=None if self.draft_path is None else self.draft_path[:rows])
        batch = ForwardBatch(
            phase=self.phase, req_pool_indices=self.req_pool_indices[:rows], seq_lens=self.seq_lens[:rows],
            out_cache_loc=self.out_cache_loc[:rows * self.tpr], seq_lens_cpu=self.seq_lens_cpu[:rows],
            extend_lens=None if self.extend_lens is None else self.extend_lens[:rows], spec=info)
        return batch, {name: buf[:self._count(name, rows)] for name, buf in self.inputs.items()}

    def replayable(self, batch: ForwardBatch) -> bool:
        """Whether a graph captured from these buffers can run ``batch``; raises on a malformed batch."""
        if batch.batch_size % self.rows_per_request:
            raise ValueError(f"batch_size={batch.batch_size} (supported: a multiple of "
                             f"rows_per_request={self.rows_per_request} for phase={self.phase.value})")
        if batch.tokens_per_row != self.tpr or batch.num_tokens != batch.batch_size * self.tpr:
            raise ValueError(f"tokens={batch.num_tokens} for {batch.batch_size} rows (supported: "
                             f"{self.tpr} per row for phase={self.phase.value} under the plan's spec)")
        if batch.spec is not None and batch.spec.custom_mask is not None and self.custom_mask is None:
            raise ValueError(f"custom_mask given (supported: none for phase={self.phase.value} "
                             f"with topk={self.spec.topk})")
        # draft_step is a Python int, frozen into a graph at capture (where it is 0).
        return batch.spec is None or batch.spec.draft_step == 0

    def load(self, batch: ForwardBatch, inputs: Inputs, size: int) -> None:
        """Copy ``batch`` and ``inputs`` into the leading rows and pad up to ``size`` requests."""
        n, rows, t = batch.batch_size, size * self.rows_per_request, self.tpr
        _put("req_pool_indices", self.req_pool_indices, batch.req_pool_indices, n, rows, PADDING_REQ)
        _put("seq_lens", self.seq_lens, batch.seq_lens, n, rows, self.fill)
        # Without a host copy from the engine this is one device-to-host copy, outside the graph.
        host = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
        _put("seq_lens_cpu", self.seq_lens_cpu, host, n, rows, self.fill)
        _put("out_cache_loc", self.out_cache_loc, batch.out_cache_loc, n * t, rows * t, PADDING_SLOT)
        if self.extend_lens is not None:
            if batch.extend_lens is None:
                raise ValueError(f"extend_lens=None (supported: a [bs] tensor for phase={self.phase.value})")
            _put("extend_lens", self.extend_lens, batch.extend_lens, n, rows, 1)
        spec = batch.spec or SpecInfo()
        if self.custom_mask is not None:
            mask = spec.custom_mask if spec.custom_mask is not None else self.causal.expand(n, -1, -1)
            _put("custom_mask", self.custom_mask, mask, n, n, 0)
            self.custom_mask[n:rows].copy_(self.causal)
        if self.draft_path is not None:
            if spec.draft_path is None:
                raise ValueError(f"draft_path=None (supported: a [rows, num_steps] tensor for "
                                 f"phase={self.phase.value})")
            _put("draft_path", self.draft_path, spec.draft_path, n, rows, PADDING_SLOT)
        if set(inputs) != set(self.inputs):
            raise ValueError(f"inputs={sorted(inputs)} (supported: {sorted(self.inputs)})")
        for name, buf in self.inputs.items():
            if inputs[name].dtype != buf.dtype:  # a silent cast would hide a caller's mistake
                raise ValueError(f"{name}.dtype={inputs[name].dtype} (supported: {buf.dtype})")
            _put(name, buf, inputs[name], self._count(name, n), self._count(name, rows), 0)


def unpad(outputs: StepOutputs, keep: Mapping[int, int]) -> StepOutputs:
    """Views of ``outputs`` cut to the real rows/tokens: leading dim ``padded`` -> ``keep[padded]``."""
    def cut(t: torch.Tensor) -> torch.Tensor:
        return t[:keep[t.shape[0]]] if t.dim() and t.shape[0] in keep else t

    return cut(outputs) if isinstance(outputs, torch.Tensor) else tuple(cut(t) for t in outputs)
