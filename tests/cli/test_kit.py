"""The conformance kit's dependencies are an extra: without them the command says what to install."""

import subprocess
import sys
import tomllib

from repo import ROOT

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
