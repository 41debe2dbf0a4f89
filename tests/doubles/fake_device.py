"""A fake ``DeviceAPI`` (:mod:`attnhal.graphs.device`'s seam): the device-graph guard's
control flow runs on CPU against it (tests/graphs/test_device_unit.py).

It models what matters to the guard: a current device and a current stream per device,
a graph that records "kernels" launched on its capture stream, a host sync that raises
under sync debug mode "error" and otherwise invalidates the capture (the driver then
fails ``capture_end``), an allocation counter. Its methods follow ``DeviceAPI``'s
signatures, checked on CPU by tests/graphs/test_doubles.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["FakeDevice", "FakeGraph", "FakeStream"]

_MODES = {"default": 0, "warn": 1, "error": 2}


class FakeStream:
    def __init__(self, name: str, device: int) -> None:
        self.name, self.device = name, device

    def __repr__(self) -> str:
        return f"FakeStream({self.name}, {self.device})"


class FakeGraph:
    def __init__(self) -> None:
        self.work, self.replays, self.where = 0, 0, None  # type: ignore[var-annotated]
        self.handle = object()

    def pool(self) -> object:
        return self.handle


class FakeDevice:
    """A ``DeviceAPI`` with ``devices`` GPUs, no GPU needed."""

    def __init__(self, devices: int = 2) -> None:
        self.device = 0
        self.streams = {i: FakeStream(f"default{i}", i) for i in range(devices)}
        self.created_streams: list[FakeStream] = []
        self.mode = 0
        self.capturing: FakeGraph | None = None
        self.invalidated = False
        self.begins: list[dict[str, Any]] = []
        self.pools: list[object] = []
        self.releases = 0
        self.allocs, self.allocs_per_replay = 0, 0

    # --- what the code under test launches -------------------------------------------
    def launch(self, device: int | None = None) -> None:
        """A kernel on ``device``'s current stream; recorded if that is the capture stream."""
        where = (self.device if device is None else device, self.streams[self.device if device is None else device])
        if self.capturing is not None and where == self.capturing.where:
            self.capturing.work += 1

    def host_sync(self) -> None:
        """What ``.item()`` does: refused under sync debug mode "error", else it breaks a capture."""
        if self.mode == 2:
            raise RuntimeError("called a synchronizing CUDA operation")
        if self.capturing is not None:
            self.invalidated = True

    # --- DeviceAPI ---------------------------------------------------------------------
    def available(self) -> bool:
        return True

    def index(self, device: torch.device) -> int:
        return device.index if device.index is not None else self.device

    @contextlib.contextmanager
    def device_guard(self, index: int) -> Iterator[None]:
        saved, self.device = self.device, index
        try:
            yield
        finally:
            self.device = saved

    def current_stream(self, index: int) -> FakeStream:
        return self.streams[index]

    def set_stream(self, stream: FakeStream) -> None:
        self.streams[stream.device] = stream

    def new_stream(self, index: int) -> FakeStream:
        self.created_streams.append(FakeStream(f"side{len(self.created_streams)}", index))
        return self.created_streams[-1]

    def wait_stream(self, waiter: FakeStream, waited: FakeStream) -> None:
        pass

    def pool_handle(self) -> object:
        self.pools.append(object())
        return self.pools[-1]

    def new_graph(self) -> FakeGraph:
        return FakeGraph()

    def capture_begin(self, graph: FakeGraph, pool: object | None, mode: str) -> None:
        assert self.capturing is None, "nested capture"
        graph.where = (self.device, self.streams[self.device])
        self.begins.append({"device": self.device, "stream": self.streams[self.device], "pool": pool, "mode": mode})
        self.capturing = graph

    def capture_end(self, graph: FakeGraph) -> bool:
        self.capturing = None
        if self.invalidated:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return graph.work == 0

    def replay(self, graph: FakeGraph) -> None:
        graph.replays += 1
        self.allocs += self.allocs_per_replay

    def sync_debug_mode(self) -> int:
        return self.mode

    def set_sync_debug_mode(self, mode: int | str) -> None:
        self.mode = _MODES[mode] if isinstance(mode, str) else mode

    def release_cached_memory(self, index: int) -> None:
        self.releases += 1

    def allocations(self, index: int) -> int:
        return self.allocs
