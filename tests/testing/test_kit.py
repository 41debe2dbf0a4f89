"""The kit's own behaviour: flaky failures and kit errors are results, budgets and
progress, the thorough fixed examples, and the exit status of ``attnhal conformance``."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from broken_backends import ToyDecode

from attnhal.backend import ForwardBatch
from attnhal.phases import Phase
from attnhal.platform import Vendor, parse
from attnhal.testing.checks import Claim, ClaimKind, ClaimResult, Status, Target
from attnhal.testing.checks.phases import phase_examples
from attnhal.testing.report import run_conformance
from repo import HELPER_PATHS, ROOT



class WrongOnce(ToyDecode):
    """Wrong on exactly one forward (``FAIL_AT``-th of the class): the first drawn example fails,
    and passes when hypothesis runs it again."""

    FAIL_AT: ClassVar[int] = 0
    calls: ClassVar[itertools.count[int]] = itertools.count(1)

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        out = super().forward_decode(q, layer, batch)
        return out + 1 if next(WrongOnce.calls) == WrongOnce.FAIL_AT else out


def test_a_failure_that_does_not_repeat_is_reported_falsified_flaky() -> None:
    fixed = len(phase_examples(Target(WrongOnce, parse("cpu")), Phase.DECODE, "float32"))
    WrongOnce.calls = itertools.count(1)
    WrongOnce.FAIL_AT = fixed + 1  # one forward per example: the first drawn one
    report = run_conformance(WrongOnce, platform="cpu", max_examples=3, only=["phase[decode", "vendor[cpu]"])
    result = report.results[0]
    assert result.status is Status.FALSIFIED and result.flaky, report.format()
    assert result.label == "falsified (flaky)" and "then passed when run again" in result.detail
    assert "max |out - ref|" in result.detail and result.counterexample and "CaseRecipe(Phase.DECODE" in result.counterexample
    assert report.results[1].status is Status.VERIFIED  # the run went on
    assert "falsified (flaky)" in report.format() and not report.ok


def test_a_kit_error_in_one_claim_keeps_the_report_of_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnhal.testing.checks.run as run

    def broken(target: Target, claim: Claim) -> tuple[str, int]:
        raise RuntimeError("a bug of the kit")

    monkeypatch.setattr(run, "check_inputs_unchanged", broken)
    report = run_conformance(ToyDecode, platform="cpu", max_examples=0,
                             only=["deterministic", "inputs_unchanged", "unclaimed[prefill]"])
    statuses = {r.claim.name: r.status for r in report.results}
    assert statuses == {"deterministic": Status.VERIFIED, "inputs_unchanged": Status.ERROR,
                        "unclaimed[prefill]": Status.VERIFIED}
    assert report.errors[0].detail == "the kit failed: RuntimeError: a bug of the kit"
    assert not report.ok and "FAIL: inputs_unchanged" in report.format()


def test_budget_runs_rounds_of_random_examples_and_progress_reports_each_claim() -> None:
    seen: list[tuple[int, int, str, str | None]] = []

    def progress(i: int, total: int, claim: Claim, result: ClaimResult | None) -> None:
        seen.append((i, total, claim.name, None if result is None else result.label))

    report = run_conformance(ToyDecode, platform="cpu", budget=3.0, only=["phase[decode", "vendor[cpu]"],
                             progress=progress)
    phase = report.results[0]
    fixed = len(phase_examples(Target(ToyDecode, parse("cpu")), Phase.DECODE, "float32"))
    assert phase.status is Status.VERIFIED and phase.examples >= fixed + 1  # fixed, then at least one round
    assert seen == [(0, 2, "phase[decode, float32]", None), (0, 2, "phase[decode, float32]", "verified"),
                    (1, 2, "vendor[cpu]", None), (1, 2, "vendor[cpu]", "verified")]
    assert "random examples for 3 s spread over the claims" in report.format()


def test_lowered_bounds_reach_the_examples_and_the_report_names_them() -> None:
    seen: list[int] = []

    class Recording(ToyDecode):
        def init_forward_metadata(self, batch: Any) -> None:
            seen.append(int(batch.seq_lens.max()))
            super().init_forward_metadata(batch)

    report = run_conformance(Recording, platform="cpu", max_examples=0, only=["phase[decode, float32"],
                             max_seq_len=70, max_cost=2**20)
    assert report.ok and seen and max(seen) <= 70
    assert "bounds lowered: contexts up to 70 tokens, batch cost up to 1048576" in report.format()
    assert "bounds lowered" not in run_conformance(ToyDecode, platform="cpu", max_examples=0,
                                                   only=["vendor[cpu]"]).format()


def test_thorough_adds_the_costlier_fixed_examples() -> None:
    plain = phase_examples(Target(ToyDecode, parse("cpu")), Phase.DECODE, "float32")
    thorough = phase_examples(Target(ToyDecode, parse("cpu"), thorough=True), Phase.DECODE, "float32")
    assert max(max(s.seq_lens()) for s in plain) == 4097
    assert max(max(s.seq_lens()) for s in thorough) == 8193 and len(thorough) > len(plain)
    small = phase_examples(Target(ToyDecode, parse("cpu"), max_seq_len=70), Phase.DECODE, "float32")
    assert max(max(s.seq_lens()) for s in small) <= 70


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (*HELPER_PATHS, os.environ.get("PYTHONPATH")))))
    return subprocess.run([sys.executable, "-m", "attnhal", "conformance", "broken_backends:ToyDecode",
                           "--platform", "cpu", "--examples", "0", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_cli_vendor_claims_of_devices_elsewhere_fail_only_when_strict() -> None:
    default = _cli("--json")
    assert default.returncode == 0, default.stderr
    data: Any = json.loads(default.stdout)[0]
    elsewhere = [f"vendor[{v.value}]" for v in Vendor if v is not Vendor.CPU]  # ToyDecode claims every vendor
    assert sorted(data["unchecked"]) == sorted(elsewhere) == sorted(data["device_elsewhere"])
    assert data["counts"]["falsified"] == 0 and data["failing_unchecked"] == [] and data["ok"]
    assert data["verdict"].startswith("PASS: ")
    strict = _cli("--strict")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "FAIL: not checked here (waive with --allow-unchecked): vendor[cuda], vendor[hip]" in strict.stdout
    waived = _cli("--strict", "--allow-unchecked")
    assert waived.returncode == 0, waived.stdout + waived.stderr
    assert "not checked here, waived by --allow-unchecked: vendor[cuda], vendor[hip]" in waived.stdout
    assert " s | detail" in waived.stdout  # per-claim time


def test_cli_refuses_a_bad_budget() -> None:
    run = _cli("--budget", "0")
    assert run.returncode == 2 and "--budget='0' (supported: a finite number 0.001..86400 seconds)" in run.stderr


def test_claims_every_backend_owes_are_listed() -> None:
    from attnhal.testing.checks import claims

    names = [c.name for c in claims(ToyDecode.capabilities)]
    assert "deterministic" in names and "inputs_unchanged" in names
    assert Claim(ClaimKind.DETERMINISTIC).name == "deterministic"


def test_rounds_run_until_the_time_is_spent_or_the_cap_is_reached() -> None:
    from hypothesis import strategies as st

    from attnhal.testing.checks.common import ROUND, run_examples

    seen: list[int] = []
    timed = Target(ToyDecode, parse("cpu"), max_examples=10**9, seconds=0.5)
    count = run_examples(timed, "timed", st.integers(0, 10**6), [7], seen.append)
    assert count == len(seen) > 3 * ROUND and seen[0] == 7  # the fixed example first
    capped = Target(ToyDecode, parse("cpu"), max_examples=6, seconds=60.0)
    assert run_examples(capped, "capped", st.integers(0, 10**6), [], lambda x: None) == 6


def test_a_batch_without_query_tokens_under_large_inputs_is_checked() -> None:
    """Every prefill row empty, large q/k: nothing to compare, and no kit error (found by --thorough)."""
    from attnhal.testing.cases import CaseRecipe
    from attnhal.testing.checks.phases import eager_body
    from attnhal_torch import TorchBackend

    class Counted(TorchBackend):
        forwards: ClassVar[int] = 0

        def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: int,
                    batch: ForwardBatch) -> torch.Tensor:
            Counted.forwards += 1
            return super().forward(q, k, v, layer, batch)

    body = eager_body(Target(Counted, parse("cpu")), Claim(ClaimKind.PHASE, "prefill", "float16"))
    body(CaseRecipe(Phase.PREFILL, dtype="float16", prefix_lens=(0, 3), new_lens=(0, 0), qk_magnitude=32,
                    v_magnitude=2.0**15))
    assert Counted.forwards == 1  # the check reached the backend's forward, and compared nothing


# --- the kit's layout -------------------------------------------------------------------------

KIT = ROOT / "attnhal" / "testing"


def _own_package_imports(path: Path) -> list[str]:
    """Imports in ``path`` of names from its own package's ``__init__`` (``from attnhal.testing
    import x`` in attnhal/testing/, ``from . import x``), and ``as ast`` aliases."""
    import ast

    package = ".".join(path.relative_to(KIT.parents[1]).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module == package or (node.level and not node.module)):
            found.append(f"{path.name}:{node.lineno}: from {node.module or '.'} import ...")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [f"{path.name}:{node.lineno}: as ast" for a in node.names if a.asname == "ast"]
    return found


def test_kit_modules_import_siblings_by_module_never_through_their_package() -> None:
    """No import circle through a package's ``__init__`` (``checks/phases.py`` once imported
    ``fixed`` through ``checks/__init__``, which imports ``phases``), no stdlib-shadowing alias."""
    modules = [p for p in KIT.rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 20
    assert [f for p in modules for f in _own_package_imports(p)] == []


def test_the_cases_package_exports_in_isort_order() -> None:
    import attnhal.testing as kit
    import attnhal.testing.cases as cases

    assert kit.CaseRecipe is cases.CaseRecipe
    # isort-style: constants, classes, functions
    assert cases.__all__ == sorted(cases.__all__, key=lambda n: (not n.isupper(), not n[0].isupper(), n))


def test_backend_conformance_is_the_sum_of_the_claim_families() -> None:
    from attnhal.testing import conformance as kit

    families = [kit.PhaseConformance, kit.FeatureConformance, kit.GraphConformance, kit.MultiStepConformance,
                kit.PropertyConformance]
    tests = {cls: {n for n in vars(cls) if n.startswith("test_")} for cls in families}
    assert all(issubclass(kit.BackendConformance, cls) for cls in families)
    everything = {n for n in dir(kit.BackendConformance) if n.startswith("test_")}
    assert everything == set().union(*tests.values()) | {"test_vendor"}
    kinds = [cls.claim_kinds for cls in families]
    assert set().union(*kinds) | {ClaimKind.VENDOR} == set(ClaimKind)  # every claim kind has one family
    assert sum(map(len, kinds)) == len(set().union(*kinds))  # and only one
