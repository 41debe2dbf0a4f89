"""Triton backend numerics per phase, run by the Triton interpreter on CPU.

Every phase's kernels against the conformance kit's fp64 oracle
(:mod:`attnhal.testing.oracle`, written from the masking table of
:mod:`attnhal.backend.batch`) on batches built by the kit's builder
(:func:`~attnhal.testing.cases.build_case`): drawn by hypothesis, then a fixed case of
every (phase, dtype), large head sizes, a KV cache of another dtype than the queries, the
fallback launch row, and a second backend (torch) as a cross-check. Features are in
``test_triton_features.py``, custom ops and graphs in ``test_triton_graphs.py``; the cases
in ``triton_cases.py``.

``ATTNHAL_TRITON_EXAMPLES`` raises the hypothesis example count per phase. The
interpreter runs every program of a grid, idle split programs included, so CI runs the
numerics on the interpreter's launch row (at most 4 splits) and keeps the simulated
targets' rows (16-32 splits) for the tests about them; ``ATTNHAL_SLOW=1`` runs the
numerics on those rows too.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from triton_cases import (
    DTYPES,
    PLATFORMS,
    SETTINGS,
    TritonCase,
    assert_close,
    build,
    check,
    expected,
    run,
    shape,
    triton_cases,
)

from attnhal.backend import AttentionConfig
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.spec import SpecConfig
from attnhal.testing.oracle import real_tokens
from attnhal_triton import TritonBackend


@SETTINGS
@given(triton_cases(Phase.DECODE, max_len=256))
def test_decode_matches_reference(case: TritonCase) -> None:
    check(case)


@SETTINGS
@given(triton_cases(Phase.DRAFT_DECODE))
def test_draft_decode_matches_reference(case: TritonCase) -> None:
    check(case)


@SETTINGS
@given(triton_cases(Phase.PREFILL, max_len=150))
def test_prefill_matches_reference(case: TritonCase) -> None:
    check(case)


@SETTINGS
@given(triton_cases(Phase.TARGET_VERIFY))
def test_target_verify_matches_reference(case: TritonCase) -> None:
    check(case)


@SETTINGS
@given(triton_cases(Phase.DRAFT_EXTEND))
def test_draft_extend_matches_reference(case: TritonCase) -> None:
    check(case)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("phase", list(Phase), ids=[p.value for p in Phase])
def test_every_phase_every_dtype(phase: Phase, dtype: str) -> None:
    """Deterministic coverage of each (phase, dtype) pair whatever hypothesis draws."""
    check(shape(phase, dtype=dtype))


@pytest.mark.parametrize("head_size", [128, 256])
def test_large_head_sizes(head_size: int) -> None:
    for phase in (Phase.DECODE, Phase.TARGET_VERIFY):
        check(shape(phase, head_size=head_size, lens=(40,), news=(1,), dtype="float16"))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_kv_cache_dtype_differs_from_query_dtype(phase: Phase) -> None:
    """An fp32 cache with fp16 queries: K/V are cast to the query's dtype in the kernel.
    The forward gets ``k = v = None``: the new tokens' K/V are already in the pool."""
    case, backend = build(shape(phase, dtype="float32"))
    cfg = backend.config
    half = TritonBackend(AttentionConfig(cfg.num_q_heads, cfg.num_kv_heads, cfg.head_size, torch.float16),
                         case.pool, platform=parse("cpu"))
    case.q = case.q.half()
    got = run(case, half, write=False)
    assert got.dtype == torch.float16
    assert_close(half, got, expected(case, half, write=False))


