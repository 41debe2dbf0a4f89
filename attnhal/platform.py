"""What device we run on — the only module in attnhal that knows vendors.

Everything that differs by vendor or architecture is *data*: one
:class:`VendorRow` per vendor (arch notation, known archs with their warp size
and fp8 flavour, graph API, torch device type) and the fields of
:class:`Platform` derived from it. The planner and the backends read these
fields; they never compare vendor strings themselves.

A platform is either detected from torch (:func:`detect`) or parsed from a
spec such as ``"cuda:sm90"``, ``"hip:gfx942"``, ``"xpu:pvc"``, ``"npu:910b"``,
``"musa:mp31"`` or ``"cpu"`` (:func:`parse`) to simulate hardware this machine
does not have. ``ATTNHAL_PLATFORM`` overrides detection with such a spec.

Archs: a known arch (in its vendor's table) is taken as is. A well-formed arch
that is not in the table is accepted with an :class:`UnknownArchWarning` and
conservative facts: no fp8, and a warp size only where the vendor (or the arch's
family) fixes it — otherwise ``warp_size`` is ``None`` (unknown), never a guess.
"""

from __future__ import annotations

import functools
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

__all__ = [
    "ArchSet",
    "Fp8Flavor",
    "GraphKind",
    "Platform",
    "PlatformSpecError",
    "UnknownArchWarning",
    "VENDORS",
    "Vendor",
    "VendorRow",
    "arch_at_least",
    "current",
    "detect",
    "parse",
]

ENV_VAR = "ATTNHAL_PLATFORM"


class Vendor(str, Enum):
    CUDA = "cuda"
    HIP = "hip"
    CPU = "cpu"
    XPU = "xpu"  # Intel GPUs (torch.xpu)
    NPU = "npu"  # Huawei Ascend (torch_npu)
    MUSA = "musa"  # Moore Threads (torch_musa)


class Fp8Flavor(str, Enum):
    """Which e4m3 encoding the hardware's fp8 instructions use."""

    OCP = "e4m3fn"  # NVIDIA sm89+, AMD gfx950 / RDNA4
    FNUZ = "e4m3fnuz"  # AMD gfx940/941/942 (MI300): no negative zero, bias 8
    NONE = "none"


class GraphKind(str, Enum):
    """How a graph is captured *on this process's device*.

    ``DEVICE`` is the vendor's graph API on a real device (``torch.cuda.CUDAGraph``,
    hipGraph on ROCm builds of torch); ``EMULATED`` is the CPU capture emulator
    (:mod:`attnhal.graphs.emulator`), used on CPU and for simulated platforms;
    ``NONE`` means no capture at all.
    """

    DEVICE = "device"
    EMULATED = "emulated"
    NONE = "none"


class PlatformSpecError(ValueError):
    """A platform spec string that cannot be parsed."""


class UnknownArchWarning(UserWarning):
    """A well-formed arch that is not in its vendor's table: facts are conservative."""


# --- vendors as data ------------------------------------------------------------

ArchKey = tuple[int, ...]


@dataclass(frozen=True)
class ArchFacts:
    """What one known arch brings: warp size (None = not recorded) and fp8 flavour."""

    warp_size: int | None
    fp8: Fp8Flavor = Fp8Flavor.NONE


