"""Releases by rule: which supported engine release models an installed or named one.

An engine release string (PEP 440, as pip installs it; a leading ``v`` as tags spell it) names
a *series* (its first ``digits`` release numbers: vLLM's minor ``0.34``, SGLang's ``0.5.23``)
and a position in it (a patch ``0.34.1``, a pre-release ``0.34.0rc1``, a post release
``0.5.23.post1``, a dev build, a local label). A release of a supported series is modelled as
that series' supported release — its flags, catalogue and plugin hooks are the series' — and
:func:`modelled` says so in one line; a release of another series has no match (``None``).

The rule is the engines' own: both move code between minors (vLLM) or releases (SGLang), not
within a series' patches and pre/post builds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Modelled", "modelled", "release_numbers"]

_PEP440 = re.compile(r"v?(?P<release>\d+(?:\.\d+)*)"
                     r"(?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
                     r"(?:[-_.]?(?:post|rev|r)[-_.]?\d*|-\d+)?"
                     r"(?:[-_.]?dev[-_.]?\d*)?"
                     r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?", re.IGNORECASE)


def release_numbers(version: str) -> tuple[int, ...] | None:
    """The release numbers of a PEP 440 version (``"v0.34.0rc1"`` -> ``(0, 34, 0)``); ``None``
    when ``version`` is not one."""
    match = _PEP440.fullmatch(version.strip())
    if match is None:
        return None
    return tuple(int(part) for part in match["release"].split("."))


def _padded(numbers: tuple[int, ...], digits: int) -> tuple[int, ...]:
    return (numbers + (0,) * digits)[:digits]


@dataclass(frozen=True)
class Modelled:
    """The supported release that models ``given``; ``line`` says why where they differ ("": same)."""

    given: str
    release: str

    @property
    def exact(self) -> bool:
        return self.given == self.release

    def line(self, engine: str) -> str:
        if self.exact:
            return ""
        return (f"{engine} {self.given} is modelled as {engine} {self.release} (the same series: a patch, pre- or "
                f"post-release of a supported release is read by that release's rules)")


def modelled(version: str | None, supported: Sequence[str], digits: int) -> Modelled | None:
    """The release of ``supported`` whose series (first ``digits`` numbers) ``version`` belongs to.

    An exact match wins; ``None`` for no version, a string that is no PEP 440 version, or a
    series attnhal does not support.
    """
    if version is None:
        return None
    if version in supported:
        return Modelled(version, version)
    numbers = release_numbers(version)
    if numbers is None:
        return None
    for release in supported:
        theirs = release_numbers(release)
        if theirs is not None and _padded(theirs, digits) == _padded(numbers, digits):
            return Modelled(version, release)
    return None
