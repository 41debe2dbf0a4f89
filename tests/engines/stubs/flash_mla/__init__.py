"""Stand-in for flash_mla in the engine test environments: see _attnhal_stub."""

from _attnhal_stub import stand_in

stand_in(__name__, "0.0.0+attnhal.stub")
