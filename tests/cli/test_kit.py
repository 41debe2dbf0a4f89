"""The conformance kit's dependencies are an extra: without them the command says what to install."""

import os
import subprocess
import sys
import tomllib

from repo import ROOT

from attnhal.cli import main

#: A process in which hypothesis cannot be imported (as in a plain `pip install attnhal`).
WITHOUT_HYPOTHESIS = ("import sys; sys.modules['hypothesis'] = None; from attnhal.cli import main; "
                      "sys.exit(main(sys.argv[1:]))")


def test_conformance_without_hypothesis_names_the_extra():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_HYPOTHESIS, "conformance", "torch", "--platform", "cpu"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnhal conformance: error: "), proc.stderr
    assert "hypothesis" in lines[0] and "pip install 'attnhal[kit]'" in lines[0]
    assert proc.stdout == ""


def test_the_kit_extra_is_declared_and_documented():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    kit = {r.split(">")[0].split("=")[0] for r in extras["kit"]}
    assert kit >= {"hypothesis", "pytest"}
    assert "attnhal[kit]" in extras["test"]
    assert not any(r.startswith("hypothesis") for r in project["dependencies"])  # the kit stays optional
    assert "pip install 'attnhal[kit]'" in (ROOT / "docs" / "conformance.md").read_text()


def test_a_run_that_verifies_nothing_does_not_pass():
    """Triton on a CPU without the interpreter: every claim is not checked; waiving them passes nothing."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnhal", "conformance", "triton", "--platform", "cpu",
                           "--examples", "0", "--allow-unchecked"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "FAIL: nothing verified here (a run that checks no claim cannot pass)"


def test_ctrl_c_prints_the_claims_already_run_and_exits_130(monkeypatch, capsys):
    import attnhal.testing.report as report

    real, calls = report.verify, []

    def interrupted_at_the_third(target, claim):
        calls.append(claim)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(target, claim)
    monkeypatch.setattr(report, "verify", interrupted_at_the_third)
    assert main(["conformance", "torch", "--platform", "cpu", "--examples", "0"]) == 130
    out, err = capsys.readouterr()
    assert calls[0].name in out and calls[1].name in out and calls[2].name not in out.split("\n\n")[1]
    assert out.strip().splitlines()[-1].startswith("FAIL: interrupted after 2 claims")
    assert err.strip() == "attnhal conformance: interrupted"