@dataclass(frozen=True)
class VendorRow:
    """Everything attnhal knows about one vendor, as data.

    Attributes
    ----------
    vendor: the vendor.
    pattern: well-formed arch names; group 1.. feed ``key``.
    notation: how archs are written, for error messages.
    key: arch -> ordering key (archs compare by it); ``None`` where the vendor's
        archs have no order (then ordering uses the position in ``known``).
    canonical: arch -> canonical spelling.
    known: known archs and their facts, oldest first.
    warp_size: the warp size of every arch of this vendor, if the vendor fixes it.
    family: arch -> family name (launch tables key on it).
    family_warp: arch-name prefix -> warp size, where a family fixes it (unknown archs).
    graph_api: the graph API a real device of this vendor captures with.
    graph_min_torch: the oldest torch ``(major, minor)`` whose device graphs report capture
        errors on this vendor, where newer than the project's floor (see ``Platform``).
    torch_device: the torch device type of a real device.
    name_hints: marketing-name fragment -> arch, for detection where the device name does
        not spell the arch (``"data center gpu max"`` -> ``"pvc"``).
    """

    vendor: Vendor
    pattern: re.Pattern[str]
    notation: str
    known: Mapping[str, ArchFacts]
    canonical: Callable[[re.Match[str]], str]
    key: Callable[[re.Match[str]], ArchKey] | None = None
    warp_size: int | None = None
    family: Callable[[str], str] = lambda arch: arch
    family_warp: Mapping[str, int] = field(default_factory=dict)
    graph_api: str = "none"
    graph_min_torch: tuple[int, int] | None = None
    torch_device: str = "cpu"
    name_hints: Mapping[str, str] = field(default_factory=dict)

    def match(self, arch: str) -> re.Match[str]:
        m = self.pattern.match(arch.strip().lower())
        if m is None:
            raise PlatformSpecError(f"arch={arch!r} (supported: {self.notation})")
        return m

    def normalize(self, arch: str) -> str:
        return self.canonical(self.match(arch))

    def order(self, arch: str) -> ArchKey | None:
        """The ordering key of ``arch``; None for an unknown arch of an unordered vendor."""
        m = self.match(arch)
        if self.key is not None:
            return self.key(m)
        names = list(self.known)
        name = self.canonical(m)
        return (names.index(name),) if name in names else None

    def facts(self, arch: str) -> tuple[ArchFacts, bool]:
        """The facts of ``arch`` and whether it is known; unknown archs get conservative facts."""
        known = self.known.get(arch)
        if known is not None:
            return known, True
        warp = self.warp_size
        if warp is None:  # a family fixes it where the arch name starts with that family's prefix
            warp = next((w for prefix, w in self.family_warp.items() if arch.startswith(prefix)), None)
        return ArchFacts(warp_size=warp, fp8=Fp8Flavor.NONE), False


def _cc(m: re.Match[str]) -> ArchKey:
    return (int(m.group(1)),)


def _gfx(m: re.Match[str]) -> ArchKey:
    return int(m.group(1)), int(m.group(2), 16), int(m.group(3), 16)


def _gfx_family(arch: str) -> str:
    m = _GFX.match(arch)
    if m is None:
        return arch
    return f"gfx{m.group(1)}{m.group(2)}"


_GFX = re.compile(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])$")
_OCP, _FNUZ, _NO = Fp8Flavor.OCP, Fp8Flavor.FNUZ, Fp8Flavor.NONE


def _cuda_known() -> dict[str, ArchFacts]:
    # Every CUDA arch runs 32-wide warps; fp8 (e4m3fn) tensor-core instructions start at sm89.
    ccs = (70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)
    return {f"sm{cc}": ArchFacts(32, _OCP if cc >= 89 else _NO) for cc in ccs}


def _hip_known() -> dict[str, ArchFacts]:
    # CDNA/GCN (gfx9xx) runs 64-wide wavefronts; RDNA (gfx10+) wave32 by default.
    cdna = {"gfx906": _NO, "gfx908": _NO, "gfx90a": _NO, "gfx940": _FNUZ, "gfx941": _FNUZ,
            "gfx942": _FNUZ, "gfx950": _OCP}
    rdna = {"gfx1030": _NO, "gfx1100": _NO, "gfx1101": _NO, "gfx1102": _NO, "gfx1150": _NO,
            "gfx1151": _NO, "gfx1200": _OCP, "gfx1201": _OCP}
    return {**{a: ArchFacts(64, f) for a, f in cdna.items()}, **{a: ArchFacts(32, f) for a, f in rdna.items()}}


