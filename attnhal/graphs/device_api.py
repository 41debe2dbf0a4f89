"""The device calls a guarded capture makes (:class:`DeviceAPI`), and torch's implementations.

A vendor row names the implementation its device graphs use
(:attr:`~attnhal.platform.VendorRow.graph_device`, ``"module:Class"``);
:func:`device_api` loads it once per process. The implementations here are thin
forwards to one torch device module each:

* :class:`TorchCudaAPI`: ``torch.cuda`` — NVIDIA, and AMD on ROCm builds of torch,
  where ``torch.cuda.CUDAGraph`` is hipGraph;
* :class:`TorchXpuAPI`: ``torch.xpu`` with ``torch.xpu.XPUGraph`` — Intel GPUs, where
  this torch has XPU graphs.

Each has ``unavailable()``: why this process's torch cannot drive it (``None``: it can),
which :func:`attnhal.platform.detect` asks before it gives a device a graph kind.
Nothing here initializes a device: torch's device modules are touched inside methods.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any, ClassVar, ContextManager, Protocol

import torch

from attnhal.platform.graph_device import load_graph_device

__all__ = ["DeviceAPI", "TORCH_CUDA", "TorchCudaAPI", "TorchXpuAPI", "device_api"]

_EMPTY_GRAPH = "graph is empty"  # torch's capture_end warning: "The CUDA Graph is empty. ..."


class DeviceAPI(Protocol):
    """The device calls a guarded capture makes (the seam tests fake)."""

    def available(self) -> bool: ...

    def index(self, device: torch.device) -> int:
        """The device's ordinal (the current device when ``device`` names none)."""

    def device_guard(self, index: int) -> ContextManager[object]: ...

    def current_stream(self, index: int) -> Any: ...

    def set_stream(self, stream: Any) -> None: ...

    def new_stream(self, index: int) -> Any: ...

    def wait_stream(self, waiter: Any, waited: Any) -> None: ...

    def pool_handle(self) -> object: ...

    def new_graph(self) -> Any: ...

    def capture_begin(self, graph: Any, pool: object | None, mode: str) -> None: ...

    def capture_end(self, graph: Any) -> bool:
        """End the capture; True when the graph recorded no work. Raises on a driver failure."""

    def replay(self, graph: Any) -> None: ...

    def sync_debug_mode(self) -> int: ...

    def set_sync_debug_mode(self, mode: int | str) -> None: ...

    def release_cached_memory(self, index: int) -> None:
        """Synchronize, collect garbage and return cached blocks, so the graph pool can grow."""

    def allocations(self, index: int) -> int:
        """Cumulative count of allocator allocations on the device."""


class _TorchModuleAPI:
    """:class:`DeviceAPI` over one torch device module (``torch.<module>``) and its graph class."""

    #: The torch device module (``torch.cuda``) and its graph class (``CUDAGraph``).
    module: ClassVar[str]
    graph_class: ClassVar[str]

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this torch cannot drive this API (no such module or graph class); None: it can."""
        api = getattr(torch, cls.module, None)
        if api is None or not hasattr(api, cls.graph_class):
            return f"torch {torch.__version__} has no torch.{cls.module}.{cls.graph_class}"
        return None

    @property
    def _torch(self) -> Any:
        return getattr(torch, self.module)

    def available(self) -> bool:
        return bool(self._torch.is_available())

    def index(self, device: torch.device) -> int:
        return device.index if device.index is not None else int(self._torch.current_device())

    def device_guard(self, index: int) -> ContextManager[object]:
        guard: ContextManager[object] = self._torch.device(index)
        return guard

    def current_stream(self, index: int) -> Any:
        return self._torch.current_stream(index)

    def set_stream(self, stream: Any) -> None:
        self._torch.set_stream(stream)

    def new_stream(self, index: int) -> Any:
        return self._torch.Stream(device=index)

    def wait_stream(self, waiter: Any, waited: Any) -> None:
        waiter.wait_stream(waited)

    def pool_handle(self) -> object:
        return self._torch.graph_pool_handle()

    def new_graph(self) -> Any:
        return getattr(self._torch, self.graph_class)()

    def capture_begin(self, graph: Any, pool: object | None, mode: str) -> None:
        graph.capture_begin(pool=pool, capture_error_mode=mode)

    def capture_end(self, graph: Any) -> bool:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph.capture_end()
        empty = False
        for w in caught:
            if _EMPTY_GRAPH in str(w.message).lower():
                empty = True
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return empty

    def replay(self, graph: Any) -> None:
        graph.replay()

    def sync_debug_mode(self) -> int:
        return int(self._torch.get_sync_debug_mode())

    def set_sync_debug_mode(self, mode: int | str) -> None:
        self._torch.set_sync_debug_mode(mode)

    def release_cached_memory(self, index: int) -> None:
        self._torch.synchronize(index)
        gc.collect()
        self._torch.empty_cache()

    def allocations(self, index: int) -> int:
        # memory_stats()["allocation.all.allocated"] without flattening ~150 keys in Python:
        # this runs around every replay.
        stats = self._torch.memory_stats_as_nested_dict(index)  # {} before the device is initialized
        return int(stats.get("allocation", {}).get("all", {}).get("allocated", 0))


class TorchCudaAPI(_TorchModuleAPI):
    """:class:`DeviceAPI` over ``torch.cuda`` (CUDA and ROCm builds alike)."""

    module = "cuda"
    graph_class = "CUDAGraph"


class TorchXpuAPI(_TorchModuleAPI):
    """:class:`DeviceAPI` over ``torch.xpu`` and ``torch.xpu.XPUGraph``.

    Two calls differ from ``torch.cuda`` (torch 2.13): ``XPUGraph.capture_begin`` takes a
    pool only, so the capture error mode is not passed on; and ``torch.xpu`` has no sync
    debug mode, so the guard cannot make torch refuse a host sync inside the capture
    before it happens: what such a sync does is the driver's affair. Unit-tested on the
    CPU over a stand-in ``torch.xpu``; not yet run on an Intel GPU.
    """

    module = "xpu"
    graph_class = "XPUGraph"

    def capture_begin(self, graph: Any, pool: object | None, mode: str) -> None:
        graph.capture_begin(pool=pool)

    def sync_debug_mode(self) -> int:
        return 0

    def set_sync_debug_mode(self, mode: int | str) -> None:
        pass  # torch.xpu has none (see the class docs)


#: What :class:`~attnhal.graphs.DeviceGraph` uses when given neither an API nor a platform.
TORCH_CUDA = f"{__name__}:TorchCudaAPI"

#: One instance per named implementation: each device's capture stream lives with its API.
_APIS: dict[str, DeviceAPI] = {}


def device_api(path: str) -> DeviceAPI:
    """The :class:`DeviceAPI` that ``path`` (``"module:Class"``, a row's ``graph_device``) names,
    made once per process."""
    api = _APIS.get(path)
    if api is None:
        api = _APIS[path] = load_graph_device(path)()
    return api
