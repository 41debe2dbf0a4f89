"""Bounds as data: the range of every number that sizes work, written once.

A :class:`Bound` is the allowed range of one field (``page_size``: ``1..4096``). The record
that owns the field checks it (:meth:`Bound.check` raises
:class:`~attnhal.errors.InvalidValue`), and the CLI builds its argument types from the
same object (:func:`attnhal.cli.args.bounded`), so a flag and the API cannot disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnhal.errors import InvalidValue

__all__ = ["Bound", "FloatBound"]


@dataclass(frozen=True)
class Bound:
    """An integer field's range ``low..high``, both included."""

    field: str
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"Bound({self.field!r}, low={self.low}, high={self.high}) (supported: low <= high)")

    @property
    def supported(self) -> str:
        return f"an integer {self.low}..{self.high}"

    def check(self, value: object, field: str | None = None) -> int:
        """``value`` if it is an int in range, else :class:`InvalidValue` naming ``field``
        (default: this bound's field). Bools, floats and strings are refused."""
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise InvalidValue(field or self.field, value, self.supported)
        return value

    def __str__(self) -> str:
        return f"{self.low}..{self.high}"


@dataclass(frozen=True)
class FloatBound:
    """A real field's range ``low..high`` (finite, both included): NaN and infinities are refused."""

    field: str
    low: float
    high: float
    unit: str = ""

    @property
    def supported(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"a finite number {self.low:g}..{self.high:g}{unit}"

    def check(self, value: object, field: str | None = None) -> float:
        """``value`` as a float if it is a finite number in range, else :class:`InvalidValue`."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidValue(field or self.field, value, self.supported)
        number = float(value) if abs(value) < 1e308 or isinstance(value, float) else math.inf
        if not (math.isfinite(number) and self.low <= number <= self.high):
            raise InvalidValue(field or self.field, value, self.supported)
        return number

    def __str__(self) -> str:
        return f"{self.low:g}..{self.high:g}"

