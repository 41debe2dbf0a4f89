import pytest

from attnhal.capabilities import (
    AttentionRequest,
    BackendCapabilities,
    FillTerm,
    SeqLenFill,
    SpecLimits,
    Tolerance,
    not_supported_reasons,
)
from attnhal.phases import Feature, Phase
from attnhal.platform import Vendor, parse
from attnhal.reasons import ReasonCode
from attnhal.spec import SpecConfig

CAPS = BackendCapabilities(
    name="demo", vendors={"cuda", "hip"}, phases={"prefill", "decode"}, graph={"decode": SpecLimits()},
    min_arch={"cuda": "sm80", "hip": "gfx942"}, dtypes={"float16"}, head_sizes={64, 128},
    features={"custom_mask"},
)


def codes(reasons):
    return [r.code for r in reasons]


def test_supported_request_has_no_reasons():
    req = AttentionRequest(phase=Phase.DECODE, dtype="float16", head_size=128, num_q_heads=32, num_kv_heads=8)
    assert not_supported_reasons(CAPS, req, parse("cuda:sm90")) == []


def test_every_mismatch_is_a_reason_with_field_value_and_supported():
    req = AttentionRequest(phase=Phase.TARGET_VERIFY, dtype="float32", kv_dtype="fp8_e4m3", head_size=96,
                           page_size=16, num_q_heads=6, num_kv_heads=4, features=frozenset({Feature.SINKS}))
    reasons = not_supported_reasons(CAPS, req, parse("cuda:sm90"))
    assert codes(reasons) == [ReasonCode.PHASE, ReasonCode.DTYPE, ReasonCode.KV_DTYPE, ReasonCode.HEAD_SIZE,
                              ReasonCode.PAGE_SIZE, ReasonCode.FEATURE, ReasonCode.HEAD_RATIO]
    msgs = [r.message for r in reasons]
    assert "head_size=96 (supported: {64, 128})" in msgs
    assert "dtype=float32 (supported: {float16})" in msgs
    assert all("=" in m and "(supported: " in m for m in msgs)


def test_vendor_and_arch():
    assert codes(not_supported_reasons(CAPS, AttentionRequest(), parse("cpu"))) == [ReasonCode.VENDOR]
    r = not_supported_reasons(CAPS, AttentionRequest(), parse("hip:gfx90a"))
    assert codes(r) == [ReasonCode.ARCH] and r[0].message == "arch=gfx90a (supported: >= gfx942)"
    assert not_supported_reasons(CAPS, AttentionRequest(), parse("hip:gfx950")) == []


@pytest.mark.parametrize("kwargs, needle", [
    (dict(graph={"draft_extend": SpecLimits()}), "graph=['draft_extend']"),
    (dict(phases={"prefill"}, graph={"prefill": SpecLimits()}), "graph=prefill"),
    (dict(dtypes={"float64"}), "dtypes=['float64']"),
    (dict(head_sizes={0}), "head_sizes=[0]"),
    (dict(min_arch={"hip": "mi300"}), "min_arch.hip"),
    (dict(tolerances={"int8": (1.0, 1.0)}), "tolerances=['int8']"),
])
def test_malformed_descriptor_names_the_field(kwargs, needle):
    base = dict(name="bad", vendors={"cuda"}, phases={"decode", "prefill"})
    with pytest.raises(ValueError) as exc:
        BackendCapabilities(**{**base, **kwargs})
    assert needle in str(exc.value)


def test_bad_enum_values_raise():
    with pytest.raises(ValueError):
        BackendCapabilities(name="x", vendors={"intel"}, phases=set())
    with pytest.raises(ValueError):
        BackendCapabilities(name="x", vendors={"cuda"}, phases={"verify"})


def test_equal_descriptors_compare_and_hash_equal():
    a = BackendCapabilities(name="x", vendors=["cuda", "hip"], phases=["decode"], graph={"decode": SpecLimits()})
    b = BackendCapabilities(name="x", vendors={Vendor.HIP, Vendor.CUDA}, phases={Phase.DECODE},
                            graph={Phase.DECODE: SpecLimits()})
    assert a == b and hash(a) == hash(b)


def test_spec_limits_violations():
    spec = SpecConfig.eagle(3, topk=4, num_draft_tokens=8)
    got = SpecLimits(max_topk=1, max_num_steps=5, max_draft_tokens=4).violations(spec, ReasonCode.GRAPH_LIMIT, "x")
    assert [r.message for r in got] == ["topk=4 (supported: <= 1 for x)", "draft_tokens=8 (supported: <= 4 for x)"]
    assert SpecLimits().violations(spec, ReasonCode.GRAPH_LIMIT, "x") == []


def test_seq_len_fill_depends_on_spec():
    spec = SpecConfig.eagle(3, topk=2, num_draft_tokens=6)
    assert SeqLenFill().value(spec) == 1
    assert SeqLenFill(0, FillTerm.NUM_DRAFT_TOKENS).value(spec) == 6
    assert SeqLenFill(1, FillTerm.NUM_STEPS).value(spec) == 4
    assert SeqLenFill(1, FillTerm.NUM_STEPS).value(None) == 1


def test_default_tolerances_and_override():
    caps = BackendCapabilities(name="x", vendors={"cpu"}, phases=set(), tolerances={"float16": (1e-2, 1e-2)})
    assert caps.tolerance("float32").atol == 1e-4
    assert caps.tolerance("float16") == Tolerance(1e-2, 1e-2)


# --- conditions and variants --------------------------------------------------------------------
from attnhal.capabilities import Facts, IntSet, Variant, When  # noqa: E402
from attnhal.spec import ModelKind, RequestContext  # noqa: E402


def test_when_matches_all_given_facts_and_never_an_unknown_one():
    facts = Facts.of(parse("hip:gfx942"), RequestContext(model="mla", page_size=64), SpecConfig.eagle(3, 2, 4))
    assert When(model={"mla"}, page_size=IntSet(min=2)).matches(facts)
    assert not When(model={"mla"}, page_size=IntSet(max=32)).matches(facts)
    assert When(arch={"hip": ("gfx942", "gfx950")}, topk=IntSet(frozenset({2}))).matches(facts)
    assert not When(arch={"cuda": ("sm80..",)}).matches(facts)  # another vendor's archs
    assert not When(kv_dtype={"fp8_e4m3"}).matches(facts)  # kv dtype not given: no match
    assert When(fp8={"e4m3fnuz"}, algorithm={"eagle"}).matches(facts)
    with pytest.raises(ValueError, match="at least one condition"):
        When()
    with pytest.raises(ValueError, match="when.dtype"):
        When(dtype={"float64"})


def test_variant_validation_names_the_field():
    with pytest.raises(ValueError, match="variant field=name"):
        Variant(When(topk={2}), {"name": "x"})
    with pytest.raises(ValueError, match="changes nothing"):
        Variant(When(topk={2}))
    base = dict(name="v", vendors={"cuda"}, phases={"decode"}, graph={"decode": SpecLimits()})
    with pytest.raises(ValueError, match=r"variants\[0\] \(when topk \{2\}\).*graph=\['target_verify'\]"):
        BackendCapabilities(**base, variants=(Variant(When(topk={2}), {"graph": {"target_verify": SpecLimits()}}),))


def test_variants_apply_in_order_and_a_dropped_phase_drops_its_claims():
    caps = BackendCapabilities(
        name="v", vendors={"cuda"}, phases={"decode", "draft_extend"},
        graph={"decode": SpecLimits(), "draft_extend": SpecLimits()}, run_limits={"draft_extend": SpecLimits(1)},
        variants=(Variant(When(topk=IntSet(min=2)), {"page_sizes": {16}}),
                  Variant(When(topk=IntSet(min=3)), {"page_sizes": {32}}, remove={"phases": {"draft_extend"}})))
    two = caps.resolve(Facts.of(spec=SpecConfig.eagle(2, 2, 3)))
    three = caps.resolve(Facts.of(spec=SpecConfig.eagle(2, 3, 3)))
    assert two.page_sizes == {16} and three.page_sizes == {32}
    assert Phase.DRAFT_EXTEND not in three.graph and Phase.DRAFT_EXTEND not in three.run_limits
    assert caps.resolve(Facts()) is caps


def test_not_supported_reasons_resolves_variants_and_checks_the_model():
    caps = BackendCapabilities(name="m", vendors={"cuda"}, phases={"decode"}, models={"mha", "mla"},
                               variants=(Variant(When(model={"mla"}), {"head_sizes": {576}}),))
    assert not_supported_reasons(caps, AttentionRequest(model=ModelKind.MLA, head_size=576), parse("cuda:sm90")) == []
    r = not_supported_reasons(caps, AttentionRequest(model=ModelKind.GQA, head_size=576), parse("cuda:sm90"))
    assert codes(r) == [ReasonCode.MODEL, ReasonCode.HEAD_SIZE]
    assert BackendCapabilities(name="x", vendors={"cuda"}, phases=set(), features={"mla"}).models == {
        ModelKind.MHA, ModelKind.GQA, ModelKind.MLA}


def test_archs_claim():
    caps = BackendCapabilities(name="a", vendors={"cuda", "hip"}, phases={"decode"},
                               archs={"cuda": ("sm80..sm90",), "hip": ("gfx942", "gfx950")})
    assert not_supported_reasons(caps, AttentionRequest(), parse("cuda:sm89")) == []
    r = not_supported_reasons(caps, AttentionRequest(), parse("cuda:sm100"))
    assert codes(r) == [ReasonCode.ARCH] and r[0].message == "arch=sm100 (supported: cuda sm80..sm90)"
    assert codes(not_supported_reasons(caps, AttentionRequest(), parse("hip:gfx90a"))) == [ReasonCode.ARCH]


def test_fill_rules_with_width_and_max():
    spec = SpecConfig.eagle(3, topk=2, num_draft_tokens=6)
    rule = SeqLenFill(1, at_least=1, at_least_plus=FillTerm.WIDTH)
    assert str(rule) == "max(1, 1 + width)"
    assert rule.value(spec, Phase.TARGET_VERIFY) == 7 and rule.value(spec, Phase.DRAFT_DECODE) == 3
    assert rule.value(spec, Phase.DECODE) == 2 and SeqLenFill(0, FillTerm.TOPK).value(spec) == 2
