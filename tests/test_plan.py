"""The planner: properties over generated descriptors, spec configs and platforms."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnhal.capabilities import GRAPH_PHASES, BackendCapabilities, Phase, ReasonCode, SpecLimits
from attnhal.descriptors import load_descriptor
from attnhal.plan import GraphPolicy, PhaseBackends, SpecConfig, plan
from attnhal.platform import Vendor, parse
from attnhal.testing.strategies import descriptors, graph_policies, platforms, spec_configs

ALL = tuple(Phase)
TRITON_LIKE = BackendCapabilities(
    name="triton-like", vendors={"cuda", "hip"}, phases=ALL,
    graph={p: SpecLimits() for p in GRAPH_PHASES}, multi_step=SpecLimits(), features={"custom_mask"},
)
maybe_caps = st.none() | descriptors()


def backends_for(spec, target, draft, extend):
    return PhaseBackends(target=target, draft_decode=draft if spec.num_steps > 1 else None, draft_extend=extend)


@given(spec_configs(), platforms(), maybe_caps, maybe_caps, maybe_caps, graph_policies())
def test_never_raises_and_every_no_has_a_reason(spec, platform, target, draft, extend, policy):
    p = plan(spec, platform, PhaseBackends(target, draft, extend), policy)
    assert set(p.phases) == set(Phase)
    for phase, d in p.phases.items():
        assert d.capture <= d.runs
        if not d.runs or not d.capture:
            assert d.reasons, f"{phase} has no reason"
        for r in d.reasons:
            assert "=" in r.message and "(supported: " in r.message
    assert p.valid == all(not d.blocking for d in p.phases.values())


@given(spec_configs(), descriptors(vendors=(Vendor.CUDA, Vendor.HIP), min_arch=False),
       descriptors(vendors=(Vendor.CUDA, Vendor.HIP), min_arch=False), graph_policies())
def test_vendor_symmetry(spec, target, draft, policy):
    both = {Vendor.CUDA, Vendor.HIP}
    target, draft = replace(target, vendors=both), replace(draft, vendors=both)
    b = backends_for(spec, target, draft, draft)
    cuda, hip = plan(spec, parse("cuda:sm90"), b, policy), plan(spec, parse("hip:gfx942"), b, policy)
    assert cuda.to_dict()["phases"] == hip.to_dict()["phases"]
    assert cuda.valid == hip.valid


@given(spec_configs(speculative=True).filter(lambda s: s.num_steps == 1), platforms(), maybe_caps,
       descriptors(), descriptors(), graph_policies())
def test_one_step_draft_extend_reads_only_its_own_backend(spec, platform, target, draft_a, draft_b, policy):
    """num_steps == 1: no draft_decode; draft_extend's capture depends only on the draft-extend backend."""
    extend = draft_a
    with_none = plan(spec, platform, PhaseBackends(target, None, extend), policy)
    with_other = plan(spec, platform, PhaseBackends(draft_b, draft_b, extend), policy)
    assert not with_none[Phase.DRAFT_DECODE].runs
    assert with_none[Phase.DRAFT_DECODE].reasons[0].code is ReasonCode.PHASE_NOT_RUN
    assert with_none[Phase.DRAFT_EXTEND] == with_other[Phase.DRAFT_EXTEND]


@given(spec_configs(speculative=False), platforms(), descriptors(), graph_policies())
def test_no_speculation_runs_only_prefill_and_decode(spec, platform, caps, policy):
    p = plan(spec, platform, PhaseBackends(caps, caps, caps), policy)
    assert [ph for ph in Phase if p[ph].runs] == [Phase.PREFILL, Phase.DECODE]


@given(spec_configs(speculative=True), platforms(graphs=True))
def test_draft_decode_runs_iff_more_than_one_step(spec, platform):
    p = plan(spec, platform, PhaseBackends.same(replace(TRITON_LIKE, vendors=set(Vendor)), spec))
    assert p[Phase.DRAFT_DECODE].runs == (spec.num_steps > 1)
    assert p.valid and set(p.captured) == {ph for ph in GRAPH_PHASES if p[ph].runs}


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
def test_seed_scenario_one_step_captures_draft_extend(platform):
    """SGLang PR #21709: with num_steps == 1 draft extend lost its graph; on HIP even after the fix."""
    spec = SpecConfig.eagle(num_steps=1)
    p = plan(spec, parse(platform), PhaseBackends(target=TRITON_LIKE, draft_decode=None, draft_extend=TRITON_LIKE))
    assert p.valid
    assert p[Phase.DRAFT_EXTEND].runs and p[Phase.DRAFT_EXTEND].capture
    assert p[Phase.TARGET_VERIFY].capture and not p[Phase.DRAFT_DECODE].runs


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
def test_seed_scenario_from_the_shipped_example_file(platform):
    caps = load_descriptor("docs/examples/triton-like.toml")
    spec = SpecConfig.eagle(1)
    p = plan(spec, parse(platform), PhaseBackends.same(caps, spec))
    assert p[Phase.DRAFT_EXTEND].capture


