"""GraphRunner on the CPU emulator: replay == eager, padding, eager fallback, graph safety.

The toy backends (tests/doubles/broken_backends.py) are each caught for their own reason;
the same checks run with real device graphs in tests/graphs/test_device_gpu.py.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from broken_backends import (
    AllocatingDecode,
    HostSyncDecode,
    StaleLenDecode,
    ToyDecode,
    decode_batch,
    make_pool,
    release,
)
from doubles import attnhal_warnings, stand_in
from graph_steps import (
    ALL_GRAPHS,
    CFG,
    CPU,
    SIZES,
    SPEC,
    TORCH_SPEC,
    Meta,
    attention_step,
    check_torch_backend,
    decode_plan,
    eager,
    mixing_forward,
    qkv,
    spec_batch,
    spec_steps,
    torch_steps,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from attnhal.backend import PADDING_REQ, PADDING_SLOT, ForwardBatch, KVPool
from attnhal.capabilities import FillTerm, SeqLenFill, Variant, When
from attnhal.graphs import (
    CaptureError,
    EmulatedGraph,
    GraphCaptureWarning,
    GraphRunner,
    runner as runner_module,
)
from attnhal.phases import Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, PhasePlan, plan
from attnhal.platform import GraphKind, parse
from attnhal.reasons import ReasonCode











def toy_runner(cls: type[ToyDecode], pool: KVPool | None = None) -> tuple[GraphRunner, ToyDecode, KVPool]:
    pool = pool or make_pool(CFG, max_reqs=16, max_context_len=32)
    backend = cls(CFG, pool)
    return GraphRunner(decode_plan(cls.capabilities), CPU, {Phase.DECODE: attention_step(backend)}), backend, pool


@pytest.fixture(scope="module")
def toy() -> tuple[GraphRunner, ToyDecode, KVPool]:
    return toy_runner(ToyDecode)


seq_lens = st.lists(st.integers(1, 32), min_size=1, max_size=8)


# --------------------------------------------------------------- replay == eager


def test_toy_backend_is_real_attention() -> None:
    """The toy agrees with a per-row softmax(q k^T) v over the row's slots."""
    pool = make_pool(CFG)
    backend = ToyDecode(CFG, pool)
    batch, x = decode_batch(pool, [1, 7, 32], seed=1), qkv(3, 1)
    got = eager(backend, batch, x)
    for r, n in enumerate(batch.seq_lens.tolist()):
        slots = pool.req_to_token[batch.req_pool_indices[r], :n].long()
        k = pool.k[0][slots].repeat_interleave(CFG.group_size, dim=1)  # [n, h, d]
        v = pool.v[0][slots].repeat_interleave(CFG.group_size, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", x["q"][r], k) * CFG.sm_scale, dim=-1)
        torch.testing.assert_close(got[r], torch.einsum("hn,nhd->hd", p, v), atol=1e-6, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(lens=seq_lens, seed=st.integers(0, 2**16))
def test_replay_equals_eager(toy: tuple[GraphRunner, ToyDecode, KVPool], lens: list[int], seed: int) -> None:
    runner, backend, pool = toy
    batch, x = decode_batch(pool, lens, seed=seed), qkv(len(lens), seed)
    before = runner.summary()[Phase.DECODE]
    replayed = runner.run(Phase.DECODE, batch, x)
    assert isinstance(replayed, torch.Tensor) and replayed.shape == (len(lens), CFG.num_q_heads, CFG.head_size)
    replayed = replayed.clone()  # a view of the graph's static output
    torch.testing.assert_close(replayed, eager(backend, batch, x), atol=1e-6, rtol=0)
    after = runner.summary()[Phase.DECODE]
    assert (after.replays, after.eager_runs) == (before.replays + 1, before.eager_runs)
    release(pool, batch)


def test_captures_every_size_and_pads_odd_batches(toy: tuple[GraphRunner, ToyDecode, KVPool]) -> None:
    runner, backend, pool = toy
    assert runner.captured_sizes(Phase.DECODE) == SIZES
    assert runner.summary()[Phase.DECODE].captured_sizes == SIZES
    for bs in (3, 5, 7):  # not capture sizes: padded to 4, 8, 8
        batch, x = decode_batch(pool, list(range(2, 2 + bs)), seed=bs), qkv(bs, bs)
        out = runner.run("decode", batch, x)
        assert isinstance(out, torch.Tensor) and out.shape[0] == bs
        torch.testing.assert_close(out.clone(), eager(backend, batch, x), atol=1e-6, rtol=0)
        release(pool, batch)


def test_above_largest_size_runs_eagerly() -> None:
    runner, backend, pool = toy_runner(ToyDecode)
    batch, x = decode_batch(pool, [3] * 11, seed=3), qkv(11, 3)
    out = runner.run(Phase.DECODE, batch, x)
    stats = runner.summary()[Phase.DECODE]
    assert (stats.replays, stats.eager_runs) == (0, 1)
    torch.testing.assert_close(out, eager(backend, batch, x), atol=0, rtol=0)


# ------------------------------------------------------------------------- padding


class Spy(ToyDecode):
    """Keeps a copy of the static batch it is given at each replay."""

    seen: ForwardBatch | None = None

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        self.seen = ForwardBatch(batch.phase, batch.req_pool_indices.clone(), batch.seq_lens.clone(),
                                 batch.out_cache_loc.clone(), seq_lens_cpu=batch.seq_lens_cpu)
        super().init_replay_metadata(batch)


def test_padded_rows_never_change_real_rows() -> None:
    runner, backend, pool = toy_runner(Spy)
    k_before = pool.k[0].clone()
    batch, x = decode_batch(pool, [9, 30, 4], seed=5), qkv(3, 5)
    alone = []
    for r in range(3):  # each row on its own replays the size-1 graph: no padding at all
        row = ForwardBatch(Phase.DECODE, batch.req_pool_indices[r:r + 1], batch.seq_lens[r:r + 1],
                           batch.out_cache_loc[r:r + 1], seq_lens_cpu=batch.seq_lens_cpu[r:r + 1])  # type: ignore[index]
        alone.append(runner.run(Phase.DECODE, row, {n: t[r:r + 1] for n, t in x.items()}).clone())  # type: ignore[union-attr]
    padded = runner.run(Phase.DECODE, batch, x)
    assert isinstance(padded, torch.Tensor)
    torch.testing.assert_close(padded, torch.cat(alone), atol=1e-6, rtol=0)

    seen = backend.seen  # type: ignore[attr-defined]
    assert seen is not None and seen.batch_size == 4  # padded up to the next captured size
    fill = backend.graph_seq_len_fill_value(None)
    assert seen.req_pool_indices[3] == PADDING_REQ and seen.out_cache_loc[3] == PADDING_SLOT
    assert seen.seq_lens[3] == fill and seen.seq_lens_cpu is not None and seen.seq_lens_cpu[3] == fill
    # K/V changed only at the real rows' new slots and at the padding slot
    changed = (pool.k[0] != k_before).flatten(1).any(1).nonzero().flatten().tolist()
    assert set(changed) <= set(batch.out_cache_loc.tolist()) | {PADDING_SLOT}


# ------------------------------------------------------- each broken backend, its own way


def test_correct_backend_replays_without_allocating(toy: tuple[GraphRunner, ToyDecode, KVPool]) -> None:
    runner, _, pool = toy
    batch = decode_batch(pool, [5, 6, 7], seed=2)
    runner.run(Phase.DECODE, batch, qkv(3, 2))
    stats = runner.summary()[Phase.DECODE]
    assert stats.replays >= 1 and stats.replay_allocations == 0
    release(pool, batch)


def test_host_sync_is_a_capture_error_naming_the_op() -> None:
    pool = make_pool(CFG)
    backend = HostSyncDecode(CFG, pool)
    batch, x = decode_batch(pool, [4, 9], seed=0), qkv(2, 0)
    backend.init_forward_metadata(batch)
    with pytest.raises(CaptureError, match="_local_scalar_dense"):
        EmulatedGraph().capture(lambda: backend.forward(x["q"], x["k"], x["v"], 0, batch))

    with pytest.warns(GraphCaptureWarning, match="phase=decode") as record:
        runner, _, pool = toy_runner(HostSyncDecode, pool)
    assert len(record) == 1
    decision = runner.plan[Phase.DECODE]
    assert not decision.capture and decision.reasons[-1].code is ReasonCode.CAPTURE_FAILED
    assert decision.reasons[-1].message.startswith("CaptureError: aten._local_scalar_dense")
    out = runner.run(Phase.DECODE, batch, x)  # eager, and right
    torch.testing.assert_close(out, eager(ToyDecode(CFG, pool), batch, x), atol=0, rtol=0)
    assert runner.summary()[Phase.DECODE].eager_runs == 1


def test_stale_host_length_makes_replay_differ_from_eager() -> None:
    runner, backend, pool = toy_runner(StaleLenDecode)
    assert isinstance(backend, StaleLenDecode)
    fill = backend.graph_seq_len_fill_value(None)
    assert backend.captured_len == fill  # the capture batch is all padding rows
    batch, x = decode_batch(pool, [12, 20, 31, 7], seed=4), qkv(4, 4)
    replayed = runner.run(Phase.DECODE, batch, x)
    assert isinstance(replayed, torch.Tensor)
    replayed = replayed.clone()
    assert backend.ctx == 31  # init_replay_metadata saw the real length ...
    right = eager(backend, batch, x)
    assert not torch.allclose(replayed, right, atol=1e-3)  # ... but the graph did not
    # The replay is exactly attention over the first `captured_len` positions.
    stale = ToyDecode(CFG, pool)
    stale.context_len = lambda batch: fill  # type: ignore[method-assign]
    torch.testing.assert_close(replayed, eager(stale, batch, x), atol=1e-6, rtol=0)


def test_allocating_backend_is_caught_by_replay_allocations() -> None:
    runner, backend, pool = toy_runner(AllocatingDecode)
    batch, x = decode_batch(pool, [3, 30, 11], seed=6), qkv(3, 6)
    out = runner.run(Phase.DECODE, batch, x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out.clone(), eager(backend, batch, x), atol=1e-6, rtol=0)
    assert runner.summary()[Phase.DECODE].replay_allocations > 0


# ------------------------------------------------------ spec phases and capture failure














def test_spec_phases_pad_every_field() -> None:
    meta = Meta(fill=6)
    p = plan(SPEC, CPU, PhaseBackends.same(ALL_GRAPHS, SPEC), GraphPolicy(batch_sizes=SIZES))
    runner = GraphRunner(p, CPU, spec_steps(meta))
    assert meta.states == [(8 * SPEC.topk, 8 * SPEC.num_draft_tokens)]  # once per owner, sized for all
    for phase in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY):
        assert runner.captured_sizes(phase) == SIZES
        batch, x = spec_batch(phase, 3, seed=len(phase.value))
        out = runner.run(phase, batch, x)
        assert isinstance(out, torch.Tensor)
        torch.testing.assert_close(out.clone(), mixing_forward(batch, x))
        seen = meta.seen[phase]
        rows, real = 4 * (SPEC.topk if phase is Phase.DRAFT_DECODE else 1), batch.batch_size
        assert seen.batch_size == rows
        fill = p[phase].seq_len_fill
        assert (seen.seq_lens[real:] == fill).all() and (seen.req_pool_indices[real:] == PADDING_REQ).all()
        assert (seen.out_cache_loc[real * (batch.tokens_per_row or 1):] == PADDING_SLOT).all()
        spec = seen.spec
        assert spec is not None
        if seen.extend_lens is not None:
            assert (seen.extend_lens[real:] == 1).all()
        if spec.custom_mask is not None:
            t = SPEC.num_draft_tokens
            assert (spec.custom_mask[real:] == torch.ones(t, t, dtype=torch.bool).tril()).all()
        if spec.draft_path is not None:
            assert (spec.draft_path[real:] == PADDING_SLOT).all()
    assert all(s.replays == 1 and s.eager_runs == 0 for s in runner.summary().values())


#: Fills that differ per phase, one of them only through a variant that matches the CPU.
PER_PHASE_FILL = replace(
    ALL_GRAPHS, name="per-phase-fill",
    phase_fill={Phase.DRAFT_EXTEND: SeqLenFill(3), Phase.TARGET_VERIFY: SeqLenFill(1, plus=FillTerm.WIDTH)},
    variants=(Variant(When(vendor={"cpu"}), {"phase_fill": {Phase.DRAFT_DECODE: SeqLenFill(9)}}, note="cpu"),))


def test_runner_captures_the_plans_per_phase_sizes_and_pads_with_its_per_phase_fill() -> None:
    meta = Meta(fill=99)  # the owner's own answer must never be used with a planned phase
    p = plan(SPEC, CPU, PhaseBackends.same(PER_PHASE_FILL, SPEC), GraphPolicy(batch_sizes=(2, 4, 8), max_tokens=10))
    want_sizes = {Phase.DRAFT_DECODE: (2, 4), Phase.DRAFT_EXTEND: (2,), Phase.TARGET_VERIFY: (2,)}  # width 2, 5, 5
    want_fill = {Phase.DRAFT_DECODE: 9, Phase.DRAFT_EXTEND: 3, Phase.TARGET_VERIFY: 1 + SPEC.num_draft_tokens}
    assert {ph: p[ph].capture_sizes for ph in want_sizes} == want_sizes
    assert {ph: p[ph].seq_len_fill for ph in want_fill} == want_fill
    assert PER_PHASE_FILL.fill_for(Phase.DRAFT_DECODE).value(SPEC) == 1  # 9 only once resolved for the CPU
    runner = GraphRunner(p, CPU, spec_steps(meta))
    assert meta.states == [(4 * SPEC.topk, 2 * SPEC.num_draft_tokens)]  # each phase at its own largest size
    for phase, sizes in want_sizes.items():
        assert runner.captured_sizes(phase) == sizes == runner.summary()[phase].captured_sizes
        batch, x = spec_batch(phase, 1, seed=3)  # one request, padded to 2
        torch.testing.assert_close(runner.run(phase, batch, x).clone(), mixing_forward(batch, x))  # type: ignore[union-attr]
        seen, real = meta.seen.pop(phase), batch.batch_size
        assert seen.batch_size == 2 * real and (seen.seq_lens[real:] == want_fill[phase]).all()
        assert seen.seq_lens_cpu is not None and (seen.seq_lens_cpu[real:] == want_fill[phase]).all()
        big, bx = spec_batch(phase, 3, seed=4)  # above the phase's largest size: eager
        torch.testing.assert_close(runner.run(phase, big, bx), mixing_forward(big, bx))
    stats = runner.summary()
    assert stats[Phase.DRAFT_DECODE].replays == 2 and stats[Phase.DRAFT_DECODE].eager_runs == 0
    assert all((stats[ph].replays, stats[ph].eager_runs) == (1, 1) for ph in (Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY))


def test_hand_built_plan_without_sizes_or_fill_uses_the_policy_and_the_owner() -> None:
    """A PhasePlan built by hand (no capture_sizes, no seq_len_fill) gets what the planner would
    give for sizes, and the metadata owner's fill."""
    meta = Meta(fill=7)
    hand = GraphPlan(platform=CPU.name, spec=SPEC, policy=GraphPolicy(batch_sizes=(2, 4), max_tokens=10),
                     phases={Phase.TARGET_VERIFY: PhasePlan(runs=True, capture=True, backend="hand")})
    runner = GraphRunner(hand, CPU, {Phase.TARGET_VERIFY: spec_steps(meta)[Phase.TARGET_VERIFY]})
    assert runner.captured_sizes(Phase.TARGET_VERIFY) == (2,)  # 4 x 5 tokens > max_tokens
    batch, x = spec_batch(Phase.TARGET_VERIFY, 1, seed=5)
    torch.testing.assert_close(runner.run(Phase.TARGET_VERIFY, batch, x).clone(), mixing_forward(batch, x))  # type: ignore[union-attr]
    seen = meta.seen[Phase.TARGET_VERIFY]
    assert seen.batch_size == 2 and seen.seq_lens[1] == 7 and runner.summary()[Phase.TARGET_VERIFY].replays == 1


def test_failed_capture_falls_back_for_that_phase_only() -> None:
    p = plan(SPEC, CPU, PhaseBackends.same(ALL_GRAPHS, SPEC), GraphPolicy(batch_sizes=SIZES))
    assert p.captured == (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)
    steps = spec_steps(Meta(fill=6), failing=Phase.DRAFT_EXTEND)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = GraphRunner(p, CPU, steps)
    assert attnhal_warnings(caught) == [GraphCaptureWarning]
    assert runner.plan.captured == (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY)
    why = runner.plan[Phase.DRAFT_EXTEND].reasons[-1]
    assert why.code is ReasonCode.CAPTURE_FAILED and why.message.startswith("CaptureError: ")
    assert "_local_scalar_dense" in why.message and runner.summary()[Phase.DRAFT_EXTEND].failure == why.message
    assert p[Phase.DRAFT_EXTEND].capture  # the plan given is not mutated

    for phase in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY):
        batch, x = spec_batch(phase, 2, seed=9)
        out = runner.run(phase, batch, x)
        torch.testing.assert_close(out, steps[phase].forward(batch, x))
    stats = runner.summary()
    assert (stats[Phase.DRAFT_EXTEND].replays, stats[Phase.DRAFT_EXTEND].eager_runs) == (0, 1)
    assert stats[Phase.DRAFT_EXTEND].captured_sizes == ()
    assert stats[Phase.TARGET_VERIFY].replays == stats[Phase.DRAFT_DECODE].replays == 1


