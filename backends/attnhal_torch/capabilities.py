"""The torch backend's descriptor, under its former module name: see :mod:`attnhal_torch.descriptor`."""

import warnings

from attnhal_torch.descriptor import CAPABILITIES

warnings.warn("attnhal_torch.capabilities is deprecated: import CAPABILITIES from attnhal_torch.descriptor",
              DeprecationWarning, stacklevel=2)

__all__ = ["CAPABILITIES"]
