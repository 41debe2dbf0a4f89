"""A real device graph, guarded so that a failed capture stays local.

Every device call goes through a :class:`~attnhal.graphs.device_api.DeviceAPI`, the
implementation the platform's vendor row names: :class:`TorchCudaAPI` (``torch.cuda``;
NVIDIA, and AMD where ROCm builds of torch map ``torch.cuda.CUDAGraph`` to hipGraph) or
:class:`TorchXpuAPI` (``torch.xpu.XPUGraph``). Importing this module initializes no
device. The seam lets tests substitute a fake to check the guard's control flow on a
machine without a GPU (``tests/graphs/test_device_unit.py``).

How a capture is guarded (why each step exists; the sync debug mode is ``torch.cuda``'s):

* the captured call runs with ``torch.cuda.set_sync_debug_mode("error")``: torch
  raises *before* a synchronizing driver call (``.item()``, ``nonzero``, a
  device-to-host copy), so the driver's capture is never invalidated and ends
  cleanly. Without it a host sync invalidates the capture; on older torch the
  allocator stays in capture state and every later capture fails, and on ROCm
  before the platform's minimum torch nothing is raised at all;
* capture runs under the tensors' device, on one capture stream per device, and
  the thread's current stream is restored in ``finally``;
* when the driver itself fails (``capture_end`` raises), the device's capture
  state is not trusted again: later captures on that device raise
  :class:`CaptureAbort` with the first failure as the reason;
* an empty graph (work launched on another device or stream) is a
  :class:`CaptureError`, not a replay that silently does nothing.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch

from .base import CaptureAbort, CaptureError, Graph
from .device_api import TORCH_CUDA, DeviceAPI, TorchCudaAPI, TorchXpuAPI, device_api

__all__ = ["CAPTURE_ERROR_MODES", "DeviceAPI", "DeviceGraph", "TorchCudaAPI", "TorchXpuAPI",
           "capture_session"]

T = TypeVar("T")

#: ``torch.cuda.CUDAGraph.capture_begin(capture_error_mode=...)`` values. "global" (torch's
#: default) also fails the capture when *another* thread makes an unsafe call, e.g. an
#: NCCL/RCCL watchdog thread; "thread_local" only watches the capturing thread.
CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


@dataclass
class _DeviceState:
    """Per device: the one capture stream and, once the driver failed a capture, why."""

    stream: Any
    broken: str | None = None


_STATES: weakref.WeakKeyDictionary[Any, dict[int, _DeviceState]] = weakref.WeakKeyDictionary()


def _state(api: DeviceAPI, index: int) -> _DeviceState:
    states = _STATES.setdefault(api, {})
    if index not in states:
        states[index] = _DeviceState(stream=api.new_stream(index))
    return states[index]


@contextlib.contextmanager
def capture_session(device: str | torch.device, api: DeviceAPI | None = None) -> Iterator[object]:
    """Prepare ``device`` once for a series of captures; yields the memory pool they share.

    The synchronize / garbage collection / ``empty_cache`` that ``torch.cuda.graph``
    pays on every capture happen here once (they only make room for the pool).
    """
    api = api or device_api(TORCH_CUDA)
    if not api.available():
        raise RuntimeError(_no_device(api))
    index = api.index(torch.device(device))
    with api.device_guard(index):
        api.release_cached_memory(index)
        yield api.pool_handle()


class DeviceGraph(Graph):
    """A CUDA/HIP graph.

    Parameters
    ----------
    device:
        The device whose work is captured (the tensors' device); capture and replay
        run under it. None: the current device.
    pool:
        Memory pool handle to share with other graphs (from :func:`capture_session`,
        ``torch.cuda.graph_pool_handle()`` or another graph's :attr:`pool`); None gives
        this graph a private pool.
    warmup_iters:
        Eager runs of ``fn`` on the capture stream before capture, so that lazy
        initialization (library handles, autotuning, allocator growth) happens outside
        the graph. The runner calls :meth:`warm_up` once per size and passes 0.
    capture_error_mode:
        One of :data:`CAPTURE_ERROR_MODES`; "thread_local" where other threads (an
        NCCL/RCCL watchdog) make unsafe calls during capture.
    api:
        The device calls: the platform's (``new_graph(platform)`` passes them); None:
        :class:`TorchCudaAPI`.
    """

    def __init__(self, device: str | torch.device | None = None, pool: object | None = None,
                 warmup_iters: int = 1, capture_error_mode: str = "global",
                 api: DeviceAPI | None = None) -> None:
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise ValueError(f"capture_error_mode={capture_error_mode!r} "
                             f"(supported: {', '.join(CAPTURE_ERROR_MODES)})")
        self._device = torch.device(device) if device is not None else torch.device("cuda")
        self._pool = pool
        self._warmup_iters = warmup_iters
        self._mode = capture_error_mode
        self._api = api or device_api(TORCH_CUDA)
        self._graph: Any = None
        self._index = -1
        self._replay_allocations = 0

    def warm_up(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once eagerly on the device's capture stream, where :meth:`capture` runs it
        (per-stream lazy state, such as a BLAS workspace, is created for that stream)."""
        with self._capture_stream():
            fn()

    def capture(self, fn: Callable[[], T]) -> T:
        """Warm ``fn`` up ``warmup_iters`` times, then capture one run of it on the capture stream.

        Both run under ``torch.no_grad()`` and the device. A host sync inside ``fn``
        raises :class:`CaptureError` and leaves the device able to capture again; a
        failure of the driver's capture raises :class:`CaptureAbort`, after which this
        device refuses further captures. The current stream is restored either way.
        """
        if self._graph is not None:
            raise RuntimeError("this graph is already captured; make a new one")
        with self._capture_stream() as state:
            for _ in range(self._warmup_iters):
                fn()
            graph = self._api.new_graph()
            out, fn_error, empty = self._record(fn, graph, state)
        if isinstance(fn_error, Exception):
            raise _as_capture_error(fn_error) from fn_error
        if fn_error is not None:  # KeyboardInterrupt, SystemExit: not a capture error
            raise fn_error
        if empty:
            raise CaptureError("device graph capture", "the graph recorded no work: kernels ran on another "
                               f"device or stream than the capture stream of device {self._index}")
        self._graph = graph
        return cast(T, out)

    @contextlib.contextmanager
    def _capture_stream(self) -> Iterator[_DeviceState]:
        """Under ``torch.no_grad()``, the device and its capture stream; the caller's stream comes back."""
        api = self._api
        if not api.available():
            raise RuntimeError(_no_device(api))
        self._index = index = api.index(self._device)
        state = _state(api, index)
        if state.broken is not None:
            raise CaptureAbort("device graph capture", f"an earlier capture on device {index} failed in "
                               f"the driver, so its capture state is not trusted: {state.broken}")
        with torch.no_grad(), api.device_guard(index):
            caller = api.current_stream(index)
            api.wait_stream(state.stream, caller)
            api.set_stream(state.stream)
            try:
                yield state
            finally:
                api.set_stream(caller)
                api.wait_stream(caller, state.stream)

    def _record(self, fn: Callable[[], T], graph: Any, state: _DeviceState
                ) -> tuple[T | None, BaseException | None, bool]:
        """Capture ``fn`` under the sync guard; returns (outputs, fn's error, graph empty)."""
        api = self._api
        api.capture_begin(graph, self._pool, self._mode)
        out: T | None = None
        fn_error: BaseException | None = None
        previous = api.sync_debug_mode()
        api.set_sync_debug_mode("error")
        try:
            out = fn()
        except BaseException as exc:  # noqa: BLE001 - the capture must end first; re-raised by the caller
            fn_error = exc
        finally:
            api.set_sync_debug_mode(previous)
        try:
            empty = api.capture_end(graph)
        except Exception as exc:  # a driver failure: this device's capture state is gone
            state.broken = f"{type(exc).__name__}: {exc}"
            cause = f"; the captured function raised first: {fn_error}" if fn_error else ""
            raise CaptureAbort("device graph capture", f"the driver failed the capture ({exc}){cause}. "
                               "No further graphs are captured on this device") from (fn_error or exc)
        return out, fn_error, empty

    def replay(self) -> None:
        """Launch the captured graph on the current stream of its device."""
        if self._graph is None:
            raise RuntimeError("replay() before capture()")
        api = self._api
        with api.device_guard(self._index):
            before = api.allocations(self._index)
            api.replay(self._graph)
            self._replay_allocations = api.allocations(self._index) - before

    @property
    def replay_allocations(self) -> int:
        """Allocator allocations during the last replay, from the device's memory stats."""
        return self._replay_allocations

    @property
    def pool(self) -> object | None:
        """This graph's memory pool handle, to share with graphs captured later."""
        if self._graph is not None and self._pool is None:
            return self._graph.pool()
        return self._pool


def _no_device(api: DeviceAPI) -> str:
    return f"no device is available to {type(api).__name__}; use an emulated graph"


def _as_capture_error(exc: BaseException) -> CaptureError:
    if isinstance(exc, CaptureError):
        return exc
    return CaptureError("device graph capture", f"{type(exc).__name__}: {exc}. The usual cause is a host "
                        "sync (.item(), nonzero, .tolist(), .cpu()) or an allocation outside the graph "
                        "pool; capture the function with an emulated graph to name the op")
