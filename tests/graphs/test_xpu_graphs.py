"""The platform all the way to the graph, on CPU: an Intel XPU through stand-in device modules.

The XPU row names ``attnhal.graphs.device_api:TorchXpuAPI``. Where that implementation
cannot capture (a simulated platform whose row names none; a detected device whose torch
has no ``torch.xpu.XPUGraph``) every phase is planned eager with the reason
``graph_device_unavailable``; with a stand-in ``torch.xpu`` that has graphs, the plan
captures and the runner captures and replays through the stand-in (it records its calls,
and replays the recorded ops with the CPU emulator's recorder, so outputs are checked).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest
import torch
from doubles import signature_drift
from graph_steps import ALL_GRAPHS, SIZES, SPEC, Meta, mixing_forward, spec_batch, spec_steps

from attnhal.graphs import GraphRunner, TorchXpuAPI, device_api
from attnhal.graphs.emulator import _Recorder
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import GraphKind, Platform, Vendor, detect, facts, parse
from attnhal.reasons import ReasonCode

XPU_NAME = "Intel(R) Data Center GPU Max 1550"


def xpu_plan(platform: Platform) -> GraphPlan:
    return plan(SPEC, platform, PhaseBackends.same(ALL_GRAPHS, SPEC), GraphPolicy(batch_sizes=SIZES))


def assert_all_eager(p: GraphPlan, why: str) -> None:
    running = [ph for ph in GRAPH_PHASES if p[ph].runs]
    assert running and p.valid and p.captured == ()
    for ph in running:
        first = p[ph].reasons[0]
        assert first.code is ReasonCode.GRAPH_DEVICE_UNAVAILABLE and why in first.message, first


# --- a stand-in torch.xpu ---------------------------------------------------------------------

class StandInGraph:
    """``torch.xpu.XPUGraph``'s surface: records the ops between ``capture_begin`` and
    ``capture_end`` (the emulator's recorder) and re-runs them at ``replay``."""

    def __init__(self, log: list[str]) -> None:
        self.log, self.ops, self.handle = log, (), object()
        self._recorder: Any = None

    def capture_begin(self, pool: object | None = None) -> None:  # XPUGraph takes no capture_error_mode
        self.log.append("capture_begin")
        self._recorder = _Recorder()
        self._recorder.__enter__()

    def capture_end(self) -> None:
        self._recorder.__exit__(None, None, None)
        self.ops, self._recorder = tuple(self._recorder.ops), None
        self.log.append("capture_end")

    def replay(self) -> None:
        self.log.append("replay")
        for op in self.ops:
            op.replay()

    def pool(self) -> object:
        return self.handle


class StandInStream:
    def wait_stream(self, other: object) -> None:
        pass


def stand_in_xpu(monkeypatch: pytest.MonkeyPatch, with_graphs: bool) -> list[str]:
    """Make ``torch.xpu`` answer what detection and :class:`TorchXpuAPI` ask, for one device
    named :data:`XPU_NAME` (each function replaced in the real module, which torch itself also
    reads); ``XPUGraph`` only ``with_graphs``. Returns the stand-in graphs' call log."""
    log: list[str] = []
    streams = {"current": StandInStream()}
    calls = dict(
        is_available=lambda: True, current_device=lambda: 0, get_device_name=lambda device=None: XPU_NAME,
        device=lambda index: contextlib.nullcontext(), current_stream=lambda index=None: streams["current"],
        set_stream=lambda stream: streams.update(current=stream), Stream=lambda device=None: StandInStream(),
        graph_pool_handle=lambda: object(), synchronize=lambda device=None: None, empty_cache=lambda: None,
        memory_stats_as_nested_dict=lambda device=None: {})
    for name, fn in calls.items():
        monkeypatch.setattr(torch.xpu, name, fn)
    if with_graphs:
        monkeypatch.setattr(torch.xpu, "XPUGraph", lambda: StandInGraph(log))
    else:
        monkeypatch.delattr(torch.xpu, "XPUGraph", raising=False)
    return log


#: What TorchXpuAPI calls on torch.xpu (the stand-in below replaces each).
XPU_CALLS = ("is_available", "current_device", "device", "current_stream", "set_stream", "Stream",
             "graph_pool_handle", "synchronize", "empty_cache", "memory_stats_as_nested_dict")


def test_the_xpu_api_and_its_stand_in_follow_this_torch() -> None:
    """TorchXpuAPI runs only on an Intel GPU; the names it calls exist in this torch, and the
    stand-in graph has XPUGraph's signatures."""
    if not hasattr(torch.xpu, "XPUGraph"):
        pytest.skip(f"torch {torch.__version__} has no torch.xpu.XPUGraph")
    assert [name for name in XPU_CALLS if not hasattr(torch.xpu, name)] == []
    assert signature_drift(StandInGraph, torch.xpu.XPUGraph, ("capture_begin", "capture_end", "replay", "pool")) == []


@pytest.fixture
def fresh_apis(monkeypatch: pytest.MonkeyPatch) -> None:
    """One DeviceAPI instance per path and process: this test's own."""
    monkeypatch.setattr(device_api, "_APIS", {})
    monkeypatch.delenv("ATTNHAL_PLATFORM", raising=False)


# --- simulated ----------------------------------------------------------------------------------

def test_simulated_xpu_whose_row_names_no_implementation_plans_every_phase_eager(monkeypatch) -> None:
    row = replace(facts.VENDORS[Vendor.XPU], graph_device=None)
    monkeypatch.setattr(facts, "VENDORS", MappingProxyType({**facts.VENDORS, Vendor.XPU: row}))
    xpu = parse("xpu:pvc")
    assert xpu.simulated and xpu.has_graph_api and xpu.graph_device_error == "the xpu vendor row names none"
    assert xpu.name == "xpu:pvc"  # the spec still reproduces the platform
    assert_all_eager(xpu_plan(xpu), "graph_device=none")


def test_simulated_xpu_reads_only_its_row() -> None:
    """The row names TorchXpuAPI: planned like CUDA, whatever this torch has."""
    xpu = parse("xpu:pvc")
    assert xpu.graph_device == "attnhal.graphs.device_api:TorchXpuAPI" and xpu.graph_device_error is None
    assert xpu_plan(xpu).captured == xpu_plan(parse("cuda:sm90")).captured == (
        Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)


def test_planning_a_simulated_platform_imports_no_torch_and_no_graph_implementation() -> None:
    code = textwrap.dedent("""
        import sys
        from attnhal import BackendCapabilities, PhaseBackends, SpecConfig, plan
        from attnhal.phases import Phase
        from attnhal.platform import Vendor, parse
        from attnhal.capabilities import SpecLimits
        caps = BackendCapabilities(name="any", vendors=frozenset(Vendor), phases=frozenset(Phase),
                                   graph={Phase.DECODE: SpecLimits()})
        assert plan(SpecConfig(), parse("xpu:pvc"), PhaseBackends.same(caps)).captured
        assert not plan(SpecConfig(), parse("npu:910b"), PhaseBackends.same(caps)).captured
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("attnhal.graphs")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- detected, through a stand-in torch.xpu ----------------------------------------------------

def test_detected_xpu_without_xpu_graphs_plans_eager_and_captures_nothing(monkeypatch, fresh_apis) -> None:
    log = stand_in_xpu(monkeypatch, with_graphs=False)
    xpu = detect()
    assert xpu.vendor is Vendor.XPU and not xpu.simulated and xpu.has_graph_api
    assert xpu.graph_kind is GraphKind.NONE  # detect() gives DEVICE only where the implementation loads
    assert TorchXpuAPI.unavailable() == xpu.graph_device_error == f"torch {torch.__version__} has no torch.xpu.XPUGraph"
    p = xpu_plan(xpu)
    assert_all_eager(p, "has no torch.xpu.XPUGraph")
    runner = GraphRunner(p, replace(xpu, torch_device="cpu"), spec_steps(Meta(fill=6)))
    assert all(runner.captured_sizes(ph) == () for ph in GRAPH_PHASES) and log == []


def test_detected_xpu_with_a_stand_in_implementation_captures_and_replays_through_it(monkeypatch,
                                                                                      fresh_apis) -> None:
    log = stand_in_xpu(monkeypatch, with_graphs=True)
    xpu = detect()
    assert xpu.graph_kind is GraphKind.DEVICE and xpu.graph_device_error is None
    p = xpu_plan(xpu)
    assert p.captured == (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)
    here = replace(xpu, torch_device="cpu")  # the stand-in device computes on the CPU
    runner = GraphRunner(p, here, spec_steps(Meta(fill=6)))
    assert isinstance(device_api.device_api(xpu.graph_device or ""), TorchXpuAPI)
    assert log.count("capture_begin") == log.count("capture_end") == 3 * len(SIZES)
    for phase in p.captured:
        assert runner.captured_sizes(phase) == SIZES
        batch, x = spec_batch(phase, 3, seed=7)  # 3 requests: padded to the captured size 4
        out = runner.run(phase, batch, x)
        torch.testing.assert_close(out, mixing_forward(batch, x))
    assert log.count("replay") == 3
    assert all(s.replays == 1 and s.eager_runs == 0 for s in runner.summary().values())


# --- what the CLI shows ---------------------------------------------------------------------

ANY_VENDOR = """schema_version = 2
name = "anydev"
vendors = ["cuda", "hip", "xpu", "npu", "musa"]
phases = ["prefill", "decode", "draft_decode", "draft_extend", "target_verify"]
dtypes = ["float16"]
head_sizes = [128]
page_sizes = [1]
multi_step = true

[graph]
decode = {}
draft_decode = {}
draft_extend = {}
target_verify = {}
"""


@pytest.mark.parametrize("command", ["plan", "explain"])
def test_plan_and_explain_say_why_nothing_is_captured(tmp_path, capsys, command: str) -> None:
    from attnhal.cli import main

    descriptor = tmp_path / "anydev.toml"
    descriptor.write_text(ANY_VENDOR)
    argv = [command, "--platform", "npu:910b", "--backend", str(descriptor), "--spec-steps", "3", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    phases = (out.get("plan") or out)["phases"]
    for phase in ("draft_decode", "draft_extend", "target_verify"):
        assert phases[phase]["capture"] is False
        assert phases[phase]["reasons"][0]["code"] == "graph_device_unavailable"
        assert "the npu vendor row names none" in phases[phase]["reasons"][0]["message"]
