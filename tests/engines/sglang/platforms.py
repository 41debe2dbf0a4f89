"""Emulated GPU platforms for SGLang's own code, on a CPU-only machine.

SGLang asks "what machine is this?" through probe functions of ``sglang.srt.utils.common``
(``is_cuda``, ``is_hip``, ``is_sm100_supported``, ``get_device_sm``, ...), through module flags
computed from them at import time (``_is_cuda = is_cuda()`` in many modules), through its
runtime context's ``get_platform()`` facts and through ``torch.cuda.get_device_capability``.
:func:`emulate` answers all four for one platform, so the engine's own resolution and
graph-decision code runs as it would on that GPU. Nothing of a GPU is executed: only
configuration and ``isinstance`` decisions read these answers.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Emulated:
    """One platform's answers (attnhal's platform spec, SGLang's facts)."""

    spec: str  # "cuda:sm90", "cuda:sm100", "hip:gfx942", "musa:mp31"
    vendor: str  # "cuda" | "hip" | "musa"
    capability: tuple[int, int]
    memory_mib: int  # what SGLang's memory query answers (sizes capture batch sizes)

    @property
    def device(self) -> str:
        """The torch device SGLang's workers carry (ROCm's is "cuda"; MUSA's is "musa")."""
        return "musa" if self.vendor == "musa" else "cuda"

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]

    def probes(self) -> dict[str, Any]:
        """SGLang probe function name -> answer on this platform."""
        cuda, hip, musa = self.vendor == "cuda", self.vendor == "hip", self.vendor == "musa"
        major = self.capability[0]
        return {
            "is_cuda": cuda, "is_hip": hip, "is_cuda_alike": cuda or hip, "is_cpu": False, "is_npu": False,
            "is_xpu": False, "is_musa": musa, "is_mps": False, "is_hpu": False, "is_sail": False,
            "is_habana_available": False, "cpu_has_amx_support": False,
            "is_flashinfer_available": cuda,
            "is_sm80_supported": cuda and major == 8, "is_ampere_with_cuda_12_3": cuda and major == 8,
            "is_sm90_supported": cuda and major == 9, "is_hopper_with_cuda_12_3": cuda and major == 9,
            "is_sm100_supported": cuda and major == 10, "is_sm110_supported": cuda and major == 11,
            "is_sm100_or_sm110_supported": cuda and major in (10, 11),
            "is_sm120_supported": cuda and major == 12, "is_sm120": cuda and major == 12, "is_sm121": False,
            "is_blackwell": cuda and major in (10, 11, 12), "is_blackwell_supported": cuda and major in (10, 11, 12),
            "is_gfx942_supported": hip and self.spec.endswith("gfx942"),
            "is_gfx95_supported": hip and self.spec.endswith("gfx950"), "is_gfx1250_supported": False,
            "get_device_sm": self.sm if cuda else 0,
            "get_device_capability": self.capability,
            "get_device_count": 1, "get_device_memory_capacity": self.memory_mib,
            "get_device": self.device,
        }

    def facts(self) -> dict[str, Any]:
        """SGLang's runtime-context platform facts (``runtime_context.override_platform``)."""
        p = self.probes()
        return {"is_cuda": p["is_cuda"], "is_hip": p["is_hip"], "is_npu": False, "is_xpu": False, "is_musa": p["is_musa"],
                "is_mps": False, "is_sm90": p["is_sm90_supported"], "is_sm100": p["is_sm100_supported"],
                "is_sm100_or_sm110": p["is_sm100_or_sm110_supported"], "is_sm110": p["is_sm110_supported"],
                "is_sm120": p["is_sm120_supported"], "is_blackwell": p["is_blackwell"],
                "is_hopper_with_cuda_12_3": p["is_hopper_with_cuda_12_3"], "has_amx": False,
                "has_flashinfer": p["is_flashinfer_available"], "device_sm": p["get_device_sm"],
                "device_capability": self.capability}


PLATFORMS = {
    "cuda:sm90": Emulated("cuda:sm90", "cuda", (9, 0), 80 * 1024),  # H100 80 GB
    "cuda:sm100": Emulated("cuda:sm100", "cuda", (10, 0), 180 * 1024),  # B200
    "hip:gfx942": Emulated("hip:gfx942", "hip", (9, 4), 192 * 1024),  # MI300X
    # Moore Threads S5000 (MUSA is CUDA-alike to SGLang: platforms/musa.py); no SM of CUDA's.
    "musa:mp31": Emulated("musa:mp31", "musa", (3, 1), 80 * 1024),
}

#: Module flags set at import from the probes (``_is_hip = is_hip()``), by flag -> probe.
_FLAGS = {"_is_cuda": "is_cuda", "_is_hip": "is_hip", "_is_cpu": "is_cpu", "_is_npu": "is_npu", "_is_xpu": "is_xpu",
          "_is_musa": "is_musa", "_is_mps": "is_mps", "_is_cuda_alike": "is_cuda_alike",
          "_is_flashinfer_available": "is_flashinfer_available", "_is_sm100_supported": "is_sm100_supported",
          "_is_sm90_supported": "is_sm90_supported", "_is_blackwell": "is_blackwell",
          "_is_gfx95_supported": "is_gfx95_supported", "_is_gfx942_supported": "is_gfx942_supported",
          "_is_cpu_amx_available": "cpu_has_amx_support"}


def _originals() -> dict[int, str]:
    """id of each original probe function of ``sglang.srt.utils.common`` -> its name."""
    from sglang.srt.utils import common

    found = {}
    for name in PLATFORMS["cuda:sm90"].probes():
        fn = getattr(common, name, None)
        if fn is not None:
            found[id(fn)] = name
    return found


_ORIGINAL_IDS: dict[int, str] = {}
_ACTIVE: list[str] = []  # the platform being emulated (nested blocks of the same platform are free)


@contextlib.contextmanager
def emulate(spec: str) -> Iterator[Emulated]:
    """Make every loaded SGLang module see platform ``spec``; everything is restored on exit.

    Modules imported inside the block see it too where they bind probes by name (the
    probes in ``utils.common`` are replaced); import the engine's modules before the
    block so their import-time flags are set here as well.
    """
    import torch
    from sglang.srt import runtime_context

    if spec not in PLATFORMS:
        raise ValueError(f"platform={spec!r} (supported: {', '.join(PLATFORMS)})")
    platform = PLATFORMS[spec]
    if _ACTIVE:
        if _ACTIVE[-1] != spec:
            raise RuntimeError(f"platform={spec!r} inside an emulation of {_ACTIVE[-1]!r}")
        yield platform
        return
    if not _ORIGINAL_IDS:
        _ORIGINAL_IDS.update(_originals())
    answers = platform.probes()
    saved: list[tuple[Any, str, Any]] = []

    def put(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("sglang"):
            continue
        namespace = vars(module)
        for name, value in list(namespace.items()):
            probe = _ORIGINAL_IDS.get(id(value)) if callable(value) else None
            if probe is not None:
                put(module, name, _constant(answers[probe], probe))
            elif name in _FLAGS and isinstance(value, bool):
                put(module, name, bool(answers[_FLAGS[name]]))
    put(torch.cuda, "get_device_capability", lambda device=None: platform.capability)
    override = runtime_context.override_platform(**platform.facts())
    override.install()
    _ACTIVE.append(spec)
    try:
        yield platform
    finally:
        _ACTIVE.pop()
        override.restore()
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _constant(value: Any, name: str) -> Any:
    def probe(*args: Any, **kwargs: Any) -> Any:
        return value

    probe.__name__ = f"emulated_{name}"
    return probe
