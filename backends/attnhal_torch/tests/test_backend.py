"""The torch reference backend against the fp64 reference, eager and under graph capture."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from cases import expected, one_thread, random_spec

from attnhal.backend import PADDING_REQ, PADDING_SLOT, ForwardBatch, KVPool, UnsupportedPhase
from attnhal.graphs import CaptureError, EmulatedGraph
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import Vendor
from attnhal.registry import BackendPlugin
from attnhal.spec import DTYPES, SpecConfig
from attnhal.testing.cases import Case, CaseRecipe, PoolSize, build_case, make_pool, pool_size
from attnhal.testing.oracle import query_tokens
from attnhal.testing.strategies import case_specs, tree_parents
from attnhal_torch import TorchBackend

CAPS = TorchBackend.capabilities
pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: str, rows: torch.Tensor | None = None) -> None:
    """``|out - ref| <= atol + rtol * |ref|`` with the backend's declared tolerance."""
    tol = CAPS.tolerance(dtype)
    diff = (out.double() - ref).abs()
    bound = tol.atol + tol.rtol * ref.abs()
    if rows is not None:
        diff, bound = diff[rows], bound[rows]
    worst = (diff - bound).max().item() if diff.numel() else -1.0
    assert worst <= 0, f"max excess {worst:.3e} over the {dtype} tolerance {tol}; max |diff| {diff.max():.3e}"


def run_eager(case: Case, backend: TorchBackend | None = None, **kwargs: Any) -> torch.Tensor:
    backend = backend or TorchBackend(case.config, case.pool, **kwargs)
    backend.init_forward_metadata(case.batch)
    out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    return out


# --- strategies ------------------------------------------------------------------------------

@st.composite
def specs(draw: st.DrawFn, phase: Phase, **kwargs: Any) -> CaseRecipe:
    """:func:`case_specs` of the torch claims with MHA/GQA/MQA up to 3 KV heads (6/3 among
    them); ``target_verify`` chains sometimes carry an explicit tree mask too."""
    spec = draw(case_specs(CAPS, phase, max_kv_heads=3, max_group=4, max_seq_len=52, **kwargs))
    if phase is Phase.TARGET_VERIFY and not spec.tree_parents and draw(st.booleans()):
        T = spec.tokens_per_row or 0
        spec = dataclasses.replace(spec, tree_parents=tuple(draw(tree_parents(T)) for _ in range(spec.requests)))
    return spec


@st.composite
def kernel_params(draw: st.DrawFn) -> dict[str, int]:
    # tiny chunks and budgets force many chunks and many softmax segments
    return {"chunk": draw(st.sampled_from([1, 3, 8, 32])),
            "score_budget_bytes": draw(st.sampled_from([64, 4096, 16 << 20])),
            # 0: no precomputed gather index, each chunk computes its own
            "index_budget_bytes": draw(st.sampled_from([0, 64 << 20])),
            # worker threads split the rows (eager only)
            "host_workers": draw(st.sampled_from([1, 2, 3]))}


@st.composite
def phase_cases(draw: st.DrawFn, phase: Phase) -> tuple[Case, dict[str, int]]:
    return build_case(draw(specs(phase, max_requests=4))), draw(kernel_params())


# --- descriptor ------------------------------------------------------------------------------------

def test_descriptor_claims() -> None:
    assert CAPS.name == "torch"
    assert CAPS.vendors == {Vendor.CUDA, Vendor.HIP, Vendor.CPU}
    assert CAPS.phases == set(Phase)
    assert set(CAPS.graph) == set(GRAPH_PHASES)
    assert CAPS.multi_step is not None and Feature.CUSTOM_MASK in CAPS.features
    assert CAPS.dtypes == set(DTYPES) and {64, 128, 256} <= CAPS.head_sizes
    assert not CAPS.needs_host_seq_lens


def test_registered_through_entry_point() -> None:
    eps = importlib.metadata.entry_points(group="attnhal.backends")
    plugin = next(ep for ep in eps if ep.name == "torch").load()
    assert isinstance(plugin, BackendPlugin) and plugin.load() is TorchBackend


# --- eager, every phase -----------------------------------------------------------------------------

