"""Issue 10: each constraint real backends have, written in a descriptor file and planned.

Every test plans a realistic case from a TOML descriptor and checks the decision and
the reason code. The descriptors are modelled on the constraints the issue lists for
SGLang 0.5.23 backends (aiter, flashinfer/flashinfer-MLA, fa3, trtllm); the catalogue
cites the engine lines.
"""

import tomllib

import pytest

from attnhal.capabilities.files import parse_descriptor
from attnhal.phases import Phase
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.platform import parse
from attnhal.reasons import ReasonCode
from attnhal.registry import Registry
from attnhal.spec import RequestContext, SpecAlgorithm, SpecConfig

ALL_GRAPHS = """
phases = ["prefill", "decode", "draft_decode", "draft_extend", "target_verify"]
multi_step = true
features = ["custom_mask"]
graph = {decode = {}, draft_decode = {}, draft_extend = {}, target_verify = {}}
"""


def toml(text: str, name: str = "b", vendors: str = '["cuda", "hip"]'):
    head = f'schema_version = 2\nname = "{name}"\nvendors = {vendors}\n'
    return parse_descriptor(tomllib.loads(head + text))


def plan_with(caps, spec, platform="cuda:sm90", context=None, policy=None):
    return plan(spec, parse(platform), PhaseBackends.same(caps, spec), policy, context)


def codes(decision):
    return [r.code for r in decision.reasons]


TREE = SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
CHAIN = SpecConfig.eagle(3)


# 1. run limits ---------------------------------------------------------------------------
AITER = toml('run_limits = {draft_extend = {max_topk = 1}}\n' + ALL_GRAPHS, "aiter-like", '["hip"]')


def test_run_limit_makes_the_plan_invalid_not_eager():
    p = plan_with(AITER, TREE, "hip:gfx942")
    assert not p.valid and p[Phase.DRAFT_EXTEND].blocking and not p[Phase.DRAFT_EXTEND].capture
    assert codes(p[Phase.DRAFT_EXTEND]) == [ReasonCode.SPEC_LIMIT]
    assert "topk=2 (supported: <= 1 for running draft_extend" in p[Phase.DRAFT_EXTEND].reasons[0].message
    ok = plan_with(AITER, CHAIN, "hip:gfx942")
    assert ok.valid and ok[Phase.DRAFT_EXTEND].capture


# 2. page size ----------------------------------------------------------------------------
PAGED = toml(ALL_GRAPHS + """
page_sizes = [1, 16, 32, 64]
[[variants]]
note = "tree verify only with page size 1"
when = {page_size = {min = 2}, topk = {min = 2}}
run_limits = {target_verify = {max_topk = 1}}
""", "paged")
TRTLLM = toml("page_sizes = [16, 32, 64, 128]\n" + ALL_GRAPHS, "trtllm-like", '["cuda"]')


def test_tree_verify_only_with_page_size_one():
    assert plan_with(PAGED, TREE, context=RequestContext(page_size=1)).valid
    p = plan_with(PAGED, TREE, context=RequestContext(page_size=16))
    assert not p.valid and codes(p[Phase.TARGET_VERIFY]) == [ReasonCode.SPEC_LIMIT]
    assert p[Phase.TARGET_VERIFY].variants == ("tree verify only with page size 1",)
    assert plan_with(PAGED, CHAIN, context=RequestContext(page_size=16)).valid


def test_page_size_set_is_checked_against_the_context():
    p = plan_with(TRTLLM, CHAIN, context=RequestContext(page_size=1))
    assert not p.valid and codes(p[Phase.TARGET_VERIFY]) == [ReasonCode.PAGE_SIZE]
    assert "page_size=1 (supported: {16, 32, 64, 128})" in p[Phase.TARGET_VERIFY].reasons[0].message
    assert plan_with(TRTLLM, CHAIN, context=RequestContext(page_size=64)).valid


