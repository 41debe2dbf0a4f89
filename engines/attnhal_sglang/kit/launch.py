"""SGLang's work as single ops the CPU graph emulator records and replays.

A real graph records SGLang's kernel launches with their arguments fixed: the
``ForwardMetadata`` object and the batch as they were at capture, reading static buffers
whose contents change between replays. SGLang's Triton kernels, run by the interpreter,
are invisible to the emulator's dispatch mode (it would record only the interpreter's copies),
so each forward runs as one custom op, ``attnhal_sglang::run``, with what a graph would
freeze bound in a :class:`Launch`: replaying the op re-runs the launch with its capture-time
metadata. SGLang's out-of-graph metadata step (allowed host work and allocation by its
contract: it runs before ``graph.replay()``) runs through the same op, so the emulator sees
one step there too — with host copies allowed inside it (SGLang's contract: the step runs
before the replay, not in it); a forward launch keeps the emulator's ban on them.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["Launch", "run"]

_launches: weakref.WeakValueDictionary[int, Launch] = weakref.WeakValueDictionary()
_ids = itertools.count(1)


class Launch:
    """A bound piece of SGLang work; the owner keeps it alive, the op finds it by ``key``."""

    def __init__(self, work: Callable[[], None], host_work: bool = False) -> None:
        self.work, self.key, self.host_work = work, next(_ids), host_work
        _launches[self.key] = self


#: What a capture emulator patches onto ``torch.Tensor`` to refuse host copies (``Tensor``
#: itself defines neither: its base class does).
_HOST_COPIES = ("tolist", "numpy")


@contextlib.contextmanager
def _host_copies_allowed() -> Iterator[None]:
    """Lift a capture's refusal of ``Tensor.tolist``/``numpy`` for the duration (restored after)."""
    patched = {name: torch.Tensor.__dict__[name] for name in _HOST_COPIES if name in torch.Tensor.__dict__}
    for name in patched:
        delattr(torch.Tensor, name)
    try:
        yield
    finally:
        for name, value in patched.items():
            setattr(torch.Tensor, name, value)


@torch.library.custom_op("attnhal_sglang::run", mutates_args=("written",))
def _run(written: torch.Tensor, key: int) -> None:
    launch = _launches.get(key)
    if launch is None:
        raise RuntimeError(f"attnhal_sglang::run key={key}: the launch is gone (its backend was freed)")
    with _host_copies_allowed() if launch.host_work else contextlib.nullcontext():
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
