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

import pytest

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
# The tier's own modules (harness, ...) by name; network_guard and tier_summary are in tests/helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Subprocesses an engine starts are outside the socket guard: the hubs' offline switches cover them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import network_guard  # noqa: E402

network_guard.install()
logging.getLogger("vllm").setLevel(logging.ERROR)

from tier_summary import LINES as SUMMARY  # noqa: E402


@pytest.fixture(autouse=True)
def no_network() -> object:
    network_guard.take_attempts()
    yield
    attempts = network_guard.take_attempts()
    assert not attempts, f"the test tried to reach the network: {attempts}"


def pytest_terminal_summary(terminalreporter: object) -> None:
    if SUMMARY:
        terminalreporter.write_sep("=", "vLLM executed-engine grid")  # type: ignore[attr-defined]
        for line in SUMMARY:
            terminalreporter.write_line(line)  # type: ignore[attr-defined]
