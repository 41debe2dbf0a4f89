"""attnhal cpu backend: a fused C++ paged-attention kernel for CPUs, built on first use.

Registered through the ``attnhal.backends`` entry point as ``cpu``. ``import
attnhal_cpu`` imports no torch: the descriptor (:data:`CAPABILITIES`) is plain data;
``CpuBackend`` loads on first access, and the kernel is compiled (or loaded from
torch's extension cache) the first time the backend is asked whether it can run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnhal_cpu.descriptor import CAPABILITIES, NATIVE_PHASES, PLUGIN

if TYPE_CHECKING:
    from attnhal_cpu.backend import CpuBackend

__all__ = ["CAPABILITIES", "NATIVE_PHASES", "PLUGIN", "CpuBackend"]


def __getattr__(name: str) -> Any:
    # `from attnhal_cpu import CpuBackend` resolves through here.
    if name == "CpuBackend":
        from attnhal_cpu.backend import CpuBackend

        return CpuBackend
    raise AttributeError(f"module 'attnhal_cpu' has no attribute {name!r}")
