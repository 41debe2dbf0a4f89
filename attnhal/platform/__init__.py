"""What device we run on — the only package in attnhal that knows vendors.

Everything that differs by vendor or architecture is *data*: one
:class:`VendorRow` per vendor (:mod:`attnhal.platform.vendors`) and the fields
of :class:`Platform` derived from it (:mod:`attnhal.platform.facts`). The
planner and the backends read these fields; they never compare vendor strings
themselves. Arch notation and order live in :mod:`attnhal.platform.archs`.

A platform is either detected from torch (:func:`detect`, the only code that
asks torch, in :mod:`attnhal.platform.detection`) or parsed from a spec such as
``"cuda:sm90"``, ``"hip:gfx942"``, ``"xpu:pvc"``, ``"npu:910b"``, ``"musa:mp31"``
or ``"cpu"`` (:func:`parse`) to simulate hardware this machine does not have.
``ATTNHAL_PLATFORM`` overrides detection with such a spec.

Each row names the implementation its graphs are captured with
(:attr:`VendorRow.graph_device`), loaded lazily; a platform whose implementation
cannot capture here says why (``Platform.graph_device_error``,
:mod:`attnhal.platform.graph_device`).

Archs: a known arch (in its vendor's table) is taken as is. A well-formed arch
that is not in the table is accepted with an :class:`UnknownArchWarning` and
conservative facts: no fp8, and a warp size only where the vendor (or the arch's
family) fixes it — otherwise ``warp_size`` is ``None`` (unknown), never a guess.
"""

from __future__ import annotations

from attnhal.platform.archs import ArchSet, arch_at_least, arch_sets, normalize_arch
from attnhal.platform.detection import ENV_VAR, detect
from attnhal.platform.facts import Platform, parse
from attnhal.platform.vendors import (
    VENDORS,
    ArchFacts,
    ArchKey,
    Fp8Flavor,
    GraphKind,
    PlatformSpecError,
    UnknownArchWarning,
    Vendor,
    VendorRow,
)

__all__ = [
    "ENV_VAR",
    "VENDORS",
    "ArchFacts",
    "ArchKey",
    "ArchSet",
    "Fp8Flavor",
    "GraphKind",
    "Platform",
    "PlatformSpecError",
    "UnknownArchWarning",
    "Vendor",
    "VendorRow",
    "arch_at_least",
    "arch_sets",
    "as_platform",
    "detect",
    "normalize_arch",
    "parse",
]


def as_platform(spec: str | Platform | None = None) -> Platform:
    """``spec`` as a platform: a Platform passes through, a string is parsed, None detects."""
    if isinstance(spec, Platform):
        return spec
    if spec is None:
        return detect()
    if isinstance(spec, str):
        return parse(spec)
    raise TypeError(f"platform={spec!r} (supported: a Platform, a spec string like 'hip:gfx942', or None)")