@pytest.mark.parametrize("platform,phase,head_size,dtype,kernel,blocks", [
    ("cuda:sm80", Phase.TARGET_VERIFY, 256, "float16", "extend_verify_tree", (32, 16)),
    ("cuda:sm120", Phase.DECODE, 64, "bfloat16", "decode", (32, 16)),
    ("hip:gfx942", Phase.PREFILL, 256, "float16", "extend_prefill", (64, 16)),
    ("hip:gfx942", Phase.TARGET_VERIFY, 256, "float32", "extend_verify_tree", (32, 16)),
    ("cuda:sm90", Phase.TARGET_VERIFY, 256, "float16", "extend_verify_tree", (32, 32)),
    ("hip:gfx942", Phase.PREFILL, 256, "float32", "extend_prefill", (32, 16)),
], ids=["sm80-tree-d256", "sm120-decode-d64", "gfx942-prefill-d256", "gfx942-tree-d256-fp32", "sm90-tree-d256",
        "gfx942-prefill-d256-fp32"])
def test_rows_narrowed_so_as_not_to_spill(platform: str, phase: Phase, head_size: int, dtype: str, kernel: str,
                                          blocks: tuple[int, int]) -> None:
    """The rows whose tiles were narrowed to compile spill-free, run on their own blocks and
    split counts (the interpreter ignores warps, stages and ``maxnreg``)."""
    case = shape(phase, head_size=head_size, dtype=dtype, platform=platform, lens=(40,), news=(3,), kv_heads=1)
    built, backend = build(case)
    assert tuple(v for k, v in backend.rows[kernel].blocks.items() if k != "L2_DOMAINS") == blocks
    assert_close(backend, run(built, backend), expected(built, backend))


@pytest.mark.parametrize("phase", [Phase.PREFILL, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_gfx942_rows_deal_a_rows_query_blocks_to_one_l2(phase: Phase) -> None:
    """gfx942's extend rows carry L2_DOMAINS 8: the kernel renumbers its programs
    (``l2_order.l2_program``) so that the query blocks of a (row, KV head, split) run behind
    one XCD's L2. 12 windows (3 rows x 4 KV heads: 8 dealt, 4 in the grid's order) of up to
    5 query blocks (prefill, BLOCK_M 64) or of one (tree verify) are exact."""
    case = shape(phase, platform="hip:gfx942", kv_heads=4, group=2, lens=(40, 3, 20), news=(150, 40, 90), tokens=8)
    built, backend = build(case)
    kernel = "extend_prefill" if phase is Phase.PREFILL else "extend_verify_tree"
    assert backend.rows[kernel].blocks["L2_DOMAINS"] == 8
    assert_close(backend, run(built, backend), expected(built, backend))


def test_fallback_row_runs() -> None:
    """An unknown arch's fallback blocks (BLOCK_N 32, 8 splits) give the same answers."""
    with pytest.warns(UserWarning, match="gfx1100"):
        for phase in (Phase.DECODE, Phase.PREFILL):
            check(shape(phase, platform="hip:gfx1100"))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("phase", list(Phase), ids=[p.value for p in Phase])
def test_matches_project_reference(phase: Phase, seed: int) -> None:
    """The kit's batches from ``tests/helpers/cases.py``'s seeded specs (stale req_to_token tails,
    scattered slots, zero-length prefills, draft trees of topk 2, shared draft ancestors),
    and the package's fp64 reference, with K/V written by forward."""
    import cases
    tree = SpecConfig.eagle(3, topk=2, num_draft_tokens=5)
    spec = tree if phase in (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY) else None
    case, backend = build(TritonCase(cases.random_spec(
        phase, seed, requests=3, spec=spec, draft_step=seed % 3, num_q_heads=8, num_kv_heads=2, head_size=32,
        dtype=DTYPES[seed]), PLATFORMS[seed % len(PLATFORMS)]))
    want = cases.expected(case)
    got = run(case, backend)
    tol = backend.capabilities.tolerance(str(got.dtype).removeprefix("torch."))
    torch.testing.assert_close(got.double(), want, atol=tol.atol, rtol=tol.rtol)


def test_agrees_with_torch_backend_when_present() -> None:
    """A second implementation as a cross-check, on the tokens the caller reads."""
    from attnhal_torch import TorchBackend

    for phase in Phase:
        case, backend = build(shape(phase))
        other = TorchBackend(backend.config, case.pool)
        want = run(case, other)
        assert_close(backend, run(case, backend), want, real_tokens(case.batch))
