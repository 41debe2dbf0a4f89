"""The kit's building blocks: descriptor-bound strategies draw valid batches of claimed
shapes only, and the fp64 reference agrees with an independent one (torch SDPA)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample
from hypothesis import strategies as st

import attnhal.testing.strategies as hst
from attnhal.backend import validate_forward
from attnhal.capabilities import SpecLimits
from attnhal.phases import Feature, Phase
from attnhal.spec import SpecConfig
from attnhal.testing.cases import CaseRecipe, build_case, tree_mask
from attnhal.testing.oracle import real_tokens, reference_forward
from attnhal_torch import TorchBackend


def _minimal(strategy: st.SearchStrategy[Any], condition: Callable[[Any], bool]) -> Any:
    """The minimal example of ``strategy`` satisfying ``condition``, whatever the example
    database holds (``find`` replays entries keyed by the condition's source, and a shrink
    started from another test's entry can end in another local minimum)."""
    return find(strategy, condition, settings=settings(max_examples=2000, database=None, derandomize=True))


NARROW = replace(TorchBackend.capabilities, name="narrow", dtypes=frozenset({"float16"}),
                 head_sizes=frozenset({32, 80}), features=frozenset(),
                 graph={Phase.TARGET_VERIFY: SpecLimits(max_topk=1, max_num_steps=2)},
                 multi_step=SpecLimits(max_topk=2, max_num_steps=3))


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_drawn_cases_are_valid_and_claimed(phase: Phase, data: st.DataObject) -> None:
    spec = data.draw(hst.case_specs(NARROW, phase))
    assert spec.dtype == "float16" and spec.head_size in (32, 80)
    assert spec.num_q_heads % spec.num_kv_heads == 0
    if phase is Phase.TARGET_VERIFY:  # no custom_mask claimed: chains only
        assert spec.topk == 1 and not spec.tree_parents
    case = build_case(spec)
    validate_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config)
    assert case.q.dtype == torch.float16 and case.batch.seq_lens_cpu is None  # needs_host_seq_lens=False


@settings(max_examples=25, deadline=None)
@given(spec=hst.spec_configs_for(NARROW, Phase.TARGET_VERIFY, NARROW.graph_limits(Phase.TARGET_VERIFY)),
       ms=hst.spec_configs_for(NARROW, Phase.DRAFT_DECODE, NARROW.multi_step))
def test_spec_configs_stay_within_limits(spec: SpecConfig, ms: SpecConfig) -> None:
    assert spec.topk == 1 and spec.num_steps <= 2
    assert 2 <= ms.num_steps <= 3 and ms.topk <= 2


@settings(max_examples=30, deadline=None)
@given(parents=st.integers(1, 7).flatmap(hst.tree_parents))
def test_tree_masks_are_ancestor_closed(parents: tuple[int, ...]) -> None:
    mask = tree_mask(parents)
    for i in range(len(parents)):
        assert mask[i, i] and mask[i, 0]  # itself and the root
        for j in range(len(parents)):
            if mask[i, j] and j != i:
                assert mask[parents[i], j] or j == parents[i]  # an ancestor of i is an ancestor of its parent


@settings(max_examples=10, deadline=None)
@given(spec=hst.multi_step_specs(TorchBackend.capabilities))
def test_multi_step_specs_start_at_step_zero(spec: CaseRecipe) -> None:
    assert spec.draft_step == 0 and spec.spec is not None and spec.spec.num_steps >= 2
    assert len(spec.reparent) == spec.spec.num_steps - 2


def test_edge_cases_are_reachable() -> None:
    caps = TorchBackend.capabilities
    empty = _minimal(hst.case_specs(caps, Phase.PREFILL), lambda s: 0 in s.new_lens and 0 in s.prefix_lens)
    assert empty.new_lens == (0,) and empty.prefix_lens == (0,)
    short = _minimal(hst.case_specs(caps, Phase.DECODE), lambda s: min(s.seq_lens()) == 1)
    assert short.seq_lens() == [1]
    gqa = _minimal(hst.head_configs(), lambda h: h[0] > h[1] > 1)
    assert gqa == (4, 2)  # the smallest GQA: shrinking keeps what a failure needs
    assert _minimal(hst.case_specs(caps, Phase.DRAFT_EXTEND), lambda s: max(s.new_lens) > 1).new_lens == (2,)


