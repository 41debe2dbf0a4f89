"""A child Python process that compiles for real GPU targets: without ``TRITON_INTERPRET``, which
the suite sets for the interpreter's kernels (Triton reads it when a kernel is defined)."""

from __future__ import annotations

import os
import subprocess
import sys


def compiling_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``TRITON_INTERPRET``, with ``extra`` added."""
    return {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, **extra}


def run_compiling(*args: str, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in such a child (``extra``: variables to add), its output captured as text."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=compiling_env(**extra),
                          check=False, timeout=timeout)