# 3. arch sets ----------------------------------------------------------------------------
FA3 = toml('archs = {cuda = ["sm80..sm90"]}\n' + ALL_GRAPHS, "fa3-like", '["cuda"]')
TRT_ARCHS = toml('archs = {cuda = ["sm90", "sm100..sm103", "sm120.."], hip = ["gfx942", "gfx950"]}\n' + ALL_GRAPHS)


@pytest.mark.parametrize("caps, platform, ok", [
    (FA3, "cuda:sm80", True), (FA3, "cuda:sm89", True), (FA3, "cuda:sm90", True), (FA3, "cuda:sm100", False),
    (TRT_ARCHS, "cuda:sm80", False), (TRT_ARCHS, "cuda:sm89", False), (TRT_ARCHS, "cuda:sm90", True),
    (TRT_ARCHS, "cuda:sm103", True), (TRT_ARCHS, "cuda:sm120", True), (TRT_ARCHS, "hip:gfx90a", False),
    (TRT_ARCHS, "hip:gfx942", True), (TRT_ARCHS, "hip:gfx950", True),
])
def test_arch_sets(caps, platform, ok):
    p = plan_with(caps, CHAIN, platform)
    assert p.valid == ok
    if not ok:
        assert codes(p[Phase.TARGET_VERIFY]) == [ReasonCode.ARCH]
        assert p[Phase.TARGET_VERIFY].reasons[0].message.startswith(f"arch={parse(platform).arch} (supported: ")


# 4. claims that depend on the model --------------------------------------------------------
FLASHINFER = toml('models = ["mha", "gqa", "mla"]\n' + ALL_GRAPHS + """
[[variants]]
note = "MLA: no draft-extend graph, no tree mask, multi-step only with topk 1"
when = {model = "mla"}
graph = {draft_extend = false}
remove = {features = ["custom_mask"]}
multi_step = {max_topk = 1}
""", "flashinfer-like")


def test_one_name_serves_mha_and_mla_with_different_claims():
    mha = plan_with(FLASHINFER, TREE, context=RequestContext(model="mha"))
    assert mha.valid and set(mha.captured) == {Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY}
    mla_chain = plan_with(FLASHINFER, CHAIN, context=RequestContext(model="mla"))
    assert mla_chain.valid and codes(mla_chain[Phase.DRAFT_EXTEND]) == [ReasonCode.GRAPH_UNSUPPORTED]
    mla_tree = plan_with(FLASHINFER, TREE, context=RequestContext(model="mla"))
    assert not mla_tree.valid
    assert codes(mla_tree[Phase.TARGET_VERIFY]) == [ReasonCode.FEATURE]
    assert codes(mla_tree[Phase.DRAFT_DECODE]) == [ReasonCode.MULTI_STEP]


def test_model_kind_not_served_is_a_reason():
    mha_only = toml(ALL_GRAPHS, "mha-only")
    p = plan_with(mha_only, CHAIN, context=RequestContext(model="mla"))
    assert not p.valid and codes(p[Phase.PREFILL]) == [ReasonCode.MODEL]


# 5. claims that differ per vendor under one name ---------------------------------------------
PER_VENDOR = toml(ALL_GRAPHS + """
[[variants]]
note = "HIP implementation: verify graphs only for chains"
when = {vendor = "hip"}
graph = {target_verify = {max_topk = 1}}
""")


def test_vendor_variant():
    assert plan_with(PER_VENDOR, TREE, "cuda:sm90")[Phase.TARGET_VERIFY].capture
    hip = plan_with(PER_VENDOR, TREE, "hip:gfx942")
    assert hip.valid and codes(hip[Phase.TARGET_VERIFY]) == [ReasonCode.GRAPH_LIMIT]


