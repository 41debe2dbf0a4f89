"""Every tensor a Triton launch reads sits on one device, checked before the launch.

A GPU kernel given a host tensor fails deep inside Triton's launcher ("Pointer argument
(at 15) cannot be accessed from Triton (cpu tensor?)") with no name, and the interpreter
runs it anyway: CPU CI never sees the mistake. :func:`on_one_device` wraps each custom
op (and its fake) so that every tensor argument is compared with one anchor argument's
device, in every mode: interpreter, device, fake tensors (``torch.compile`` tracing) and
graph capture. It compares ``torch.device`` objects only: no sync, no allocation.

The check reads the op's own signature, so a tensor argument added later is checked
without anyone listing it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

__all__ = ["check_one_device", "on_one_device"]

F = TypeVar("F", bound=Callable[..., Any])


def check_one_device(op: str, anchor: str, arguments: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first tensor of ``arguments`` whose device differs from
    ``arguments[anchor]``'s (both devices in the message); ``None`` and non-tensors pass."""
    device = arguments[anchor].device
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor) and value.device != device:
            raise ValueError(f"{op}: {name}.device={value.device} (supported: {anchor}'s device "
                             f"{device}; a kernel reads every tensor argument on one device — move "
                             f"{name} there once, before the forward)")


def on_one_device(anchor: str, op: str | None = None) -> Callable[[F], F]:
    """Decorate an op whose tensor arguments must all be on ``anchor``'s device; errors name
    ``op`` (default: the function's name; a fake registered as ``_`` passes its op's).

    ``functools.wraps`` keeps the signature visible (``inspect.signature`` follows
    ``__wrapped__``), so ``torch.library.custom_op`` infers the same schema.
    """
    def decorate(fn: F) -> F:
        signature, name = inspect.signature(fn), op or fn.__name__
        if anchor not in signature.parameters:
            raise TypeError(f"{name} has no argument {anchor!r} to take the device from")

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            check_one_device(name, anchor, signature.bind(*args, **kwargs).arguments)
            return fn(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate
