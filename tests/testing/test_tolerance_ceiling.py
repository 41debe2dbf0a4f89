"""The kit's tolerance ceiling: a declared tolerance may tighten it, never loosen it, and the
report prints the tolerance each claim was checked with."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from loose_backends import UnscaledLoose

from attnhal.capabilities import Tolerance
from attnhal.errors import InvalidValue
from attnhal.testing.checks.tolerances import CEILINGS
from attnhal.testing.report import run_conformance
from attnhal_torch import TorchBackend
from repo import HELPER_PATHS


def test_an_infinite_tolerance_fails_every_numeric_claim_naming_the_ceiling() -> None:
    report = run_conformance(UnscaledLoose, max_examples=0, platform="cpu",
                             only=["phase[decode, float32]", "unclaimed"])
    falsified = {r.claim.name: r.detail for r in report.falsified}
    assert not report.ok
    assert list(falsified) == ["phase[decode, float32]"]
    assert "looser than the kit's ceiling for float32" in falsified["phase[decode, float32]"]
    assert "atol <= 0.001" in falsified["phase[decode, float32]"]


def test_the_same_bug_within_the_ceiling_is_falsified_by_the_numbers() -> None:
    within = type("UnscaledWithin", (UnscaledLoose,), {"capabilities": TorchBackend.capabilities})
    report = run_conformance(within, max_examples=0, platform="cpu", only=["phase[decode, float32]"])
    assert [r.claim.name for r in report.falsified] == ["phase[decode, float32]"]
    assert "ceiling" not in report.falsified[0].detail


def test_the_report_prints_the_tolerance_of_each_claim() -> None:
    report = run_conformance(TorchBackend, max_examples=0, platform="cpu",
                             only=["phase[decode, float32]", "unclaimed"])
    assert report.results[0].tolerance == "float32 1e-05"
    assert "[tolerance float32 1e-05]" in report.format()
    assert report.to_dict()["claims"][0]["tolerance"] == "float32 1e-05"


def test_the_cli_fails_the_loose_backend_naming_the_ceiling() -> None:
    out = subprocess.run([sys.executable, "-m", "attnhal", "conformance", "loose_backends:UnscaledLoose",
                          "--platform", "cpu", "--examples", "0", "--allow-unchecked"],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                             filter(None, (*HELPER_PATHS, os.environ.get("PYTHONPATH"))))))
    assert out.returncode == 1, out.stderr
    assert "ceiling for float32" in out.stdout and "FAIL" in out.stdout


def test_every_shipped_default_is_within_its_ceiling() -> None:
    for backend in (TorchBackend,):
        for dtype, tol in backend.capabilities.tolerances.items():
            assert tol.atol <= CEILINGS[dtype].limit.atol and tol.rtol <= CEILINGS[dtype].limit.rtol


@pytest.mark.parametrize("value", [math.nan, -1.0, "1e-3", True])
def test_a_meaningless_tolerance_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidValue) as err:
        Tolerance(value, 1e-3)  # type: ignore[arg-type]
    assert err.value.field == "atol"
