"""SGLang's work as single ops the CPU graph emulator records and replays.

A real graph records SGLang's kernel launches with their arguments fixed: the
``ForwardMetadata`` object and the batch as they were at capture, reading static buffers
whose contents change between replays. SGLang's Triton kernels, run by the interpreter,
are invisible to the emulator's dispatch mode (it would record only the interpreter's copies),
so each forward runs as one custom op, ``attnhal_sglang::run``, with what a graph would
freeze bound in a :class:`Launch`: replaying the op re-runs the launch with its capture-time
metadata. SGLang's out-of-graph metadata step (allowed host work and allocation by its
contract: it runs before ``graph.replay()``) runs through the same op, so the emulator sees
one step there too.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Launch", "run"]

_launches: weakref.WeakValueDictionary[int, Launch] = weakref.WeakValueDictionary()
_ids = itertools.count(1)


class Launch:
    """A bound piece of SGLang work; the owner keeps it alive, the op finds it by ``key``."""

    def __init__(self, work: Callable[[], None]) -> None:
        self.work, self.key = work, next(_ids)
        _launches[self.key] = self


@torch.library.custom_op("attnhal_sglang::run", mutates_args=("written",))
def _run(written: torch.Tensor, key: int) -> None:
    launch = _launches.get(key)
    if launch is None:
        raise RuntimeError(f"attnhal_sglang::run key={key}: the launch is gone (its backend was freed)")
    launch.work()


@_run.register_fake
def _(written: torch.Tensor, key: int) -> None:
    return None


def run(launch: Launch, written: torch.Tensor) -> None:
    """Run ``launch`` as one op that writes ``written`` (what the graph sees it change)."""
    torch.ops.attnhal_sglang.run(written, launch.key)


def keep(owner: Any, launch: Launch) -> Launch:
    """``owner`` holds ``launch`` for as long as it lives (the op only has a weak reference)."""
    owner.__dict__.setdefault("_attnhal_launches", []).append(launch)
    return launch
