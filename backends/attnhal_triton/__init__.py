"""attnhal Triton backend for CUDA and HIP.

``import attnhal_triton`` imports neither torch nor triton: the descriptor
(:data:`CAPABILITIES`, also ``TritonBackend.capabilities``) and the launch table are
available even where triton is missing; ``TritonBackend`` (which needs torch) loads
on first access, and the kernels (which need triton) at the first forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnhal_triton.descriptor import CAPABILITIES, PLUGIN
from attnhal_triton.launch_table import FALLBACK, TABLE, LaunchRow, NoLaunchRowWarning, lookup

if TYPE_CHECKING:
    from attnhal_triton.backend import TritonBackend

__all__ = ["CAPABILITIES", "FALLBACK", "PLUGIN", "TABLE", "LaunchRow", "NoLaunchRowWarning", "TritonBackend",
           "lookup"]


def __getattr__(name: str) -> Any:
    # `from attnhal_triton import TritonBackend` resolves through here.
    if name == "TritonBackend":
        from attnhal_triton.backend import TritonBackend

        return TritonBackend
    raise AttributeError(f"module 'attnhal_triton' has no attribute {name!r}")
