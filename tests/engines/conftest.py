"""The engine tiers: tests/engines/sglang and tests/engines/vllm import their engine.

The main suite's interpreter has neither engine: it does not collect the tier directories.
``tests/engines/test_tiers.py`` builds (or reuses) each engine's environment and runs its
tier there in a subprocess with ``ATTNHAL_ENGINE_TIER`` set, which is when the tier's own
directory is collected.
"""

import os

#: The tier (``ATTNHAL_ENGINE_TIER``: the key setup.sh takes) -> the directory it collects: both vLLM
#: releases run tests/engines/vllm (its harness executes the installed release's code).
TIER_DIRS = {"sglang": "sglang", "vllm": "vllm", "vllm-0.34": "vllm"}
collect_ignore = [tier for tier in ("sglang", "vllm") if TIER_DIRS.get(os.environ.get("ATTNHAL_ENGINE_TIER", "")) != tier]

