"""The facts about one device (:class:`Platform`) and how they are built from a vendor row.

:func:`parse` builds a simulated platform from a spec string such as
``"cuda:sm90"``, ``"hip:gfx942"`` or ``"cpu"``, to plan for hardware this machine
does not have; :func:`attnhal.platform.detect` builds the real one. Both go
through :func:`make_platform`, which reads the arch's facts from its row.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from attnhal.errors import shown
from attnhal.platform.archs import arch_at_least
from attnhal.platform.graph_device import graph_device_reason
from attnhal.platform.vendors import VENDORS, Fp8Flavor, GraphKind, PlatformSpecError, UnknownArchWarning, Vendor

__all__ = ["Platform", "make_platform", "parse"]


@dataclass(frozen=True)
class Platform:
    """Facts about one device, real or simulated.

    Attributes
    ----------
    vendor: who makes the device.
    arch: the arch in the vendor's notation (``"sm90"``, ``"gfx942"``, ``"pvc"``,
        ``"910b"``, ``"mp31"``; ``"cpu"`` for CPU).
    warp_size: threads per warp (CUDA 32) or wavefront (CDNA 64, RDNA 32);
        ``None`` where the vendor has no fixed one or the arch is unknown.
    fp8_flavor: the fp8 e4m3 encoding the hardware computes in.
    has_graph_api: whether the (possibly simulated) device can capture and
        replay graphs. This is what the planner reads.
    graph_kind: how graphs are captured in *this* process. A simulated HIP
        platform has a graph API but runs on this machine's CPU, so it uses the
        emulator. A detected device gets ``DEVICE`` only where its row's graph
        implementation loads (else ``NONE``).
    torch_device: the torch device string tensors live on (ROCm torch also
        calls its devices ``"cuda"``).
    device_name: human-readable name.
    simulated: parsed from a spec rather than detected.
    known_arch: the arch is in its vendor's table (else the facts are conservative).
    graph_min_torch: the oldest torch ``(major, minor)`` whose device graphs report a
        host sync during capture on this vendor (ROCm: torch < 2.9 may capture it
        silently, baking the capture-time value into the graph); None: any torch
        the project supports. The graph runner refuses device capture below it.
    graph_device: the row's graph implementation (``"module:Class"``, ``"emulator"``,
        or None: none); the graph runner captures device graphs with it.
    graph_device_error: why that implementation cannot capture here (None: it can;
        see :mod:`attnhal.platform.graph_device`). The planner captures nothing then,
        and says this.
    """

    vendor: Vendor
    arch: str
    warp_size: int | None
    fp8_flavor: Fp8Flavor
    has_graph_api: bool
    graph_kind: GraphKind
    torch_device: str = "cpu"
    device_name: str = ""
    simulated: bool = False
    known_arch: bool = True
    graph_min_torch: tuple[int, int] | None = None
    graph_device: str | None = None
    graph_device_error: str | None = None

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        """The platform string (``"hip:gfx942"``, ``"cpu"``) :func:`parse` turns back into this platform."""
        base = self.vendor.value if self.vendor is Vendor.CPU else f"{self.vendor.value}:{self.arch}"
        return base if self.has_graph_api else f"{base},nographs"

    @property
    def arch_family(self) -> str:
        """The arch family that launch-setting tables key on (``"sm90"``, ``"gfx94"``)."""
        return VENDORS[self.vendor].family(self.arch)

    @property
    def graph_api(self) -> str:
        """The graph API a real device of this vendor captures with."""
        return VENDORS[self.vendor].graph_api

    def arch_at_least(self, minimum: str) -> bool:
        """True if this platform's arch is ``minimum`` or newer (same vendor's notation)."""
        return arch_at_least(self.vendor, self.arch, minimum)


def make_platform(vendor: Vendor, arch: str, *, has_graph_api: bool, graph_kind: GraphKind,
                  torch_device: str, device_name: str, simulated: bool) -> Platform:
    """The platform of ``arch`` of ``vendor``, its facts from the vendor's row.

    An arch the row does not know gets conservative facts and an :class:`UnknownArchWarning`
    (issued at the caller of :func:`parse` or :func:`~attnhal.platform.detect`). A real
    device (``simulated=False``) loads the row's graph implementation to know whether it
    captures here; a simulated one only reads the row (:mod:`attnhal.platform.graph_device`).
    """
    row = VENDORS[vendor]
    arch = row.normalize(arch)
    facts, known = row.facts(arch)
    if not known:
        warnings.warn(f"arch={arch} is not in attnhal's {vendor.value} table (known: {', '.join(row.known)}): "
                      f"using conservative facts (fp8 none, warp size {facts.warp_size or 'unknown'})",
                      UnknownArchWarning, stacklevel=3)
    missing = graph_device_reason(row, load=not simulated) if has_graph_api else None
    if missing is not None and graph_kind is GraphKind.DEVICE:
        graph_kind = GraphKind.NONE  # the device has graphs, this process cannot capture them
    return Platform(
        vendor=vendor, arch=arch, warp_size=facts.warp_size, fp8_flavor=facts.fp8,
        has_graph_api=has_graph_api,
        graph_kind=graph_kind if has_graph_api else GraphKind.NONE,
        torch_device=torch_device, device_name=device_name, simulated=simulated, known_arch=known,
        graph_min_torch=row.graph_min_torch, graph_device=row.graph_device, graph_device_error=missing,
    )


_OPTIONS = ("nographs",)


def _examples() -> str:
    return ", ".join(f"'{v.value}:{next(iter(r.known))}'" if v is not Vendor.CPU else "'cpu'"
                     for v, r in VENDORS.items())


def parse(spec: str) -> Platform:
    """Build a simulated platform from ``"vendor:arch[,nographs]"`` (``"cpu"`` takes no arch).

    Examples: ``"cuda:sm90"``, ``"cuda:80"``, ``"hip:gfx942"``, ``"xpu:pvc"``,
    ``"npu:910b"``, ``"musa:mp31"``, ``"cpu"``, ``"hip:gfx942,nographs"`` (a
    device without a graph API). Simulated devices run on this machine's CPU and
    capture with the emulator. An arch is required: ``"cuda"`` or ``"cuda:"`` is
    an error, never a silent default.
    """
    if not isinstance(spec, str):
        raise TypeError(f"spec={spec!r} (supported: a platform string like 'hip:gfx942')")
    head, *options = [part.strip() for part in spec.strip().lower().split(",")]
    bad = [o for o in options if o not in _OPTIONS]
    if bad:
        raise PlatformSpecError(f"platform option={shown(bad[0])} (supported: {', '.join(_OPTIONS)})")
    vendor_name, colon, arch = head.partition(":")
    try:
        vendor = Vendor(vendor_name)
    except ValueError:
        raise PlatformSpecError(f"platform={shown(spec)} (supported: {', '.join(v.value for v in Vendor)}, "
                                f"e.g. {_examples()})") from None
    if vendor is Vendor.CPU and arch not in ("", "cpu"):
        raise PlatformSpecError(f"platform={shown(spec)} (supported: 'cpu' takes no arch)")
    if vendor is not Vendor.CPU and not arch:
        raise PlatformSpecError(f"platform={shown(spec)} (supported: {vendor.value}:ARCH with an arch; "
                                f"{VENDORS[vendor].notation})")
    arch = VENDORS[vendor].normalize(arch or "cpu")
    return make_platform(
        vendor, arch,
        has_graph_api="nographs" not in options, graph_kind=GraphKind.EMULATED,
        torch_device="cpu", device_name=f"simulated {vendor.value} {arch}",
        simulated=vendor is not Vendor.CPU,
    )