def test_case_recipe_repr_is_short_valid_python() -> None:
    spec = CaseRecipe(Phase.DECODE, head_size=32, prefix_lens=(0, 7))
    assert repr(spec) == "CaseRecipe(Phase.DECODE, head_size=32, prefix_lens=(0, 7))"
    assert eval(repr(spec), {"CaseRecipe": CaseRecipe, "Phase": Phase}) == spec
    with pytest.raises(ValueError, match="new_lens"):
        CaseRecipe(Phase.PREFILL, prefix_lens=(1, 2), new_lens=(1,))


def test_reference_rows_padded_by_a_graph_runner_are_not_real() -> None:
    case = build_case(CaseRecipe(Phase.DRAFT_EXTEND, prefix_lens=(3, 4), new_lens=(1, 2), spec=SpecConfig.eagle(2)))
    assert real_tokens(case.batch) == [0, 3, 4]  # T = 3 per row; the rest is padding
    case.batch.req_pool_indices[1] = 0  # PADDING_REQ: a graph runner's padded row
    assert real_tokens(case.batch) == [0]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=3), st.sampled_from([(4, 4), (4, 2), (4, 1)]),
       st.integers(1, 2**16))
def test_reference_matches_sdpa_on_causal_prefill(lens, heads, slot_seed) -> None:
    """The kit's reference against an independent implementation: torch SDPA, per request."""
    q_heads, kv_heads = heads
    spec = CaseRecipe(Phase.PREFILL, num_q_heads=q_heads, num_kv_heads=kv_heads, prefix_lens=(0,) * len(lens),
                    new_lens=tuple(lens), slot_seed=slot_seed)
    case = build_case(spec)
    out = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
    start = 0
    for n in lens:
        q = case.q[start:start + n].double().transpose(0, 1)  # [H, n, D]
        k = case.k[start:start + n].double().transpose(0, 1).repeat_interleave(q_heads // kv_heads, 0)
        v = case.v[start:start + n].double().transpose(0, 1).repeat_interleave(q_heads // kv_heads, 0)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                scale=case.config.sm_scale)
        torch.testing.assert_close(out[start:start + n], want.transpose(0, 1), atol=1e-10, rtol=1e-10)
        start += n


# --- what the strategies reach ---------------------------------------------------------

def test_context_lengths_reach_block_boundaries_and_long_contexts() -> None:
    for k in (4, 7, 12):
        for x in (2**k - 1, 2**k, 2**k + 1):
            assert _minimal(hst.context_lengths(), lambda n, x=x: n == x) == x
    assert _minimal(hst.context_lengths(), lambda n: n >= 4096) == 4096 - 1 + 1  # 2^12 is the first past 4095
    assert _minimal(hst.context_lengths(300, low=5), lambda n: True) == 5
    assert all(n <= 300 for n in (_minimal(hst.context_lengths(300), lambda n, t=t: n >= t) for t in (100, 257)))


def test_head_layouts_reach_wide_gqa_and_mqa_with_many_heads() -> None:
    assert _minimal(hst.head_layouts(), lambda h: h[1] > 1 and h[0] // h[1] == 16)[0] // 16 >= 2
    mqa = _minimal(hst.head_layouts(), lambda h: h[1] == 1 and h[0] >= 8)
    assert mqa == (8, 1)
    assert _minimal(hst.head_layouts(), lambda h: h[0] == h[1] == 8) == (8, 8)


def test_batches_reach_long_contexts_and_long_extends_within_the_cost_model() -> None:
    caps = TorchBackend.capabilities
    long = _minimal(hst.case_specs(caps, Phase.DECODE), lambda s: max(s.seq_lens()) > 4096)
    assert long.requests == 1
    extend = _minimal(hst.case_specs(caps, Phase.PREFILL), lambda s: max(s.new_lens) > 128)
    assert max(extend.new_lens) == 129
    # a long context leaves no room for more long requests
    @settings(max_examples=60, deadline=None)
    @given(hst.case_specs(caps, Phase.TARGET_VERIFY, max_requests=3))
    def within(spec: CaseRecipe) -> None:
        assert hst.batch_cost(spec) <= 2 * hst.DEFAULT_MAX_COST  # the first request may fill it alone
    within()


def test_input_variations_are_drawn_and_built() -> None:
    caps = TorchBackend.capabilities
    spec = _minimal(hst.case_specs(caps, Phase.DECODE, inputs=True, dtype="float16"),
                lambda s: s.qk_magnitude > 1 and s.v_magnitude > 1 and s.qkv_layout == "fused" and s.scale)
    case = build_case(spec)
    q, k, v = case.q, case.k, case.v
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert q.stride(0) == (spec.num_q_heads + 2 * spec.num_kv_heads) * spec.head_size
    assert float(q.abs().max()) <= 32 and torch.equal(q, q.round())
    owned = torch.tensor(sorted({s for row in case.row_slots for s in row}))  # the rest holds NaN/inf
    assert float(case.pool.v[0][owned].abs().max()) <= 2**15  # near fp16's range, never past it
    assert torch.isfinite(case.pool.v[0][owned]).all()
    strided = build_case(replace(spec, qkv_layout="strided"))
    assert strided.q.stride(1) == 2 * spec.head_size and strided.q.stride(2) == 1
    assert case.config.scale == spec.scale
    with pytest.raises(ValueError, match="qkv_layout=packed"):
        replace(spec, qkv_layout="packed")


def test_context_lengths_reach_page_multiples_when_pages_are_claimed() -> None:
    for x in (3 * 128 - 1, 3 * 128, 3 * 128 + 1):
        assert _minimal(hst.context_lengths(page_size=128), lambda n, x=x: n == x) == x
        with pytest.raises(NoSuchExample):  # no block edge: only the page size brings them
            _minimal(hst.context_lengths(), lambda n, x=x: n == x)
    assert _minimal(hst.context_lengths(page_size=128), lambda n: n > 300) == 3 * 128 - 1


def test_feature_fields_combine_only_what_is_claimed() -> None:
    caps = TorchBackend.capabilities
    combined = _minimal(hst.feature_fields(caps, ("e4m3fnuz",)),
                        lambda f: {"sliding_window", "sinks", "logit_softcap", "page_size", "kv_dtype"} <= set(f))
    assert combined["fp8_flavor"] == "e4m3fnuz" if combined["kv_dtype"] == "fp8_e4m3" else True
    assert combined["page_size"] in caps.page_sizes and combined["page_size"] > 1
    assert _minimal(hst.feature_fields(caps), lambda f: True) == {}  # shrinks to none of them
    mla = _minimal(hst.feature_fields(caps), lambda f: "head_size" in f)
    assert mla == hst.MLA_FIELDS
    # a descriptor that claims windows only draws windows only, in every shape
    only_window = replace(caps, features=frozenset({Feature.SLIDING_WINDOW}), page_sizes=frozenset({1}),
                          kv_dtypes=frozenset(caps.dtypes))

    @settings(max_examples=40, deadline=None, database=None)
    @given(hst.feature_fields(only_window))
    def windows_only(fields: dict[str, Any]) -> None:
        assert set(fields) <= {"sliding_window"}
    windows_only()
    wide = _minimal(hst.window_fields(), lambda f: f["sliding_window"] == (None, 1000))
    assert wide == {"sliding_window": (None, 1000)}


def test_page_sized_batches_are_drawn_at_page_multiples() -> None:
    caps = TorchBackend.capabilities
    full = _minimal(hst.case_specs(caps, Phase.DECODE, page_size=64), lambda s: any(
        n % 64 == 0 and n > 0 for n in s.seq_lens()) and s.requests == 1)
    assert full.page_size == 64 and full.seq_lens()[0] % 64 == 0
    build_case(full)
