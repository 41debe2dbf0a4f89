"""The graph runner checks with real device graphs (``torch.cuda.CUDAGraph``; hipGraph on ROCm).

On a machine with an NVIDIA or AMD GPU, run::

    pytest tests/graphs/test_device_gpu.py

Everything here is skipped unless :func:`attnhal.platform.detect` reports
``graph_kind == device`` (unset ``ATTNHAL_PLATFORM``, which simulates a platform).
The checks mirror tests/graphs/test_runner.py; tensors live on ``platform.torch_device``.
What a device graph reports differently from the emulator: a host sync is refused by
the capture guard (``CaptureError("device graph capture")``, no op name), and
``replay_allocations`` counts the allocator's allocations around a replay, which a
real graph keeps at 0 (so the allocating toy backend is not caught here: that check
is the emulator's).

Tests that fail a capture on purpose run in a fresh process (:func:`isolated`): on
older torch a failed capture can leave the allocator in capture state for the rest
of the process. Triton runs under real graphs in a process started without
``TRITON_INTERPRET`` (conftest.py sets it for everything else).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
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
from doubles import attnhal_warnings, spy
from graph_steps import (
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
from attnhal.graphs import (
    CaptureAbort,
    CaptureError,
    DeviceGraph,
    GraphCaptureWarning,
    GraphRunner,
    runner as runner_module,
)
from attnhal.phases import Phase
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.platform import GraphKind, detect
from attnhal.reasons import ReasonCode
from attnhal.spec import SpecConfig
from repo import ROOT

PLATFORM = detect()
DEV = PLATFORM.torch_device
pytestmark = pytest.mark.skipif(PLATFORM.graph_kind is not GraphKind.DEVICE,
                                reason=f"no device graph API here (platform {PLATFORM.name}, "
                                       f"graph_kind {PLATFORM.graph_kind.value})")
_CHILD = "ATTNHAL_GPU_TEST_CHILD"


def isolated(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` alone in a fresh pytest process, so that its failed captures poison nothing here."""
    if os.environ.get(_CHILD):
        return test

    @functools.wraps(test)
    def in_child(*_: Any, **__: Any) -> None:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               f"{__file__}::{test.__name__}"], cwd=ROOT, env={**os.environ, _CHILD: "1"},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    return in_child


