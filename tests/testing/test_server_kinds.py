"""The kit's reach (issue 45): each double of tests/doubles/server_kinds.py is falsified for
the claim that owns its kind, while the torch backend verifies the same claim; each defect
is shown by hand on the example that triggers it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from server_kinds import (
    SERVER_KINDS,
    FirstBatchSizesSplits,
    Fp16Scores,
    GridYClamped,
    GroupPast64Wraps,
    MasksAfterTheDot,
    ReturnsItsBuffer,
    SoftcapLostAtHead256,
)

from attnhal.phases import Phase
from attnhal.platform import as_platform
from attnhal.testing.cases import build_case
from attnhal.testing.checks import Claim, ClaimKind, Status, Target, canonical_cases, verify
from attnhal.testing.oracle import reference_forward
from attnhal_torch import TorchBackend


def _claim(kind: str, subject: str, dtype: str | None) -> Claim:
    return Claim(ClaimKind(kind), subject, dtype)


def _target(cls: type) -> Target:
    return Target(cls, as_platform("cpu"), derandomize=True, database=None, max_examples=0)


@pytest.mark.parametrize("cls", list(SERVER_KINDS), ids=lambda c: c.__name__)
def test_each_server_kind_is_falsified_for_its_claim(cls: type) -> None:
    result = verify(_target(cls), _claim(*SERVER_KINDS[cls]))
    assert result.status is Status.FALSIFIED, (result.label, result.detail)


#: Per claim, where its examples must reach (the coverage report names it): quantity -> (lowest max, values).
_REACH: dict[tuple[str, str, str | None], dict[str, object]] = {
    ("phase", "decode", "float32"): {"rows_x_heads": 65536, "query_heads": 256, "batch_sizes": 256,
                                     "largest_logits": 65505, "unowned_memory": ["nan", "pad", "stale"]},
    ("phase", "decode", "float16"): {"largest_logits": 65505},
    ("inputs_unchanged", "", None): {"batch_sizes": 3},
    ("batch_invariant", "", None): {"history": 7, "context_lengths": 2049,
                                    "unowned_memory": ["nan", "pad", "stale"]},
    ("feature", "logit_softcap", None): {"head_sizes": 576},
}


@pytest.mark.parametrize("claim", sorted(set(SERVER_KINDS.values()), key=str), ids=str)
def test_the_torch_backend_verifies_the_same_claims(claim: tuple[str, str, str | None]) -> None:
    result = verify(_target(TorchBackend), _claim(*claim))
    assert result.status is Status.VERIFIED, (result.label, result.detail)
    for quantity, want in _REACH[claim].items():  # the report says how far the new check reached
        got = result.coverage[quantity]
        assert got == want if isinstance(want, list) else got[1] >= want, (quantity, got)


def _error(cls: type, recipe: object) -> float:
    case = build_case(recipe)  # type: ignore[arg-type]
    ref = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale,
                            case.config)
    backend = cls(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    out = backend.forward(case.q, case.k, case.v, case.layer, case.batch).double()
    return float((out - ref).abs().nan_to_num(float("inf")).max())


@pytest.mark.parametrize("page_size", [1, 16])
def test_masking_after_the_dot_shows_only_in_nan_memory(page_size: int) -> None:
    base = replace(canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float32", 16)[0], page_size=page_size)
    assert _error(MasksAfterTheDot, replace(base, unowned="stale")) < 1e-5  # stale values, pages past the pool
    assert _error(MasksAfterTheDot, base) == float("inf")  # NaN in the tile's tail, or the free pages it names
    assert _error(TorchBackend, base) < 1e-5


def test_the_pool_holds_nan_and_minus_one_only_where_the_batch_does_not_own() -> None:
    recipe = replace(canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float32", 16)[0], page_size=16)
    case = build_case(recipe)
    owned = sorted({s for row in case.row_slots for s in row})
    k = case.pool.k[case.layer]
    assert torch.isfinite(k[owned]).all() and torch.isfinite(k[:16]).all()  # the padding page is finite
    assert (~torch.isfinite(k)).flatten(1).all(1).sum() == k.shape[0] - 16 - len(owned)
    for req, seq in zip(case.batch.req_pool_indices.tolist(), recipe.seq_lens()):
        row = case.pool.req_to_page[req]
        used = -(-seq // 16)
        assert (row[:used] > 0).all()
        tail = row[used:].long() * 16
        assert not torch.isfinite(k[tail]).any() and not set(tail.tolist()) & set(owned)  # free pages
    padded = build_case(replace(recipe, unowned="pad"))
    for req, seq in zip(padded.batch.req_pool_indices.tolist(), recipe.seq_lens()):
        assert (padded.pool.req_to_page[req, -(-seq // 16):] == -1).all()
    stale = build_case(replace(recipe, unowned="stale"))
    assert torch.isfinite(stale.pool.k[0]).all()
    for req, seq in zip(stale.batch.req_pool_indices.tolist(), recipe.seq_lens()):
        assert (stale.pool.req_to_page[req, -(-seq // 16):] > stale.pool.num_slots // 16).all()


def test_a_returned_buffer_shows_only_when_the_first_output_is_kept() -> None:
    recipe = canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float32", 16)[0]
    case = build_case(recipe)
    backend = ReturnsItsBuffer(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    first = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    right = first.clone()
    assert _error(ReturnsItsBuffer, recipe) < 1e-5  # each answer right when read at once
    backend.forward(-case.q, case.k, case.v, case.layer, case.batch)
    assert not torch.equal(first, right)


def test_a_workspace_sized_by_the_first_batch_shows_only_in_a_history() -> None:
    from attnhal.testing.cases import PoolSize, make_pool, pool_size
    from attnhal.testing.checks.fixed import at_lengths

    base = canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float32", 16)[0]
    short, long = at_lengths(base, (5,)), at_lengths(base, (300, 7))
    assert _error(FirstBatchSizesSplits, long) < 1e-5  # a fresh backend per batch is right
    pool = make_pool(short, PoolSize.union(pool_size(short), pool_size(long)))
    errors = []
    backend = None
    for recipe in (short, long):  # one instance, lengths rising
        case = build_case(recipe, pool=pool)
        backend = backend or FirstBatchSizesSplits(case.config, pool)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch).double()
        ref = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
        errors.append(float((out - ref).abs().max()))
    assert errors[0] < 1e-5 < 1e-3 < errors[1]


def test_fp16_scores_show_only_past_fp16s_range() -> None:
    from attnhal.testing.checks.fixed import range_cases

    base = canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float16", 16)[0]
    assert _error(Fp16Scores, base) < 1e-2
    assert _error(Fp16Scores, range_cases(base)[0]) == float("inf")
    assert _error(TorchBackend, range_cases(base)[0]) < 0.1  # the tolerance widens with the logits (~1.1e5)


def test_server_size_defects_show_only_at_server_sizes() -> None:
    from attnhal.testing.checks.fixed import server_cases

    base = canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float32", 16)[0]
    wide, grid = server_cases(base)
    rows1024 = server_cases(base, thorough=True)[-1]
    assert grid.rows == 256 and grid.rows * grid.num_q_heads > 65535 and wide.num_q_heads == 128
    assert rows1024.rows == 1024 and rows1024.rows * rows1024.num_q_heads > 65535
    assert _error(GroupPast64Wraps, base) < 1e-5 and _error(GroupPast64Wraps, wide) > 1e-3
    assert _error(GridYClamped, wide) < 1e-5 and _error(GridYClamped, grid) > 1e-3


def test_a_feature_lost_at_one_head_size_shows_only_there() -> None:
    base = replace(canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float32", 16)[0], logit_softcap=1.0)
    assert _error(SoftcapLostAtHead256, base) < 1e-5
    assert _error(SoftcapLostAtHead256, replace(base, head_size=256)) > 1e-3
