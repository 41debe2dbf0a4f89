"""The engine tiers: tests/engines/sglang and tests/engines/vllm import their engine.

The main suite's interpreter has neither engine: it does not collect the tier directories.
``tests/engines/test_tiers.py`` builds (or reuses) each engine's environment and runs its
tier there in a subprocess with ``ATTNHAL_ENGINE_TIER`` set, which is when the tier's own
directory is collected.
"""

import os

collect_ignore = [tier for tier in ("sglang", "vllm") if os.environ.get("ATTNHAL_ENGINE_TIER") != tier]

