"""Test doubles that follow the code they replace by construction, and warning checks that
read attnhal's own warnings only.

Device tests run only where a GPU is, so their doubles rot unseen: a spy of
``new_graph`` written as ``spy(kind, pool=None)`` broke the day the runner started passing
``device=``, and an exact list of caught warnings broke when torch 2.11 added its own
("Synchronization debug mode is a prototype feature"). Here:

* :func:`stand_in` replaces a function with one that takes ``*args, **kwargs``, binds
  them to the *real* function's signature (a call the real one would refuse fails the
  same way) and hands the bound arguments, defaults applied, to the test's behaviour;
  :func:`spy` is the stand-in that records and forwards.
* :func:`signature_drift` lists the methods of a class double whose parameters differ
  from the class or protocol it stands for; the CPU suite asserts it is empty for every
  class double of a device path (``tests/graphs/test_doubles.py``).
* :func:`attnhal_warnings` keeps the categories attnhal defines, whatever else torch,
  Triton or Python add.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import pytest

__all__ = ["attnhal_warnings", "signature_drift", "spy", "stand_in"]


def stand_in(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str,
             behaviour: Callable[[inspect.BoundArguments], Any]) -> list[inspect.BoundArguments]:
    """Replace ``owner.name`` for this test by ``behaviour`` of the real function's bound
    arguments; returns the list each call's arguments are appended to."""
    real = getattr(owner, name)
    signature = inspect.signature(real)
    calls: list[inspect.BoundArguments] = []

    def double(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)  # TypeError where the real function would raise one
        bound.apply_defaults()
        calls.append(bound)
        return behaviour(bound)

    monkeypatch.setattr(owner, name, double)
    return calls


def spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[inspect.BoundArguments]:
    """Record every call of ``owner.name`` (bound to its signature) and forward it unchanged."""
    real = getattr(owner, name)
    return stand_in(monkeypatch, owner, name, lambda bound: real(*bound.args, **bound.kwargs))


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, bool]]:
    """(name, kind, has a default) of each parameter but ``self``."""
    params = inspect.signature(fn).parameters.values()
    return [(p.name, p.kind, p.default is not p.empty) for p in params if p.name != "self"]


def signature_drift(double: Any, real: Any, methods: Iterable[str] | None = None) -> list[str]:
    """Each method of ``real`` (a class, protocol or module; default: the public callables it
    defines) that ``double`` lacks or whose parameters (names, kinds, which have defaults)
    differ: ``"name: double(...) vs real(...)"``. Annotations are not compared."""
    names = methods if methods is not None else [
        n for n in vars(real) if not n.startswith("_") and callable(getattr(real, n))]
    out = []
    for name in names:
        theirs = getattr(double, name, None)
        if theirs is None:
            out.append(f"{name}: missing from {double.__name__}")
            continue
        want, got = _parameters(getattr(real, name)), _parameters(theirs)
        if got != want:
            out.append(f"{name}: {double.__name__}{inspect.signature(theirs)} vs "
                       f"{real.__name__}{inspect.signature(getattr(real, name))}")
    return out


def attnhal_warnings(caught: Iterable[warnings.WarningMessage]) -> list[type[Warning]]:
    """The categories of ``caught`` that attnhal defines, in order (others are the platform's)."""
    return [w.category for w in caught if w.category.__module__.split(".")[0] == "attnhal"]
