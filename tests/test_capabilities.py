import pytest

from attnhal.capabilities import (
    AttentionRequest,
    BackendCapabilities,
    Feature,
    FillTerm,
    Phase,
    ReasonCode,
    SeqLenFill,
    SpecLimits,
    Tolerance,
    not_supported_reasons,
)
from attnhal.plan import SpecConfig
from attnhal.platform import Vendor, parse

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
