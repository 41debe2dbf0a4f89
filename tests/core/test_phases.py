"""attnhal.phases: which phases run (phases_run, not_run_reason) and how wide each is (tokens_per_row)."""

import pytest
import torch
from hypothesis import given

from attnhal.backend import ForwardBatch, SpecInfo
from attnhal.graphs.runner import tokens_per_row as runner_tokens_per_row
from attnhal.phases import ALGORITHM_PHASES, Phase, not_run_reason, phases_run, tokens_per_request, tokens_per_row
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.reasons import ReasonCode
from attnhal.spec import SpecAlgorithm, SpecConfig
from attnhal.testing.cases import build_case
from attnhal.testing.strategies import descriptors, platforms, spec_configs
from cases import random_spec

# num_draft_tokens (3) != draft_extend_len (4) in the chain, and topk (4) > 1 in the tree,
# so that each phase's width comes from one quantity only.
CHAIN = SpecConfig.eagle(3, topk=1, num_draft_tokens=3)
TREE = SpecConfig.eagle(3, topk=4, num_draft_tokens=8)
#: Per phase: (tokens per row, tokens per request) of CHAIN and of TREE.
WIDTHS = {
    Phase.PREFILL: ((None, 0), (None, 0)),
    Phase.DECODE: ((1, 1), (1, 1)),
    Phase.DRAFT_DECODE: ((1, 1), (1, 4)),
    Phase.DRAFT_EXTEND: ((4, 4), (8, 8)),
    Phase.TARGET_VERIFY: ((3, 3), (8, 8)),
}


def test_the_specs_separate_the_widths():
    assert (CHAIN.num_draft_tokens, CHAIN.draft_extend_len, CHAIN.topk) == (3, 4, 1)
    assert (TREE.num_draft_tokens, TREE.draft_extend_len, TREE.topk) == (8, 8, 4)


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("which", [0, 1], ids=["chain", "tree"])
def test_tokens_per_row_and_per_request_of_every_phase(phase, which):
    spec = (CHAIN, TREE)[which]
    per_row, per_request = WIDTHS[phase][which]
    assert tokens_per_row(phase, spec) == per_row
    assert tokens_per_request(phase, spec) == per_request


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("which", [0, 1], ids=["chain", "tree"])
def test_batch_case_and_runner_delegate_to_tokens_per_row(phase, which):
    spec = (CHAIN, TREE)[which]
    recipe = random_spec(phase, seed=which, spec=spec)
    case = build_case(recipe)
    want = tokens_per_row(phase, recipe.spec)
    assert recipe.tokens_per_row == want
    assert case.batch.tokens_per_row == want
    if phase is Phase.PREFILL:
        with pytest.raises(ValueError, match="phase=prefill"):
            runner_tokens_per_row(phase, spec)
    else:
        assert runner_tokens_per_row(phase, spec) == WIDTHS[phase][which][0]
        # A batch's rows hold exactly its tokens in every uniform phase.
        assert case.batch.num_tokens == case.batch.batch_size * want


def test_tokens_per_row_reads_a_spec_info_of_its_own_widths():
    info = SpecInfo(topk=2, num_draft_tokens=5, draft_extend_len=7)
    assert [tokens_per_row(p, info) for p in Phase] == [None, 1, 1, 7, 5]


def test_tokens_per_row_needs_the_spec_only_where_it_is_read():
    assert [tokens_per_row(p, None) for p in (Phase.PREFILL, Phase.DECODE, Phase.DRAFT_DECODE)] == [None, 1, 1]
    for phase in (Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND):
        with pytest.raises(ValueError, match=f"spec=None .*phase={phase.value}"):
            tokens_per_row(phase, None)
    empty = torch.zeros(2, dtype=torch.int64)
    batch = ForwardBatch(phase=Phase.TARGET_VERIFY, req_pool_indices=empty, seq_lens=empty, out_cache_loc=empty)
    with pytest.raises(ValueError, match="spec=None"):
        batch.tokens_per_row


@pytest.mark.parametrize("algorithm", list(SpecAlgorithm))
@pytest.mark.parametrize("num_steps", [1, 2, 5])
def test_phases_run_is_the_algorithm_row_without_a_one_step_draft(algorithm, num_steps):
    spec = SpecConfig(algorithm, num_steps, 1)
    want = set(ALGORITHM_PHASES[algorithm]) - ({Phase.DRAFT_DECODE} if num_steps == 1 else set())
    assert phases_run(spec) == want
    for phase in Phase:
        why = not_run_reason(phase, spec)
        assert (why is None) == (phase in want)
        if why is not None:
            assert why.code is ReasonCode.PHASE_NOT_RUN
            assert ("num_steps=1" in why.message) == (phase in ALGORITHM_PHASES[algorithm])


def test_phases_run_spot_values():
    assert phases_run(SpecConfig()) == {Phase.PREFILL, Phase.DECODE}
    assert phases_run(SpecConfig.eagle(1)) == {Phase.PREFILL, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY}
    assert phases_run(SpecConfig.eagle(2, topk=2, num_draft_tokens=4)) == {
        Phase.PREFILL, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE, Phase.TARGET_VERIFY}
    assert phases_run(SpecConfig.ngram(5)) == {Phase.PREFILL, Phase.TARGET_VERIFY}


@given(spec_configs(), platforms(), descriptors())
def test_the_planner_runs_exactly_phases_run(spec, platform, caps):
    p = plan(spec, platform, PhaseBackends.same(caps, spec), GraphPolicy())
    assert {phase for phase in Phase if p[phase].runs} == phases_run(spec)
    for phase in Phase:
        if not p[phase].runs:
            assert p[phase].reasons == (not_run_reason(phase, spec),)