#: One row per vendor. Adding a vendor is adding a row (and a ``Vendor`` member).
VENDORS: Mapping[Vendor, VendorRow] = MappingProxyType({
    Vendor.CUDA: VendorRow(
        Vendor.CUDA, re.compile(r"^(?:sm_?)?(\d{2,3})$"),
        "CUDA compute capability as 2-3 digits, like 'sm90', 'sm_80', '90' or 'sm120'",
        _cuda_known(), canonical=lambda m: f"sm{m.group(1)}", key=_cc, warp_size=32,
        graph_api="torch.cuda.CUDAGraph", torch_device="cuda"),
    Vendor.HIP: VendorRow(
        Vendor.HIP, _GFX, "AMD gfx name like 'gfx90a', 'gfx942', 'gfx1100'",
        _hip_known(), canonical=lambda m: m.group(0), key=_gfx, family=_gfx_family,
        # The warp size of an unknown gfx arch follows its major family, where that family is known.
        family_warp={"gfx9": 64, "gfx10": 32, "gfx11": 32, "gfx12": 32},
        # Before torch 2.9 a host sync inside a ROCm capture may raise nothing (see docs/graphs.md).
        graph_api="torch.cuda.CUDAGraph (hipGraph)", graph_min_torch=(2, 9), torch_device="cuda"),
    Vendor.CPU: VendorRow(
        Vendor.CPU, re.compile(r"^(.*)$"), "'cpu' takes no arch", {"cpu": ArchFacts(1)},
        canonical=lambda m: "cpu", key=lambda m: (0,), warp_size=1,
        graph_api="attnhal CPU capture emulator", torch_device="cpu"),
    Vendor.XPU: VendorRow(
        # Intel GPUs pick a sub-group size (8/16/32) per kernel: no fixed warp size is recorded.
        Vendor.XPU, re.compile(r"^([a-z][a-z0-9]{1,9})$"),
        "Intel GPU codename like 'pvc' (Data Center Max), 'bmg' (Arc B), 'dg2' (Arc A), 'lnl'",
        {"dg2": ArchFacts(None), "mtl": ArchFacts(None), "arl": ArchFacts(None), "pvc": ArchFacts(None),
         "lnl": ArchFacts(None), "bmg": ArchFacts(None)},
        canonical=lambda m: m.group(1), graph_api="torch.xpu.XPUGraph", torch_device="xpu",
        name_hints={"data center gpu max": "pvc", "arc(tm) b": "bmg", "arc(tm) a": "dg2"}),
    Vendor.NPU: VendorRow(
        # Ascend AI Cores are not SIMT: there is no warp; warp_size stays unknown (None).
        Vendor.NPU, re.compile(r"^(?:ascend)?(\d{3}[a-z0-9_]*)$"),
        "Ascend SoC like '910b', '910_93', '310p'",
        {"310p": ArchFacts(None), "910": ArchFacts(None), "910b": ArchFacts(None), "910_93": ArchFacts(None)},
        canonical=lambda m: m.group(1), graph_api="torch_npu NPUGraph", torch_device="npu"),
    Vendor.MUSA: VendorRow(
        # Warp sizes of Moore Threads archs are not recorded here (None) until verified.
        Vendor.MUSA, re.compile(r"^mp_?(\d{2})$"), "Moore Threads arch like 'mp21', 'mp22', 'mp31'",
        {"mp21": ArchFacts(None), "mp22": ArchFacts(None), "mp31": ArchFacts(None)},
        canonical=lambda m: f"mp{m.group(1)}", key=_cc, graph_api="torch_musa MUSAGraph",
        torch_device="musa", name_hints={"s80": "mp21", "s3000": "mp21", "s4000": "mp22", "s5000": "mp31"}),
})


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
        emulator.
    torch_device: the torch device string tensors live on (ROCm torch also
        calls its devices ``"cuda"``).
    device_name: human-readable name.
    simulated: parsed from a spec rather than detected.
    known_arch: the arch is in its vendor's table (else the facts are conservative).
    graph_min_torch: the oldest torch ``(major, minor)`` whose device graphs report a
        host sync during capture on this vendor (ROCm: torch < 2.9 may capture it
        silently, baking the capture-time value into the graph); None: any torch
        the project supports. The graph runner refuses device capture below it.
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

    def __str__(self) -> str:
        return self.spec

    @property
    def spec(self) -> str:
        """The spec string :func:`parse` turns back into this platform."""
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


# --- arch notation -------------------------------------------------------------

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


# --- parse / detect ------------------------------------------------------------

_OPTIONS = ("nographs",)


