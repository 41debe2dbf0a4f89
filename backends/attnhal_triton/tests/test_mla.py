"""MLA (q/k 576 = latent 512 + rope 64, V = the latent 512, one KV head) in the Triton
backend, run by the Triton interpreter on CPU.

Every phase over MLA's latent pool (``KVPool(v_in_k=True)``: the kernel reads V from the
K tiles) in fp32 and bf16 over an fp8 cache, against the kit's fp64 oracle and against the
torch backend on the same pool (within the looser of the two backends' tolerances); the
kit's layout (V its own tensor) in fp16 at page size 1; 128 heads (several head blocks);
gfx942's programs renumbered for its 8 L2s;
a 576 head that is not MLA (V 576: the tail accumulator) with window, soft-cap and sinks;
graphs and the multi-step draft under the CPU graph emulator. The kit itself checks the
``mla`` claim (``test_conformance.py::test_feature[mla]``, ``ATTNHAL_SLOW=1``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from triton_cases import assert_close, expected, run, shape

from attnhal.backend import UnsupportedFeature
from attnhal.graphs import EmulatedGraph
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.spec import SpecConfig
from attnhal.testing.cases import CaseRecipe, build_case
from attnhal.testing.oracle import real_tokens, reference_attention
from attnhal_torch import TorchBackend
from attnhal_triton import TritonBackend, mla_ops
from attnhal_triton.mla_traffic import latent_pool


def _mla(phase: Phase, dtype: str = "float32", heads: int = 16, kv_dtype: str | None = None, page: int = 16,
         lens: tuple[int, ...] = (70, 5), **kw: object) -> CaseRecipe:
    case = shape(phase, kv_heads=1, group=heads, head_size=576, dtype=dtype, lens=lens, kv_dtype=kv_dtype,
                 page_size=page, **kw)  # type: ignore[arg-type]
    return replace(case.recipe, v_head_size=512)


@pytest.mark.parametrize("dtype,kv_dtype", [("float32", None), ("bfloat16", "fp8_e4m3")], ids=["fp32", "bf16-fp8"])
@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
def test_latent_pool_matches_oracle_and_torch(phase: Phase, dtype: str, kv_dtype: str | None) -> None:
    recipe = _mla(phase, dtype, kv_dtype=kv_dtype)
    case = build_case(recipe, pool=latent_pool(recipe))
    layer = case.layer
    assert mla_ops.v_in_k(case.pool.k[layer], case.pool.v[layer])
    backend = TritonBackend(case.config, case.pool, platform=parse("cpu"))
    got = run(case, backend, write=False)
    assert got.shape == (*case.q.shape[:2], 512) and got.dtype == case.q.dtype
    assert_close(backend, got, expected(case, backend, write=False))
    theirs = run(case, TorchBackend(case.config, case.pool), write=False)
    ours, ref = backend.capabilities.tolerance_for(dtype, kv_dtype), TorchBackend.capabilities.tolerance_for(
        dtype, kv_dtype)
    torch.testing.assert_close(got.double(), theirs.double(), atol=max(ours.atol, ref.atol),
                               rtol=max(ours.rtol, ref.rtol))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_separate_v_fp16_page1(phase: Phase) -> None:
    """The kit's pools: V its own tensor, read beside the K tiles."""
    case = build_case(_mla(phase, "float16", page=1))
    assert not mla_ops.v_in_k(case.pool.k[case.layer], case.pool.v[case.layer])
    backend = TritonBackend(case.config, case.pool, platform=parse("cpu"))
    assert_close(backend, run(case, backend), expected(case, backend))


def test_128_heads_take_several_blocks_and_splits() -> None:
    """TP 1: 128 q heads in blocks of the row's BLOCK_M, each row split in several KV ranges."""
    recipe = _mla(Phase.DECODE, heads=128, lens=(150, 3))
    case = build_case(recipe, pool=latent_pool(recipe))
    backend = TritonBackend(case.config, case.pool, platform=parse("cpu"))
    backend.init_forward_metadata(case.batch)
    meta = backend._meta
    assert meta is not None and meta.num_splits is not None and meta.num_splits.tolist() == [3, 1]
    assert_close(backend, run(case, backend, write=False), expected(case, backend, write=False))


