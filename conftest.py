"""Test-suite setup, for the tests under tests/ and beside each backend (backends/*/tests/).

TRITON_INTERPRET must be set before any @triton.jit function is defined (Triton
reads it at decoration time), so it is set here, before any test module imports
kernels. Cross-target compile checks run in subprocesses without it.
"""

import importlib.util
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("ATTNHAL_DEBUG", "1")


def _hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
    settings.register_profile("thorough", deadline=None, max_examples=500,
                              suppress_health_check=[HealthCheck.too_slow], print_blob=True)
    settings.load_profile(os.environ.get("ATTNHAL_HYPOTHESIS_PROFILE", "ci"))


if os.environ.get("ATTNHAL_ENGINE_TIER") is None or importlib.util.find_spec("hypothesis") is not None:
    _hypothesis_profiles()  # an engine tier's environment may have no hypothesis (it runs no property tests)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    """Show each engine tier's closing lines (grid sizes, counts per backend) in the run's summary.

    Here rather than in tests/engines/conftest.py: under xdist only this conftest is loaded
    by the process that writes the summary; the tier test records its lines as a property.
    """
    for report in terminalreporter.stats.get("passed", []):
        for name, text in getattr(report, "user_properties", ()):
            if name.endswith("_tier"):
                terminalreporter.write_sep("-", f"engine tier {name.removesuffix('_tier')}")
                terminalreporter.write_line(str(text).rstrip())