@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_phase_matches_reference(phase: Phase, data: st.DataObject) -> None:
    case, kernel = data.draw(phase_cases(phase))
    ref = expected(case)
    assert_matches(run_eager(case, **kernel), ref, case.recipe.dtype)


@pytest.mark.parametrize("extend_lens", [[0, 0], [0, 5], [7, 0], [1, 1]])
def test_prefill_with_empty_rows_and_no_prefix(extend_lens: list[int]) -> None:
    case = build_case(random_spec(Phase.PREFILL, seed=3, prefix_lens=[0, 0], new_lens=extend_lens))
    assert_matches(run_eager(case), expected(case), "float32")


def test_draft_extend_of_one_token_per_row() -> None:
    """``draft_extend_len == 1`` (no SpecConfig has it, so it is cut from a built batch of
    ``draft_extend_len == 2`` with one accepted token per row): rows without padding."""
    case = build_case(random_spec(Phase.DRAFT_EXTEND, seed=6, requests=3, spec=SpecConfig.eagle(1),
                                  new_lens=[1, 1, 1]))
    assert case.batch.spec is not None and case.batch.spec.draft_extend_len == 2
    keep = torch.arange(0, case.batch.num_tokens, 2)  # each row's accepted token, not its padding
    case.batch = dataclasses.replace(case.batch, out_cache_loc=case.batch.out_cache_loc[keep],
                                     spec=dataclasses.replace(case.batch.spec, draft_extend_len=1))
    case.q, case.k, case.v = case.q[keep], case.k[keep], case.v[keep]
    assert_matches(run_eager(case), expected(case), "float32")


def test_long_prefill_splits_query_blocks() -> None:
    case = build_case(random_spec(Phase.PREFILL, seed=5, prefix_lens=[30, 0], new_lens=[70, 45],
                                  num_q_heads=4, num_kv_heads=2, head_size=32))
    backend = TorchBackend(case.config, case.pool, chunk=8, score_budget_bytes=4096)
    assert backend._prefill_block() < 70  # several pieces per row
    assert_matches(run_eager(case, backend), expected(case), "float32")


def test_one_metadata_serves_every_layer() -> None:
    case = build_case(random_spec(Phase.TARGET_VERIFY, seed=9, requests=3, num_layers=3,
                                  spec=SpecConfig.eagle(3, topk=2, num_draft_tokens=4)))
    backend = TorchBackend(case.config, case.pool, chunk=4)
    backend.init_forward_metadata(case.batch)
    for layer in range(3):
        ref = expected(case, layer)
        assert_matches(backend.forward(case.q, case.k, case.v, layer, case.batch), ref, "float32")


def test_noncontiguous_q_and_kv_already_in_pool() -> None:
    case = build_case(random_spec(Phase.DECODE, seed=2, requests=3, num_q_heads=4, num_kv_heads=2))
    ref = expected(case)
    case.pool.write(case.layer, case.batch.out_cache_loc, case.k, case.v)
    qkv = torch.cat([case.q, torch.zeros_like(case.q)], dim=1)  # q as a strided slice
    backend = TorchBackend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    assert_matches(backend.forward(qkv[:, :4], None, None, case.layer, case.batch), ref, "float32")


def test_draft_path_is_read_at_forward_time() -> None:
    case = build_case(random_spec(Phase.DRAFT_DECODE, seed=4, draft_step=1,
                                  spec=SpecConfig.eagle(3, topk=2, num_draft_tokens=4)))
    backend = TorchBackend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    assert case.batch.spec is not None and case.batch.spec.draft_path is not None
    path = case.batch.spec.draft_path
    path[:, 0] = path[:, 0].flip(0)  # re-parent the branches after the metadata was built
    assert_matches(backend.forward(case.q, case.k, case.v, case.layer, case.batch), expected(case), "float32")


def test_forward_needs_metadata_of_that_batch() -> None:
    case = build_case(random_spec(Phase.DECODE, seed=1))
    backend = TorchBackend(case.config, case.pool)
    with pytest.raises(RuntimeError, match="init_forward_metadata"):
        backend.forward(case.q, case.k, case.v, 0, case.batch)


# --- graphs on the CPU emulator -------------------------------------------------------------------------

def copy_batch(dst: ForwardBatch, src: ForwardBatch) -> None:
    """What a graph runner does before a replay: new values into the static tensors."""
    for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "extend_lens"):
        d, s = getattr(dst, name), getattr(src, name)
        if d is not None:
            d.copy_(s)
    if dst.spec is not None and src.spec is not None:
        for name in ("custom_mask", "draft_path"):
            d, s = getattr(dst.spec, name), getattr(src.spec, name)
            if d is not None:
                d.copy_(s)


def pad_last_row(batch: ForwardBatch) -> None:
    """Turn the last row into a graph runner's padding row."""
    per_row = batch.tokens_per_row or 1
    batch.req_pool_indices[-1] = PADDING_REQ
    batch.seq_lens[-1] = 1
    batch.out_cache_loc[-per_row:] = PADDING_SLOT
    if batch.extend_lens is not None:
        batch.extend_lens[-1] = 1
    if batch.spec is not None and batch.spec.draft_path is not None:
        batch.spec.draft_path[-1] = PADDING_SLOT
    if batch.spec is not None and batch.spec.custom_mask is not None:
        batch.spec.custom_mask[-1] = torch.ones_like(batch.spec.custom_mask[-1]).tril()


@st.composite
def replay_specs(draw: st.DrawFn, first: CaseRecipe) -> CaseRecipe:
    """Another batch for the graph captured on ``first``: same shape (requests, heads, layers,
    spec config, draft step, tree or not), new lengths, K/V, q, slots, tree and draft path."""
    other = draw(specs(first.phase, spec=first.spec, requests=first.requests, dtype=first.dtype,
                       head_size=first.head_size))
    fields: dict[str, Any] = {"num_q_heads": first.num_q_heads, "num_kv_heads": first.num_kv_heads,
                              "num_layers": first.num_layers, "layer": first.layer}
    if first.phase is Phase.TARGET_VERIFY:
        T = first.tokens_per_row or 0
        fields["tree_parents"] = (tuple(draw(tree_parents(T)) for _ in range(first.requests))
                                  if first.tree_parents else ())
    if first.phase is Phase.DRAFT_DECODE:
        k, step = first.topk, first.draft_step
        fields["draft_step"] = step
        fields["draft_picks"] = tuple(tuple(tuple(draw(st.integers(0, k - 1)) for _ in range(step))
                                            for _ in range(k)) for _ in range(first.requests))
    return dataclasses.replace(other, **fields)


@pytest.mark.parametrize("phase", GRAPH_PHASES, ids=lambda p: p.value)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_graph_replay_matches_reference(phase: Phase, data: st.DataObject) -> None:
    first_spec = data.draw(specs(phase, max_requests=3))
    replays = [data.draw(replay_specs(first_spec)) for _ in range(2)]
    pool = make_pool(first_spec, functools.reduce(PoolSize.union, map(pool_size, [first_spec, *replays])))
    kernel = data.draw(kernel_params())
    first = build_case(first_spec, pool=pool)
    backend = TorchBackend(first.config, pool, **kernel)
    backend.init_graph_state(first.batch.batch_size, first.batch.num_tokens)
    backend.init_capture_metadata(first.batch)
    q, k, v = first.q.clone(), first.k.clone(), first.v.clone()
    graph = EmulatedGraph()
    out = graph.capture(lambda: backend.forward(q, k, v, first.layer, first.batch))
    for replay, spec in enumerate(replays):
        case = build_case(spec, pool=pool)
        if replay == 1 and spec.requests > 1:
            pad_last_row(case.batch)
        ref = expected(case)
        copy_batch(first.batch, case.batch)
        q.copy_(case.q), k.copy_(case.k), v.copy_(case.v)
        backend.init_replay_metadata(first.batch)
        graph.replay()
        assert graph.replay_allocations == 0
        real = _real_tokens(case.batch)
        assert_matches(out, ref, spec.dtype, rows=real)
        assert torch.isfinite(out).all()


