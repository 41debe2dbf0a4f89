"""The vLLM tier: run inside the vLLM environment (``tests/engines/setup.sh vllm``).

``VLLM_TARGET_DEVICE=cpu`` before vLLM is imported; the network refused (FlashInfer's cubin
check would otherwise send an HTTP request: the harness also answers it "no cubins");
the grid's counts printed at the end of the run.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
# The tier's own modules (harness, ...) by name; network_guard and tier_summary are in tests/helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_tier  # noqa: E402
from engine_tier import no_network  # noqa: E402,F401  (autouse fixture)

engine_tier.isolate()
logging.getLogger("vllm").setLevel(logging.ERROR)


def pytest_terminal_summary(terminalreporter: object) -> None:
    engine_tier.write_summary(terminalreporter, "vLLM executed-engine grid")
