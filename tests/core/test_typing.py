"""The core is typed: mypy (configured in pyproject.toml) finds nothing in ``attnhal/``."""

from __future__ import annotations

import subprocess
import sys

from repo import ROOT


def test_mypy_finds_nothing_in_the_core() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "attnhal"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
