"""The SGLang tier: run inside the SGLang environment (``tests/engines/setup.sh sglang``).

Imports SGLang once per process (its speculative workers take 15-25 s), refuses the network,
and prints the differential grid's counts at the end of the run.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import pytest

# The tier's own modules (harness, ...) by name; network_guard and tier_summary are in tests/helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Subprocesses an engine starts are outside the socket guard: the hubs' offline switches cover them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# test_kit.py runs SGLang's Triton kernels on the CPU: the interpreter must be on before they
# are defined, which is when harness.import_engine() below imports SGLang's attention modules.
os.environ.setdefault("TRITON_INTERPRET", "1")

import network_guard  # noqa: E402

network_guard.install()
# SGLang logs every override it makes and warns about missing GPU kernels: thousands of lines
# over the grid. The decisions are read from its return values, not its log.
logging.getLogger("sglang").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="sglang")

import harness  # noqa: E402

harness.import_engine()
logging.getLogger("sglang").setLevel(logging.ERROR)

from tier_summary import LINES as SUMMARY  # noqa: E402


@pytest.fixture(autouse=True)
def no_network() -> object:
    network_guard.take_attempts()
    yield
    attempts = network_guard.take_attempts()
    assert not attempts, f"the test tried to reach the network: {attempts}"


def pytest_terminal_summary(terminalreporter: object) -> None:
    if SUMMARY:
        terminalreporter.write_sep("=", "SGLang executed-engine grid")  # type: ignore[attr-defined]
        for line in SUMMARY:
            terminalreporter.write_line(line)  # type: ignore[attr-defined]
