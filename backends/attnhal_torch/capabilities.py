"""The torch backend's descriptor, under its former module name: see :mod:`attnhal_torch.descriptor`."""

from attnhal_torch.descriptor import CAPABILITIES

__all__ = ["CAPABILITIES"]
