"""The device-graph guard's control flow, on CPU, with a fake device behind the seam.

``attnhal.graphs.device`` makes every device call through ``DeviceAPI``. The fake
(tests/doubles/fake_device.py) models what matters to the guard: a current device and a
current stream per device, a graph that records "kernels" launched on its capture stream,
a host sync that raises under sync debug mode "error" and otherwise invalidates the
capture (the driver then fails ``capture_end``), an allocation counter. What the real driver and
torch do is checked on a GPU by tests/graphs/test_device_gpu.py and benchmarks/gpu_session.sh.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import pytest
import torch
from doubles import attnhal_warnings
from fake_device import FakeDevice
from graph_steps import ALL_GRAPHS, SIZES, SPEC, Meta, mixing_forward, spec_batch

from attnhal.graphs import (
    CaptureAbort,
    CaptureError,
    DeviceGraph,
    GraphCaptureWarning,
    GraphRunner,
    PhaseStep,
    device_api as device_api_module,
)
from attnhal.graphs.runner import torch_version
from attnhal.phases import Phase
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.platform import GraphKind, Platform, parse


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    api = FakeDevice()
    # The one instance per named implementation: CUDA's (FAKE_GPU's row and DeviceGraph's default).
    monkeypatch.setitem(device_api_module._APIS, device_api_module.TORCH_CUDA, api)
    return api


def test_host_sync_is_refused_inside_the_guard_and_the_device_captures_again(fake: FakeDevice) -> None:
    fake.set_sync_debug_mode("warn")  # the caller's own mode comes back after capture

    def bad() -> None:
        fake.launch()
        fake.host_sync()

    with pytest.raises(CaptureError, match="synchronizing") as info:
        DeviceGraph(warmup_iters=0).capture(bad)
    assert not isinstance(info.value, CaptureAbort)
    assert fake.mode == 1 and fake.capturing is None and not fake.invalidated
    assert fake.streams[0].name == "default0"  # current stream restored
    graph = DeviceGraph(warmup_iters=0)
    graph.capture(fake.launch)
    graph.replay()
    assert graph._graph.replays == 1  # type: ignore[attr-defined]


def test_driver_failure_aborts_and_later_captures_on_that_device_are_refused(fake: FakeDevice) -> None:
    fake.set_sync_debug_mode("error")

    def invalidates() -> None:  # a sync the debug mode does not see (a raw driver call)
        fake.launch()
        fake.invalidated = True

    with pytest.raises(CaptureAbort, match="driver failed the capture"):
        DeviceGraph(warmup_iters=0).capture(invalidates)
    assert fake.streams[0].name == "default0" and fake.mode == 2
    fake.invalidated = False
    with pytest.raises(CaptureAbort, match="operation not permitted"):  # the first failure is the reason
        DeviceGraph(warmup_iters=0).capture(fake.launch)
    assert len(fake.begins) == 1  # refused before asking the driver
    other = DeviceGraph("cuda:1", warmup_iters=0)  # another device is unaffected
    other.capture(lambda: fake.launch())
    assert fake.begins[-1]["device"] == 1


def test_failing_function_and_failing_driver_report_both(fake: FakeDevice) -> None:
    def both() -> None:
        fake.invalidated = True
        raise ValueError("boom in the step")

    with pytest.raises(CaptureAbort, match="boom in the step") as info:
        DeviceGraph(warmup_iters=0).capture(both)
    assert isinstance(info.value.__cause__, ValueError)
    assert fake.streams[0].name == "default0" and fake.capturing is None


def test_empty_graph_is_a_capture_error(fake: FakeDevice) -> None:
    with pytest.raises(CaptureError, match="recorded no work"):
        DeviceGraph(warmup_iters=0).capture(lambda: fake.launch(device=1))  # work on another device
    with pytest.raises(CaptureError, match="recorded no work"):
        DeviceGraph(warmup_iters=0).capture(lambda: None)


def test_capture_and_replay_run_under_the_tensors_device(fake: FakeDevice) -> None:
    graph = DeviceGraph("cuda:1", warmup_iters=0)
    seen: list[int] = []
    graph.capture(lambda: (seen.append(fake.device), fake.launch()))
    assert seen == [1] and fake.begins[0]["device"] == 1 and fake.device == 0
    fake.replay = lambda g: seen.append(fake.device)  # type: ignore[method-assign]
    graph.replay()
    assert seen == [1, 1] and fake.device == 0


def test_one_capture_stream_per_device_never_the_current_one(fake: FakeDevice) -> None:
    for device in ("cuda:0", "cuda:0", "cuda:1", "cuda:1"):
        DeviceGraph(device, warmup_iters=0).capture(fake.launch)
    streams = [b["stream"] for b in fake.begins]
    assert streams[0] is streams[1] and streams[2] is streams[3] and streams[0] is not streams[2]
    assert all(s.name.startswith("side") for s in streams) and len(fake.created_streams) == 2
    assert [fake.streams[i].name for i in (0, 1)] == ["default0", "default1"]


def test_warm_up_runs_on_the_capture_stream_before_capture(fake: FakeDevice) -> None:
    where: list[tuple[str, bool]] = []
    DeviceGraph(warmup_iters=2).capture(lambda: (where.append((fake.streams[0].name, fake.capturing is not None)),
                                                 fake.launch()))
    assert where == [("side0", False), ("side0", False), ("side0", True)]


def test_capture_error_mode_is_passed_and_checked(fake: FakeDevice) -> None:
    DeviceGraph(warmup_iters=0, capture_error_mode="thread_local").capture(fake.launch)
    assert fake.begins[0]["mode"] == "thread_local"
    with pytest.raises(ValueError, match=r"capture_error_mode='local' \(supported: global, thread_local, relaxed\)"):
        DeviceGraph(capture_error_mode="local")


def test_replay_allocations_come_from_the_allocator_counter(fake: FakeDevice) -> None:
    graph = DeviceGraph(warmup_iters=0)
    graph.capture(fake.launch)
    graph.replay()
    assert graph.replay_allocations == 0
    fake.allocs_per_replay = 3
    graph.replay()
    assert graph.replay_allocations == 3


# --- the runner over the fake device ------------------------------------------------

FAKE_GPU = replace(parse("cuda:sm90"), graph_kind=GraphKind.DEVICE)  # tensors stay on the CPU


def fake_steps(fake: FakeDevice, order: list[Phase], sync_in: Phase | None = None,
               driver_fails_in: Phase | None = None) -> dict[Phase, PhaseStep]:
    """The spec phases of tests/graphs/test_runner.py, each launching one fake kernel per forward."""
    def forward_of(phase: Phase) -> Any:
        def forward(batch: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
            if fake.capturing is not None:
                order.append(phase)
                fake.invalidated = fake.invalidated or phase is driver_fails_in
                if phase is sync_in:
                    fake.host_sync()
            fake.launch()
            return mixing_forward(batch, x)
        return forward

    inputs: dict[str, Any] = {"h": ("token", (3,), torch.float32), "r": ("row", (), torch.float32)}
    return {p: PhaseStep(Meta(fill=6), forward_of(p), inputs, rows_per_request=SPEC.topk if p is Phase.DRAFT_DECODE else 1)
            for p in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)}


def fake_runner(platform: Platform, steps: dict[Phase, PhaseStep], **kw: Any) -> GraphRunner:
    p = plan(SPEC, platform, PhaseBackends.same(ALL_GRAPHS, SPEC), GraphPolicy(batch_sizes=SIZES))
    return GraphRunner(p, platform, steps, **kw)


def test_runner_prepares_once_shares_one_pool_and_captures_target_verify_first(fake: FakeDevice) -> None:
    order: list[Phase] = []
    runner = fake_runner(FAKE_GPU, fake_steps(fake, order), capture_error_mode="thread_local")
    assert fake.releases == 1 and len(fake.pools) == 1  # once per runner, not per capture
    assert len(fake.begins) == 3 * len(SIZES)
    assert {id(b["pool"]) for b in fake.begins} == {id(fake.pools[0])}
    assert {b["mode"] for b in fake.begins} == {"thread_local"}
    # largest footprint first: verify and extend hold 5 tokens per request, draft decode 2
    assert order[::len(SIZES)] == [Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE]
    assert all(runner.captured_sizes(p) == SIZES for p in order)
    batch, x = spec_batch(Phase.TARGET_VERIFY, 3, seed=1)
    runner.run(Phase.TARGET_VERIFY, batch, x)
    stats = runner.summary()[Phase.TARGET_VERIFY]
    assert (stats.replays, stats.eager_runs, stats.replay_allocations) == (1, 0, 0)


def test_runner_host_sync_in_one_phase_keeps_the_others_captured(fake: FakeDevice) -> None:
    order: list[Phase] = []
    with pytest.warns(GraphCaptureWarning, match="phase=draft_extend") as caught:
        runner = fake_runner(FAKE_GPU, fake_steps(fake, order, sync_in=Phase.DRAFT_EXTEND))
    assert attnhal_warnings(caught) == [GraphCaptureWarning]
    assert runner.plan.captured == (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY)
    assert runner.captured_sizes(Phase.DRAFT_DECODE) == SIZES == runner.captured_sizes(Phase.TARGET_VERIFY)
    assert fake.mode == 0 and fake.streams[0].name == "default0"


def test_runner_stops_capturing_after_a_driver_failure(fake: FakeDevice) -> None:
    order: list[Phase] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = fake_runner(FAKE_GPU, fake_steps(fake, order, driver_fails_in=Phase.TARGET_VERIFY))
    assert attnhal_warnings(caught) == [GraphCaptureWarning] * 3
    assert order == [Phase.TARGET_VERIFY] and runner.plan.captured == ()
    reasons = {p: runner.summary()[p].failure or "" for p in order + [Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE]}
    assert reasons[Phase.TARGET_VERIFY].startswith("CaptureAbort: ")
    assert all("after phase=target_verify failed in the driver" in reasons[p]
               for p in (Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE))
    batch, x = spec_batch(Phase.DRAFT_EXTEND, 2, seed=3)
    runner.run(Phase.DRAFT_EXTEND, batch, x)
    assert runner.summary()[Phase.DRAFT_EXTEND].eager_runs == 1


def test_runner_refuses_device_capture_below_the_platforms_minimum_torch(fake: FakeDevice) -> None:
    old = replace(FAKE_GPU, graph_min_torch=(99, 0))
    with pytest.warns(GraphCaptureWarning, match=r"torch=\S+ \(supported: >= 99\.0 for device graphs on cuda"):
        runner = fake_runner(old, fake_steps(fake, []))
    assert runner.plan.captured == () and fake.begins == [] and fake.releases == 0


def test_minimum_torch_is_vendor_data() -> None:
    assert parse("hip:gfx942").graph_min_torch == (2, 9)
    assert parse("cuda:sm90").graph_min_torch is None and parse("cpu").graph_min_torch is None
    assert torch_version("2.9.0+rocm6.4") == (2, 9) and torch_version("2.13.0a0+git1234") == (2, 13)
    assert torch_version("3") == (3, 0)


def test_emulated_platform_ignores_the_minimum_torch(fake: FakeDevice) -> None:
    old = replace(parse("hip:gfx942"), graph_min_torch=(99, 0))
    runner = fake_runner(old, fake_steps(fake, []))
    assert len(runner.plan.captured) == 3 and fake.begins == []  # the emulator captured


def test_runner_warms_each_size_up_once_on_the_capture_stream(fake: FakeDevice) -> None:
    calls: list[tuple[str, bool]] = []
    steps = fake_steps(fake, [])
    step = steps[Phase.TARGET_VERIFY]

    def forward(batch: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
        calls.append((fake.streams[0].name, fake.capturing is not None))
        return step.forward(batch, x)

    fake_runner(FAKE_GPU, {Phase.TARGET_VERIFY: replace(step, forward=forward)})
    assert calls == [("side0", False), ("side0", True)] * len(SIZES)
    assert fake.streams[0].name == "default0"


def test_the_real_api_calls_what_this_torch_has() -> None:
    """TorchCudaAPI runs only on a GPU; at least the names and parameters it uses exist here."""
    import inspect

    for name in ("set_stream", "Stream", "graph_pool_handle", "get_sync_debug_mode", "set_sync_debug_mode",
                 "memory_stats_as_nested_dict", "synchronize", "empty_cache", "current_stream", "device"):
        assert hasattr(torch.cuda, name), name
    assert {"pool", "capture_error_mode"} <= set(inspect.signature(torch.cuda.CUDAGraph.capture_begin).parameters)
    assert all(hasattr(torch.cuda.CUDAGraph, m) for m in ("capture_end", "replay", "pool"))


def test_no_device_is_a_clear_error_before_any_device_call() -> None:
    from attnhal.graphs import capture_session

    if torch.cuda.is_available():
        pytest.skip("a device is present")
    with pytest.raises(RuntimeError, match="no device is available to TorchCudaAPI"):
        DeviceGraph().capture(lambda: None)
    cuda = replace(parse("cuda:sm90"), graph_kind=GraphKind.DEVICE)
    with pytest.raises(RuntimeError, match="no device is available"), capture_session(cuda, "cuda"):
        pass
    with capture_session("cpu", "cpu") as pool:
        assert pool is None


def test_an_interrupt_inside_capture_ends_the_capture_and_propagates(fake: FakeDevice) -> None:
    def interrupted() -> None:
        fake.launch()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        DeviceGraph(warmup_iters=0).capture(interrupted)
    assert fake.capturing is None and fake.mode == 0 and fake.streams[0].name == "default0"
    DeviceGraph(warmup_iters=0).capture(fake.launch)  # the device still captures
