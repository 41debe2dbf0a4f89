"""The backends of docs/examples pass ``attnhal conformance`` as the docs say they do: the
complete minimal backend (under 60 lines) and the one built on the torch reference."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo import ROOT

EXAMPLES = ROOT / "docs" / "examples"


def _conformance(ref: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, (str(EXAMPLES), os.environ.get("PYTHONPATH"))))
    return subprocess.run([sys.executable, "-m", "attnhal", "conformance", ref, "--platform", "cpu", "--examples", "0"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=path))


def test_the_minimal_backend_is_complete_in_under_60_lines() -> None:
    assert len((EXAMPLES / "minimal_backend.py").read_text().splitlines()) < 60


@pytest.mark.parametrize("ref, verified", [("minimal_backend:MinimalDecode", "PASS: 15 claims"),
                                           ("torch_based_backend:DecodeOnTopOfTorch", "PASS: 33 claims")])
def test_the_example_backend_passes_the_kit(ref: str, verified: str) -> None:
    run = _conformance(ref)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert verified in run.stdout and "phase[decode, float32]" in run.stdout


def test_a_module_name_is_answered_with_what_to_write_instead() -> None:
    run = _conformance("minimal_backend")
    assert run.returncode == 2 and "minimal_backend:ClassName" in run.stderr
    run = _conformance("attnhal_torch")
    assert run.returncode == 2 and "entry-point name, here torch" in run.stderr
