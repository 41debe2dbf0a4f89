"""The SGLang tier: run inside the SGLang environment (``tests/engines/setup.sh sglang``).

Imports SGLang once per process (its speculative workers take 15-25 s), refuses the network,
and prints the differential grid's counts at the end of the run.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

# The tier's own modules (harness, ...) by name; network_guard and tier_summary are in tests/helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_tier  # noqa: E402
from engine_tier import no_network  # noqa: E402,F401  (autouse fixture)

engine_tier.isolate()
# SGLang logs every override it makes and warns about missing GPU kernels: thousands of lines
# over the grid. The decisions are read from its return values, not its log.
logging.getLogger("sglang").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="sglang")

import harness  # noqa: E402

harness.import_engine()
logging.getLogger("sglang").setLevel(logging.ERROR)


def pytest_terminal_summary(terminalreporter: object) -> None:
    engine_tier.write_summary(terminalreporter, "SGLang executed-engine grid")