def test_malformed_batches_are_errors_not_silent_broadcasts() -> None:
    p = plan(SPEC, CPU, PhaseBackends.same(ALL_GRAPHS, SPEC), GraphPolicy(batch_sizes=SIZES))
    runner = GraphRunner(p, CPU, spec_steps(Meta(fill=6)))
    batch, x = spec_batch(Phase.TARGET_VERIFY, 2, seed=1)
    with pytest.raises(ValueError, match=r"h\.shape"):
        runner.run(Phase.TARGET_VERIFY, batch, {**x, "h": x["h"][:1]})
    with pytest.raises(ValueError, match="batch.phase"):
        runner.run(Phase.DRAFT_EXTEND, batch, x)
    with pytest.raises(KeyError, match="phase=decode"):
        runner.run(Phase.DECODE, replace(batch, phase=Phase.DECODE), x)
    draft, dx = spec_batch(Phase.DRAFT_DECODE, 2, seed=1)
    with pytest.raises(ValueError, match="rows_per_request"):
        runner.run(Phase.DRAFT_DECODE, replace(draft, req_pool_indices=draft.req_pool_indices[:3]), dx)


# ---------------------------------------------------------------- the platform decides


def test_graph_kind_and_pool_follow_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    class PoolGraph(EmulatedGraph):
        def __init__(self) -> None:
            super().__init__()
            self.handle = object()

        @property
        def pool(self) -> object:
            return self.handle

    # Bound to new_graph's own signature: the runner's call must be one new_graph accepts.
    bound = stand_in(monkeypatch, runner_module, "new_graph", lambda _: PoolGraph())
    hip = parse("hip:gfx942")
    assert hip.graph_kind is GraphKind.EMULATED
    pool = make_pool(CFG)
    cuda_plan, hip_plan = decode_plan(ToyDecode.capabilities, parse("cuda:sm90")), decode_plan(ToyDecode.capabilities, hip)
    assert cuda_plan.to_dict()["phases"] == hip_plan.to_dict()["phases"]  # vendor symmetry
    GraphRunner(hip_plan, hip, {Phase.DECODE: attention_step(ToyDecode(CFG, pool))})
    calls = [(c.arguments["platform"].graph_kind.value, c.arguments["pool"]) for c in bound]
    assert [kind for kind, _ in calls] == ["emulated"] * len(SIZES)
    first = calls[0][1]
    assert first is None and len({id(p) for _, p in calls[1:]}) == 1 and calls[1][1] is not None


