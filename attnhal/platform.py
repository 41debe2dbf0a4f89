"""What device we run on — the only module in attnhal that knows vendors.

Everything that differs by vendor or architecture is a *field* of :class:`Platform`
(warp size, fp8 flavour, graph API, ...). The planner and the backends read
these fields; they never compare vendor strings themselves.

A platform is either detected from torch (:func:`detect`) or parsed from a
spec such as ``"cuda:sm90"``, ``"hip:gfx942"`` or ``"cpu"`` (:func:`parse`) to
simulate hardware this machine does not have. ``ATTNHAL_PLATFORM`` overrides
detection with such a spec.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "Fp8Flavor",
    "GraphKind",
    "Platform",
    "PlatformSpecError",
    "Vendor",
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


class Fp8Flavor(str, Enum):
    """Which e4m3 encoding the hardware's fp8 instructions use."""

    OCP = "e4m3fn"  # NVIDIA sm89+, AMD gfx950 / RDNA4
    FNUZ = "e4m3fnuz"  # AMD gfx940/941/942 (MI300): no negative zero, bias 8
    NONE = "none"


class GraphKind(str, Enum):
    """How a graph is captured *on this process's device*.

    ``DEVICE`` is ``torch.cuda.CUDAGraph`` (hipGraph on ROCm builds of torch);
    ``EMULATED`` is the CPU capture emulator (:mod:`attnhal.graphs.emulator`),
    used on CPU and for simulated platforms; ``NONE`` means no capture at all.
    """

    DEVICE = "device"
    EMULATED = "emulated"
    NONE = "none"


class PlatformSpecError(ValueError):
    """A platform spec string that cannot be parsed."""


@dataclass(frozen=True)
class Platform:
    """Facts about one device, real or simulated.

    Attributes
    ----------
    vendor: who makes the device.
    arch: ``"sm90"`` style for CUDA (compute capability 9.0), a gfx name such as
        ``"gfx942"`` for HIP, ``"cpu"`` for CPU.
    warp_size: threads per warp (CUDA 32) or wavefront (CDNA 64, RDNA 32).
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
    graph_min_torch: the oldest torch ``(major, minor)`` whose device graphs report a
        host sync during capture on this vendor (ROCm: torch < 2.9 may capture it
        silently, baking the capture-time value into the graph); None: any torch
        the project supports. The graph runner refuses device capture below it.
    """

    vendor: Vendor
    arch: str
    warp_size: int
    fp8_flavor: Fp8Flavor
    has_graph_api: bool
    graph_kind: GraphKind
    torch_device: str = "cpu"
    device_name: str = ""
    simulated: bool = False
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
        if self.vendor is Vendor.HIP:
            return _gfx_family(self.arch)
        return self.arch

    def arch_at_least(self, minimum: str) -> bool:
        """True if this platform's arch is ``minimum`` or newer (same vendor's notation)."""
        return arch_at_least(self.vendor, self.arch, minimum)


# --- architecture notation -------------------------------------------------

_SM = re.compile(r"^(?:sm_?)?(\d{2,3})$")
_GFX = re.compile(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])$")


def _cuda_cc(arch: str) -> int:
    m = _SM.match(arch)
    if m is None:
        raise PlatformSpecError(f"arch={arch!r} (supported: CUDA compute capability like 'sm90', 'sm_80' or '90')")
    return int(m.group(1))


def _gfx_key(arch: str) -> tuple[int, int, int]:
    m = _GFX.match(arch)
    if m is None:
        raise PlatformSpecError(f"arch={arch!r} (supported: AMD gfx name like 'gfx90a', 'gfx942', 'gfx1100')")
    return int(m.group(1)), int(m.group(2), 16), int(m.group(3), 16)


def _gfx_family(arch: str) -> str:
    major, minor, _ = _gfx_key(arch)
    return f"gfx{major}{minor:x}"


def normalize_arch(vendor: Vendor, arch: str) -> str:
    """Canonical arch string for ``vendor`` (``"sm_90"`` -> ``"sm90"``); raises on bad notation."""
    arch = arch.strip().lower()
    if vendor is Vendor.CUDA:
        return f"sm{_cuda_cc(arch)}"
    if vendor is Vendor.HIP:
        _gfx_key(arch)
        return arch
    return "cpu"


def arch_at_least(vendor: Vendor, arch: str, minimum: str) -> bool:
    """Compare two archs of one vendor. CDNA and RDNA share one gfx ordering (major, minor, stepping)."""
    if vendor is Vendor.CUDA:
        return _cuda_cc(arch) >= _cuda_cc(minimum)
    if vendor is Vendor.HIP:
        return _gfx_key(arch) >= _gfx_key(minimum)
    return True


# --- vendor facts as data ----------------------------------------------------

