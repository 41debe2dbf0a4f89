"""A real device graph over ``torch.cuda.CUDAGraph``.

The same class serves NVIDIA and AMD GPUs: on ROCm builds torch maps
``torch.cuda.CUDAGraph`` to hipGraph. Importing this module does not
initialize the GPU; ``torch.cuda`` is only used inside methods.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar, cast

import torch

from .base import CaptureError, Graph

T = TypeVar("T")


class DeviceGraph(Graph):
    """A CUDA/HIP graph.

    Parameters
    ----------
    pool:
        Memory pool handle to share with other graphs
        (``torch.cuda.graph_pool_handle()`` or another graph's :attr:`pool`);
        None gives this graph a private pool.
    warmup_iters:
        Eager runs of ``fn`` on a side stream before capture, so that lazy
        initialization (library handles, autotuning, allocator growth) happens
        outside the graph, as torch recommends.
    """

    def __init__(self, pool: object | None = None, warmup_iters: int = 1) -> None:
        self._pool = pool
        self._warmup_iters = warmup_iters
        self._graph: torch.cuda.CUDAGraph | None = None

    def capture(self, fn: Callable[[], T]) -> T:
        """Warm ``fn`` up on a side stream, then capture one run of it.

        Both run under ``torch.no_grad()``. A capture failure from the driver
        (typically a host sync) is re-raised as :class:`CaptureError`.
        """
        if self._graph is not None:
            raise RuntimeError("this graph is already captured; make a new one")
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA/HIP device is available; use an emulated graph")
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            self._warm_up(fn)
            try:
                # The handle is opaque here; torch checks it.
                with torch.cuda.graph(graph, pool=cast(Any, self._pool)):
                    out = fn()
            except RuntimeError as exc:
                if isinstance(exc, CaptureError):
                    raise
                raise CaptureError(
                    "device graph capture",
                    f"{exc}. The usual cause is a host sync (.item(), nonzero, "
                    ".tolist(), .cpu()) or an allocation outside the graph pool; "
                    "capture the function with an emulated graph to name the op",
                ) from exc
        self._graph = graph
        return out

    def _warm_up(self, fn: Callable[[], object]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self._warmup_iters):
                fn()
        torch.cuda.current_stream().wait_stream(side)

    def replay(self) -> None:
        """Launch the captured graph on the current stream."""
        if self._graph is None:
            raise RuntimeError("replay() before capture()")
        self._graph.replay()

    @property
    def replay_allocations(self) -> int:
        """Always 0: a real graph cannot allocate at replay."""
        return 0

    @property
    def pool(self) -> object | None:
        """This graph's memory pool handle, to share with graphs captured later."""
        if self._graph is not None:
            return self._graph.pool()
        return self._pool
