"""Making graphs: one graph of a kind, and the session a series of captures shares.

The kind is the value of ``Platform.graph_kind``: ``"device"`` (the vendor's graph
API, ``torch.cuda.CUDAGraph``, which torch maps to hipGraph on ROCm) or
``"emulated"`` (the CPU capture emulator).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .base import Graph
from .device import CAPTURE_ERROR_MODES, DeviceGraph
from .device import capture_session as _device_session
from .emulator import EmulatedGraph

__all__ = ["CAPTURE_ERROR_MODES", "GRAPH_KINDS", "capture_session", "new_graph"]

#: The graph kinds that capture ("none", a platform without a graph API, does not).
GRAPH_KINDS = ("device", "emulated")


def _check_kind(kind: str) -> None:
    if kind not in GRAPH_KINDS:
        raise ValueError(f"graph_kind={kind!r} (supported: {', '.join(GRAPH_KINDS)})")


def new_graph(kind: str, pool: object | None = None, *, device: str | torch.device | None = None,
              warmup_iters: int = 1, capture_error_mode: str = "global") -> Graph:
    """Make an uncaptured graph of ``kind`` ("device" or "emulated").

    ``pool`` is a memory pool handle shared between device graphs; ``device``,
    ``warmup_iters`` and ``capture_error_mode`` are :class:`DeviceGraph`'s. The
    emulator has no pool, stream or device to guard and ignores them. Any other
    kind (including "none": the platform has no graph API) is a ValueError.
    """
    _check_kind(kind)
    if kind == "device":
        return DeviceGraph(device=device, pool=pool, warmup_iters=warmup_iters,
                           capture_error_mode=capture_error_mode)
    return EmulatedGraph()


@contextlib.contextmanager
def capture_session(kind: str, device: str | torch.device) -> Iterator[object | None]:
    """Prepare ``device`` once for a series of captures of ``kind``; yields their shared pool.

    Device graphs: synchronize, garbage-collect and free cached memory once, then
    yield one ``graph_pool_handle``. The emulator needs nothing and yields None.
    """
    _check_kind(kind)
    if kind == "emulated":
        yield None
        return
    with _device_session(device) as pool:
        yield pool
