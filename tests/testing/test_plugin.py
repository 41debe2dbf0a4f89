"""The pytest plugin end to end (fresh pytest processes in empty directories), the mixin
as a third party uses it, and run_conformance in a plain process without the Triton
interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lying_backends  # noqa: F401 - see below
import pytest
import torch  # noqa: F401 - see below
from lying_backends import StaleReplayDecode
from repo import HELPER_PATHS

from attnhal.testing.report import run_conformance

# In-process pytester runs restore sys.modules afterwards; torch must be imported before
# the first one, or the next run would re-import its C extension (which fails).
pytest_plugins = ["pytester"]


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (*HELPER_PATHS, env.get("PYTHONPATH"))))
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _pytest(cwd: Path, *args: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=_env(**env), capture_output=True, text=True, timeout=600)


def test_plugin_imports_nothing_heavy() -> None:
    code = ("import sys, attnhal.testing.plugin; "
            "print(sorted(m for m in ('torch', 'hypothesis', 'triton', 'attnhal_torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    assert out.stdout.strip() == "[]"


def test_backend_option_runs_the_whole_suite_in_an_empty_directory(tmp_path: Path) -> None:
    # The documented spelling with plugin autoloading off: load the plugin explicitly.
    run = _pytest(tmp_path, "-p", "attnhal.testing.plugin", "--attnhal-backend", "torch",
                  "--attnhal-examples", "0", "--attnhal-allow-unchecked", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "42 passed, 16 skipped" in run.stdout  # every claim of torch; unclaimed items and other vendors skip
    assert "attnhal conformance: torch on cpu" in run.stdout  # the claims table
    assert "graph[target_verify]" in run.stdout and "not checked here" in run.stdout
    assert "deterministic" in run.stdout and "inputs_unchanged" in run.stdout


def test_vendor_claims_of_devices_elsewhere_skip_unless_strict(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--attnhal-backend", "torch", "-k", "vendor", "-rs")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 5 skipped" in run.stdout  # cuda and hip: no device here (with the reason); 3 vendors unclaimed
    assert "not checked here: vendor[cuda]: no cuda device" in run.stdout
    run = _pytest(tmp_path, "--attnhal-backend", "torch", "-k", "vendor", "--attnhal-strict")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 failed, 1 passed" in run.stdout
    assert "not checked here: vendor[cuda]: no cuda device" in run.stdout
    assert "waive with --attnhal-allow-unchecked" in run.stdout


def test_unchecked_claims_fail_unless_waived(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--attnhal-backend", "torch", "--attnhal-platform", "cpu,nographs", "-k", "graph")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "not checked here: graph[decode]: platform cpu,nographs has no graph API" in run.stdout
    assert "waive with --attnhal-allow-unchecked" in run.stdout


def test_entry_point_plugin_with_module_attr_and_a_lying_backend(tmp_path: Path) -> None:
    # Autoloaded through the pytest11 entry point; an unregistered class by module:attr.
    run = _pytest(tmp_path, "--attnhal-backend", "lying_backends:StaleReplayDecode", "--attnhal-examples", "0",
                  "-k", "graph or phase")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "claim graph[decode] falsified: replay != eager" in run.stdout
    assert "Failing explicit example: graph_decode(" in run.stdout  # the counterexample
    # phase[decode, float32] and the four unclaimed phases hold; only the graph claim is a lie
    assert "1 failed, 5 passed" in run.stdout


@pytest.mark.parametrize("args, env, named", [
    (("--attnhal-budget", "inf"), {}, "--attnhal-budget=inf (supported: a finite number 0.001..86400 seconds)"),
    (("--attnhal-examples", "-1"), {}, "--attnhal-examples=-1 (supported: an integer 0..10000)"),
    ((), {"ATTNHAL_CONFORMANCE_EXAMPLES": "abc"}, "ATTNHAL_CONFORMANCE_EXAMPLES='abc' (supported: an integer "
                                                   "0..10000, as --examples) (environment)"),
])
def test_unbounded_options_and_variables_are_usage_errors(tmp_path: Path, args, env, named) -> None:
    run = _pytest(tmp_path, "--attnhal-backend", "torch", *args, **env)
    assert run.returncode == 4 and named in run.stderr, run.stdout[-2000:] + run.stderr[-2000:]


def test_unknown_backend_is_a_usage_error(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--attnhal-backend", "no-such-backend")
    assert run.returncode == 4  # pytest's usage error
    assert "--attnhal-backend no-such-backend" in run.stderr and "supported: " in run.stderr


def test_mixin_in_a_third_party_test_file(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="""
        from attnhal.testing.conformance import BackendConformance
        from attnhal_torch import TorchBackend

        class TestMine(BackendConformance):
            backend_cls = TorchBackend
            max_examples = 0
            allow_unchecked = True
    """)
    result = pytester.runpytest_inprocess("-k", "decode and (phase or graph) and not draft and not bfloat16",
                                          "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, skipped=1)  # decode is claimed: test_unclaimed_phase[decode] skips
    result.stdout.fnmatch_lines(["*attnhal conformance: torch on cpu*", "*phase?decode, float32*verified*"])


def test_one_claim_family_alone_and_families_combined(pytester: pytest.Pytester) -> None:
    # A backend whose graph support is wrong: its phase claims alone pass; with the graph
    # family added, the lie is found.
    pytester.makepyfile(test_mine="""
        from attnhal.testing.conformance import GraphConformance, PhaseConformance
        from lying_backends import StaleReplayDecode

        class TestPhases(PhaseConformance):
            backend_cls = StaleReplayDecode
            max_examples = 0

        class TestPhasesAndGraphs(PhaseConformance, GraphConformance):
            backend_cls = StaleReplayDecode
            max_examples = 0
    """)
    for path in HELPER_PATHS:
        pytester.syspathinsert(path)
    phases = pytester.runpytest_inprocess("-k", "TestPhases and not Graphs", "-p", "no:cacheprovider")
    phases.assert_outcomes(passed=5, skipped=15)  # phase[decode, float32] and 4 unclaimed phases
    assert "test_graph" not in phases.stdout.str() and "vendor" not in phases.stdout.str()
    both = pytester.runpytest_inprocess("-k", "TestPhasesAndGraphs", "-p", "no:cacheprovider")
    # the same 5 pass; graph[decode] fails, and seq_len_fill[decode] is not checked through the broken
    # graph (as attnhal conformance reports it: both front ends blame the same claim)
    both.assert_outcomes(failed=2, passed=5, skipped=21)
    both.stdout.fnmatch_lines(["*claim graph?decode? falsified: replay != eager*",
                               "*not checked here: seq_len_fill?decode?: graph?decode? is falsified*"])
    report = run_conformance(StaleReplayDecode, max_examples=0, platform="cpu", only=["graph[decode]", "seq_len_fill"])
    assert [(r.claim.name, r.status.value) for r in report.results] == [
        ("graph[decode]", "falsified"), ("seq_len_fill[decode]", "not checked here")]


def test_mixin_with_fixtures_instead_of_attributes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import pytest
        from lying_backends import WrongGQA

        @pytest.fixture(scope="class")
        def backend_cls():
            return WrongGQA

        @pytest.fixture(scope="class")
        def max_examples():
            return 0
    """)
    pytester.makepyfile(test_mine="""
        from attnhal.testing.conformance import BackendConformance

        class TestMine(BackendConformance):
            pass
    """)
    for path in HELPER_PATHS:
        pytester.syspathinsert(path)
    result = pytester.runpytest_inprocess("-k", "test_phase and decode-float32 and not draft", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*claim phase?decode, float32? falsified: head_size=*(GQA)*"])


def test_run_conformance_without_the_triton_interpreter_is_not_a_crash() -> None:
    code = ("import json; from attnhal.testing.report import run_conformance; "
            "r = run_conformance('triton', max_examples=0, platform='cpu'); print(json.dumps(r.to_dict()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=_env(TRITON_INTERPRET=None, ATTNHAL_PLATFORM=None))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # nothing could run: nothing falsified, and the report fails because nothing is verified
    assert report["ok"] is False and report["counts"]["verified"] == 0 and report["counts"]["falsified"] == 0
    assert "phase[decode, float32]" in report["unchecked"]
    reasons = {c["claim"]: c["detail"] for c in report["claims"]}
    assert reasons["phase[decode, float32]"].startswith("[runtime] device=cpu")
    assert reasons["graph[decode]"].startswith("[runtime] device=cpu")
    assert reasons["vendor[cuda]"].startswith("no cuda device in this process")
