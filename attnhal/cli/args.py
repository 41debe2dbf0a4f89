"""Parameter types for ``attnhal`` commands, built-in and plugin: each one is a value given as ``type=``.

::

    from attnhal.cli.args import bounded, choice, within
    from attnhal.spec import PAGE_SIZE

    p.add_argument("--jobs", type=bounded(1, 64), help="parallel compiles, %(type)s")
    p.add_argument("--page-size", type=within(PAGE_SIZE), help="tokens per page, %(type)s")
    p.add_argument("--dtype", type=choice(("float16", "bfloat16")), help="compute dtype")

A converter refuses a value with :class:`BadArgument`, which carries the value and what is
allowed as data (``str()``: ``99 (supported: an integer 1..64)``). The CLI's parser
(:class:`attnhal.cli.app`'s) names the flag from the argument it was converting, so the user
reads ``--jobs=99 (supported: an integer 1..64)``: the flag is named once, where it is
declared, and no message is read back. A plain ``argparse`` parser still reads well
(``argument --jobs: 99 (supported: ...)``). ``str()`` of a :class:`Bounded` is its range
(``1..64``): a help text shows the bound with argparse's ``%(type)s``, so the bound is written
once too. A value that a record bounds (:mod:`attnhal.bounds`) takes :func:`within`, never a
second ``bounded(...)`` of the same numbers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import overload

from attnhal.bounds import Bound, FloatBound
from attnhal.errors import AttnhalError, InvalidValue, shown

__all__ = ["BadArgument", "Bounded", "Choice", "IntList", "ParamType", "Real", "Registered", "bounded", "choice", "int_list",
           "seconds", "within"]

class BadArgument(AttnhalError, argparse.ArgumentTypeError, ValueError):
    """A command-line value a parameter type refuses.

    Attributes
    ----------
    value: the text given, or the number read from it (a number is shown bare, text quoted).
    supported: what the parameter allows, in words (``an integer 1..64``).
    """

    def __init__(self, value: object, supported: str) -> None:
        self.value, self.supported = value, supported
        super().__init__(f"{self.shown} (supported: {supported})")

    @property
    def shown(self) -> str:
        """The value as a message repeats it: cut to 20 characters, text quoted."""
        return shown(self.value)

    def __reduce__(self) -> tuple[type[BadArgument], tuple[object, str]]:
        return (type(self), (self.value, self.supported))

    def naming(self, flag: str) -> str:
        """``FLAG=VALUE (supported: ...)``: this error for the flag it was given to."""
        return f"{flag}={self.shown} (supported: {self.supported})"


class ParamType:
    """Base of this module's parameter types: calling one converts a command-line string or
    raises :class:`BadArgument` (the CLI's parser then names the flag)."""

    def __call__(self, text: str) -> object:
        raise NotImplementedError


@dataclass(frozen=True)
class Bounded(ParamType):
    """An integer in ``low..high``, both included (click's ``IntRange``).

    Every number that sizes work takes one, so no input runs away in time or memory.
    Calling it converts a command-line string or raises :class:`BadArgument`:
    ``'1.5' (supported: an integer 0..16)`` for a non-integer (quoted: it is text),
    ``100 (supported: an integer 0..16)`` for an integer out of range.
    ``bound`` is the record's :class:`~attnhal.bounds.Bound` it was made from (:func:`within`).
    """

    low: int
    high: int
    bound: Bound | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"bounded(low={self.low}, high={self.high}) (supported: low <= high)")

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also an integer too long to convert (over 4300 digits)
            raise BadArgument(text, f"an integer {self}") from None
        if not self.low <= value <= self.high:
            raise BadArgument(value, f"an integer {self}")
        return value

    def __str__(self) -> str:
        return f"{self.low}..{self.high}"


def bounded(low: int, high: int) -> Bounded:
    """``type=bounded(1, 16)``: an integer flag within ``low..high`` (see :class:`Bounded`)."""
    return Bounded(low, high)


@dataclass(frozen=True)
class Choice(ParamType):
    """One of ``allowed``; the message lists them all."""

    allowed: tuple[str, ...]

    def __call__(self, text: str) -> str:
        if text not in self.allowed:
            raise BadArgument(text, ", ".join(self.allowed))
        return text


@dataclass(frozen=True)
class Registered(ParamType):
    """One of the names ``names()`` gives (an entry-point group's), read only when the flag is given
    or help is shown: a command line without the flag never waits for the scan. The message lists
    them all; a help text's ``{names}`` becomes them (:class:`attnhal.cli.app` formats it)."""

    names: Callable[[], Sequence[str]]

    def __call__(self, text: str) -> str:
        allowed = tuple(self.names())
        if text not in allowed:
            raise BadArgument(text, ", ".join(allowed))
        return text


def choice(allowed: Sequence[str]) -> Choice:
    """``type=choice(("mha", "gqa"))``: one of ``allowed`` (see :class:`Choice`)."""
    return Choice(tuple(allowed))


def int_list(text: str) -> tuple[int, ...]:
    """``type=int_list``: integers separated by commas (``1,3,5``), each ``0..2**31``."""
    return IntList(Bounded(0, 2 ** 31))(text)


@dataclass(frozen=True)
class IntList(ParamType):
    """Integers separated by commas (``1,3,5``), each within ``item`` (a :class:`Bounded`)."""

    item: Bounded

    def __call__(self, text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            values = ()
        if not values or not all(self.item.low <= v <= self.item.high for v in values):
            raise BadArgument(text, f"integers {self.item} separated by commas")
        return values

    def __str__(self) -> str:
        return f"integers {self.item} separated by commas"


@dataclass(frozen=True)
class Real(ParamType):
    """A finite number within ``bound`` (:class:`~attnhal.bounds.FloatBound`): ``inf``, ``nan``,
    ``1e308`` and text are refused with the bound's own words."""

    bound: FloatBound

    def __call__(self, text: str) -> float:
        try:
            return self.bound.check(float(text))
        except (ValueError, InvalidValue):  # text, or a number out of the bound
            raise BadArgument(text, self.bound.supported) from None

    def __str__(self) -> str:
        return str(self.bound)


@overload
def within(bound: Bound, *, off: int | None = None) -> Bounded: ...


@overload
def within(bound: FloatBound) -> Real: ...


def within(bound: Bound | FloatBound, *, off: int | None = None) -> Bounded | Real:
    """The argument type of a record's bound (:mod:`attnhal.bounds`): the flag and the record
    that owns the field check the same range, written once. ``off``: one more value below the
    range that the flag takes to mean "none" (``--spec-steps 0``: no speculative decoding)."""
    if isinstance(bound, FloatBound):
        return Real(bound)
    if off is not None and off != bound.low - 1:
        raise ValueError(f"off={off} (supported: {bound.low - 1}, just below {bound.field}'s {bound})")
    return Bounded(bound.low if off is None else off, bound.high, bound)


#: ``type=seconds``: a finite duration, 1 ms to 24 hours.
seconds = Real(FloatBound("seconds", 0.001, 86_400.0, "seconds"))
