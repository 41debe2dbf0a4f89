"""MultiStepDraft: refusals with reasons, per-step batches, eager steps and one graph for all steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from cases import one_thread, random_spec

from attnhal.backend import AttentionBackend, ForwardBatch, KVPool, MultiStepDraft, MultiStepUnsupported
from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.graphs import EmulatedGraph
from attnhal.phases import Phase
from attnhal.reasons import ReasonCode
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, build_case
from attnhal.testing.oracle import reference_forward
from attnhal_torch import TorchBackend

pytestmark = pytest.mark.usefixtures(one_thread.__name__)
CAPS = TorchBackend.capabilities


def _backend_with(caps: BackendCapabilities) -> type[AttentionBackend]:
    class Backend(AttentionBackend):
        capabilities: ClassVar[BackendCapabilities] = caps

    return Backend


def _case(num_steps: int, topk: int, seed: int, pool: KVPool | None = None, bs: int = 2, **kw: Any) -> Any:
    """A step-0 draft decode of ``bs`` requests (random prefixes, scattered slots) for ``num_steps``."""
    spec = SpecConfig.eagle(num_steps, topk=topk, num_draft_tokens=topk * num_steps + 1)
    return build_case(random_spec(Phase.DRAFT_DECODE, seed, requests=bs, spec=spec, draft_step=0,
                                  num_q_heads=4, num_kv_heads=2, head_size=16, **kw), pool=pool)


def _step_qkv(case: Case, steps: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(case.q.shape, generator=gen), torch.randn(case.k.shape, generator=gen),
             torch.randn(case.v.shape, generator=gen)) for _ in range(steps)]


# --- refusals ------------------------------------------------------------------------------------

def test_refuses_backend_without_multi_step() -> None:
    caps = replace(CAPS, name="single", multi_step=None)
    case = _case(3, 1, seed=0)
    with pytest.raises(MultiStepUnsupported) as err:
        MultiStepDraft(_backend_with(caps), case.config, case.pool, SpecConfig.eagle(3))
    assert [r.code for r in err.value.reasons] == [ReasonCode.MULTI_STEP]
    assert "backend 'single' declares no multi-step draft support" in str(err.value)


def test_refuses_one_step() -> None:
    case = _case(3, 1, seed=0)
    with pytest.raises(MultiStepUnsupported, match="draft_decode does not run when num_steps == 1") as err:
        MultiStepDraft(TorchBackend, case.config, case.pool, SpecConfig.eagle(1))
    assert err.value.reasons[0].code is ReasonCode.PHASE_NOT_RUN


def test_refuses_spec_beyond_backend_limits() -> None:
    caps = replace(CAPS, name="chain_only", multi_step=SpecLimits(max_topk=1, max_num_steps=3))
    case = _case(3, 1, seed=0)
    with pytest.raises(MultiStepUnsupported) as err:
        MultiStepDraft(_backend_with(caps), case.config, case.pool, SpecConfig.eagle(4, topk=2, num_draft_tokens=6))
    messages = [r.message for r in err.value.reasons]
    assert all(r.code is ReasonCode.MULTI_STEP for r in err.value.reasons)
    assert any(m.startswith("topk=2 (supported: <= 1") for m in messages)
    assert any(m.startswith("num_steps=4 (supported: <= 3") for m in messages)


def test_refuses_backend_without_draft_decode_phase() -> None:
    caps = replace(CAPS, name="no_dd", phases=frozenset({Phase.DECODE}), graph={})
    case = _case(3, 1, seed=0)
    with pytest.raises(MultiStepUnsupported) as err:
        MultiStepDraft(_backend_with(caps), case.config, case.pool, SpecConfig.eagle(3))
    assert err.value.reasons[0].code is ReasonCode.PHASE


# --- step batches ------------------------------------------------------------------------------------

def test_step_batches_are_views_with_their_step() -> None:
    case = _case(4, 2, seed=1)
    msd = MultiStepDraft(TorchBackend, case.config, case.pool, SpecConfig.eagle(4, topk=2, num_draft_tokens=5))
    assert msd.num_forwards == 3
    steps = msd.step_batches(case.batch)
    assert msd.step_batches(case.batch) is steps  # same list: metadata and forwards agree
    path = case.batch.spec.draft_path
    for s, b in enumerate(steps):
        assert b.spec is not None and b.spec.draft_step == s and b.phase is Phase.DRAFT_DECODE
        assert b.out_cache_loc.untyped_storage().data_ptr() == path.untyped_storage().data_ptr()
        assert torch.equal(b.out_cache_loc, path[:, s])
        assert b.req_pool_indices is case.batch.req_pool_indices and b.seq_lens is case.batch.seq_lens
    with pytest.raises(IndexError):
        msd.backend(3)


def test_step_batches_refuse_other_phases_and_short_paths() -> None:
    case = _case(3, 1, seed=1)
    msd = MultiStepDraft(TorchBackend, case.config, case.pool, SpecConfig.eagle(3))
    with pytest.raises(ValueError, match="draft_path.shape"):
        msd.step_batches(replace(case.batch, spec=replace(case.batch.spec, draft_path=case.batch.spec.draft_path[:, :1])))
    with pytest.raises(ValueError, match="supported: draft_decode"):
        msd.step_batches(replace(case.batch, phase=Phase.DECODE))


# --- eager and graph equivalence with the reference ------------------------------------------------------

def _run_steps(msd: MultiStepDraft, batch: ForwardBatch,
               qkv: Sequence[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    return [msd.backend(s).forward(q, k, v, 0, b) for s, (b, (q, k, v)) in enumerate(zip(msd.step_batches(batch), qkv))]


@settings(max_examples=25, deadline=None)
@given(num_steps=st.integers(2, 5), topk=st.integers(1, 3), bs=st.integers(1, 3), seed=st.integers(0, 999),
       dtype=st.sampled_from(["float32", "bfloat16"]))
def test_eager_steps_match_reference(num_steps: int, topk: int, bs: int, seed: int, dtype: str) -> None:
    case = _case(num_steps, topk, seed, bs=bs, dtype=dtype)
    spec = SpecConfig.eagle(num_steps, topk=topk, num_draft_tokens=topk * num_steps + 1)
    msd = MultiStepDraft(TorchBackend, case.config, case.pool, spec, chunk=8)
    msd.init_forward_metadata(case.batch)
    tol = CAPS.tolerance(dtype)
    for s, (b, (q, k, v)) in enumerate(zip(msd.step_batches(case.batch), _step_qkv(case, msd.num_forwards, seed))):
        q, k, v = q.to(case.q.dtype), k.to(case.q.dtype), v.to(case.q.dtype)
        ref = reference_forward(q, k, v, 0, b, case.pool, case.config.sm_scale)
        out = msd.backend(s).forward(q, k, v, 0, b)
        torch.testing.assert_close(out.double(), ref, atol=tol.atol, rtol=tol.rtol)


@settings(max_examples=10, deadline=None)
@given(num_steps=st.integers(2, 4), topk=st.integers(1, 3), seed=st.integers(0, 999))
def test_all_steps_in_one_graph(num_steps: int, topk: int, seed: int) -> None:
    pool = KVPool(num_layers=1, num_slots=400, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                  max_reqs=6, max_context_len=60)
    first = _case(num_steps, topk, seed, pool=pool)
    spec = SpecConfig.eagle(num_steps, topk=topk, num_draft_tokens=topk * num_steps + 1)
    msd = MultiStepDraft(TorchBackend, first.config, pool, spec, chunk=8)
    rows = first.batch.batch_size
    msd.init_graph_state(rows, rows)
    workspaces = {id(getattr(msd.backend(s), "_graph_ws")) for s in range(msd.num_forwards)}
    assert len(workspaces) == 1  # the steps share one scratch workspace
    msd.init_capture_metadata(first.batch)
    static = [tuple(t.clone() for t in qkv) for qkv in _step_qkv(first, msd.num_forwards, seed)]
    graph = EmulatedGraph()
    outs = graph.capture(lambda: _run_steps(msd, first.batch, static))
    for replay in (1, 2):
        case = _case(num_steps, topk, seed + replay, pool=pool)
        fresh = _step_qkv(case, msd.num_forwards, seed + replay)
        # eager on a copy of the pool: the expected result of all steps
        eager_pool = KVPool(num_layers=1, num_slots=400, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                            max_reqs=6, max_context_len=60)
        eager_pool.k[0].copy_(pool.k[0]), eager_pool.v[0].copy_(pool.v[0]), eager_pool.req_to_token.copy_(pool.req_to_token)
        eager = MultiStepDraft(TorchBackend, case.config, eager_pool, spec)
        eager.init_forward_metadata(case.batch)
        want = _run_steps(eager, case.batch, fresh)
        for name in ("req_pool_indices", "seq_lens", "out_cache_loc"):
            getattr(first.batch, name).copy_(getattr(case.batch, name))
        first.batch.spec.draft_path.copy_(case.batch.spec.draft_path)
        for dst, src in zip(static, fresh):
            for d, s in zip(dst, src):
                d.copy_(s)
        msd.init_replay_metadata(first.batch)
        graph.replay()
        assert graph.replay_allocations == 0
        for got, exp in zip(outs, want):
            torch.testing.assert_close(got, exp, atol=1e-5, rtol=1e-5)


# --- through the GraphRunner: the whole multi-step draft as one graph per size ------------------------

def test_graph_runner_captures_all_steps_in_one_graph() -> None:
    from attnhal.graphs import GraphRunner, PhaseStep
    from attnhal.planner import GraphPolicy, PhaseBackends, plan
    from attnhal.platform import parse

    spec = SpecConfig.eagle(3, topk=2, num_draft_tokens=5)
    pool = KVPool(num_layers=1, num_slots=500, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                  max_reqs=8, max_context_len=48)
    case = _case(3, 2, seed=3, pool=pool, bs=3)
    msd = MultiStepDraft(TorchBackend, case.config, pool, spec)
    steps = msd.num_forwards

    def forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(msd.backend(s).forward(x["q"][:, s], x["k"][:, s], x["v"][:, s], 0, b)
                     for s, b in enumerate(msd.step_batches(batch)))

    f32 = torch.float32
    step = PhaseStep(metadata=msd, forward=forward, rows_per_request=spec.topk,
                     inputs={"q": ("row", (steps, 4, 16), f32), "k": ("row", (steps, 2, 16), f32),
                             "v": ("row", (steps, 2, 16), f32)})
    cpu = parse("cpu")
    the_plan = plan(spec, cpu, PhaseBackends.same(CAPS, spec), GraphPolicy(batch_sizes=(1, 2, 4)))
    runner = GraphRunner(the_plan, cpu, {Phase.DRAFT_DECODE: step})
    assert runner.captured_sizes(Phase.DRAFT_DECODE) == (1, 2, 4)
    for seed, bs in ((4, 3), (5, 1), (6, 2)):  # 3 requests replay the size-4 graph with a padded request
        case = _case(3, 2, seed=seed, pool=pool, bs=bs)
        rows = case.batch.batch_size
        gen = torch.Generator().manual_seed(seed)
        x = {"q": torch.randn(rows, steps, 4, 16, generator=gen), "k": torch.randn(rows, steps, 2, 16, generator=gen),
             "v": torch.randn(rows, steps, 2, 16, generator=gen)}
        want = []
        for s in range(steps):  # the reference, step by step on the pool as the steps leave it
            b = replace(case.batch, out_cache_loc=case.batch.spec.draft_path[:, s],
                        spec=replace(case.batch.spec, draft_step=s))
            want.append(reference_forward(x["q"][:, s], x["k"][:, s], x["v"][:, s], 0, b, pool, case.config.sm_scale))
            pool.write(0, b.out_cache_loc, x["k"][:, s], x["v"][:, s])
        got = runner.run(Phase.DRAFT_DECODE, case.batch, x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=1e-5)
    stats = runner.summary()[Phase.DRAFT_DECODE]
    assert stats.replays == 3 and stats.eager_runs == 0 and stats.replay_allocations == 0
