"""Detection: the platform of this process, from ``ATTNHAL_PLATFORM`` or from what torch sees.

The only module of attnhal that asks torch about the device, and so the only one
allowed a vendor probe (``torch.version.hip``, ``gcnArchName``, ``torch.xpu``):
everything else reads the :class:`~attnhal.platform.Platform` it returns. torch
is imported inside the functions, so ``import attnhal`` stays torch-free.
"""

from __future__ import annotations

import os
from dataclasses import replace

from attnhal.platform.facts import Platform, make_platform, parse
from attnhal.platform.vendors import VENDORS, GraphKind, PlatformSpecError, Vendor

__all__ = ["ENV_VAR", "detect", "torch_version"]

#: A platform spec here overrides detection (see :func:`~attnhal.platform.parse`).
ENV_VAR = "ATTNHAL_PLATFORM"


def torch_version(version: str) -> tuple[int, int]:
    """``"2.9.0+rocm6.4"`` -> ``(2, 9)``: the ``(major, minor)`` that ``Platform.graph_min_torch``
    is compared with."""
    major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


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
        return make_platform(Vendor.CPU, "cpu", has_graph_api=True, graph_kind=GraphKind.EMULATED,
                             torch_device="cpu", device_name="cpu", simulated=False)
    vendor, arch, device, name = found
    # DEVICE only where the row's graph implementation loads here: make_platform checks it.
    platform = make_platform(vendor, arch, has_graph_api=True, graph_kind=GraphKind.DEVICE,
                             torch_device=device, device_name=name, simulated=False)
    return _with_reported_warp(platform)


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


def _with_reported_warp(platform: Platform) -> Platform:
    """A real CUDA/HIP device reports its warp size; it wins over the table."""
    import torch

    if not platform.torch_device.startswith("cuda"):
        return platform
    warp = getattr(torch.cuda.get_device_properties(platform.torch_device), "warp_size", None)
    return replace(platform, warp_size=int(warp)) if warp else platform
