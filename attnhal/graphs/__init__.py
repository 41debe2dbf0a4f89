"""Graph capture primitives: real CUDA/HIP graphs and a CPU capture emulator.

``new_graph(kind)`` takes the value of ``Platform.graph_kind``: "device"
(``torch.cuda.CUDAGraph``, which torch maps to hipGraph on ROCm) or
"emulated" (the CPU emulator). :class:`GraphRunner` captures the phases a
plan captures, pads batches to capture sizes and replays (docs/graphs.md).
"""

from __future__ import annotations

from .base import CaptureError, Graph
from .device import DeviceGraph
from .emulator import EmulatedGraph

__all__ = [
    "CaptureError",
    "DeviceGraph",
    "EmulatedGraph",
    "Graph",
    "GraphCaptureWarning",
    "GraphRunner",
    "InputSpec",
    "MetadataOwner",
    "PhaseStats",
    "PhaseStep",
    "StepOutputs",
    "new_graph",
]

GRAPH_KINDS = ("device", "emulated")


def new_graph(kind: str, pool: object | None = None) -> Graph:
    """Make an uncaptured graph of ``kind`` ("device" or "emulated").

    ``pool`` is a memory pool handle shared between device graphs; the
    emulator has no pool to share and ignores it. Any other kind (including
    "none": the platform has no graph API) is a ValueError.
    """
    if kind == "device":
        return DeviceGraph(pool=pool)
    if kind == "emulated":
        return EmulatedGraph()
    raise ValueError(f"graph_kind={kind!r} (supported: {', '.join(GRAPH_KINDS)})")


# Last: the runner builds graphs through new_graph above.
from .runner import (  # noqa: E402
    GraphCaptureWarning,
    GraphRunner,
    InputSpec,
    MetadataOwner,
    PhaseStats,
    PhaseStep,
    StepOutputs,
)
