"""The example engine's captured phase functions: what each graph runs, as a :class:`PhaseStep`.

Each step's forward reads its inputs from the runner's static buffers (``x``) and the batch,
and returns the tensors the worker reads after replay.
"""

from __future__ import annotations

from typing import Any

import torch

from attnhal.backend import AttentionBackend, ForwardBatch, MultiStepDraft
from attnhal.example_engine.model import TinyLlama
from attnhal.example_engine.tree import grow
from attnhal.graphs import PhaseStep

__all__ = ["decode_step", "draft_decode_step", "extend_step"]


def _token_inputs() -> dict[str, Any]:
    return {"input_ids": ("token", (), torch.int64), "positions": ("token", (), torch.int64)}


def decode_step(model: TinyLlama, backend: AttentionBackend) -> PhaseStep:
    """Decode and target verify: the argmax after every query token, ``[tokens]``."""
    def forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(x["input_ids"], x["positions"], batch, backend).argmax(-1)
    return PhaseStep(backend, forward, _token_inputs())


def extend_step(draft: TinyLlama, backend: AttentionBackend) -> PhaseStep:
    """Draft extend: the logits after each request's last committed token, ``[bs, vocab]``."""
    def forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = draft(x["input_ids"], x["positions"], batch, backend)
        assert batch.extend_lens is not None and batch.tokens_per_row is not None
        rows = torch.arange(batch.batch_size, device=logits.device)
        return logits[rows * batch.tokens_per_row + batch.extend_lens.long() - 1]
    return PhaseStep(backend, forward, _token_inputs())


def draft_decode_step(draft: TinyLlama, multi: MultiStepDraft, topk: int) -> PhaseStep:
    """The multi-step draft: all ``num_steps - 1`` forwards as one step; per row and step
    (token, score, parent branch), each ``[rows, num_steps - 1]``."""
    def forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        path = batch._spec().draft_path
        assert path is not None
        tokens, scores = x["tokens"], x["scores"]
        outs: list[tuple[torch.Tensor, ...]] = []
        for s, step_batch in enumerate(multi.step_batches(batch)):
            positions = batch.seq_lens.long() + s
            logits = draft(tokens, positions, step_batch, multi.backend(s))
            tokens, scores, parent = grow(scores.view(-1, topk), logits)
            # Each new branch continues its parent's path: re-parent the slots written so far.
            path[:, : s + 1].copy_(path[:, : s + 1].view(-1, topk, s + 1)
                                   .gather(1, parent[:, :, None].expand(-1, -1, s + 1)).view(-1, s + 1))
            tokens, scores = tokens.reshape(-1), scores.reshape(-1)
            outs.append((tokens, scores, parent.reshape(-1)))
        return tuple(torch.stack(col, dim=1) for col in zip(*outs))
    inputs = {"tokens": ("row", (), torch.int64), "scores": ("row", (), torch.float32)}
    return PhaseStep(multi, forward, inputs, rows_per_request=topk)