def test_gfx942_rows_renumber_programs_for_its_l2s_exactly() -> None:
    """gfx942's rows deal 8 XCDs: the kernel renumbers its programs so each XCD's L2 runs whole
    (row, split) windows (``l2_order.l2_program``, checked program by program in
    test_mla_traffic.py); results are exact on a grid whose windows (3 rows x splits, 4 head
    blocks each) do not divide evenly over the 8 L2s."""
    recipe = _mla(Phase.DECODE, heads=64, lens=(150, 3, 40))
    case = build_case(recipe, pool=latent_pool(recipe))
    backend = TritonBackend(case.config, case.pool, platform=parse("hip:gfx942"))
    assert backend.rows["mla_decode"].blocks["L2_DOMAINS"] == 8
    got = run(case, backend, write=False)
    meta = backend._meta
    windows = 3 * meta.mid_o.shape[2] if meta is not None and meta.mid_o is not None else 0
    assert windows > 8 and windows % 8  # windows dealt whole and a tail in the grid's order
    assert_close(backend, got, expected(case, backend, write=False))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_head_576_with_v_576_and_features(phase: Phase) -> None:
    """A 576 head that is not MLA (GQA, V 576 = 512 + a tail accumulator), with a window,
    soft-cap and sinks: the kit runs every claimed head size on every phase."""
    case = build_case(shape(phase, kv_heads=2, group=2, head_size=576, lens=(70, 5), window=20, softcap=5.0,
                            sinks=True).recipe)
    backend = TritonBackend(case.config, case.pool, platform=parse("cpu"))
    assert_close(backend, run(case, backend), expected(case, backend))


@pytest.mark.parametrize("window", [None, 1], ids=["full", "window1"])
def test_tree_verify_in_blocks_of_one_token(window: int | None) -> None:
    """gfx942's rows: BLOCK_M 16 holds one token's 16 heads, so a block loads only the draft
    keys its token sees (its ancestors; with a window, the near ones): exact all the same."""
    recipe = replace(_mla(Phase.TARGET_VERIFY, tokens=8, lens=(40, 3)), sliding_window=window)
    case = build_case(recipe, pool=latent_pool(recipe))
    backend = TritonBackend(case.config, case.pool, platform=parse("hip:gfx942"))
    assert backend.rows["mla_verify_tree"].blocks["BLOCK_M"] == 16
    assert_close(backend, run(case, backend, write=False), expected(case, backend, write=False))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_fp16_query_over_an_fp32_cache(phase: Phase) -> None:
    """fp32 dots (mla_forms.fp32_dots) over the fp32 latent pool, on sm90's fp32 rows."""
    recipe = _mla(phase, "float16", kv_dtype="float32")
    case = build_case(recipe, pool=latent_pool(recipe))
    backend = TritonBackend(case.config, case.pool, platform=parse("cuda:sm90"))
    assert_close(backend, run(case, backend, write=False), expected(case, backend, write=False))


def test_other_split_heads_are_refused() -> None:
    case = build_case(replace(_mla(Phase.DECODE), v_head_size=256))
    with pytest.raises(UnsupportedFeature, match="head_size/v_head_size=576/256"):
        TritonBackend(case.config, case.pool, platform=parse("cpu"))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND], ids=lambda p: p.value)
