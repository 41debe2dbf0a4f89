"""Debug-mode batch validation: valid batches pass, each bad field is named with its value."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from cases import one_thread, random_spec

from attnhal.backend import (
    BatchValidationError,
    ForwardBatch,
    debug_enabled,
    set_debug,
    validate_batch,
    validate_forward,
)
from attnhal.backend.validate import ENV_VAR
from attnhal.graphs import EmulatedGraph
from attnhal.phases import Phase
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, build_case
from attnhal_torch import TorchBackend

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

PARAMS: dict[Phase, dict[str, Any]] = {
    Phase.PREFILL: {"prefix_lens": [3, 0, 5], "new_lens": [2, 4, 0]},
    Phase.DECODE: {},
    Phase.TARGET_VERIFY: {"spec": SpecConfig.eagle(3, topk=2, num_draft_tokens=4)},
    Phase.DRAFT_EXTEND: {"spec": SpecConfig.eagle(2), "new_lens": [1, 3, 2]},  # draft_extend_len 3
    Phase.DRAFT_DECODE: {"spec": SpecConfig.eagle(3, topk=2, num_draft_tokens=4), "draft_step": 1},
}


def case_of(phase: Phase) -> Case:
    params = {"prefix_lens": [4, 7, 2], **PARAMS[phase]}
    return build_case(random_spec(phase, seed=11, **params))


@pytest.fixture
def debug() -> Iterator[None]:
    set_debug(True)
    try:
        yield
    finally:
        set_debug(None)


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
def test_valid_batches_pass(phase: Phase) -> None:
    case = case_of(phase)
    validate_batch(case.batch, case.pool, case.config)
    validate_forward(case.q, case.k, case.v, 0, case.batch, case.pool, case.config)
    with pytest.raises(ValueError, match="seq_lens"):  # the checks ran on this batch: past the pool, it fails
        validate_batch(replace(case.batch, seq_lens=case.batch.seq_lens + 10_000), case.pool, case.config)


def _set(name: str, index: int | tuple[int, ...], value: int) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        getattr(case.batch, name)[index] = value
    return mutate


def _spec(**fields: Any) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        assert case.batch.spec is not None
        values = {k: (v(case) if callable(v) else v) for k, v in fields.items()}
        case.batch.spec = replace(case.batch.spec, **values)
    return mutate


def _batch(**fields: Any) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        values = {k: (v(case) if callable(v) else v) for k, v in fields.items()}
        case.batch = replace(case.batch, **values)
    return mutate


def _table(row: int, pos: int, value: int) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        req = int(case.batch.req_pool_indices[row])
        case.pool.req_to_token[req, pos] = value
    return mutate


# (phase, mutation, field named in the error, text the message must contain)
BAD: list[tuple[Phase, Callable[[Case], None], str, str]] = [
    (Phase.DECODE, _set("seq_lens", 2, -1), "seq_lens[2]", "seq_lens[2]=-1 (supported: 0.."),
    (Phase.DECODE, _set("seq_lens", 1, 10_000), "seq_lens[1]", "=10000 (supported: 0.."),
    (Phase.DECODE, _set("out_cache_loc", 2, 99_999), "out_cache_loc[2]", "=99999 (supported: 0.."),
    (Phase.DECODE, _set("out_cache_loc", 0, 1), "out_cache_loc[0]", "the slot of position"),
    (Phase.DECODE, _set("req_pool_indices", 1, 999), "req_pool_indices[1]", "rows of pool.req_to_page"),
    (Phase.DECODE, _batch(req_pool_indices=lambda c: c.batch.req_pool_indices.float()),
     "req_pool_indices.dtype", "torch.float32"),
    (Phase.DECODE, _batch(seq_lens=lambda c: c.batch.seq_lens[:2]), "seq_lens.shape", "[2]"),
    (Phase.DECODE, _batch(out_cache_loc=lambda c: c.batch.out_cache_loc[:2]), "num_tokens", "num_tokens=2"),
    (Phase.DECODE, _batch(seq_lens_cpu=lambda c: c.batch.seq_lens + 1), "seq_lens_cpu", "equal to its device tensor"),
    (Phase.DECODE, _set("seq_lens", 0, 0), "seq_lens[0]", "the new token is part of the row"),
    (Phase.DECODE, _table(1, 3, 10_000), "slot of position", "slots of the pool"),
    (Phase.PREFILL, _batch(extend_lens=None), "extend_lens", "extend_lens=None"),
    (Phase.PREFILL, _set("extend_lens", 0, 50), "extend_lens[0]", "extend_lens[0]=50 (supported: 0..seq_lens[0]"),
    (Phase.PREFILL, _batch(extend_lens_cpu=[1, 1, 1]), "extend_lens_cpu", "equal to extend_lens"),
    (Phase.PREFILL, _batch(out_cache_loc=lambda c: c.batch.out_cache_loc[1:]), "num_tokens", "sum(extend_lens)"),
    (Phase.TARGET_VERIFY, _spec(custom_mask=lambda c: c.batch.spec.custom_mask[:, :3]),
     "spec.custom_mask.shape", "[3, 4, 4]"),
    (Phase.TARGET_VERIFY, _spec(custom_mask=lambda c: c.batch.spec.custom_mask.int()),
     "spec.custom_mask.dtype", "torch.bool"),
    (Phase.TARGET_VERIFY, _spec(custom_mask=None), "spec.custom_mask", "tree mask when topk=2"),
    (Phase.TARGET_VERIFY, _set("seq_lens", 1, 2), "seq_lens[1]", ">= 4"),
    (Phase.TARGET_VERIFY, _spec(num_draft_tokens=5), "num_tokens", "num_draft_tokens 5"),
    (Phase.TARGET_VERIFY, _batch(spec=None), "spec", "a SpecInfo"),
    (Phase.DRAFT_EXTEND, _set("extend_lens", 1, 0), "extend_lens[1]", "extend_lens[1]=0 (supported: 1.."),
    (Phase.DRAFT_EXTEND, _set("extend_lens", 0, 4), "extend_lens[0]", "draft_extend_len=3"),
    (Phase.DRAFT_EXTEND, _spec(draft_extend_len=2), "num_tokens", "draft_extend_len 2"),
    (Phase.DRAFT_DECODE, _spec(draft_path=None), "spec.draft_path", "draft_path=None"),
    (Phase.DRAFT_DECODE, _spec(draft_path=lambda c: c.batch.spec.draft_path[:, :1]),
     "spec.draft_path.shape", "draft_step + 1 = 2"),
    (Phase.DRAFT_DECODE, _spec(draft_step=-1), "spec.draft_step", ">= 0"),
    (Phase.DRAFT_DECODE, _set("out_cache_loc", 3, 1), "out_cache_loc[3]", "spec.draft_path[3, 1]"),
]


@pytest.mark.parametrize("phase, mutate, field, text", BAD, ids=[f"{p.value}-{f}" for p, _, f, _ in BAD])
def test_bad_field_is_named(phase: Phase, mutate: Callable[[Case], None], field: str, text: str) -> None:
    case = case_of(phase)
    mutate(case)
    with pytest.raises(ValueError) as err:
        validate_batch(case.batch, case.pool, case.config)
    if isinstance(err.value, BatchValidationError):
        assert err.value.field.startswith(field)
    assert text in str(err.value) and "supported: " in str(err.value)


FORWARD_BAD = [
    (lambda c: (c.q[:, :1], c.k, c.v, 0), "q.shape"),
    (lambda c: (c.q.int(), c.k, c.v, 0), "q.dtype"),
    (lambda c: (c.q, None, c.v, 0), "k"),
    (lambda c: (c.q, c.k[:, :, :4], c.v, 0), "k.shape"),
    (lambda c: (c.q, c.k, c.v, 5), "layer"),
]


@pytest.mark.parametrize("args, field", FORWARD_BAD, ids=[f for _, f in FORWARD_BAD])
def test_bad_forward_argument_is_named(args: Callable[[Case], tuple[Any, ...]], field: str) -> None:
    case = case_of(Phase.DECODE)
    q, k, v, layer = args(case)
    with pytest.raises(BatchValidationError) as err:
        validate_forward(q, k, v, layer, case.batch, case.pool, case.config)
    assert err.value.field == field and str(err.value).startswith(f"{field}=")


def test_padded_rows_only_get_range_checks() -> None:
    case = case_of(Phase.TARGET_VERIFY)
    req = int(case.batch.req_pool_indices[2])
    case.batch.req_pool_indices[2] = 0
    case.batch.seq_lens[2] = 1  # the graph fill value: below num_draft_tokens
    case.batch.out_cache_loc[-4:] = 0
    validate_batch(case.batch, case.pool, case.config)
    case.batch.req_pool_indices[2] = req  # the same row, real: its seq len is refused
    with pytest.raises(ValueError, match=r"seq_lens\[2\]"):
        validate_batch(case.batch, case.pool, case.config)


# --- the debug switch ---------------------------------------------------------------------------------

def _bad_decode() -> tuple[Case, TorchBackend]:
    case = case_of(Phase.DECODE)
    case.batch.out_cache_loc[1] = case.pool.num_slots + 7
    return case, TorchBackend(case.config, case.pool)


def test_debug_switch_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    set_debug(None)
    monkeypatch.setenv(ENV_VAR, "0")
    assert not debug_enabled()
    monkeypatch.setenv(ENV_VAR, "1")
    assert debug_enabled()
    set_debug(False)
    try:
        assert not debug_enabled()
    finally:
        set_debug(None)


def test_forward_and_metadata_validate_only_in_debug(debug: None) -> None:
    case, backend = _bad_decode()
    with pytest.raises(BatchValidationError, match=r"out_cache_loc\[1\]"):
        backend.init_forward_metadata(case.batch)
    with pytest.raises(BatchValidationError, match=r"out_cache_loc\[1\]"):
        backend.forward(case.q, case.k, case.v, 0, case.batch)
    set_debug(False)
    backend.init_forward_metadata(case.batch)  # not checked: no error from validation
    with pytest.raises(IndexError):  # the bad slot reaches index_copy_
        backend.forward(case.q, case.k, case.v, 0, case.batch)


def test_validation_never_runs_inside_a_capture(debug: None) -> None:
    case = case_of(Phase.DECODE)
    backend = TorchBackend(case.config, case.pool)
    backend.init_graph_state(3, 3)
    backend.init_capture_metadata(case.batch)  # outside the capture: validated (and valid)
    case.batch.out_cache_loc[0] = 1  # a slot of the pool, but not the one of row 0's new position
    with pytest.raises(BatchValidationError, match=r"out_cache_loc\[0\]"):  # eager, debug on: refused
        backend.forward(case.q, case.k, case.v, 0, case.batch)
    # Inside a capture validation is skipped: run, it would refuse the batch (or, reading the
    # host, be a CaptureError). The capture succeeding is what proves it did not run.
    out = EmulatedGraph().capture(lambda: backend.forward(case.q, case.k, case.v, 0, case.batch))
    assert out.shape == case.q.shape


def test_forward_batch_type_is_checked() -> None:
    case = case_of(Phase.DECODE)
    bad = ForwardBatch(Phase.DECODE, [1, 2, 3], case.batch.seq_lens, case.batch.out_cache_loc)  # type: ignore[arg-type]
    with pytest.raises(BatchValidationError, match="req_pool_indices=list"):
        validate_batch(bad, case.pool)
    assert torch.is_tensor(case.batch.seq_lens)
