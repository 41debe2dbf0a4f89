"""attnhal reference backend in plain torch: any device, all phases, graph-safe.

Registered through the ``attnhal.backends`` entry point as ``torch``. ``import
attnhal_torch`` imports no torch: the descriptor (:data:`CAPABILITIES`, in
:mod:`attnhal_torch.descriptor`) is plain data; ``TorchBackend`` (in
:mod:`attnhal_torch.backend`) loads on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnhal_torch.descriptor import CAPABILITIES, PLUGIN

if TYPE_CHECKING:
    from attnhal_torch.backend import TorchBackend

__all__ = ["CAPABILITIES", "PLUGIN", "TorchBackend"]


def __getattr__(name: str) -> Any:
    # `from attnhal_torch import TorchBackend` resolves through here.
    if name == "TorchBackend":
        from attnhal_torch.backend import TorchBackend

        return TorchBackend
    raise AttributeError(f"module 'attnhal_torch' has no attribute {name!r}")
