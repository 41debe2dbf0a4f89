"""Arch notation: canonical spelling, order within a vendor, and sets of archs.

Each vendor writes archs its own way (``sm90``, ``gfx942``, ``pvc``); the row in
:data:`~attnhal.platform.vendors.VENDORS` knows the notation and the order, and
these functions are the only place that compares two archs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from attnhal.platform.vendors import VENDORS, PlatformSpecError, Vendor

__all__ = ["ArchSet", "arch_at_least", "arch_sets", "normalize_arch"]


def normalize_arch(vendor: Vendor, arch: str) -> str:
    """Canonical arch string for ``vendor`` (``"sm_90"`` -> ``"sm90"``); raises on bad notation."""
    return VENDORS[Vendor(vendor)].normalize(arch)


@functools.lru_cache(maxsize=4096)  # pure; planners compare the same few archs over and over
def arch_at_least(vendor: Vendor, arch: str, minimum: str) -> bool:
    """Compare two archs of one vendor. CDNA and RDNA share one gfx ordering (major, minor, stepping).

    An arch without a known place in its vendor's order is not "at least" anything
    but itself (conservative). Raises :class:`PlatformSpecError` on bad notation.
    """
    row = VENDORS[Vendor(vendor)]
    have, need = row.order(arch), row.order(minimum)
    if have is None or need is None:
        return row.normalize(arch) == row.normalize(minimum)
    return have >= need


@dataclass(frozen=True)
class ArchSet:
    """A set of archs of one vendor: exact names and inclusive ranges.

    Written ``"sm90"`` (exact), ``"sm80..sm90"`` (inclusive range), ``"sm100.."``
    (that arch or newer) or ``"..gfx90a"`` (that arch or older).
    """

    vendor: Vendor
    items: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "vendor", Vendor(self.vendor))
        if isinstance(self.items, str) or not self.items:
            raise PlatformSpecError(f"archs={self.items!r} (supported: a non-empty list of {self.vendor.value} "
                                    "archs or ranges like 'sm80..sm90', 'sm100..')")
        object.__setattr__(self, "items", tuple(self.items))
        row = VENDORS[self.vendor]
        for item in self.items:
            lo, sep, hi = str(item).partition("..")
            for end in (lo, hi) if sep else (lo,):
                if end or not sep:
                    row.normalize(end)
            if sep and not (lo or hi):
                raise PlatformSpecError(f"arch range={item!r} (supported: 'a..b', 'a..' or '..b')")
            older, newer = (row.order(lo), row.order(hi)) if lo and hi else (None, None)
            if older is not None and newer is not None and older > newer:
                raise PlatformSpecError(f"arch range={item!r} (supported: an ordered range, the older arch "
                                        f"first: '{hi}..{lo}')")

    def __contains__(self, arch: object) -> bool:
        return isinstance(arch, str) and any(_arch_in(self.vendor, item, arch) for item in self.items)

    def __str__(self) -> str:
        return ", ".join(self.items)


@functools.lru_cache(maxsize=4096)
def _arch_in(vendor: Vendor, item: str, arch: str) -> bool:
    """``arch`` is ``item`` (an arch, or a range ``a..b`` / ``a..`` / ``..b``) of ``vendor``."""
    lo, sep, hi = item.partition("..")
    if not sep:
        return VENDORS[vendor].normalize(lo) == arch
    return (not lo or arch_at_least(vendor, arch, lo)) and (not hi or arch_at_least(vendor, hi, arch))


def arch_sets(table: Mapping[Any, ArchSet | Iterable[str]]) -> dict[Vendor, ArchSet]:
    """``{vendor: ArchSet or [arch or range, ...]}`` as ArchSets (the descriptor notation)."""
    return {Vendor(v): s if isinstance(s, ArchSet) else ArchSet(Vendor(v), tuple(s)) for v, s in table.items()}
