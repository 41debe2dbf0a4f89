"""The planner: properties over generated descriptors, spec configs and platforms."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnhal.capabilities import BackendCapabilities, Facts, SpecLimits
from attnhal.capabilities.files import load_descriptor
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.platform import Vendor, parse
from attnhal.reasons import ReasonCode
from attnhal.spec import RequestContext, SpecAlgorithm, SpecConfig
from attnhal.testing.strategies import descriptors, graph_policies, platforms, spec_configs
from conditional_strategies import algorithm_specs, conditional_descriptors, contexts, policies_for

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
    running = {ph for ph in GRAPH_PHASES if p[ph].runs}
    # A vendor whose row names no graph implementation (NPU, MUSA) captures nothing, and says why.
    assert p.valid and set(p.captured) == (running if platform.graph_device_error is None else set())
    if platform.graph_device_error is not None:
        assert all(p[ph].reasons[0].code is ReasonCode.GRAPH_DEVICE_UNAVAILABLE for ph in running)


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


def test_tree_draft_tokens_reach_every_candidate_node_as_sglang_selects_them():
    """Verify takes the best num_draft_tokens - 1 of topk + (num_steps - 1) * topk^2 candidates:
    3 steps, topk 4 -> up to 4 + 2 * 16 + 1 = 37 tokens (16 is a common SGLang setting)."""
    assert SpecConfig.eagle(3, topk=4, num_draft_tokens=16).num_draft_tokens == 16
    assert SpecConfig.eagle(3, topk=4, num_draft_tokens=37).max_draft_tokens == 37
    with pytest.raises(ValueError, match=r"num_draft_tokens=38 \(supported: 2..37 "):
        SpecConfig.eagle(3, topk=4, num_draft_tokens=38)
    assert SpecConfig.eagle(5).max_draft_tokens == 6  # a chain: num_steps + 1


def test_spec_config_validation_names_fields():
    with pytest.raises(ValueError, match="num_steps=0"):
        SpecConfig.eagle(0)
    with pytest.raises(ValueError, match=r"^num_draft_tokens=0 \(supported: 2\.\.\d+; a tree, topk=2 > 1, must give "
                                         r"the tokens it verifies\)$"):
        SpecConfig.eagle(2, topk=2)
    with pytest.raises(ValueError, match=r"num_draft_tokens=9 \(supported: 2..7"):
        SpecConfig.eagle(2, topk=2, num_draft_tokens=9)
    assert SpecConfig.eagle(3).num_draft_tokens == 4
    with pytest.raises(ValueError, match="batch_sizes"):
        GraphPolicy(batch_sizes=(0,))


def test_capture_sizes():
    assert GraphPolicy(max_batch_size=20).capture_sizes() == (1, 2, 4, 8, 16, 20)
    assert GraphPolicy(batch_sizes=(4, 1, 4)).capture_sizes() == (1, 4)


# --- the schema-v2 fields: variants, run limits, context, roles, policy -------------------------

maybe_cond = st.none() | conditional_descriptors()


@settings(max_examples=60)
@given(algorithm_specs(), platforms(), contexts, st.data(),
       st.tuples(*[maybe_cond] * 6), st.sampled_from(["prefill", "decode"]))
def test_v2_never_raises_and_every_no_has_a_reason(spec, platform, context, data, roles, mode):
    target, draft, extend, prefill, decode, verify = roles
    backends = PhaseBackends(target, draft, extend, prefill, decode, verify, speculative_attention_mode=mode)
    p = plan(spec, platform, backends, data.draw(policies_for(spec)), context)
    for sub in (p, *p.adaptive.values()):
        for phase, d in sub.phases.items():
            assert d.capture <= d.runs and (d.capture or d.reasons), f"{phase} has no reason"
            assert all("=" in r.message and "(supported: " in r.message for r in d.reasons)
            assert d.capture == bool(d.capture_sizes) and (d.seq_len_fill is not None) == d.capture
    assert not set(p.unfit_steps) & set(p.adaptive)
    assert all(r.code is ReasonCode.STEP_COUNT and "(supported: " in r.message for r in p.unfit_steps.values())
    assert p.valid == (not p.unfit_steps and all(not d.blocking for d in p.phases.values())
                       and all(a.valid for a in p.adaptive.values()))


@settings(max_examples=60)
@given(algorithm_specs(), contexts, st.data(),
       conditional_descriptors(vendors=(Vendor.CUDA, Vendor.HIP), vendor_facts=False),
       conditional_descriptors(vendors=(Vendor.CUDA, Vendor.HIP), vendor_facts=False))
def test_v2_vendor_symmetry(spec, context, data, target, draft):
    both = {Vendor.CUDA, Vendor.HIP}
    target, draft = replace(target, vendors=both), replace(draft, vendors=both)
    b = PhaseBackends(target, draft, draft, decode=draft)
    policy = data.draw(policies_for(spec))
    cuda, hip = (plan(spec, parse(s), b, policy, context) for s in ("cuda:sm90", "hip:gfx942"))
    assert cuda.to_dict()["phases"] == hip.to_dict()["phases"] and cuda.valid == hip.valid


EXPLICIT_ROLE = {Phase.PREFILL: "prefill", Phase.DECODE: "decode", Phase.TARGET_VERIFY: "target_verify",
                 Phase.DRAFT_DECODE: "draft_decode", Phase.DRAFT_EXTEND: "draft_extend"}


@settings(max_examples=50)
@given(algorithm_specs(), platforms(), contexts, st.sampled_from(list(Phase)), st.sampled_from(["prefill", "decode"]),
       st.lists(st.integers(0, 2), min_size=5, max_size=5), st.tuples(*[conditional_descriptors()] * 3))
def test_v2_each_phase_reads_only_its_own_backend_including_split_roles(spec, platform, context, phase, mode,
                                                                        picks, pool):
    *_, other = pool
    target, draft, extend, prefill, decode = (pool[i] for i in picks)
    first = PhaseBackends(target, draft, extend, prefill=prefill, decode=decode, speculative_attention_mode=mode)
    own = first.for_phase(phase)
    # Every role is `other` except the one this phase reads, set explicitly.
    second = PhaseBackends(**{**dict.fromkeys(EXPLICIT_ROLE.values(), other), "target": other,
                              EXPLICIT_ROLE[phase]: own})
    a, b = plan(spec, platform, first, context=context), plan(spec, platform, second, context=context)
    assert replace(a[phase], role=None) == replace(b[phase], role=None)


@given(algorithm_specs(), platforms(), contexts, conditional_descriptors())
def test_v2_run_limit_violated_means_invalid(spec, platform, context, caps):
    p = plan(spec, platform, PhaseBackends(caps, caps, caps), context=context)
    resolved = caps.resolve(Facts.of(platform, context, spec))
    for phase, d in p.phases.items():
        limits = resolved.run_limits.get(phase)
        if d.runs and limits is not None and limits.violations(spec, ReasonCode.SPEC_LIMIT, "x"):
            assert not p.valid and d.blocking and not d.capture
            if not resolved.platform_reasons(platform):
                assert ReasonCode.SPEC_LIMIT in {r.code for r in d.reasons}


@given(conditional_descriptors(), platforms(), contexts, algorithm_specs())
def test_resolve_is_the_base_plus_matching_variants_in_order(caps, platform, context, spec):
    facts = Facts.of(platform, context, spec)
    resolved = caps.resolve(facts)
    matching = [v for v in caps.variants if v.when.matches(facts)]
    assert resolved.applied == tuple(v.note or f"when {v.when}" for v in matching)
    assert resolved.resolve(facts) == resolved  # resolving twice changes nothing
    if not matching:
        assert resolved is caps


# --- Python API validation at the public entry points --------------------------------

@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(num_steps="3"), TypeError, "num_steps='3' (supported: an int, got str)"),
    (dict(num_steps=1.5), TypeError, "num_steps=1.5"),
    (dict(num_steps=True), TypeError, "num_steps=True"),
    (dict(num_steps=65), ValueError, "num_steps=65 (supported: 1..64)"),
    (dict(num_steps=2, topk=65, num_draft_tokens=3), ValueError, "topk=65 (supported: 1..64)"),
    (dict(num_steps=2, topk=2, num_draft_tokens=2.0), TypeError, "num_draft_tokens=2.0"),
    (dict(num_steps=64, topk=64, num_draft_tokens=1025), ValueError, "num_draft_tokens=1025 (supported: 2..1024)"),
    (dict(num_steps=2, algorithm="medusa"), ValueError, "algorithm='medusa' (supported: none, eagle"),
])
def test_spec_config_refuses_wrong_types_and_out_of_bounds(kwargs, error, needle):
    algorithm = kwargs.pop("algorithm", "eagle")
    with pytest.raises(error) as exc:
        SpecConfig.eagle(**kwargs, algorithm=algorithm) if algorithm == "eagle" else SpecConfig(algorithm, **kwargs)
    assert needle in str(exc.value)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(max_batch_size=4097), ValueError, "max_batch_size=4097 (supported: 1..4096)"),
    (dict(max_batch_size="32"), TypeError, "max_batch_size='32'"),
    (dict(batch_sizes=tuple(range(1, 258))), ValueError, "(supported: 1..256 values, got 257)"),
    (dict(batch_sizes=(1, 5000)), ValueError, "batch_sizes=5000 (supported: 1..4096)"),
    (dict(batch_sizes="8"), TypeError, "batch_sizes='8'"),
    (dict(step_counts=(1, 65)), ValueError, "step_counts=65 (supported: 1..64)"),
    (dict(disabled_phases={"verify"}), ValueError, "phase='verify'"),
    (dict(enabled="yes"), TypeError, "enabled='yes'"),
])
def test_graph_policy_bounds_name_the_bound(kwargs, error, needle):
    with pytest.raises(error) as exc:
        GraphPolicy(**kwargs)
    assert needle in str(exc.value)


def test_plan_argument_types():
    spec = SpecConfig.eagle(2)
    backends = PhaseBackends.same(TRITON_LIKE, spec)
    assert plan(spec, "hip:gfx942", backends).to_dict() == plan(spec, parse("hip:gfx942"), backends).to_dict()
    with pytest.raises(TypeError, match="platform=None"):
        plan(spec, None, backends)
    with pytest.raises(TypeError, match="spec="):
        plan("eagle", "cuda:sm90", backends)
    with pytest.raises(TypeError, match="backends="):
        plan(spec, "cuda:sm90", TRITON_LIKE)
    with pytest.raises(TypeError, match="context="):
        plan(spec, "cuda:sm90", backends, None, {"page_size": 16})
    with pytest.raises(TypeError, match="caps='torch'"):
        PhaseBackends.same("torch", spec)
    with pytest.raises(TypeError, match="draft_extend='torch'"):
        PhaseBackends(TRITON_LIKE, draft_extend="torch")
    with pytest.raises(ValueError, match="speculative_attention_mode='verify'"):
        PhaseBackends(TRITON_LIKE, speculative_attention_mode="verify")


def test_request_context_validation():
    with pytest.raises(ValueError, match="model='moe'"):
        RequestContext(model="moe")
    with pytest.raises(ValueError, match="kv_dtype='int4'"):
        RequestContext(kv_dtype="int4")
    with pytest.raises(ValueError, match="page_size=0"):
        RequestContext(page_size=0)
    with pytest.raises(TypeError, match="head_size='128'"):
        RequestContext(head_size="128")


def test_old_import_paths_still_work():
    import attnhal
    from attnhal.spec import SpecAlgorithm as A, SpecConfig as C

    assert C is attnhal.SpecConfig and A is attnhal.SpecAlgorithm
    assert SpecConfig.ngram(5).num_draft_tokens == 5 and SpecConfig.ngram(5).algorithm is SpecAlgorithm.NGRAM
