"""Graph capture primitives: real CUDA/HIP graphs and a CPU capture emulator.

``new_graph(platform)`` (:mod:`attnhal.graphs.session`) makes a graph the way the
platform captures: device graphs through the implementation its vendor row names
(:mod:`attnhal.graphs.device_api`: ``torch.cuda``, which torch maps to hipGraph on
ROCm, or ``torch.xpu``), or the CPU emulator. :class:`GraphRunner`
(:mod:`attnhal.graphs.runner`) captures the phases a plan captures, each
described by a :class:`PhaseStep` (:mod:`attnhal.graphs.step`), pads batches to
capture sizes and replays (docs/graphs.md).
"""

from __future__ import annotations

from .base import CaptureAbort, CaptureError, Graph
from .device import DeviceGraph
from .device_api import DeviceAPI, TorchCudaAPI, TorchXpuAPI
from .emulator import EmulatedGraph
from .runner import GraphCaptureWarning, GraphRunner, PhaseStats
from .session import CAPTURE_ERROR_MODES, GRAPH_KINDS, capture_session, new_graph
from .step import MetadataOwner, PhaseStep, StepInput, StepOutputs

__all__ = [
    "CAPTURE_ERROR_MODES",
    "GRAPH_KINDS",
    "CaptureAbort",
    "CaptureError",
    "DeviceAPI",
    "DeviceGraph",
    "EmulatedGraph",
    "Graph",
    "GraphCaptureWarning",
    "GraphRunner",
    "MetadataOwner",
    "PhaseStats",
    "PhaseStep",
    "StepInput",
    "StepOutputs",
    "TorchCudaAPI",
    "TorchXpuAPI",
    "capture_session",
    "new_graph",
]
