"""attnhal's SGLang plugin beside another plugin hooking the same methods, in both load orders:
each method carries one wrapper per plugin, and one capture calls each plugin's hook once.

Fresh processes (``coexist_probe.py``): the worker modules must be first imported by SGLang's own
``apply_hooks()``, as in a server, which is when attnhal's lazy loader registers its hooks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnhal_sglang.plugin import HOOKS

PROBE = Path(__file__).resolve().parent / "coexist_probe.py"
EAGLE = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs"


@pytest.mark.parametrize("order", ["attnhal-first", "other-first"])
def test_two_plugins_hook_each_method_once_each(order: str) -> None:
    done = subprocess.run([sys.executable, str(PROBE), order], env=dict(os.environ), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["order"][:2] == (["attnhal", "other"] if order == "attnhal-first" else ["other", "attnhal"])
    for target in HOOKS:
        assert sorted(seen["chains"][target]) == ["attnhal", "other"], (target, seen["chains"])
    assert seen["calls"] == {f"attnhal {EAGLE}": 1, f"other {EAGLE}": 1}