def test_registry_holds_one_descriptor_per_vendor_under_one_name():
    from attnhal.backend import AttentionBackend

    class OnCuda(AttentionBackend):
        capabilities = toml(ALL_GRAPHS, "same", '["cuda"]')

    class OnHip(AttentionBackend):
        capabilities = toml("run_limits = {draft_extend = {max_topk = 1}}\n" + ALL_GRAPHS, "same", '["hip"]')

    reg = Registry(discover=lambda: [])
    reg.register(OnCuda)
    reg.register(OnHip)
    assert reg.get("same", parse("cuda:sm90")).backend is OnCuda
    assert reg.get("same", parse("hip:gfx942")).backend is OnHip
    assert reg.select(parse("hip:gfx942"), name="same").backend is OnHip
    assert [e.name for e in reg.ordered(parse("hip:gfx942"))] == ["same"]
    hip_caps = reg.get("same", parse("hip:gfx942")).capabilities
    assert not plan_with(hip_caps, TREE, "hip:gfx942").valid
    assert plan_with(reg.get("same", parse("cuda:sm90")).capabilities, TREE).valid


# 6. vendors beyond CUDA and HIP ---------------------------------------------------------------
@pytest.mark.parametrize("platform", ["xpu:pvc", "npu:910b", "musa:mp31"])
def test_new_vendors_plan_like_the_others(platform):
    caps = toml(ALL_GRAPHS, "any", '["cuda", "hip", "xpu", "npu", "musa"]')
    p = plan_with(caps, CHAIN, platform)
    graph_phases = {Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY}
    if platform == "xpu:pvc":  # its row names an implementation (torch.xpu): planned like CUDA
        assert p.valid and set(p.captured) == graph_phases
        assert p.to_dict()["phases"] == plan_with(caps, CHAIN, "cuda:sm90").to_dict()["phases"]
    else:  # NPU and MUSA rows name none: never "captured", with the reason
        assert p.valid and p.captured == ()
        assert {ph: codes(p[ph]) for ph in graph_phases} == dict.fromkeys(graph_phases,
                                                                            [ReasonCode.GRAPH_DEVICE_UNAVAILABLE])
        assert "graph_device=none" in p[Phase.TARGET_VERIFY].reasons[0].message
    cuda_only = toml(ALL_GRAPHS, "c", '["cuda"]')
    assert codes(plan_with(cuda_only, CHAIN, platform)[Phase.PREFILL]) == [ReasonCode.VENDOR]
    nographs = plan_with(caps, CHAIN, platform + ",nographs")
    assert nographs.valid and codes(nographs[Phase.TARGET_VERIFY]) == [ReasonCode.NO_GRAPH_API]


# 7. split roles ------------------------------------------------------------------------------
def test_split_prefill_and_decode_backends_with_speculative_attention_mode():
    prefill = toml(ALL_GRAPHS.replace(", target_verify = {}", ""), "prefill-be")  # no verify graph
    decode = toml(ALL_GRAPHS, "decode-be")
    for mode, verify_backend, captured in (("prefill", "prefill-be", False), ("decode", "decode-be", True)):
        b = PhaseBackends.split(prefill, decode, CHAIN, mode=mode)
        p = plan(CHAIN, "cuda:sm90", b)
        assert p[Phase.PREFILL].backend == "prefill-be"
        assert p[Phase.TARGET_VERIFY].backend == verify_backend and p[Phase.TARGET_VERIFY].role == mode
        assert p[Phase.DRAFT_EXTEND].backend == verify_backend
        assert p[Phase.DRAFT_DECODE].backend == "decode-be"
        assert p[Phase.TARGET_VERIFY].capture == captured
    plain = plan(SpecConfig(), "cuda:sm90", PhaseBackends.split(prefill, decode))
    assert plain[Phase.DECODE].backend == "decode-be" and plain[Phase.PREFILL].backend == "prefill-be"


