"""Triton backend custom ops and graph claims, run by the Triton interpreter on CPU.

The custom ops' schema, fake and dispatch (``opcheck``); capture and replay under the CPU
graph emulator (replays equal eager and the kit's fp64 oracle, replay metadata neither
syncs nor allocates, split counts follow the replayed lengths); a multi-step draft in one
graph; and the whole engine path through the planner and :class:`~attnhal.graphs.GraphRunner`.
Cases in ``triton_cases.py``.
"""

from __future__ import annotations

import functools

import pytest
import torch
from triton_cases import SLOW, TritonCase, assert_close, build, expected, record_launches, run, shape

from attnhal.backend import ForwardBatch, KVPool, SpecInfo
from attnhal.errors import InvalidValue
from attnhal.graphs import EmulatedGraph, GraphRunner, PhaseStep
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.spec import SpecConfig
from attnhal.testing.cases import PoolSize, build_case, make_pool, pool_size
from attnhal.testing.oracle import real_tokens, reference_attention
from attnhal_triton import TritonBackend


@pytest.mark.parametrize("phase", [Phase.DRAFT_DECODE, Phase.PREFILL, Phase.TARGET_VERIFY],
                         ids=lambda p: p.value)
def test_opcheck(phase: Phase) -> None:
    """Schema, fake and dispatch of each custom op (decode_partial, decode_reduce, extend)."""
    case, backend = build(shape(phase, lens=(20, 3), news=(2, 1), tokens=3, kv_heads=1))
    launches = record_launches(case, backend)
    assert launches
    for op, args, kwargs in launches:
        torch.library.opcheck(op, args, kwargs)


# --- graph claims: capture and replay under the CPU emulator -------------------------

def _static_copy(batch: ForwardBatch) -> ForwardBatch:
    """A batch whose tensors are fresh static buffers holding ``batch``'s values."""
    spec = batch.spec
    if spec is not None:
        spec = SpecInfo(spec.topk, spec.num_draft_tokens, spec.draft_extend_len,
                        _clone(spec.custom_mask), _clone(spec.draft_path), spec.draft_step)
    return ForwardBatch(batch.phase, batch.req_pool_indices.clone(), batch.seq_lens.clone(),
                        batch.out_cache_loc.clone(), _clone(batch.extend_lens), None, None, spec)


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _load(static: ForwardBatch, batch: ForwardBatch) -> None:
    """What a graph runner does before replay: copy new values into the static tensors."""
    pairs = [(static.req_pool_indices, batch.req_pool_indices), (static.seq_lens, batch.seq_lens),
             (static.out_cache_loc, batch.out_cache_loc), (static.extend_lens, batch.extend_lens)]
    if static.spec is not None and batch.spec is not None:
        pairs += [(static.spec.custom_mask, batch.spec.custom_mask),
                  (static.spec.draft_path, batch.spec.draft_path)]
    for dst, src in pairs:
        if dst is not None and src is not None:
            dst.copy_(src)


def _replay_metadata_allocations(backend: TritonBackend, batch: ForwardBatch) -> list[str]:
    """Run ``init_replay_metadata`` recorded by the emulator, as the conformance kit
    watches it; returns the ops that allocated (a replay must only write into buffers)."""
    from attnhal.graphs.emulator import OpKind

    recorder = EmulatedGraph()
    recorder.capture(lambda: backend.init_replay_metadata(batch))
    return sorted({op.name for op in recorder.recorded_ops
                   if op.kind is OpKind.ALLOC or (op.kind is OpKind.FUNCTIONAL and op.fresh)})


def _shared_pool(*cases: TritonCase) -> KVPool:
    """One pool that holds each case (built into it in turn, as a graph replays them)."""
    recipes = [c.recipe for c in cases]
    return make_pool(recipes[0], functools.reduce(PoolSize.union, map(pool_size, recipes)))


