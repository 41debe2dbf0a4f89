"""The fp64 reference attention's former module: it now lives in :mod:`attnhal.testing.oracle`.

Kept so that ``from attnhal.testing.reference import reference_forward`` goes on working.
"""

from __future__ import annotations

from attnhal._compat import moved
from attnhal.testing.oracle import (
    LayerFeatures,
    attended,
    attended_slots,
    batch_to_cpu,
    query_tokens,
    real_tokens,
    reference_attention,
    reference_forward,
)

moved("attnhal.testing.reference", "attnhal.testing.oracle")

__all__ = ["LayerFeatures", "attended", "attended_slots", "batch_to_cpu", "query_tokens", "real_tokens",
           "reference_attention", "reference_forward"]
