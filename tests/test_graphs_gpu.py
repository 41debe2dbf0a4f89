"""The graph runner checks with real device graphs (``torch.cuda.CUDAGraph``; hipGraph on ROCm).

On a machine with an NVIDIA or AMD GPU, run::

    pytest tests/test_graphs_gpu.py

Everything here is skipped unless :func:`attnhal.platform.detect` reports
``graph_kind == device`` (unset ``ATTNHAL_PLATFORM``, which simulates a platform).
The checks mirror tests/test_graph_runner.py; tensors live on ``platform.torch_device``.
What a device graph reports differently from the emulator: a host sync fails in the
driver (``CaptureError("device graph capture")``, no op name), and
``replay_allocations`` is always 0 (a real graph cannot allocate at replay, so the
allocating toy backend is not caught here: that check is the emulator's).
"""

from __future__ import annotations

import warnings
from typing import Any

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
from test_graph_runner import (
    ALL_GRAPHS,
    CFG,
    SIZES,
    SPEC,
    Meta,
    attention_step,
    check_torch_backend,
    decode_plan,
    eager,
    qkv,
    spec_batch,
    spec_steps,
)

from attnhal.backend import KVPool
from attnhal.capabilities import Phase, ReasonCode
from attnhal.graphs import CaptureError, DeviceGraph, GraphCaptureWarning, GraphRunner
from attnhal.graphs import runner as runner_module
from attnhal.plan import GraphPolicy, PhaseBackends, plan
from attnhal.platform import GraphKind, detect

PLATFORM = detect()
DEV = PLATFORM.torch_device
pytestmark = pytest.mark.skipif(PLATFORM.graph_kind is not GraphKind.DEVICE,
                                reason=f"no device graph API here (platform {PLATFORM.spec}, "
                                       f"graph_kind {PLATFORM.graph_kind.value})")


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    # Eager and replay may pick different reduction kernels for different row counts.
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def device_runner(cls: type[ToyDecode]) -> tuple[GraphRunner, ToyDecode, KVPool]:
    pool = make_pool(CFG, max_reqs=16, max_context_len=32, device=DEV)
    backend = cls(CFG, pool)
    runner = GraphRunner(decode_plan(cls.capabilities, PLATFORM), PLATFORM, {Phase.DECODE: attention_step(backend)})
    return runner, backend, pool


