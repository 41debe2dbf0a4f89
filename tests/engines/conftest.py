"""The engine tiers: tests/engines/sglang and tests/engines/vllm import their engine.

The main suite's interpreter has neither engine: it does not collect the tier directories.
``tests/engines/test_tiers.py`` builds (or reuses) each engine's environment and runs its
tier there in a subprocess with ``ATTNHAL_ENGINE_TIER`` set, which is when the tier's own
directory is collected.
"""

import os

collect_ignore = [tier for tier in ("sglang", "vllm") if os.environ.get("ATTNHAL_ENGINE_TIER") != tier]


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    """Show each tier's closing lines (its grid sizes and counts) in the main run's summary."""
    for report in terminalreporter.stats.get("passed", []):
        for name, text in getattr(report, "user_properties", ()):
            if name.endswith("_tier"):
                terminalreporter.write_sep("-", f"engine tier {name.removesuffix('_tier')}")
                terminalreporter.write_line(str(text).rstrip())
