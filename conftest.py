"""Test-suite setup, for the tests under tests/ and beside each backend (backends/*/tests/).

TRITON_INTERPRET must be set before any @triton.jit function is defined (Triton
reads it at decoration time), so it is set here, before any test module imports
kernels. Cross-target compile checks run in subprocesses without it.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("ATTNHAL_DEBUG", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("thorough", deadline=None, max_examples=500,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("ATTNHAL_HYPOTHESIS_PROFILE", "ci"))