def test_missing_multi_step_backend_makes_plan_invalid():
    spec = SpecConfig.eagle(3)
    p = plan(spec, parse("cuda:sm90"), PhaseBackends(TRITON_LIKE, None, TRITON_LIKE))
    assert not p.valid and p[Phase.DRAFT_DECODE].reasons[0].code is ReasonCode.NO_BACKEND
    no_multi = replace(TRITON_LIKE, multi_step=None)
    p = plan(spec, parse("cuda:sm90"), PhaseBackends(TRITON_LIKE, no_multi, TRITON_LIKE))
    assert not p.valid and [r.code for r in p[Phase.DRAFT_DECODE].reasons] == [ReasonCode.MULTI_STEP]


def test_graph_limits_policy_and_platform_reasons():
    caps = replace(TRITON_LIKE, graph={**TRITON_LIKE.graph, Phase.TARGET_VERIFY: SpecLimits(max_topk=1)})
    spec = SpecConfig.eagle(2, topk=2, num_draft_tokens=4)
    p = plan(spec, parse("hip:gfx942"), PhaseBackends.same(caps, spec))
    assert not p[Phase.TARGET_VERIFY].capture
    assert p[Phase.TARGET_VERIFY].reasons[0].message.startswith("topk=2 (supported: <= 1")
    off = plan(spec, parse("hip:gfx942"), PhaseBackends.same(caps, spec), GraphPolicy(enabled=False))
    assert {r.code for ph in off for r in off[ph].reasons if off[ph].runs} >= {ReasonCode.GRAPHS_DISABLED}
    nographs = plan(spec, parse("hip:gfx942,nographs"), PhaseBackends.same(caps, spec))
    assert nographs[Phase.DRAFT_EXTEND].reasons[0].code is ReasonCode.NO_GRAPH_API


def test_tree_verify_needs_custom_mask():
    caps = replace(TRITON_LIKE, features=set())
    spec = SpecConfig.eagle(2, topk=2, num_draft_tokens=4)
    p = plan(spec, parse("cuda:sm90"), PhaseBackends.same(caps, spec))
    assert not p.valid and p[Phase.TARGET_VERIFY].reasons[0].code is ReasonCode.FEATURE


def test_capture_failure_is_recorded_for_that_phase_only():
    spec = SpecConfig.eagle(2)
    p = plan(spec, parse("cuda:sm90"), PhaseBackends.same(TRITON_LIKE, spec))
    failed = p.with_capture_failure(Phase.DRAFT_EXTEND, "CaptureError: .item() during capture")
    assert not failed[Phase.DRAFT_EXTEND].capture
    assert failed[Phase.DRAFT_EXTEND].reasons[-1].code is ReasonCode.CAPTURE_FAILED
    assert failed[Phase.TARGET_VERIFY] == p[Phase.TARGET_VERIFY] and failed.valid


def test_spec_config_validation_names_fields():
    with pytest.raises(ValueError, match="num_steps=0"):
        SpecConfig.eagle(0)
    with pytest.raises(ValueError, match="num_draft_tokens=0"):
        SpecConfig.eagle(2, topk=2)
    with pytest.raises(ValueError, match=r"num_draft_tokens=9 \(supported: 2..5"):
        SpecConfig.eagle(2, topk=2, num_draft_tokens=9)
    assert SpecConfig.eagle(3).num_draft_tokens == 4
    with pytest.raises(ValueError, match="batch_sizes"):
        GraphPolicy(batch_sizes=(0,))


def test_capture_sizes():
    assert GraphPolicy(max_batch_size=20).capture_sizes() == (1, 2, 4, 8, 16, 20)
    assert GraphPolicy(batch_sizes=(4, 1, 4)).capture_sizes() == (1, 4)