# 8. fill rules --------------------------------------------------------------------------------
def test_fill_rule_per_phase_with_max_of_width():
    caps = toml(ALL_GRAPHS + "seq_len_fill = 1\n[phase_fill]\n"
                "target_verify = {base = 1, at_least = 1, at_least_plus = \"width\"}\n"
                "draft_extend = {base = 0, plus = \"num_steps\"}\n")
    p = plan_with(caps, TREE)
    assert p[Phase.TARGET_VERIFY].seq_len_fill == TREE.num_draft_tokens + 1  # max(1, width + 1)
    assert p[Phase.DRAFT_EXTEND].seq_len_fill == TREE.num_steps
    assert p[Phase.DRAFT_DECODE].seq_len_fill == 1
    assert caps.fill_for(Phase.DECODE).value(TREE, Phase.DECODE) == 1


# 9. policy switches ---------------------------------------------------------------------------
def test_per_phase_capture_disable():
    caps = toml(ALL_GRAPHS)
    p = plan_with(caps, CHAIN, policy=GraphPolicy(disabled_phases=frozenset({Phase.DRAFT_EXTEND})))
    assert p.valid and not p[Phase.DRAFT_EXTEND].capture
    assert codes(p[Phase.DRAFT_EXTEND]) == [ReasonCode.GRAPHS_DISABLED]
    assert p[Phase.TARGET_VERIFY].capture and p[Phase.DRAFT_DECODE].capture


def test_adaptive_step_counts_valid_for_each_and_say_which_are_captured():
    caps = toml(ALL_GRAPHS.replace("draft_decode = {}", "draft_decode = {max_num_steps = 3}"))
    spec = SpecConfig.eagle(3)
    p = plan_with(caps, spec, policy=GraphPolicy(step_counts=(1, 3, 5)))
    assert p.valid and set(p.adaptive) == {1, 5}
    assert p.captured_steps(Phase.DRAFT_DECODE) == (3,)  # not run at 1, over the graph limit at 5
    assert p.captured_steps(Phase.DRAFT_EXTEND) == (1, 3, 5)
    limited = toml(ALL_GRAPHS.replace("multi_step = true", "multi_step = {max_num_steps = 3}"))
    bad = plan_with(limited, spec, policy=GraphPolicy(step_counts=(1, 3, 5)))
    assert not bad.valid and bad[Phase.DRAFT_DECODE].capture  # valid at 3 itself, invalid at 5
    assert codes(bad.adaptive[5][Phase.DRAFT_DECODE]) == [ReasonCode.MULTI_STEP]
    assert bad.to_dict()["adaptive"]["5"]["valid"] is False


def test_adaptive_step_count_a_tree_cannot_take_is_an_invalid_plan_with_a_reason():
    caps = toml(ALL_GRAPHS)
    spec = SpecConfig.eagle(3, topk=2, num_draft_tokens=8)  # 8 tokens need num_steps >= 3 with topk 2 (2 + 2*4 + 1)
    p = plan_with(caps, spec, policy=GraphPolicy(step_counts=(1, 2, 4)))
    assert not p.valid and set(p.unfit_steps) == {1, 2} and set(p.adaptive) == {4}
    assert p.adaptive[4].valid and p.adaptive[4].spec.num_draft_tokens == 8
    assert p.unfit_steps[1].code is ReasonCode.STEP_COUNT
    assert p.unfit_steps[2].message.startswith("step_counts=2 (supported: >= 3: num_draft_tokens=8")
    assert p.to_dict()["adaptive"]["1"] == {"valid": False, "captured": [],
                                            "reasons": [p.unfit_steps[1].to_dict()]}
    assert plan_with(caps, spec, policy=GraphPolicy(step_counts=(3, 4))).valid


def test_capture_sizes_from_the_spec_width():
    caps = toml(ALL_GRAPHS)
    spec = SpecConfig.eagle(3, topk=4, num_draft_tokens=8)
    p = plan_with(caps, spec, policy=GraphPolicy(max_batch_size=64, max_tokens=128))
    assert p[Phase.TARGET_VERIFY].capture_sizes == (1, 2, 4, 8, 16)  # 16 x 8 tokens = 128
    assert p[Phase.DRAFT_DECODE].capture_sizes == (1, 2, 4, 8, 16, 24, 32)  # 4 tokens per request
    tiny = plan_with(caps, spec, policy=GraphPolicy(max_tokens=4))
    assert not tiny[Phase.TARGET_VERIFY].capture and codes(tiny[Phase.TARGET_VERIFY]) == [ReasonCode.GRAPH_LIMIT]