def test_device_kind_without_a_device_falls_back_to_eager() -> None:
    fake = replace(parse("cuda:sm90"), graph_kind=GraphKind.DEVICE)  # claims real graphs, has none
    if torch.cuda.is_available():
        pytest.skip("a real device is present: tests/graphs/test_device_gpu.py covers it")
    pool = make_pool(CFG)
    backend = ToyDecode(CFG, pool)
    with pytest.warns(GraphCaptureWarning, match="no device is available"):
        runner = GraphRunner(decode_plan(ToyDecode.capabilities, fake), fake,
                             {Phase.DECODE: attention_step(backend)})
    batch, x = decode_batch(pool, [5, 6]), qkv(2, 0)
    torch.testing.assert_close(runner.run(Phase.DECODE, batch, x), eager(backend, batch, x))


def test_platform_without_graph_api_captures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch, runner_module, "new_graph", lambda _: pytest.fail("captured"))
    nographs = parse("hip:gfx942,nographs")
    p = decode_plan(ToyDecode.capabilities, nographs)
    assert not p[Phase.DECODE].capture and p[Phase.DECODE].reasons[0].code is ReasonCode.NO_GRAPH_API
    pool = make_pool(CFG)
    backend = ToyDecode(CFG, pool)
    runner = GraphRunner(p, nographs, {Phase.DECODE: attention_step(backend)})
    batch, x = decode_batch(pool, [4]), qkv(1, 0)
    runner.run(Phase.DECODE, batch, x)
    stats = runner.summary()[Phase.DECODE]
    assert stats.captured_sizes == () and (stats.replays, stats.eager_runs) == (0, 1)


# ------------------------------------------- the reference torch backend through the runner











def test_torch_backend_replay_equals_eager() -> None:
    check_torch_backend(CPU, "cpu", requests=(3, 1))


def test_torch_backend_capture_batches_pass_debug_validation() -> None:
    """The all-padding capture batches are valid batches (validate.py accepts padded rows)."""
    from attnhal.backend import set_debug

    pool = make_pool(CFG, max_context_len=40)
    caps, steps = torch_steps(pool, TORCH_SPEC)
    p = plan(TORCH_SPEC, CPU, PhaseBackends.same(caps, TORCH_SPEC), GraphPolicy(batch_sizes=(1, 2)))
    set_debug(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", GraphCaptureWarning)
            runner = GraphRunner(p, CPU, steps)
    finally:
        set_debug(None)
    assert runner.plan.captured == (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)