def test_split_counts_follow_new_lengths_at_replay() -> None:
    """Graph safety of the per-request split counts: captured with short rows (1 split),
    replayed with long rows (4 and 3 splits) under the CPU emulator; equal to the reference."""
    for phase in (Phase.DECODE, Phase.TARGET_VERIFY):
        short, long = shape(phase, lens=(5, 20), seed=1), shape(phase, lens=(250, 130), seed=2)
        case_a, backend = build(short, pool=_shared_pool(short, long))
        static, q = _static_copy(case_a.batch), case_a.q.clone()
        backend.init_graph_state(max_bs=2, max_num_tokens=8)
        backend.init_capture_metadata(static)
        meta = backend._meta
        assert meta is not None and meta.num_splits is not None
        assert meta.num_splits.tolist() == [1, 1]
        graph = EmulatedGraph()
        out = graph.capture(lambda: backend.forward(q, None, None, 0, static))
        assert_close(backend, out, expected(case_a, backend, write=False))
        case_b = build_case(long.recipe, pool=backend.pool)  # the same tensors, rewritten in place
        _load(static, case_b.batch)
        q.copy_(case_b.q)
        assert _replay_metadata_allocations(backend, static) == []
        assert meta.num_splits.tolist() == [4, 3]
        graph.replay()
        assert graph.replay_allocations == 0
        assert_close(backend, out, expected(case_b, backend, write=False))


@pytest.mark.parametrize("phase", [Phase.DECODE, Phase.TARGET_VERIFY], ids=lambda p: p.value)
def test_replay_metadata_refuses_a_batch_that_was_not_captured(phase: Phase) -> None:
    """A graph captured at 4 rows (real rows padded), then handed the 1 real row, as an
    engine integration that forgets the padding would: its split cap (sized from the batch)
    would exceed the captured grid's and drop the tail of long rows. Refused, naming the
    captured size; the captured (padded) batch replays."""
    padded = shape(phase, lens=(250, 5, 5, 5), seed=3)
    case, backend = build(padded)
    static = _static_copy(case.batch)
    backend.init_graph_state(max_bs=4, max_num_tokens=32)
    backend.init_capture_metadata(static)
    real = build_case(shape(phase, lens=(250,), seed=3).recipe, pool=backend.pool)
    with pytest.raises(InvalidValue, match=r"batch_size=1 \(supported: a captured batch .*: 4;"):
        backend.init_replay_metadata(real.batch)
    assert _replay_metadata_allocations(backend, static) == []


GRAPH_PHASES = sorted(TritonBackend.capabilities.graph, key=lambda p: p.value)


#: Every captured phase on the interpreter row; one on a real row (16 splits, the fixed
#: maximum of the static partials, mostly idle programs) unless ATTNHAL_SLOW runs them all.
GRAPH_CASES = ([(p, r) for p in GRAPH_PHASES for r in ("cpu", "cuda:sm90", "hip:gfx90a")] if SLOW else
               [(p, "cpu") for p in GRAPH_PHASES] + [(Phase.TARGET_VERIFY, "cuda:sm90")])


