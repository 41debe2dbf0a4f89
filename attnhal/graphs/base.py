"""The graph contract shared by real device graphs and the CPU emulator.

A graph records a function once (``capture``) and re-runs the recorded work
(``replay``) on the same tensors: inputs are updated in place with ``copy_``
before each replay, and the tensors returned by ``capture`` are the graph's
static outputs, rewritten by every replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, TypeVar

import torch

from attnhal.errors import AttnhalError

T = TypeVar("T")


class CaptureError(AttnhalError, RuntimeError):
    """An operation inside a captured function cannot be part of a graph.

    Parameters
    ----------
    op:
        The offending operation, e.g. ``aten._local_scalar_dense`` or
        ``Tensor.tolist``.
    why:
        Why it breaks a graph and what to do instead.
    """

    def __init__(self, op: str, why: str) -> None:
        self.op = op
        self.why = why
        super().__init__(f"{op} cannot be captured in a graph: {why}")

    def __reduce__(self) -> tuple[type[CaptureError], tuple[str, str]]:
        # RuntimeError pickles its args (the formatted message) by default,
        # which would not match this two-argument constructor.
        return (CaptureError, (self.op, self.why))


class CaptureAbort(CaptureError):
    """The driver failed a capture, so the device's capture state is no longer trusted.

    Raised by the failing capture and by every later capture on that device: a
    :class:`~attnhal.graphs.GraphRunner` stops capturing its remaining phases.
    """


class Graph(ABC):
    """One captured function, replayable on the tensors it was captured with."""

    @abstractmethod
    def capture(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` once under capture, under ``torch.no_grad()``.

        Returns what ``fn`` returned; its tensors are the graph's static
        outputs, updated in place by each :meth:`replay`. A graph is captured
        once. Raises :class:`CaptureError` when ``fn`` does something a graph
        cannot hold (a host sync, a data-dependent output shape).
        """

    def warm_up(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once eagerly, where :meth:`capture` will run it, so that lazy
        initialization (library handles, kernel compilation, allocator growth) stays
        out of the graph."""
        with torch.no_grad():
            fn()

    @abstractmethod
    def replay(self) -> None:
        """Re-run the captured work on the current contents of its tensors."""

    @property
    @abstractmethod
    def replay_allocations(self) -> int:
        """Tensor allocations counted during the last :meth:`replay`.

        A device graph reports the allocator's allocation count around the
        replay (``torch.cuda.memory_stats``), which a sound graph keeps at 0.
        The emulator reports how many op outputs it had to allocate afresh,
        which is 0 when the captured function writes everything into
        pre-allocated tensors (``out=``, ``copy_``, in-place ops).
        """

    @property
    def pool(self) -> object | None:
        """Memory pool handle to pass to the next graph so that graphs share
        memory (``new_graph(kind, pool=g.pool)``); None where the kind has none."""
        return None