def test_graph_replays_new_lengths(phase: Phase) -> None:
    """Capture on short rows, replay on long ones written in place: the split counts follow
    on the device, replay allocates nothing, the output equals the oracle's."""
    short, long = _mla(phase, lens=(5, 20), seed=1), _mla(phase, lens=(150, 40), seed=2)
    pool = latent_pool(long)
    case_a = build_case(short, pool=pool)
    backend = TritonBackend(case_a.config, pool, platform=parse("cpu"))
    static = build_case(short, pool=pool).batch  # the graph's static tensors
    q = case_a.q.clone()
    backend.init_graph_state(max_bs=2, max_num_tokens=8)
    backend.init_capture_metadata(static)
    graph = EmulatedGraph()
    out = graph.capture(lambda: backend.forward(q, None, None, case_a.layer, static))
    assert_close(backend, out, expected(case_a, backend, write=False), real_tokens(case_a.batch))
    case_b = build_case(long, pool=pool)
    for dst, src in ((static.req_pool_indices, case_b.batch.req_pool_indices),
                     (static.seq_lens, case_b.batch.seq_lens), (q, case_b.q),
                     (static.extend_lens, case_b.batch.extend_lens)):
        if dst is not None and src is not None:
            dst.copy_(src)
    if static.spec is not None and static.spec.custom_mask is not None:
        assert case_b.batch.spec is not None and case_b.batch.spec.custom_mask is not None
        static.spec.custom_mask.copy_(case_b.batch.spec.custom_mask)
    backend.init_replay_metadata(static)
    graph.replay()
    assert graph.replay_allocations == 0
    assert_close(backend, out, expected(case_b, backend, write=False), real_tokens(case_b.batch))
    launches = [op.name for op in graph.recorded_ops if op.name.startswith("attnhal_triton::")]
    assert launches == ["attnhal_triton::mla_attend", "attnhal_triton::decode_reduce"]


def test_multi_step_draft_in_one_graph() -> None:
    """``multi_step`` over MLA: every draft step in one emulated graph, the path re-parented
    in place between steps; each step equals the fp64 reference."""
    import cases

    from attnhal.backend import MultiStepDraft

    spec = SpecConfig.eagle(num_steps=3, topk=2, num_draft_tokens=4)
    recipe = cases.random_spec(Phase.DRAFT_DECODE, 5, spec=spec, prefix_lens=[70, 9], num_q_heads=16, num_kv_heads=1,
                               head_size=576, v_head_size=512, page_size=16)
    case = build_case(recipe, pool=latent_pool(recipe))
    draft = MultiStepDraft(TritonBackend, case.config, case.pool, spec, platform=parse("cpu"))
    batch = case.batch
    assert batch.spec is not None and batch.spec.draft_path is not None
    path, rows = batch.spec.draft_path, batch.batch_size
    reparented = path[:, 0].flip(0).clone()
    original = path[:, 0].clone()
    qs = [torch.randn(rows, 16, 576) for _ in range(draft.num_forwards)]
    draft.init_graph_state(max_bs=rows, max_num_tokens=rows)
    draft.init_capture_metadata(batch)

    def run_steps() -> list[torch.Tensor]:
        outs = []
        for s, step_batch in enumerate(draft.step_batches(batch)):
            if s == 1:
                path[:, 0].copy_(reparented)
            outs.append(draft.backend(s).forward(qs[s], None, None, case.layer, step_batch))
        return outs

    outs = EmulatedGraph().capture(run_steps)
    k, v = case.pool.dequantized(case.layer)
    for s, got in enumerate(outs):
        step = replace(batch, spec=replace(batch.spec, draft_path=path.clone(), draft_step=s))
        assert step.spec is not None and step.spec.draft_path is not None
        step.spec.draft_path[:, 0] = original if s == 0 else reparented
        want = reference_attention(qs[s], k, v, step, case.pool.token_table(), case.config.sm_scale)
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
def test_plan_serves_mla_speculation_on_both_vendors(platform: str) -> None:
    """``attnhal plan --backend triton --model mla``: every phase of MTP with a tree runs on
    Triton and every graph phase is captured; without the ``mla`` claim the plan is invalid."""
    from attnhal.phases import Feature
    from attnhal.planner import PhaseBackends, plan
    from attnhal.spec import ModelKind, RequestContext

    caps = TritonBackend.capabilities
    context = RequestContext(model=ModelKind.MLA, dtype="bfloat16", kv_dtype="fp8_e4m3", head_size=576,
                             page_size=64)
    spec = SpecConfig.eagle(3, topk=2, num_draft_tokens=6)
    result = plan(spec, platform, PhaseBackends.build(None, None, spec, target=caps), context=context)
    assert result.valid
    assert {p for p in result if result[p].runs} == {Phase.PREFILL, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND,
                                                     Phase.TARGET_VERIFY}
    assert set(result.captured) == {Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY}
    assert {result[p].backend for p in result if result[p].runs} == {"triton"}
    no_mla = replace(caps, features=caps.features - {Feature.MLA}, models=None)
    assert not plan(spec, platform, PhaseBackends.build(None, None, spec, target=no_mla), context=context).valid
