"""fp8 caches under 16-bit queries at large logits, run by the Triton interpreter.

The kernels once entered the dots with ``q * sm_scale * log2(e) * k_scale`` rounded to
fp16, which overflowed to inf (then NaN) once that product passed 65504, and below it cost
the rounding of a pre-scaled q (up to 3x the bf16 tolerance at large logits). These cases
sit on both sides of that threshold, for both fp8 encodings, decode and verify, and hold
the outputs to the descriptor's tolerance against the kit's fp64 oracle; MLA's kernel
(two q tiles, one power of two) too.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from triton_cases import TritonCase, assert_close, build, expected, run, shape

from attnhal.phases import Phase
from attnhal.testing.cases.recipe import MAX_EXACT_QK
from attnhal_triton.mla_traffic import latent_pool

#: Where the old pre-scaled fp16 query overflowed: ``|q| * sm_scale * log2(e) * k_scale``.
FP16_MAX = 65504.0


def _scaled_q_peak(case: object, backend: object, q: torch.Tensor) -> float:
    """``max |q| * sm_scale * log2(e) * k_scale`` of a forward: what the old kernels rounded to fp16."""
    k_scale = float(case.pool.k_scale[case.layer])  # type: ignore[attr-defined]
    sm_scale = backend.config.sm_scale  # type: ignore[attr-defined]
    return float(q.abs().max()) * sm_scale * math.log2(math.e) * k_scale


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_fp8_is_exact_for_stored_values_at_large_logits(phase: Phase, kv_dtype: str) -> None:
    """Integer q and K up to 32 with scale 0.3 (logits of hundreds, gaps of 0.3): a bf16
    query over the fp8 cache holds bf16's tolerance (a pre-scaled fp16 q missed it by up
    to 15x here, verify in both encodings)."""
    base = shape(phase, kv_dtype=kv_dtype, dtype="bfloat16", lens=(40, 9), kv_heads=1)
    case, backend = build(TritonCase(replace(base.recipe, scale=0.3, qk_magnitude=MAX_EXACT_QK)))
    assert_close(backend, run(case, backend), expected(case, backend))


@pytest.mark.parametrize("times", [0.9, 4.0], ids=["below_fp16_max", "past_fp16_max"])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_fp8_holds_its_tolerance_at_large_logits(phase: Phase, kv_dtype: str, times: float) -> None:
    """bf16 queries scaled (by a power of two, exactly) until the old pre-scaled query
    peaks at ``times`` x 65504: finite, and within bf16's tolerance of the oracle."""
    case, backend = build(shape(phase, kv_dtype=kv_dtype, dtype="bfloat16", lens=(40, 9), kv_heads=1))
    peak = _scaled_q_peak(case, backend, case.q)
    factor = 2.0 ** math.floor(math.log2(times * FP16_MAX / peak))  # peak in (times / 2, times] x 65504
    case.q.mul_(factor)
    scaled_peak = _scaled_q_peak(case, backend, case.q)
    assert (scaled_peak >= FP16_MAX) == (times > 1), scaled_peak
    assert_close(backend, run(case, backend), expected(case, backend))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_fp8_under_fp16_queries_with_a_large_k_scale(phase: Phase) -> None:
    """fp16 queries of magnitude ~2^10 over an e5m2 cache whose K scale is 2^8: the old
    pre-scaled query passed 65504; the output holds fp16's tolerance."""
    case, backend = build(shape(phase, kv_dtype="fp8_e5m2", dtype="float16", lens=(40, 9), kv_heads=1))
    case.pool.k_scale.fill_(256.0)
    case.q.mul_(2.0**10)
    assert _scaled_q_peak(case, backend, case.q) >= FP16_MAX
    assert_close(backend, run(case, backend), expected(case, backend))


@pytest.mark.parametrize("tail", [1.0, 64.0], ids=["even", "rope_larger"])
@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_mla_fp8_past_fp16_max(phase: Phase, tail: float) -> None:
    """MLA (q 576 = latent 512 + rope 64, 4 heads, latent pool) with bf16 queries over an
    e4m3 cache, scaled until the old pre-scaled query peaks at 2-4 x 65504; ``rope_larger``:
    the rope part 64x the latent's, so one power of two must cover both of q's dots."""
    base = shape(phase, kv_heads=1, group=4, head_size=576, dtype="bfloat16", lens=(40, 9),
                 kv_dtype="fp8_e4m3", page_size=16)
    recipe = replace(base.recipe, v_head_size=512)
    case, backend = build(TritonCase(recipe), pool=latent_pool(recipe))
    case.q[..., 512:].mul_(tail)
    case.q.mul_(2.0 ** math.floor(math.log2(4 * FP16_MAX / _scaled_q_peak(case, backend, case.q))))
    assert _scaled_q_peak(case, backend, case.q) >= FP16_MAX
    assert_close(backend, run(case, backend, write=False), expected(case, backend, write=False))
