"""The kit's reach (issue 31): each blind-spot double of tests/doubles/blind_spots.py is falsified
for the claim that owns its kind, while the torch backend verifies the same claims.

The doubles run one claim each at the default example count (``phase[draft_extend]``
with the fixed examples only: its acceptance boundaries are built, not drawn).
"""

from __future__ import annotations

import pytest
import torch
from blind_spots import BLIND_SPOTS, FullAcceptanceUnmasked, ReusesRowState

from attnhal.backend import set_debug, validate_batch
from attnhal.phases import Phase
from attnhal.platform import as_platform
from attnhal.testing.cases import build_case
from attnhal.testing.cases.rows import move_requests, select_rows
from attnhal.testing.checks import Claim, ClaimKind, Status, Target, canonical_cases, verify
from attnhal.testing.checks.coverage import format_coverage
from attnhal.testing.checks.fixed import acceptance_cases
from attnhal.testing.oracle import reference_forward
from attnhal_torch import TorchBackend

_CLAIMS = {"phase": Claim(ClaimKind.PHASE, "draft_extend", "float32")}


def _claim(kind: str) -> Claim:
    return _CLAIMS.get(kind) or Claim(ClaimKind(kind))


def _target(cls: type) -> Target:
    return Target(cls, as_platform("cpu"), derandomize=True, database=None)


@pytest.mark.parametrize("cls", list(BLIND_SPOTS), ids=lambda c: c.__name__)
def test_each_blind_spot_is_falsified_for_its_claim(cls: type) -> None:
    result = verify(_target(cls), _claim(BLIND_SPOTS[cls]))
    assert result.status is Status.FALSIFIED, (result.label, result.detail)


@pytest.mark.parametrize("kind", sorted(set(BLIND_SPOTS.values())))
def test_the_torch_backend_verifies_the_same_claims(kind: str) -> None:
    result = verify(_target(TorchBackend), _claim(kind))
    assert result.status is Status.VERIFIED, (result.label, result.detail)
    assert result.coverage["batch_sizes"], result.coverage  # the report says where it looked


def test_the_acceptance_defect_needs_the_built_boundary() -> None:
    """Mixed acceptance is right; every request accepting everything is wrong."""
    base = canonical_cases(TorchBackend.capabilities, Phase.DRAFT_EXTEND, "float32", 16)[0]
    full, single, mixed = acceptance_cases(base)
    for recipe, wrong in ((full, True), (single, False), (mixed, False)):
        case = build_case(recipe)
        ref = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
        backend = FullAcceptanceUnmasked(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch).double()
        assert bool((out - ref).abs().max() > 1e-3) is wrong, recipe


def test_row_state_reuse_shows_only_when_requests_move() -> None:
    case = build_case(canonical_cases(TorchBackend.capabilities, Phase.DECODE, "float32", 16)[0])
    backend = ReusesRowState(case.config, case.pool)
    set_debug(False)  # debug validation would refuse the stale table before it is read
    try:
        for make, wrong in ((lambda: case, False), (lambda: select_rows(case, [1, 0]), False),
                            (lambda: move_requests(case), True)):  # moved only once the others ran
            derived = make()
            ref = reference_forward(derived.q, derived.k, derived.v, derived.layer, derived.batch, derived.pool,
                                    case.config.sm_scale)
            backend.init_forward_metadata(derived.batch)
            out = backend.forward(derived.q, derived.k, derived.v, derived.layer, derived.batch).double()
            assert bool((out - ref).abs().nan_to_num(float("inf")).max() > 1e-3) is wrong
    finally:
        set_debug(None)


@pytest.mark.parametrize("phase", list(Phase))
def test_an_empty_batch_is_valid_and_its_reference_is_empty(phase: Phase) -> None:
    case = select_rows(build_case(canonical_cases(TorchBackend.capabilities, phase, "float32", 16)[0]), [])
    set_debug(True)
    try:
        validate_batch(case.batch, case.pool, case.config)
        backend = TorchBackend(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    finally:
        set_debug(None)
    assert out.shape == (0, case.config.num_q_heads, case.config.out_head_size)
    ref = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
    assert ref.shape[0] == 0


def test_derived_batches_attend_what_the_original_attended() -> None:
    recipe = canonical_cases(TorchBackend.capabilities, Phase.TARGET_VERIFY, "float32", 16)[0]
    case = build_case(recipe)
    ref = reference_forward(case.q, case.k, case.v, 0, case.batch, case.pool, case.config.sm_scale)
    moved = move_requests(select_rows(case, [1, 0]))
    got = reference_forward(moved.q, moved.k, moved.v, 0, moved.batch, moved.pool, case.config.sm_scale)
    T = recipe.tokens_per_row or 1
    assert torch.equal(got, torch.cat([ref[T:], ref[:T]]))


def test_coverage_reads_as_ranges() -> None:
    text = format_coverage({"batch_sizes": [0, 64], "layers": [4, 4], "layer_patterns": ["- 6 2 -"]})
    assert text == "batch sizes 0..64; layers 4; layer patterns [- 6 2 -]"