# the spec algorithms engines run ----------------------------------------------
@pytest.mark.parametrize("algorithm", ["eagle", "eagle3", "mtp", "standalone"])
def test_draft_model_algorithms_run_the_eagle_phases(algorithm):
    caps = toml(ALL_GRAPHS)
    spec = SpecConfig(algorithm, 3)
    p = plan_with(caps, spec)
    assert p.valid and [ph for ph in Phase if p[ph].runs] == [
        Phase.PREFILL, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY]


def test_ngram_runs_target_verify_only_and_reads_no_draft_backend():
    caps = toml(ALL_GRAPHS)
    spec = SpecConfig.ngram(num_draft_tokens=8, breadth=2)
    assert spec.algorithm is SpecAlgorithm.NGRAM
    p = plan(spec, "cuda:sm90", PhaseBackends(target=caps, draft_decode=None, draft_extend=None))
    assert p.valid and [ph for ph in Phase if p[ph].runs] == [Phase.PREFILL, Phase.TARGET_VERIFY]
    assert codes(p[Phase.DRAFT_EXTEND]) == [ReasonCode.PHASE_NOT_RUN]
    no_mask = toml(ALL_GRAPHS.replace('features = ["custom_mask"]', ""))
    assert codes(plan(spec, "cuda:sm90", PhaseBackends(no_mask))[Phase.TARGET_VERIFY]) == [ReasonCode.FEATURE]


def test_fp8_condition_reads_the_platform_fp8_flavour():
    caps = toml(ALL_GRAPHS + 'kv_dtypes = ["bfloat16", "fp8_e4m3"]\n[[variants]]\nwhen = {fp8 = "none"}\n'
                'remove = {kv_dtypes = ["fp8_e4m3"]}\n')
    fp8 = RequestContext(kv_dtype="fp8_e4m3")
    assert plan_with(caps, CHAIN, "cuda:sm90", fp8).valid
    assert plan_with(caps, CHAIN, "hip:gfx942", fp8).valid
    old = plan_with(caps, CHAIN, "cuda:sm80", fp8)
    # two reasons: sm80 has no fp8 encoding, and the variant for fp8 = "none" removed fp8_e4m3
    assert not old.valid and codes(old[Phase.PREFILL]) == [ReasonCode.KV_DTYPE] * 2
    assert any("(supported: {bfloat16})" in r.message for r in old[Phase.PREFILL].reasons)


def test_cached_plans_equal_cold_ones_and_follow_every_input():
    """The planner caches per (descriptor, platform, context, spec): a re-plan equals a cold
    plan, and a change of any input (policy included) is planned afresh."""
    from attnhal.planner import decide

    caps = toml(ALL_GRAPHS.replace("draft_decode = {}", "draft_decode = {max_num_steps = 2}"))
    spec = SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
    warm = plan_with(caps, spec)
    decide._resolved.cache_clear()
    assert plan_with(caps, spec).to_dict() == warm.to_dict()
    assert plan_with(caps, spec)[Phase.TARGET_VERIFY] is plan_with(caps, spec)[Phase.TARGET_VERIFY]
    assert not plan_with(caps, spec, policy=GraphPolicy(enabled=False))[Phase.TARGET_VERIFY].capture
    assert plan_with(caps, spec, platform="hip:gfx942,nographs")[Phase.TARGET_VERIFY].reasons[0].code \
        is ReasonCode.NO_GRAPH_API
    assert plan_with(caps, SpecConfig.eagle(2, topk=2, num_draft_tokens=4))[Phase.DRAFT_DECODE].capture
    assert not warm[Phase.DRAFT_DECODE].capture  # over max_num_steps = 2 at 3 steps