def _hip_warp_size(arch: str) -> int:
    # CDNA (gfx9xx) runs 64-wide wavefronts; RDNA (gfx10+) runs wave32 by default.
    return 64 if _gfx_key(arch)[0] == 9 else 32


def _hip_fp8(arch: str) -> Fp8Flavor:
    family = _gfx_family(arch)
    if family == "gfx94":
        return Fp8Flavor.FNUZ
    if family in ("gfx95", "gfx120"):
        return Fp8Flavor.OCP
    return Fp8Flavor.NONE


def _cuda_fp8(arch: str) -> Fp8Flavor:
    return Fp8Flavor.OCP if _cuda_cc(arch) >= 89 else Fp8Flavor.NONE


# Oldest torch whose device graphs report capture errors, where newer than the project's floor.
_GRAPH_MIN_TORCH = {Vendor.HIP: (2, 9)}


def _make(vendor: Vendor, arch: str, *, has_graph_api: bool, graph_kind: GraphKind,
          torch_device: str, device_name: str, simulated: bool) -> Platform:
    arch = normalize_arch(vendor, arch)
    if vendor is Vendor.CUDA:
        warp, fp8 = 32, _cuda_fp8(arch)
    elif vendor is Vendor.HIP:
        warp, fp8 = _hip_warp_size(arch), _hip_fp8(arch)
    else:
        warp, fp8 = 1, Fp8Flavor.NONE
    return Platform(
        vendor=vendor, arch=arch, warp_size=warp, fp8_flavor=fp8,
        has_graph_api=has_graph_api,
        graph_kind=graph_kind if has_graph_api else GraphKind.NONE,
        torch_device=torch_device, device_name=device_name, simulated=simulated,
        graph_min_torch=_GRAPH_MIN_TORCH.get(vendor),
    )


# --- parse / detect ------------------------------------------------------------

_DEFAULT_ARCH = {Vendor.CUDA: "sm90", Vendor.HIP: "gfx942", Vendor.CPU: "cpu"}
_OPTIONS = ("nographs",)


def parse(spec: str) -> Platform:
    """Build a simulated platform from ``"vendor[:arch][,nographs]"``.

    Examples: ``"cuda:sm90"``, ``"cuda:80"``, ``"hip:gfx942"``, ``"hip:gfx90a"``,
    ``"cpu"``, ``"hip:gfx942,nographs"`` (a device without a graph API).
    Simulated devices run on this machine's CPU and capture with the emulator.
    """
    head, *options = [part.strip() for part in spec.strip().lower().split(",")]
    bad = [o for o in options if o not in _OPTIONS]
    if bad:
        raise PlatformSpecError(f"platform option={bad[0]!r} (supported: {', '.join(_OPTIONS)})")
    vendor_name, _, arch = head.partition(":")
    try:
        vendor = Vendor(vendor_name)
    except ValueError:
        raise PlatformSpecError(
            f"platform={spec!r} (supported: {', '.join(v.value for v in Vendor)}, "
            "e.g. 'cuda:sm90', 'hip:gfx942', 'cpu')"
        ) from None
    if vendor is Vendor.CPU and arch not in ("", "cpu"):
        raise PlatformSpecError(f"platform={spec!r} (supported: 'cpu' takes no arch)")
    arch = normalize_arch(vendor, arch or _DEFAULT_ARCH[vendor])
    return _make(
        vendor, arch,
        has_graph_api="nographs" not in options, graph_kind=GraphKind.EMULATED,
        torch_device="cpu", device_name=f"simulated {vendor.value} {arch}", simulated=vendor is not Vendor.CPU,
    )


def detect() -> Platform:
    """The platform of this process: ``ATTNHAL_PLATFORM`` if set, else what torch sees.

    Never initializes a device when none is present: ``torch.cuda.is_available()``
    only asks the driver for a device count.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        return parse(override)
    import torch

    if not torch.cuda.is_available():
        return _make(Vendor.CPU, "cpu", has_graph_api=True, graph_kind=GraphKind.EMULATED,
                     torch_device="cpu", device_name="cpu", simulated=False)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if torch.version.hip:
        vendor, arch = Vendor.HIP, str(props.gcnArchName).split(":")[0]
    else:
        vendor, arch = Vendor.CUDA, f"sm{props.major}{props.minor}"
    platform = _make(vendor, arch, has_graph_api=True, graph_kind=GraphKind.DEVICE,
                     torch_device=f"cuda:{torch.cuda.current_device()}",
                     device_name=props.name, simulated=False)
    warp = getattr(props, "warp_size", None)
    return replace(platform, warp_size=int(warp)) if warp else platform


def current(spec: str | Platform | None = None) -> Platform:
    """``spec`` as a platform: a Platform passes through, a string is parsed, None detects."""
    if isinstance(spec, Platform):
        return spec
    return detect() if spec is None else parse(spec)
