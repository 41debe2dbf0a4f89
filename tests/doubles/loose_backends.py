"""A backend that hides a wrong answer behind a loose tolerance, for the kit's ceiling tests.

:class:`UnscaledLoose` is the torch reference with the softmax scale dropped (logits
``q . k`` instead of ``q . k / sqrt(d)``: outputs off by ~0.5) and a descriptor that declares
``atol = rtol = inf`` for every dtype, so a kit that trusted the declared tolerance would
certify it. The kit must fail it, naming its ceiling.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

from attnhal.capabilities import BackendCapabilities, Tolerance
from attnhal_torch import TorchBackend
from attnhal_torch.kernel import LayerParams

__all__ = ["UnscaledLoose"]


class UnscaledLoose(TorchBackend):
    capabilities: ClassVar[BackendCapabilities] = replace(
        TorchBackend.capabilities, name="loose-unscaled",
        tolerances={d: Tolerance(math.inf, math.inf) for d in TorchBackend.capabilities.tolerances})

    def _layer_params(self, layer: int) -> LayerParams:
        return replace(super()._layer_params(layer), scale=1.0)  # the bug: no 1/sqrt(d)
