"""Whether a vendor's graph implementation can capture here, and loading it by name.

A vendor row names its graph implementation (:attr:`~attnhal.platform.VendorRow.graph_device`)
as ``"module:Class"``, the way vLLM's platforms name their graph wrapper: nothing is
imported until a platform is detected or a graph is made. The class is a
:class:`~attnhal.graphs.DeviceAPI` with a ``unavailable()`` class method saying why this
process's torch cannot drive it (``None``: it can).

What "cannot load" means (docs/graphs.md):

* a **detected** platform (a real device): the row names nothing, or the named class does
  not import, or its ``unavailable()`` gives a reason (torch without ``torch.xpu.XPUGraph``);
* a **simulated** platform (``parse("xpu:pvc")``): the row names nothing. A simulated device
  is another machine; its torch is not this one's, and planning for it imports no torch
  device module, so only the row is read.

Either way the platform records the reason (``Platform.graph_device_error``) and the
planner plans every phase eager with it (``graph_device_unavailable``).
"""

from __future__ import annotations

import importlib
from typing import Any

from attnhal.platform.vendors import EMULATOR, VendorRow

__all__ = ["graph_device_reason", "load_graph_device"]


def load_graph_device(path: str) -> Any:
    """The object ``"module:attr"`` names (imports ``module``); ``ImportError``/``AttributeError`` if none."""
    module, colon, attr = path.partition(":")
    if not colon or not module or not attr:
        raise ImportError(f"graph_device={path!r} (supported: 'module:attr', e.g. "
                          "'attnhal.graphs.device_api:TorchCudaAPI')")
    return getattr(importlib.import_module(module), attr)


def graph_device_reason(row: VendorRow, *, load: bool) -> str | None:
    """Why ``row``'s graph implementation cannot capture in this process; ``None``: it can.

    ``load=False`` (a simulated platform) reads the row only; ``load=True`` (a detected
    one) imports the implementation and asks its ``unavailable()``.
    """
    path = row.graph_device
    if path is None:
        return f"the {row.vendor.value} vendor row names none"
    if path == EMULATOR or not load:
        return None
    try:
        impl = load_graph_device(path)
        why: str | None = impl.unavailable()
    except Exception as exc:  # noqa: BLE001 - any failure to load is the reason, never a crash of detect()
        return f"{path} does not load: {type(exc).__name__}: {exc}"
    return why
