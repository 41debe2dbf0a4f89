"""The engine tiers, run from the main suite: each in its own engine's environment, as a subprocess.

``tests/engines/setup.sh ENGINE`` builds the environment on first use (minutes) and reuses
it after (about a second); the tier's tests then run there with this clone first on
``PYTHONPATH``. The tier fails this test with its own output, and so does a tier that
collects no test (pytest's exit 5).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ENGINES_DIR = Path(__file__).resolve().parent
REPO = ENGINES_DIR.parents[1]
#: Building an environment downloads and installs a few hundred MB; the tier itself is minutes.
SETUP_TIMEOUT_S = 1800
TIER_TIMEOUT_S = 2400  # the kit part under load: up to about 17 minutes


def _environment(engine: str) -> Path:
    done = subprocess.run(["bash", str(ENGINES_DIR / "setup.sh"), engine], capture_output=True, text=True,
                          timeout=SETUP_TIMEOUT_S, cwd=REPO)
    if done.returncode != 0:
        pytest.fail(f"tests/engines/setup.sh {engine} failed (exit {done.returncode}):\n{done.stderr[-6000:]}")
    sys.stderr.write(done.stderr)
    return Path(done.stdout.strip().splitlines()[-1])


def _tier_env(engine: str) -> dict[str, str]:
    env = dict(os.environ)
    env["ATTNHAL_ENGINE_TIER"] = engine
    # Subprocesses the engines start (vLLM inspects models in one) are outside the tier's socket
    # guard: the hubs' own offline switches cover them.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # This clone's attnhal and backends first: the environment may have been built from another clone.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "backends"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


#: The tiers in parts that xdist runs side by side: the kit on SGLang's own backends (SGLang's
#: Triton kernels under the interpreter: minutes) apart from SGLang's decision tests.
PARTS = {
    "sglang": ("sglang", ["tests/engines/sglang", "--ignore=tests/engines/sglang/test_kit.py"]),
    "sglang-kit": ("sglang", ["tests/engines/sglang/test_kit.py"]),
    "vllm": ("vllm", ["tests/engines/vllm"]),
    "vllm-0.34": ("vllm-0.34", ["tests/engines/vllm"]),
}


@pytest.mark.parametrize("part", list(PARTS))
def test_engine_tier(part: str, record_property: Callable[[str, object], None]) -> None:
    engine, selection = PARTS[part]
    python = _environment(engine) / "bin" / "python"
    # --confcutdir: the tier's conftests only (the main suite's root conftest is not the tier's);
    # -p no:attnhal: the conformance plugin's options are not used here.
    command = [str(python), "-m", "pytest", *selection, "-q", "-p", "no:attnhal",
               "--confcutdir", str(ENGINES_DIR), "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIER_TIMEOUT_S, cwd=REPO,
                          env=_tier_env(engine))
    output = done.stdout + done.stderr
    record_property(f"{part}_tier", _closing_lines(done.stdout))
    if done.returncode == 5:
        pytest.fail(f"the {part} tier collected no tests:\n{output[-6000:]}")
    assert done.returncode == 0, f"the {part} tier failed (exit {done.returncode}):\n{output[-12000:]}"


def _closing_lines(stdout: str) -> str:
    """The tier's grid section and its result line (what the main run's summary shows)."""
    lines = stdout.rstrip().splitlines()
    start = next((i for i, line in enumerate(lines) if "executed-engine grid" in line), max(len(lines) - 1, 0))
    return "\n".join(line for line in lines[start:] if not line.startswith("=") or "passed" in line or "failed" in line)