@pytest.mark.parametrize("phase,platform", GRAPH_CASES, ids=lambda v: getattr(v, "value", v))
def test_graph_claims_hold_under_emulator(phase: Phase, platform: str) -> None:
    """Capture on one batch, replay on another of the same shape: equals eager (another
    instance over the same pool) and the oracle, no allocation, K/V written by the graph."""
    first = shape(phase, platform=platform, lens=(33, 90, 2), news=(4, 1, 3), seed=1)
    second = shape(phase, platform=platform, lens=(120, 1, 64), news=(2, 4, 1), seed=2)
    case_a, backend = build(first, pool=_shared_pool(first, second))
    eager = TritonBackend(backend.config, backend.pool, platform=parse(platform))
    want_a = run(case_a, eager)

    static, q, k, v = _static_copy(case_a.batch), case_a.q.clone(), case_a.k.clone(), case_a.v.clone()
    backend.init_graph_state(max_bs=4, max_num_tokens=4 * 8)
    backend.init_capture_metadata(static)
    graph = EmulatedGraph()
    out = graph.capture(lambda: backend.forward(q, k, v, 0, static))
    assert_close(backend, out, want_a, real_tokens(case_a.batch))

    case_b = build_case(second.recipe, pool=backend.pool)  # the same tensors, rewritten in place
    want_b, oracle_b = run(case_b, eager), expected(case_b, eager)
    _load(static, case_b.batch)
    for dst, src in ((q, case_b.q), (k, case_b.k), (v, case_b.v)):
        dst.copy_(src)
    assert _replay_metadata_allocations(backend, static) == []
    graph.replay()
    assert graph.replay_allocations == 0
    assert_close(backend, out, want_b, real_tokens(case_b.batch))
    assert_close(backend, out, oracle_b, real_tokens(case_b.batch))
    launches = [op.name for op in graph.recorded_ops if op.name.startswith("attnhal_triton::")]
    first_op = "decode_partial" if phase in (Phase.DECODE, Phase.DRAFT_DECODE) else "extend"
    # Captured phases all split the KV range: partials, then the reduce.
    assert launches == [f"attnhal_triton::{first_op}", "attnhal_triton::decode_reduce"]


