"""Making graphs for a platform: one graph, and the session a series of captures shares.

The :class:`~attnhal.platform.Platform` decides: ``graph_kind`` says whether graphs
are device graphs or the CPU capture emulator, and for device graphs the
implementation its vendor row names (``Platform.graph_device``, e.g.
:class:`~attnhal.graphs.device_api.TorchCudaAPI`) makes the device calls. A platform
whose kind is ``none`` captures nothing (a ``ValueError`` here). A platform may be given by
name (``"cuda:sm90"``, ``"cpu"``): :func:`~attnhal.platform.as_platform` reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from attnhal.platform import GraphKind, Platform, as_platform

from .base import Graph
from .device import CAPTURE_ERROR_MODES, DeviceGraph
from .device import capture_session as _device_session
from .device_api import DeviceAPI, device_api
from .emulator import EmulatedGraph

__all__ = ["CAPTURE_ERROR_MODES", "GRAPH_KINDS", "capture_session", "new_graph"]

#: The graph kinds that capture ("none", a platform without a graph API, does not).
GRAPH_KINDS = ("device", "emulated")


def _device_calls(where: Platform) -> DeviceAPI | None:
    """The device API of ``where`` (None: emulated); ValueError where nothing captures."""
    kind = where.graph_kind.value
    if kind not in GRAPH_KINDS:
        why = f"; {where.graph_device_error}" if where.graph_device_error else ""
        raise ValueError(f"graph_kind={kind!r} on platform {where.name} (supported: {', '.join(GRAPH_KINDS)}){why}")
    if kind == GraphKind.EMULATED.value:
        return None
    path = where.graph_device
    if path is None:  # a hand-built platform: DEVICE kind, but its row names nothing
        raise ValueError(f"graph_device=None for graph_kind='device' on platform {where} "
                         "(supported: a 'module:Class' DeviceAPI, the vendor row's graph_device)")
    return device_api(path)


def new_graph(platform: Platform | str, pool: object | None = None, *, device: str | torch.device | None = None,
              warmup_iters: int = 1, capture_error_mode: str = "global") -> Graph:
    """Make an uncaptured graph for ``platform`` (a :class:`~attnhal.platform.Platform` or its name).

    A device graph makes its device calls through the platform's ``graph_device``;
    ``pool`` is a memory pool handle shared between device graphs; ``device`` (default:
    the platform's ``torch_device``), ``warmup_iters`` and ``capture_error_mode`` are
    :class:`DeviceGraph`'s. The emulator has no pool, stream or device to guard and
    ignores them. A platform that captures nothing (``graph_kind`` "none") is a ValueError.
    """
    where = as_platform(platform)
    api = _device_calls(where)
    if api is None:
        return EmulatedGraph()
    if device is None:
        device = where.torch_device
    return DeviceGraph(device=device, pool=pool, warmup_iters=warmup_iters, capture_error_mode=capture_error_mode,
                       api=api)


@contextlib.contextmanager
def capture_session(platform: Platform | str, device: str | torch.device | None = None) -> Iterator[object | None]:
    """Prepare the device once for a series of captures on ``platform``; yields their shared pool.

    Device graphs: synchronize, garbage-collect and free cached memory once, then
    yield one graph pool handle. The emulator needs nothing and yields None.
    ``device``: default the platform's ``torch_device``.
    """
    where = as_platform(platform)
    api = _device_calls(where)
    if api is None:
        yield None
        return
    if device is None:
        device = where.torch_device
    with _device_session(device, api) as pool:
        yield pool
