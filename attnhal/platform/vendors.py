"""Vendors as data: one :class:`VendorRow` per vendor, and the enums its fields use.

Everything that differs by vendor or architecture is a field of a row: arch
notation and order, known archs with their warp size and fp8 flavour, the graph
API and the implementation attnhal captures it with (:attr:`VendorRow.graph_device`),
the torch device type. Adding a vendor is adding a ``Vendor`` member, a row
in :data:`VENDORS` and, where torch can see the device, a probe in
:mod:`attnhal.platform.detection`.

Archs: a known arch (in its vendor's table) is taken as is. A well-formed arch
that is not in the table gets conservative facts (:meth:`VendorRow.facts`): no
fp8, and a warp size only where the vendor (or the arch's family) fixes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from attnhal.errors import AttnhalError, shown

__all__ = [
    "EMULATOR",
    "VENDORS",
    "ArchFacts",
    "ArchKey",
    "Fp8Flavor",
    "GraphKind",
    "PlatformSpecError",
    "UnknownArchWarning",
    "Vendor",
    "VendorRow",
]


class Vendor(str, Enum):
    """Who makes the device; each member has one row in :data:`VENDORS`."""

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


class PlatformSpecError(AttnhalError, ValueError):
    """A platform spec string that cannot be parsed."""


class UnknownArchWarning(UserWarning):
    """A well-formed arch that is not in its vendor's table: facts are conservative."""


ArchKey = tuple[int, ...]

#: :attr:`VendorRow.graph_device` of a vendor whose graphs are the CPU capture emulator
#: (:mod:`attnhal.graphs.emulator`), which always loads.
EMULATOR = "emulator"


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
    graph_api: the graph API a real device of this vendor captures with (a label, for people).
    graph_device: what attnhal loads to capture that API: ``"module:Class"`` of a
        :class:`~attnhal.graphs.DeviceAPI` (vLLM's ``get_static_graph_wrapper_cls`` idea),
        resolved lazily by :func:`~attnhal.platform.graph_device.graph_device_reason`;
        :data:`EMULATOR` for the CPU capture emulator; ``None`` where attnhal drives no graph
        API of this vendor — then no plan captures on it (see docs/graphs.md).
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
    graph_device: str | None = None
    graph_min_torch: tuple[int, int] | None = None
    torch_device: str = "cpu"
    name_hints: Mapping[str, str] = field(default_factory=dict)

    def match(self, arch: str) -> re.Match[str]:
        m = self.pattern.match(arch.strip().lower())
        if m is None:
            raise PlatformSpecError(f"arch={shown(arch)} (supported: {self.notation})")
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


#: CUDA, and HIP through ROCm builds of torch (``torch.cuda.CUDAGraph`` is hipGraph there).
_TORCH_CUDA = "attnhal.graphs.device_api:TorchCudaAPI"

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
        graph_api="torch.cuda.CUDAGraph", graph_device=_TORCH_CUDA, torch_device="cuda"),
    Vendor.HIP: VendorRow(
        Vendor.HIP, _GFX, "AMD gfx name like 'gfx90a', 'gfx942', 'gfx1100'",
        _hip_known(), canonical=lambda m: m.group(0), key=_gfx, family=_gfx_family,
        # The warp size of an unknown gfx arch follows its major family, where that family is known.
        family_warp={"gfx9": 64, "gfx10": 32, "gfx11": 32, "gfx12": 32},
        # Before torch 2.9 a host sync inside a ROCm capture may raise nothing (see docs/graphs.md).
        graph_api="torch.cuda.CUDAGraph (hipGraph)", graph_device=_TORCH_CUDA, graph_min_torch=(2, 9),
        torch_device="cuda"),
    Vendor.CPU: VendorRow(
        Vendor.CPU, re.compile(r"^(.*)$"), "'cpu' takes no arch", {"cpu": ArchFacts(1)},
        canonical=lambda m: "cpu", key=lambda m: (0,), warp_size=1,
        graph_api="attnhal CPU capture emulator", graph_device=EMULATOR, torch_device="cpu"),
    Vendor.XPU: VendorRow(
        # Intel GPUs pick a sub-group size (8/16/32) per kernel: no fixed warp size is recorded.
        Vendor.XPU, re.compile(r"^([a-z][a-z0-9]{1,9})$"),
        "Intel GPU codename like 'pvc' (Data Center Max), 'bmg' (Arc B), 'dg2' (Arc A), 'lnl'",
        {"dg2": ArchFacts(None), "mtl": ArchFacts(None), "arl": ArchFacts(None), "pvc": ArchFacts(None),
         "lnl": ArchFacts(None), "bmg": ArchFacts(None)},
        # Captures only where this torch has torch.xpu.XPUGraph (TorchXpuAPI.unavailable says why not).
        canonical=lambda m: m.group(1), graph_api="torch.xpu.XPUGraph",
        graph_device="attnhal.graphs.device_api:TorchXpuAPI", torch_device="xpu",
        name_hints={"data center gpu max": "pvc", "arc(tm) b": "bmg", "arc(tm) a": "dg2"}),
    Vendor.NPU: VendorRow(
        # Ascend AI Cores are not SIMT: there is no warp; warp_size stays unknown (None).
        Vendor.NPU, re.compile(r"^(?:ascend)?(\d{3}[a-z0-9_]*)$"),
        "Ascend SoC like '910b', '910_93', '310p'",
        {"310p": ArchFacts(None), "910": ArchFacts(None), "910b": ArchFacts(None), "910_93": ArchFacts(None)},
        # attnhal has no implementation over torch_npu's graphs yet: graph_device is None.
        canonical=lambda m: m.group(1), graph_api="torch_npu NPUGraph", torch_device="npu"),
    Vendor.MUSA: VendorRow(
        # Warp sizes of Moore Threads archs are not recorded here (None) until verified.
        Vendor.MUSA, re.compile(r"^mp_?(\d{2})$"), "Moore Threads arch like 'mp21', 'mp22', 'mp31'",
        {"mp21": ArchFacts(None), "mp22": ArchFacts(None), "mp31": ArchFacts(None)},
        # No implementation over torch_musa's graphs yet: graph_device is None.
        canonical=lambda m: f"mp{m.group(1)}", key=_cc, graph_api="torch_musa MUSAGraph",
        torch_device="musa", name_hints={"s80": "mp21", "s3000": "mp21", "s4000": "mp22", "s5000": "mp31"}),
})
