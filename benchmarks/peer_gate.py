"""The referee's output gate: each query row's error relative to that row's own scale.

A fixed absolute bound (the former gate, max |err| <= 3e-2 in bf16) cannot see a kernel
that skips part of the K/V: at 1 x 32,768 every output value is below 0.04, so attending
only the first 7/8 of the context passed it. Here each (token, head) output vector is held
to ``||out - ref|| <= GATE * ||ref||``: dropping 1/8 of the keys moves a row by about a
third of its own norm, at any length, while a correct kernel's rounding stays near its
dtype's epsilon.
"""

from __future__ import annotations

import torch

__all__ = ["FP8_GATE", "GATE", "gate_limit", "row_relative_error"]

#: Largest per-row relative error that counts as agreeing, per query dtype (fp8 K/V: its own).
GATE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
FP8_GATE = 0.1  # SGLang rounds q to e4m3 too; a skipped 1/8 of the K/V costs ~0.3


def gate_limit(dtype: torch.dtype, fp8: bool) -> float:
    return FP8_GATE if fp8 else GATE[dtype]


def row_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max_rows ||out_r - ref_r|| / ||ref_r||`` over the last dimension (fp32; NaN stays NaN).

    out, ref: ``[tokens, heads, D]``. A reference row of norm below 1e-6 (nothing attended)
    is measured absolutely.
    """
    diff = torch.linalg.vector_norm(out.float() - ref.float(), dim=-1)
    scale = torch.linalg.vector_norm(ref.float(), dim=-1).clamp_min(1e-6)
    return float((diff / scale).max()) if diff.numel() else 0.0
