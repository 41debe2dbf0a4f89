"""The root of attnhal's errors: ``except attnhal.AttnhalError`` catches every error attnhal raises on purpose.

Each error also keeps its builtin base (``ValueError`` for bad input, ``LookupError`` for a
name that resolves to nothing, ``RuntimeError`` for a failed run, ...), so code that
catches those goes on working.

:class:`InvalidValue` is the one error of a value out of its bounds: it carries the field,
the value and what is allowed as data, so a caller names the field in its own words (the
CLI maps it to the flag it declared for it) without reading the message back.
"""

from __future__ import annotations

__all__ = ["AttnhalError", "InvalidValue", "shown"]

#: How much of a rejected value a message repeats (a pasted megabyte stays one short line).
_SHOWN = 60


def shown(value: object, limit: int = 20) -> str:
    """``value`` as a message about a name repeats it: cut to ``limit`` characters, text quoted
    (``'xxxxxxxxxxxxxxxxxxxx...'``), so a pasted megabyte in a flag or an environment variable
    stays one short line."""
    text = str(value)
    cut = text[:limit] + "..." if len(text) > limit else text
    return repr(cut) if isinstance(value, str) else cut


class AttnhalError(Exception):
    """Base of attnhal's errors (mixed in beside each one's builtin base)."""


class InvalidValue(AttnhalError, ValueError):
    """``field=value (supported: ...)``: a value outside what ``field`` allows.

    Attributes
    ----------
    field: the record field or key refused (``page_size``, ``tolerances.float32.atol``).
    value: the value given, as given.
    supported: what the field allows, in words (``an integer 1..4096``).
    """

    def __init__(self, field: str, value: object, supported: str) -> None:
        self.field, self.value, self.supported = field, value, supported
        text = repr(value) if isinstance(value, str) else str(value)
        shown = text[:_SHOWN] + "..." if len(text) > _SHOWN else text
        super().__init__(f"{field}={shown} (supported: {supported})")

    def __reduce__(self) -> tuple[type[InvalidValue], tuple[str, object, str]]:
        return (type(self), (self.field, self.value, self.supported))