def _make(vendor: Vendor, arch: str, *, has_graph_api: bool, graph_kind: GraphKind,
          torch_device: str, device_name: str, simulated: bool) -> Platform:
    row = VENDORS[vendor]
    arch = row.normalize(arch)
    facts, known = row.facts(arch)
    if not known:
        warnings.warn(f"arch={arch} is not in attnhal's {vendor.value} table (known: {', '.join(row.known)}): "
                      f"using conservative facts (fp8 none, warp size {facts.warp_size or 'unknown'})",
                      UnknownArchWarning, stacklevel=3)
    return Platform(
        vendor=vendor, arch=arch, warp_size=facts.warp_size, fp8_flavor=facts.fp8,
        has_graph_api=has_graph_api,
        graph_kind=graph_kind if has_graph_api else GraphKind.NONE,
        torch_device=torch_device, device_name=device_name, simulated=simulated, known_arch=known,
        graph_min_torch=row.graph_min_torch,
    )


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
        raise PlatformSpecError(f"platform option={bad[0]!r} (supported: {', '.join(_OPTIONS)})")
    vendor_name, colon, arch = head.partition(":")
    try:
        vendor = Vendor(vendor_name)
    except ValueError:
        raise PlatformSpecError(f"platform={spec!r} (supported: {', '.join(v.value for v in Vendor)}, "
                                f"e.g. {_examples()})") from None
    if vendor is Vendor.CPU and arch not in ("", "cpu"):
        raise PlatformSpecError(f"platform={spec!r} (supported: 'cpu' takes no arch)")
    if vendor is not Vendor.CPU and not arch:
        raise PlatformSpecError(f"platform={spec!r} (supported: {vendor.value}:ARCH with an arch; "
                                f"{VENDORS[vendor].notation})")
    arch = VENDORS[vendor].normalize(arch or "cpu")
    return _make(
        vendor, arch,
        has_graph_api="nographs" not in options, graph_kind=GraphKind.EMULATED,
        torch_device="cpu", device_name=f"simulated {vendor.value} {arch}",
        simulated=vendor is not Vendor.CPU,
    )


def _detect_device() -> tuple[Vendor, str, str, str] | None:
    """(vendor, arch, torch device, name) of the accelerator torch sees, or None.

    Out-of-tree vendors (``torch.npu``, ``torch.musa``) are asked only if their
    plugin was already imported by the user; attnhal never imports it.
    """
    import torch

    for vendor, module in ((Vendor.NPU, "npu"), (Vendor.MUSA, "musa"), (Vendor.XPU, "xpu")):
        api = getattr(torch, module, None)
        if api is not None and hasattr(api, "is_available") and api.is_available():
            index = api.current_device()
            name = str(api.get_device_name(index))
            return vendor, _arch_from_name(vendor, name), f"{module}:{index}", name
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        return Vendor.HIP, str(props.gcnArchName).split(":")[0], f"cuda:{index}", props.name
    return Vendor.CUDA, f"sm{props.major}{props.minor}", f"cuda:{index}", props.name


def _arch_from_name(vendor: Vendor, name: str) -> str:
    """The known arch of ``vendor`` a device name names (``"Ascend910B3"`` -> ``"910b"``), directly
    or through the row's name hints (longest match first)."""
    lowered = name.lower()
    row = VENDORS[vendor]
    names = {**{arch: arch for arch in row.known}, **row.name_hints}
    for fragment in sorted(names, key=len, reverse=True):
        if fragment in lowered:
            return names[fragment]
    raise PlatformSpecError(f"device name={name!r} names no known {vendor.value} arch "
                            f"(supported: {', '.join(VENDORS[vendor].known)}); set {ENV_VAR}")


def detect() -> Platform:
    """The platform of this process: ``ATTNHAL_PLATFORM`` if set, else what torch sees.

    Never initializes a device when none is present: ``torch.cuda.is_available()``
    only asks the driver for a device count.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        return parse(override)
    found = _detect_device()
    if found is None:
        return _make(Vendor.CPU, "cpu", has_graph_api=True, graph_kind=GraphKind.EMULATED,
                     torch_device="cpu", device_name="cpu", simulated=False)
    vendor, arch, device, name = found
    platform = _make(vendor, arch, has_graph_api=True, graph_kind=GraphKind.DEVICE,
                     torch_device=device, device_name=name, simulated=False)
    return _with_reported_warp(platform)


def _with_reported_warp(platform: Platform) -> Platform:
    """A real CUDA/HIP device reports its warp size; it wins over the table."""
    import torch

    if not platform.torch_device.startswith("cuda"):
        return platform
    warp = getattr(torch.cuda.get_device_properties(platform.torch_device), "warp_size", None)
    return replace(platform, warp_size=int(warp)) if warp else platform


def current(spec: str | Platform | None = None) -> Platform:
    """``spec`` as a platform: a Platform passes through, a string is parsed, None detects."""
    if isinstance(spec, Platform):
        return spec
    if spec is None:
        return detect()
    if isinstance(spec, str):
        return parse(spec)
    raise TypeError(f"platform={spec!r} (supported: a Platform, a spec string like 'hip:gfx942', or None)")
