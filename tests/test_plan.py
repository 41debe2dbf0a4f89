"""The planner: properties over generated descriptors, spec configs and platforms."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
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


# --- the schema-v2 fields: variants, run limits, context, roles, policy -------------------------

from attnhal.capabilities import Facts, IntSet, SeqLenFill, Variant, When  # noqa: E402
from attnhal.spec import KV_DTYPES, ModelKind, RequestContext, SpecAlgorithm  # noqa: E402
from attnhal.testing.strategies import spec_limits  # noqa: E402

GRAPHLESS_VENDOR_FACTS = ("model", "page_size", "kv_dtype", "topk", "num_steps", "algorithm")
ALGORITHMS = [a for a in SpecAlgorithm if a is not SpecAlgorithm.NONE]


def int_sets():
    return st.one_of(st.frozensets(st.integers(1, 6), min_size=1).map(IntSet),
                     st.builds(IntSet, min=st.none() | st.integers(1, 4), max=st.none() | st.integers(2, 8)))


def whens(vendor_facts: bool = True):
    options = {"model": st.frozensets(st.sampled_from(list(ModelKind)), min_size=1),
               "page_size": int_sets(), "topk": int_sets(), "num_steps": int_sets(),
               "kv_dtype": st.frozensets(st.sampled_from(KV_DTYPES), min_size=1),
               "algorithm": st.frozensets(st.sampled_from(list(SpecAlgorithm)), min_size=1)}
    if vendor_facts:
        options |= {"vendor": st.frozensets(st.sampled_from(list(Vendor)), min_size=1),
                    "arch": st.just({Vendor.CUDA: ("sm90..",), Vendor.HIP: ("gfx942",)})}
    return st.fixed_dictionaries({}, optional=options).filter(bool).map(lambda d: When(**d))


@st.composite
def conditional_descriptors(draw, vendors=tuple(Vendor), vendor_facts=True):
    """descriptors() plus run limits, models, page sizes, per-phase fills and up to 4 variants."""
    base = draw(descriptors(vendors=vendors, min_arch=vendor_facts))
    phases = sorted(base.phases)
    graphable = [p for p in phases if p in GRAPH_PHASES]
    limits_by_phase = lambda keys: st.dictionaries(st.sampled_from(keys), st.none() | spec_limits()) if keys \
        else st.just({})  # noqa: E731
    changes = st.fixed_dictionaries({}, optional={
        "graph": limits_by_phase(graphable), "run_limits": limits_by_phase(phases),
        "multi_step": st.none() | spec_limits(),
        "page_sizes": st.frozensets(st.sampled_from([1, 16, 64]), min_size=1),
        "models": st.frozensets(st.sampled_from(list(ModelKind)), min_size=1),
    })
    variants = draw(st.lists(st.builds(Variant, whens(vendor_facts), changes.filter(bool)), max_size=4))
    run_limits = draw(st.dictionaries(st.sampled_from(phases), spec_limits())) if phases else {}
    fills = draw(st.dictionaries(st.sampled_from(graphable), st.builds(
        SeqLenFill, st.integers(0, 2), at_least=st.integers(0, 2), at_least_plus=st.sampled_from(list(FillTerm))))) \
        if graphable else {}
    return replace(base, variants=tuple(variants), run_limits=run_limits, phase_fill=fills,
                   page_sizes=draw(st.frozensets(st.sampled_from([1, 16, 64]), min_size=1)))


from attnhal.capabilities import FillTerm  # noqa: E402

contexts = st.builds(RequestContext, model=st.none() | st.sampled_from(list(ModelKind)),
                     page_size=st.none() | st.sampled_from([1, 16, 64]),
                     kv_dtype=st.none() | st.sampled_from(KV_DTYPES))


@st.composite
def algorithm_specs(draw):
    spec = draw(spec_configs())
    if not spec.speculative:
        return spec
    return SpecConfig(draw(st.sampled_from(ALGORITHMS)), spec.num_steps, spec.topk, spec.num_draft_tokens)


@st.composite
def policies_for(draw, spec):
    # Adaptive step counts the spec can take: a tree keeps its draft-token count.
    lowest = 1 if spec.topk == 1 else -(-(spec.num_draft_tokens - 1) // spec.topk)
    return GraphPolicy(enabled=draw(st.booleans()), max_batch_size=draw(st.integers(1, 64)),
                       disabled_phases=draw(st.frozensets(st.sampled_from(GRAPH_PHASES))),
                       step_counts=draw(st.none() | st.lists(st.integers(lowest, 6), min_size=1, max_size=3)),
                       max_tokens=draw(st.none() | st.integers(1, 256)))


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
    assert p.valid == (all(not d.blocking for d in p.phases.values()) and all(a.valid for a in p.adaptive.values()))


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