def run_tensor(runner: GraphRunner, batch: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
    out = runner.run(Phase.DECODE, batch, x)
    assert isinstance(out, torch.Tensor)
    return out.clone()


def test_device_graphs_share_one_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []
    real = runner_module.new_graph

    def spy(kind: str, pool: object | None = None) -> Any:
        calls.append((kind, pool))
        return real(kind, pool=pool)

    monkeypatch.setattr(runner_module, "new_graph", spy)
    runner, _, _ = device_runner(ToyDecode)
    assert runner.captured_sizes(Phase.DECODE) == SIZES
    assert [kind for kind, _ in calls] == ["device"] * len(SIZES)
    assert calls[0][1] is None and all(pool is not None for _, pool in calls[1:])


def test_replay_equals_eager_on_device() -> None:
    runner, backend, pool = device_runner(ToyDecode)
    for bs in (1, 2, 3, 4, 5, 7, 8, 11):  # 3, 5, 7 are padded; 11 runs eagerly
        batch, x = decode_batch(pool, [1 + (7 * r) % 32 for r in range(bs)], seed=bs), qkv(bs, bs, DEV)
        got = run_tensor(runner, batch, x)
        close(got, eager(backend, batch, x))
        release(pool, batch)
    stats = runner.summary()[Phase.DECODE]
    assert (stats.replays, stats.eager_runs, stats.replay_allocations) == (7, 1, 0)


def test_padded_rows_never_change_real_rows_on_device() -> None:
    runner, _, pool = device_runner(ToyDecode)
    batch, x = decode_batch(pool, [9, 30, 4], seed=5), qkv(3, 5, DEV)
    padded = run_tensor(runner, batch, x)  # size 4: one padded row
    for r in range(3):  # each row alone replays the size-1 graph
        row = type(batch)(Phase.DECODE, batch.req_pool_indices[r:r + 1], batch.seq_lens[r:r + 1],
                          batch.out_cache_loc[r:r + 1], seq_lens_cpu=batch.seq_lens_cpu[r:r + 1])  # type: ignore[index]
        alone = run_tensor(runner, row, {n: t[r:r + 1] for n, t in x.items()})
        close(alone[0], padded[r])


def test_host_sync_fails_capture_and_falls_back_on_device() -> None:
    pool = make_pool(CFG, device=DEV)
    backend = HostSyncDecode(CFG, pool)
    batch, x = decode_batch(pool, [4, 9], seed=0), qkv(2, 0, DEV)
    backend.init_forward_metadata(batch)
    with pytest.raises(CaptureError):
        DeviceGraph().capture(lambda: backend.forward(x["q"], x["k"], x["v"], 0, batch))
    with pytest.warns(GraphCaptureWarning, match="phase=decode"):
        runner, _, pool = device_runner(HostSyncDecode)
    why = runner.plan[Phase.DECODE].reasons[-1]
    assert why.code is ReasonCode.CAPTURE_FAILED and why.message.startswith("CaptureError: ")
    batch, x = decode_batch(pool, [4, 9], seed=0), qkv(2, 0, DEV)
    close(run_tensor(runner, batch, x), eager(ToyDecode(CFG, pool), batch, x))
    # the device is still healthy after a failed capture: a correct backend captures and replays
    ok, backend_ok, pool_ok = device_runner(ToyDecode)
    batch, x = decode_batch(pool_ok, [3, 5], seed=1), qkv(2, 1, DEV)
    close(run_tensor(ok, batch, x), eager(backend_ok, batch, x))


def test_stale_host_length_makes_replay_differ_on_device() -> None:
    runner, backend, pool = device_runner(StaleLenDecode)
    assert isinstance(backend, StaleLenDecode) and backend.captured_len == backend.graph_seq_len_fill_value(None)
    batch, x = decode_batch(pool, [12, 20, 31, 7], seed=4), qkv(4, 4, DEV)
    replayed = run_tensor(runner, batch, x)
    assert not torch.allclose(replayed, eager(backend, batch, x), atol=1e-3)


def test_allocating_backend_replays_correctly_on_device() -> None:
    runner, backend, pool = device_runner(AllocatingDecode)
    batch, x = decode_batch(pool, [3, 30, 11], seed=6), qkv(3, 6, DEV)
    close(run_tensor(runner, batch, x), eager(backend, batch, x))
    assert runner.summary()[Phase.DECODE].replay_allocations == 0  # a device graph cannot tell


def test_spec_phases_and_one_failing_capture_on_device() -> None:
    p = plan(SPEC, PLATFORM, PhaseBackends.same(ALL_GRAPHS, SPEC), GraphPolicy(batch_sizes=SIZES))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = spec_steps(Meta(fill=6), failing=Phase.DRAFT_EXTEND)
        runner = GraphRunner(p, PLATFORM, steps)
    assert [type(w.message) for w in caught] == [GraphCaptureWarning]
    assert runner.plan.captured == (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY)
    for phase in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY):
        batch, x = spec_batch(phase, 3, seed=len(phase.value), device=DEV)
        out = runner.run(phase, batch, x)
        assert isinstance(out, torch.Tensor)
        want = steps[phase].forward(batch, x)
        assert isinstance(want, torch.Tensor)
        close(out.clone(), want)
    stats = runner.summary()
    assert stats[Phase.DRAFT_EXTEND].eager_runs == 1 and stats[Phase.TARGET_VERIFY].replays == 1


def test_torch_backend_on_device() -> None:
    check_torch_backend(PLATFORM, DEV, requests=(3, 1, 4))