@pytest.mark.parametrize("platform", ["cpu", "cuda:sm80"] if SLOW else ["cpu"])
def test_multi_step_draft_in_one_graph(platform: str) -> None:
    """``multi_step`` claim: attnhal's generic MultiStepDraft over TritonBackend, all steps in
    one emulated graph; the draft path is re-parented in place between steps inside the
    graph, and rewritten again before a replay. Every step matches the fp64 reference."""
    import cases
    from attnhal.backend import MultiStepDraft

    steps, topk = 3, 2
    spec = SpecConfig.eagle(num_steps=steps, topk=topk, num_draft_tokens=4)
    case = build_case(cases.random_spec(Phase.DRAFT_DECODE, 5, spec=spec, prefix_lens=[70, 9],
                                                num_q_heads=8, num_kv_heads=2, head_size=32))
    draft = MultiStepDraft(TritonBackend, case.config, case.pool, spec, platform=parse(platform))
    batch = _static_copy(case.batch)
    assert batch.spec is not None and batch.spec.draft_path is not None
    path, rows = batch.spec.draft_path, batch.batch_size
    reparented = path[:, 0].flip(0).clone()  # branches swap their first ancestor
    qs = [torch.randn(rows, 8, 32) for _ in range(draft.num_forwards)]
    draft.init_graph_state(max_bs=rows, max_num_tokens=rows)
    draft.init_capture_metadata(batch)

    def run_steps() -> list[torch.Tensor]:
        outs = []
        for s, step_batch in enumerate(draft.step_batches(batch)):
            if s == 1:
                path[:, 0].copy_(reparented)
            outs.append(draft.backend(s).forward(qs[s], None, None, 0, step_batch))
        return outs

    def expected_steps(first: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for s in range(draft.num_forwards):
            eager = _static_copy(batch)
            assert eager.spec is not None and eager.spec.draft_path is not None
            eager.spec.draft_step = s
            eager.spec.draft_path[:, 0] = first if s == 0 else reparented
            out.append(reference_attention(
                qs[s], case.pool.k[0], case.pool.v[0], eager, case.pool.req_to_token,
                case.config.sm_scale))
        return out

    original = path[:, 0].clone()
    graph = EmulatedGraph()
    outs = graph.capture(run_steps)
    for got, want in zip(outs, expected_steps(original)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)

    # Replay with new queries and a new path: every step sees the current values.
    path[:, 0].copy_(original)
    path[:, 1:].copy_(path[:, 1:].flip(0))
    for q in qs:
        q.copy_(torch.randn(q.shape))
    draft.init_replay_metadata(batch)
    graph.replay()
    assert graph.replay_allocations == 0
    for got, want in zip(outs, expected_steps(original)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_spec_phase_forward_makes_no_host_sync() -> None:
    """Capturing the forward of each spec phase raises nothing (the emulator refuses syncs),
    even when the batch was prepared by ``init_forward_metadata`` (eager metadata)."""
    for phase in GRAPH_PHASES:
        case, backend = build(shape(phase))
        backend.init_forward_metadata(case.batch)
        graph = EmulatedGraph()
        graph.capture(lambda: backend.forward(case.q, None, None, 0, case.batch))
        assert any(op.name.startswith("attnhal_triton::") for op in graph.recorded_ops)  # the kernels ran


@pytest.mark.parametrize("phase", GRAPH_PHASES, ids=lambda p: p.value)
def test_graph_runner_pads_and_replays(phase: Phase) -> None:
    """The whole path an engine takes: plan -> GraphRunner captures at sizes 2 and 4, pads
    smaller batches with the descriptor's fill value, replays; equal to the fp64 reference."""
    import cases
    from attnhal.backend import AttentionConfig, MultiStepDraft
    from attnhal.planner import GraphPolicy, PhaseBackends, plan

    spec = SpecConfig() if phase is Phase.DECODE else SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
    # Plan and graphs for a simulated MI200; launch rows of the interpreter (fewer splits,
    # so the interpreted grid stays small: the real rows run in the tests above).
    platform, rows_of = parse("hip:gfx90a"), parse("cpu")
    f32 = torch.float32
    pool = KVPool(num_layers=1, num_slots=600, num_kv_heads=2, head_dim=32, dtype=f32, max_reqs=8,
                  max_context_len=60)
    cfg = AttentionConfig(8, 2, 32)
    kw = dict(num_q_heads=8, num_kv_heads=2, head_size=32, spec=None if phase is Phase.DECODE else spec)
    q_in = ("token", (8, 32), f32)
    if phase is Phase.DRAFT_DECODE:
        draft = MultiStepDraft(TritonBackend, cfg, pool, spec, platform=rows_of)
        step = PhaseStep(
            metadata=draft, inputs={"q": q_in}, rows_per_request=spec.topk,
            forward=lambda b, x: tuple(draft.backend(s).forward(x["q"], None, None, 0, sb)
                                       for s, sb in enumerate(draft.step_batches(b))))
    else:
        backend = TritonBackend(cfg, pool, platform=rows_of)
        kv_in = ("token", (2, 32), f32)
        step = PhaseStep(metadata=backend, inputs={"q": q_in, "k": kv_in, "v": kv_in},
                                forward=lambda b, x: backend.forward(x["q"], x["k"], x["v"], 0, b))
    the_plan = plan(spec, platform, PhaseBackends.same(TritonBackend.capabilities, spec),
                    GraphPolicy(batch_sizes=(2, 4)))
    runner = GraphRunner(the_plan, platform, {phase: step})
    assert runner.captured_sizes(phase) == (2, 4), runner.plan[phase].reasons
    for seed, bs in ((1, 3), (2, 1)):
        case = build_case(cases.random_spec(phase, seed, requests=bs, **kw), pool=pool)
        if phase is Phase.DRAFT_DECODE:
            outs = runner.run(phase, case.batch, {"q": case.q})
            wants = []
            for s in range(draft.num_forwards):
                assert case.batch.spec is not None
                at_step = _static_copy(case.batch)
                at_step.spec.draft_step = s  # type: ignore[union-attr]
                wants.append(reference_attention(
                    case.q, pool.k[0], pool.v[0], at_step, pool.req_to_token, cfg.sm_scale))
        else:
            outs = (runner.run(phase, case.batch, {"q": case.q, "k": case.k, "v": case.v}),)
            wants = [cases.expected(case)]
        for got, want in zip(outs, wants, strict=True):
            torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    stats = runner.summary()[phase]
    assert stats.replays == 2 and stats.replay_allocations == 0 and stats.failure is None
