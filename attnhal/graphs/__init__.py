"""Graph capture primitives: real CUDA/HIP graphs and a CPU capture emulator.

``new_graph(kind)`` (:mod:`attnhal.graphs.session`) takes the value of
``Platform.graph_kind``: "device" (``torch.cuda.CUDAGraph``, which torch maps to
hipGraph on ROCm) or "emulated" (the CPU emulator). :class:`GraphRunner`
(:mod:`attnhal.graphs.runner`) captures the phases a plan captures, each
described by a :class:`PhaseStep` (:mod:`attnhal.graphs.step`), pads batches to
capture sizes and replays (docs/graphs.md).
"""

from __future__ import annotations

from .base import CaptureAbort, CaptureError, Graph
from .device import DeviceGraph
from .emulator import EmulatedGraph
from .runner import GraphCaptureWarning, GraphRunner, PhaseStats
from .session import CAPTURE_ERROR_MODES, GRAPH_KINDS, capture_session, new_graph
from .step import MetadataOwner, PhaseStep, StepInput, StepOutputs

__all__ = [
    "CAPTURE_ERROR_MODES",
    "GRAPH_KINDS",
    "CaptureAbort",
    "CaptureError",
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
    "capture_session",
    "new_graph",
]