def _real_tokens(batch: ForwardBatch) -> torch.Tensor:
    keep = [tok for r, _, tok in query_tokens(batch) if int(batch.req_pool_indices[r]) != PADDING_REQ]
    return torch.tensor(keep, dtype=torch.int64)


@pytest.mark.parametrize("phase", GRAPH_PHASES, ids=lambda p: p.value)
def test_replay_metadata_has_no_host_sync(phase: Phase) -> None:
    tree = SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
    specs_of: dict[Phase, SpecConfig] = {Phase.TARGET_VERIFY: tree, Phase.DRAFT_DECODE: tree}
    case = build_case(random_spec(phase, seed=7, requests=3, spec=specs_of.get(phase)))
    backend = TorchBackend(case.config, case.pool)
    backend.init_graph_state(case.batch.batch_size, case.batch.num_tokens)
    backend.init_capture_metadata(case.batch)
    # Recording init_replay_metadata as if it were captured: any host read raises.
    EmulatedGraph().capture(lambda: backend.init_replay_metadata(case.batch))


def test_graph_capture_refuses_prefill_and_oversize_batches() -> None:
    case = build_case(random_spec(Phase.PREFILL, seed=1))
    backend = TorchBackend(case.config, case.pool)
    backend.init_graph_state(1, 1)
    with pytest.raises(UnsupportedPhase, match="prefill"):
        backend.init_capture_metadata(case.batch)
    decode = build_case(random_spec(Phase.DECODE, seed=1, requests=3))
    backend = TorchBackend(decode.config, decode.pool)
    backend.init_graph_state(2, 2)
    with pytest.raises(ValueError, match="init_graph_state"):
        backend.init_capture_metadata(decode.batch)


def test_host_sync_in_forward_would_be_caught() -> None:
    """Sanity of the harness: the emulator does catch a host read in a captured forward."""
    with pytest.raises(CaptureError):
        EmulatedGraph().capture(lambda: int(torch.ones(1).sum()))


# --- through the GraphRunner (padding to capture sizes, fill values) ----------------------------------------

@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND], ids=lambda p: p.value)
def test_graph_runner_replays_match_reference(phase: Phase) -> None:
    from attnhal.graphs import GraphRunner, PhaseStep
    from attnhal.planner import GraphPolicy, PhaseBackends, plan
    from attnhal.platform import parse
    from attnhal.spec import SpecConfig

    spec = SpecConfig() if phase is Phase.DECODE else SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
    pool = KVPool(num_layers=1, num_slots=400, num_kv_heads=2, head_dim=32, dtype=torch.float32,
                  max_reqs=8, max_context_len=40)
    shape: dict[str, Any] = {"num_q_heads": 4, "num_kv_heads": 2, "head_size": 32}
    by_phase = {Phase.TARGET_VERIFY: spec, Phase.DRAFT_EXTEND: spec}  # T 4 with a tree; draft_extend_len 4
    first = build_case(random_spec(phase, seed=0, requests=1, spec=by_phase.get(phase), **shape), pool=pool)
    backend = TorchBackend(first.config, pool, chunk=16)
    f32 = torch.float32
    step = PhaseStep(metadata=backend, forward=lambda b, x: backend.forward(x["q"], x["k"], x["v"], 0, b),
                     inputs={"q": ("token", (4, 32), f32), "k": ("token", (2, 32), f32), "v": ("token", (2, 32), f32)})
    cpu = parse("cpu")
    the_plan = plan(spec, cpu, PhaseBackends.same(CAPS, spec), GraphPolicy(batch_sizes=(2, 4)))
    runner = GraphRunner(the_plan, cpu, {phase: step})
    assert runner.captured_sizes(phase) == (2, 4)
    for seed, bs in ((1, 3), (2, 1), (3, 4)):
        case = build_case(random_spec(phase, seed=seed, requests=bs, spec=by_phase.get(phase), **shape), pool=pool)
        ref = expected(case)
        out = runner.run(phase, case.batch, {"q": case.q, "k": case.k, "v": case.v})
        assert isinstance(out, torch.Tensor)
        assert_matches(out, ref, "float32")
    stats = runner.summary()[phase]
    assert stats.replays == 3 and stats.replay_allocations == 0
