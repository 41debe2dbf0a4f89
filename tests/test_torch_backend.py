"""The torch reference backend against the fp64 reference, eager and under graph capture."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Case, make_case, one_thread, query_tokens

from attnhal.backend import PADDING_REQ, PADDING_SLOT, ForwardBatch, KVPool, UnsupportedPhase
from attnhal.capabilities import GRAPH_PHASES, DTYPES, Feature, Phase
from attnhal.graphs import CaptureError, EmulatedGraph
from attnhal.platform import Vendor
from attnhal_torch import TorchBackend

CAPS = TorchBackend.capabilities
HEADS = [(1, 1), (2, 2), (4, 2), (4, 1), (6, 3), (8, 2)]  # MHA, GQA, MQA
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
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
def common(draw: st.DrawFn, max_bs: int = 4) -> dict[str, Any]:
    bs = draw(st.integers(1, max_bs))
    q_heads, kv_heads = draw(st.sampled_from(HEADS))
    return {
        "bs": bs, "num_q_heads": q_heads, "num_kv_heads": kv_heads,
        "head_size": draw(st.sampled_from(sorted(CAPS.head_sizes))),
        "dtype": TORCH_DTYPES[draw(st.sampled_from(sorted(CAPS.dtypes)))],
        "prefix_lens": draw(st.lists(st.integers(0, 40), min_size=bs, max_size=bs)),
        "seed": draw(st.integers(0, 2**16)),
        "num_layers": draw(st.integers(1, 2)),
    }


@st.composite
def spec_params(draw: st.DrawFn, phase: Phase, bs: int) -> dict[str, Any]:
    if phase is Phase.PREFILL:
        return {"extend_lens": draw(st.lists(st.integers(0, 12), min_size=bs, max_size=bs))}
    if phase is Phase.TARGET_VERIFY:
        topk, steps = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        return {"topk": topk, "num_draft_tokens": draw(st.integers(2, topk * steps + 1)),
                "custom_mask": True if topk > 1 else draw(st.booleans())}
    if phase is Phase.DRAFT_EXTEND:
        t = draw(st.integers(1, 5))
        return {"draft_extend_len": t, "extend_lens": draw(st.lists(st.integers(1, t), min_size=bs, max_size=bs))}
    if phase is Phase.DRAFT_DECODE:
        steps = draw(st.integers(2, 4))
        return {"topk": draw(st.integers(1, 3)), "num_steps": steps, "draft_step": draw(st.integers(0, steps - 2))}
    return {}


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
    base = draw(common())
    case = make_case(phase, **base, **draw(spec_params(phase, base["bs"])))
    return case, draw(kernel_params())


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
    assert next(ep for ep in eps if ep.name == "torch").load() is TorchBackend


# --- eager, every phase -----------------------------------------------------------------------------

@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_phase_matches_reference(phase: Phase, data: st.DataObject) -> None:
    case, kernel = data.draw(phase_cases(phase))
    ref = case.reference()
    assert_matches(run_eager(case, **kernel), ref, str(case.q.dtype).removeprefix("torch."))


@pytest.mark.parametrize("extend_lens", [[0, 0], [0, 5], [7, 0], [1, 1]])
def test_prefill_with_empty_rows_and_no_prefix(extend_lens: list[int]) -> None:
    case = make_case(Phase.PREFILL, seed=3, bs=2, prefix_lens=[0, 0], extend_lens=extend_lens)
    assert_matches(run_eager(case), case.reference(), "float32")


def test_long_prefill_splits_query_blocks() -> None:
    case = make_case(Phase.PREFILL, seed=5, bs=2, prefix_lens=[30, 0], extend_lens=[70, 45],
                     num_q_heads=4, num_kv_heads=2, head_size=32)
    backend = TorchBackend(case.config, case.pool, chunk=8, score_budget_bytes=4096)
    assert backend._prefill_block() < 70  # several pieces per row
    assert_matches(run_eager(case, backend), case.reference(), "float32")


def test_one_metadata_serves_every_layer() -> None:
    case = make_case(Phase.TARGET_VERIFY, seed=9, bs=3, num_layers=3, topk=2, num_draft_tokens=4)
    backend = TorchBackend(case.config, case.pool, chunk=4)
    backend.init_forward_metadata(case.batch)
    for layer in range(3):
        case.layer = layer
        ref = case.reference()
        assert_matches(backend.forward(case.q, case.k, case.v, layer, case.batch), ref, "float32")


def test_noncontiguous_q_and_kv_already_in_pool() -> None:
    case = make_case(Phase.DECODE, seed=2, bs=3, num_q_heads=4, num_kv_heads=2)
    ref = case.reference()
    case.pool.write(case.layer, case.batch.out_cache_loc, case.k, case.v)
    qkv = torch.cat([case.q, torch.zeros_like(case.q)], dim=1)  # q as a strided slice
    backend = TorchBackend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    assert_matches(backend.forward(qkv[:, :4], None, None, case.layer, case.batch), ref, "float32")


def test_draft_path_is_read_at_forward_time() -> None:
    case = make_case(Phase.DRAFT_DECODE, seed=4, bs=2, topk=2, num_steps=3, draft_step=1)
    backend = TorchBackend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    assert case.batch.spec is not None and case.batch.spec.draft_path is not None
    path = case.batch.spec.draft_path
    path[:, 0] = path[:, 0].flip(0)  # re-parent the branches after the metadata was built
    assert_matches(backend.forward(case.q, case.k, case.v, case.layer, case.batch), case.reference(), "float32")


def test_forward_needs_metadata_of_that_batch() -> None:
    case = make_case(Phase.DECODE, seed=1)
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


def graph_pool(base: dict[str, Any]) -> KVPool:
    """Large enough for any case the strategies draw."""
    return KVPool(num_layers=base["num_layers"], num_slots=600, num_kv_heads=base["num_kv_heads"],
                  head_dim=base["head_size"], dtype=base["dtype"], max_reqs=8, max_context_len=72)


@pytest.mark.parametrize("phase", GRAPH_PHASES, ids=lambda p: p.value)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_graph_replay_matches_reference(phase: Phase, data: st.DataObject) -> None:
    base = data.draw(common(max_bs=3))
    pool = graph_pool(base)
    params = data.draw(spec_params(phase, base["bs"]))
    params.pop("extend_lens", None)  # each replay draws its own accepted lengths
    kernel = data.draw(kernel_params())
    first = make_case(phase, **{**base, "seed": base["seed"]}, **params, pool=pool)
    backend = TorchBackend(first.config, pool, **kernel)
    backend.init_graph_state(first.batch.batch_size, first.batch.num_tokens)
    backend.init_capture_metadata(first.batch)
    q, k, v = first.q.clone(), first.k.clone(), first.v.clone()
    graph = EmulatedGraph()
    out = graph.capture(lambda: backend.forward(q, k, v, first.layer, first.batch))
    for replay in range(2):
        case = make_case(phase, **{**base, "seed": base["seed"] + 1 + replay}, **params, pool=pool)
        if replay == 1 and base["bs"] > 1:
            pad_last_row(case.batch)
        case.layer = first.layer
        ref = case.reference()
        copy_batch(first.batch, case.batch)
        q.copy_(case.q), k.copy_(case.k), v.copy_(case.v)
        backend.init_replay_metadata(first.batch)
        graph.replay()
        assert graph.replay_allocations == 0
        real = _real_tokens(case.batch)
        assert_matches(out, ref, str(base["dtype"]).removeprefix("torch."), rows=real)
        assert torch.isfinite(out).all()


def _real_tokens(batch: ForwardBatch) -> torch.Tensor:
    keep = [tok for r, _, tok in query_tokens(batch) if int(batch.req_pool_indices[r]) != PADDING_REQ]
    return torch.tensor(keep, dtype=torch.int64)


@pytest.mark.parametrize("phase", GRAPH_PHASES, ids=lambda p: p.value)
def test_replay_metadata_has_no_host_sync(phase: Phase) -> None:
    params: dict[Phase, dict[str, Any]] = {Phase.TARGET_VERIFY: {"topk": 2, "num_draft_tokens": 4},
                                           Phase.DRAFT_DECODE: {"topk": 2}}
    case = make_case(phase, seed=7, bs=3, **params.get(phase, {}))
    backend = TorchBackend(case.config, case.pool)
    backend.init_graph_state(case.batch.batch_size, case.batch.num_tokens)
    backend.init_capture_metadata(case.batch)
    # Recording init_replay_metadata as if it were captured: any host read raises.
    EmulatedGraph().capture(lambda: backend.init_replay_metadata(case.batch))


def test_graph_capture_refuses_prefill_and_oversize_batches() -> None:
    case = make_case(Phase.PREFILL, seed=1)
    backend = TorchBackend(case.config, case.pool)
    backend.init_graph_state(1, 1)
    with pytest.raises(UnsupportedPhase, match="prefill"):
        backend.init_capture_metadata(case.batch)
    decode = make_case(Phase.DECODE, seed=1, bs=3)
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
    from attnhal.plan import GraphPolicy, PhaseBackends, SpecConfig, plan
    from attnhal.platform import parse

    spec = SpecConfig() if phase is Phase.DECODE else SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
    pool = KVPool(num_layers=1, num_slots=400, num_kv_heads=2, head_dim=32, dtype=torch.float32,
                  max_reqs=8, max_context_len=40)
    first = make_case(phase, seed=0, bs=1, num_q_heads=4, num_kv_heads=2, head_size=32, pool=pool)
    backend = TorchBackend(first.config, pool, chunk=16)
    f32 = torch.float32
    step = PhaseStep(metadata=backend, forward=lambda b, x: backend.forward(x["q"], x["k"], x["v"], 0, b),
                     inputs={"q": ("token", (4, 32), f32), "k": ("token", (2, 32), f32), "v": ("token", (2, 32), f32)})
    cpu = parse("cpu")
    the_plan = plan(spec, cpu, PhaseBackends.same(CAPS, spec), GraphPolicy(batch_sizes=(2, 4)))
    runner = GraphRunner(the_plan, cpu, {phase: step})
    assert runner.captured_sizes(phase) == (2, 4)
    by_phase: dict[Phase, dict[str, Any]] = {Phase.TARGET_VERIFY: {"topk": 2, "num_draft_tokens": 4},
                                             Phase.DRAFT_EXTEND: {"draft_extend_len": spec.draft_extend_len}}
    params = by_phase.get(phase, {})
    for seed, bs in ((1, 3), (2, 1), (3, 4)):
        case = make_case(phase, seed=seed, bs=bs, num_q_heads=4, num_kv_heads=2, head_size=32, pool=pool, **params)
        ref = case.reference()
        out = runner.run(phase, case.batch, {"q": case.q, "k": case.k, "v": case.v})
        assert isinstance(out, torch.Tensor)
        assert_matches(out, ref, "float32")
    stats = runner.summary()[phase]
    assert stats.replays == 3 and stats.replay_allocations == 0
