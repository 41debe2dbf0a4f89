"""attnhal reference backend in plain torch: any device, all phases, graph-safe.

Registered through the ``attnhal.backends`` entry point as ``torch``.
"""

from .backend import TorchBackend
from .capabilities import CAPABILITIES

__all__ = ["CAPABILITIES", "TorchBackend"]