def device_env() -> dict[str, str]:
    """This environment without the test suite's Triton interpreter and platform override."""
    return {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTNHAL_PLATFORM")}


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
    calls = spy(monkeypatch, runner_module, "new_graph")  # bound to new_graph's own signature
    runner, _, _ = device_runner(ToyDecode)
    assert runner.captured_sizes(Phase.DECODE) == SIZES
    assert [c.arguments["platform"].graph_kind.value for c in calls] == ["device"] * len(SIZES)
    pools = [c.arguments["pool"] for c in calls]
    assert pools[0] is not None and len({id(pool) for pool in pools}) == 1  # one pool per runner


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


@isolated
def test_host_sync_fails_capture_and_falls_back_on_device() -> None:
    pool = make_pool(CFG, device=DEV)
    backend = HostSyncDecode(CFG, pool)
    batch, x = decode_batch(pool, [4, 9], seed=0), qkv(2, 0, DEV)
    backend.init_forward_metadata(batch)
    stream = torch.cuda.current_stream()
    with pytest.raises(CaptureError) as info:
        DeviceGraph(DEV).capture(lambda: backend.forward(x["q"], x["k"], x["v"], 0, batch))
    assert not isinstance(info.value, CaptureAbort)  # the guard refused the sync before the driver saw it
    assert torch.cuda.current_stream() == stream and torch.cuda.get_sync_debug_mode() == 0
    with pytest.warns(GraphCaptureWarning, match="phase=decode"):
        runner, _, pool = device_runner(HostSyncDecode)
    why = runner.plan[Phase.DECODE].reasons[-1]
    assert why.code is ReasonCode.CAPTURE_FAILED and why.message.startswith("CaptureError: ")
    batch, x = decode_batch(pool, [4, 9], seed=0), qkv(2, 0, DEV)
    close(run_tensor(runner, batch, x), eager(ToyDecode(CFG, pool), batch, x))
    # after the failed capture a correct backend captures every size and *replays* (not eager)
    ok, backend_ok, pool_ok = device_runner(ToyDecode)
    assert ok.captured_sizes(Phase.DECODE) == SIZES
    batch, x = decode_batch(pool_ok, [3, 5], seed=1), qkv(2, 1, DEV)
    close(run_tensor(ok, batch, x), eager(backend_ok, batch, x))
    stats = ok.summary()[Phase.DECODE]
    assert (stats.replays, stats.eager_runs, stats.replay_allocations) == (1, 0, 0)


@isolated
def test_driver_failure_refuses_later_captures_on_device() -> None:
    x = torch.ones(64, device=DEV)

    def driver_sync() -> torch.Tensor:
        y = x * 2
        torch.cuda.synchronize()  # no sync debug mode sees this: the driver fails the capture
        return y

    stream = torch.cuda.current_stream()
    with pytest.raises(CaptureAbort):
        DeviceGraph(DEV).capture(driver_sync)
    assert torch.cuda.current_stream() == stream
    with pytest.raises(CaptureAbort, match="not trusted"):
        DeviceGraph(DEV).capture(lambda: x * 3)


def test_empty_graph_is_a_capture_error_on_device() -> None:
    host = torch.ones(8)  # work on the CPU only: the device graph records nothing
    with pytest.raises(CaptureError, match="recorded no work"):
        DeviceGraph(DEV).capture(lambda: host.mul_(2))


def test_device_graph_follows_the_tensors_device() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two devices")
    x = torch.arange(16.0, device="cuda:1")
    graph = DeviceGraph("cuda:1")
    with torch.cuda.device(0):
        out = graph.capture(lambda: x * 2)
        x.add_(1)
        graph.replay()
    torch.cuda.synchronize(1)
    assert torch.equal(out.cpu(), (torch.arange(16.0) + 1) * 2)


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
    assert runner.summary()[Phase.DECODE].replay_allocations == 0  # a real graph allocates only at capture


@isolated
def test_spec_phases_and_one_failing_capture_on_device() -> None:
    p = plan(SPEC, PLATFORM, PhaseBackends.same(ALL_GRAPHS, SPEC), GraphPolicy(batch_sizes=SIZES))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = spec_steps(Meta(fill=6), failing=Phase.DRAFT_EXTEND)
        runner = GraphRunner(p, PLATFORM, steps)
    assert attnhal_warnings(caught) == [GraphCaptureWarning]  # torch may add its own (2.11: sync debug mode)
    assert runner.plan.captured == (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY)
    for phase in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY):
        batch, x = spec_batch(phase, 3, seed=len(phase.value), device=DEV)
        out = runner.run(phase, batch, x)
        assert isinstance(out, torch.Tensor)
        want = steps[phase].forward(batch, x)
        assert isinstance(want, torch.Tensor)
        close(out.clone(), want)
    stats = runner.summary()
    assert stats[Phase.DRAFT_EXTEND].captured_sizes == () and stats[Phase.DRAFT_EXTEND].eager_runs == 1
    for phase in (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY):
        assert stats[phase].captured_sizes == SIZES
        assert (stats[phase].replays, stats[phase].eager_runs, stats[phase].replay_allocations) == (1, 0, 0)


def test_torch_backend_on_device() -> None:
    check_torch_backend(PLATFORM, DEV, requests=(3, 1, 4))


def check_demo(report: dict[str, Any]) -> None:
    """Speculative tokens equal plain greedy (graphs off), and every captured phase replayed."""
    assert report["lossless"], report["runs"]
    captured = {p for p, d in report["plan"]["phases"].items() if d["capture"]}
    assert captured, report["plan"]
    for phase in captured:
        stats = report["capture"][phase]
        assert stats["failure"] is None and stats["captured_sizes"] and stats["replays"] > 0, (phase, stats)
        assert stats["replay_allocations"] == 0, (phase, stats)


def test_reference_worker_with_torch_backend_on_device() -> None:
    from attnhal.example_engine.demo import DemoConfig, run_demo

    report = run_demo(DemoConfig(spec=SpecConfig.eagle(num_steps=3, topk=2, num_draft_tokens=4),
                                 platform=PLATFORM, backend="torch", batch_size=4, max_new_tokens=16))
    check_demo(report.to_dict())


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_reference_worker_with_triton_under_real_graphs() -> None:
    proc = subprocess.run([sys.executable, "-m", "attnhal", "demo", "--backend", "triton", "--spec-steps", "3",
                           "--topk", "2", "--draft-tokens", "4", "--batch-size", "4", "--max-new-tokens", "16",
                           "--json"], cwd=ROOT, env=device_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_demo(json.loads(proc.stdout))
