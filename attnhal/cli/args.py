"""Parameter types for ``attnhal`` commands, built-in and plugin: each one is a value given as ``type=``.

::

    from attnhal.cli.args import bounded, choice

    p.add_argument("--jobs", type=bounded(1, 64), help="parallel compiles, %(type)s")
    p.add_argument("--dtype", type=choice(("float16", "bfloat16")), help="compute dtype")

A converter describes the value it rejects in the project's form, ``99 (supported: an
integer 1..16)``. argparse reports it as ``argument --jobs: 99 (supported: ...)``, and the
CLI's parser writes the two as one, ``--jobs=99 (supported: an integer 1..64)``
(:func:`flag_message`), so the flag is named once, where it is declared. ``str()`` of a
:class:`Bounded` is its range (``1..64``): a help text shows the bound with argparse's
``%(type)s``, so the bound is written once too.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attnhal.bounds import Bound, FloatBound
from attnhal.errors import InvalidValue

__all__ = ["Bounded", "IntList", "Real", "bounded", "choice", "flag_message", "int_list", "seconds", "within"]

#: How much of a rejected value a message repeats (a pasted megabyte stays one short line).
_SHOWN = 20


def _shown(text: str) -> str:
    return text[:_SHOWN] + "..." if len(text) > _SHOWN else text


@dataclass(frozen=True)
class Bounded:
    """An integer in ``low..high``, both included (click's ``IntRange``).

    Every number that sizes work takes one, so no input runs away in time or memory.
    Calling it converts a command-line string or raises ``argparse.ArgumentTypeError``:
    ``'1.5' (supported: an integer 0..16)`` for a non-integer (quoted: it is text),
    ``100 (supported: an integer 0..16)`` for an integer out of range.
    """

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"bounded(low={self.low}, high={self.high}) (supported: low <= high)")

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also an integer too long to convert (over 4300 digits)
            raise argparse.ArgumentTypeError(f"{_shown(text)!r} (supported: an integer {self})") from None
        if not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(f"{_shown(text)} (supported: an integer {self})")
        return value

    def __str__(self) -> str:
        return f"{self.low}..{self.high}"


def bounded(low: int, high: int) -> Bounded:
    """``type=bounded(1, 16)``: an integer flag within ``low..high`` (see :class:`Bounded`)."""
    return Bounded(low, high)


def choice(allowed: Sequence[str]) -> Callable[[str], str]:
    """``type=choice(("mha", "gqa"))``: one of ``allowed``; the message lists them all."""
    def convert(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r} (supported: {', '.join(allowed)})")
        return text
    return convert


def int_list(text: str) -> tuple[int, ...]:
    """``type=int_list``: integers separated by commas (``1,3,5``), each ``0..2**31``."""
    return IntList(Bounded(0, 2 ** 31))(text)


@dataclass(frozen=True)
class IntList:
    """Integers separated by commas (``1,3,5``), each within ``item`` (a :class:`Bounded`)."""

    item: Bounded

    def __call__(self, text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            values = ()
        if not values or not all(self.item.low <= v <= self.item.high for v in values):
            raise argparse.ArgumentTypeError(f"{_shown(text)!r} (supported: integers {self.item} separated by "
                                             "commas)")
        return values

    def __str__(self) -> str:
        return f"integers {self.item} separated by commas"


@dataclass(frozen=True)
class Real:
    """A finite number within ``bound`` (:class:`~attnhal.bounds.FloatBound`): ``inf``, ``nan``,
    ``1e308`` and text are refused with the bound's own words."""

    bound: FloatBound

    def __call__(self, text: str) -> float:
        try:
            return self.bound.check(float(text))
        except (ValueError, InvalidValue):  # text, or a number out of the bound
            raise argparse.ArgumentTypeError(f"{_shown(text)!r} (supported: {self.bound.supported})") from None

    def __str__(self) -> str:
        return str(self.bound)


def within(bound: Bound | FloatBound) -> Bounded | Real:
    """The argument type of a core bound (:mod:`attnhal.bounds`): the flag and the record
    that owns the field check the same range, written once."""
    if isinstance(bound, FloatBound):
        return Real(bound)
    return Bounded(bound.low, bound.high)


#: ``type=seconds``: a finite duration, 1 ms to 24 hours.
seconds = Real(FloatBound("seconds", 0.001, 86_400.0, "seconds"))


_ARGUMENT = re.compile(r"argument (?P<flag>[^:\s]+): (?P<text>.*)", re.S)


def flag_message(message: str) -> str:
    """argparse's ``argument FLAG: TEXT`` in the CLI's voice.

    ``TEXT`` from a converter of this module (the value, then ``(supported: ...)``)
    becomes ``FLAG=TEXT``; a converter that names the flag itself (``--x=5 ...``) keeps
    its text alone; argparse's own words (``expected one argument``) stay as they are.
    """
    match = _ARGUMENT.fullmatch(message)
    if match is None:
        return message
    flag, text = match["flag"], match["text"]
    if text.startswith("-") and not text[1:2].isdigit():  # names a flag, not a negative number
        return text
    if "(supported: " in text:
        return f"{flag}={text}"
    return message
