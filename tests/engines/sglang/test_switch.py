"""``ATTNHAL_SGLANG_GRAPHS`` fails closed inside SGLang: an unknown value ends the start in SGLang's
own ``load_plugins()``, which catches a plugin's ``Exception`` (and would start without the hook)."""

from __future__ import annotations

import os
import subprocess
import sys

from entry_point_overlay import overlay

PROBE = """
from sglang.srt.plugins import load_plugins
load_plugins()
print("started")
"""


def _load_plugins(value: str) -> subprocess.CompletedProcess[str]:
    with overlay() as record:  # this clone's entry points, whoever installed the environment
        path = os.pathsep.join([str(record.parent), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path, "SGLANG_PLUGINS": "attnhal", "ATTNHAL_SGLANG_GRAPHS": value}
        return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)


def test_an_unknown_mode_refuses_to_start_in_sglangs_loader() -> None:
    done = _load_plugins("bogus")
    assert done.returncode == 1 and "started" not in done.stdout, done.stderr[-4000:]
    assert ("attnhal: ATTNHAL_SGLANG_GRAPHS='bogus' (supported: audit, enforce, strict, off): "
            "the server does not start" in done.stderr), done.stderr[-4000:]


def test_a_known_mode_starts() -> None:
    done = _load_plugins("strict")
    assert done.returncode == 0 and "started" in done.stdout, done.stderr[-4000:]
