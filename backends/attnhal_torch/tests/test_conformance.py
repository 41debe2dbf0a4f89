"""The conformance kit on the torch reference backend: the whole suite passes, the report says so.

``TestTorchConformance`` is exactly what a backend package writes (one line); the
other tests check ``run_conformance`` and its report on the same backend.
"""

from __future__ import annotations

import json

from attnhal.testing.checks import ClaimKind, Status
from attnhal.testing.conformance import BackendConformance
from attnhal.testing.report import ConformanceReport, run_conformance
from attnhal_torch import TorchBackend


class TestTorchConformance(BackendConformance):
    backend_cls = TorchBackend
    allow_unchecked = True  # the CUDA and HIP vendor claims need those devices


def _report() -> ConformanceReport:
    return run_conformance("torch", max_examples=1, platform="cpu", allow_unchecked=True)


def test_run_conformance_verifies_every_claim_it_can_run_here() -> None:
    report = _report()
    assert report.ok, report.format()
    by_status = {s: [r.claim.name for r in report.results if r.status is s] for s in Status}
    # every claim the CPU can run is verified; only the other vendors' devices are missing here
    assert by_status[Status.NOT_CHECKED] == ["vendor[cuda]", "vendor[hip]"]
    assert by_status[Status.FALSIFIED] == []
    kinds = {r.claim.kind for r in report.results if r.status is Status.VERIFIED}
    assert {ClaimKind.PHASE, ClaimKind.FEATURE, ClaimKind.GRAPH, ClaimKind.SEQ_LEN_FILL,
            ClaimKind.MULTI_STEP, ClaimKind.DETERMINISTIC, ClaimKind.INPUTS_UNCHANGED} <= kinds
    assert all(r.seconds > 0 for r in report.results if r.status is Status.VERIFIED and r.examples)
    phase_rows = [r for r in report.results if r.claim.kind is ClaimKind.PHASE]
    assert len(phase_rows) == 15  # 5 phases x 3 dtypes, each over every claimed head size
    assert all("head sizes 16, 32, 64, 80, 96, 128, 256" in r.detail for r in phase_rows)


def test_report_table_and_json() -> None:
    report = run_conformance("torch", max_examples=0, only=["graph[decode]", "vendor"])
    text = report.format()
    assert text.splitlines()[0] == "attnhal conformance: backend 'torch' (attnhal_torch.backend.TorchBackend)"
    assert "claim" in text and "| status" in text and " s | detail" in text
    assert "graph[decode]" in text and "emulated graphs at sizes 1, 2, 4" in text
    assert "not checked here |" in text and "| no cuda device in this process" in text
    # vendor claims of devices not here are listed, and fail the report only when strict
    assert ("not checked here, needs a device this process lacks (not a failure; --strict fails on it): "
            "vendor[cuda], vendor[hip]") in text
    assert text.splitlines()[-1] == "PASS: 1 claim verified here"
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is True and data["backend"] == "torch" and data["unchecked"] == ["vendor[cuda]", "vendor[hip]"]
    assert [c["claim"] for c in data["claims"]] == ["graph[decode]", "vendor[cuda]", "vendor[hip]", "vendor[cpu]"]
    assert data["counts"] == {"verified": 2, "falsified": 0, "not checked here": 2, "kit error": 0}
    strict = run_conformance("torch", max_examples=0, only=["graph[decode]", "vendor"], strict=True)
    assert not strict.ok and strict.format().splitlines()[-1] == \
        "FAIL: not checked here (waive with --allow-unchecked): vendor[cuda], vendor[hip]"


def test_report_wraps_long_details_instead_of_cutting_them() -> None:
    from attnhal.testing.checks import Claim, ClaimResult
    from attnhal.testing.report import format_results

    detail = "word " * 60 + "END"
    table = format_results([ClaimResult(Claim(ClaimKind.MULTI_STEP), Status.VERIFIED, detail, seconds=1.25)], width=80)
    lines = table.splitlines()
    assert all(len(line) <= 80 for line in lines) and len(lines) > 3
    assert "END" in table and "..." not in table
    assert lines[2].startswith("multi_step | verified |") and "1.2" in lines[2]
    assert lines[3].startswith("           |          |")  # continuation lines keep the columns


def test_simulated_platform_runs_on_the_cpu_and_says_so() -> None:
    report = run_conformance("torch", max_examples=0, platform="hip:gfx942", only=["graph[decode]", "vendor"],
                             allow_unchecked=True)
    assert report.ok
    statuses = {r.claim.name: r.status for r in report.results}
    # a simulated HIP device is not a HIP device: real hipGraphs are not checked
    assert statuses == {"graph[decode]": Status.VERIFIED, "vendor[cuda]": Status.NOT_CHECKED,
                        "vendor[hip]": Status.NOT_CHECKED, "vendor[cpu]": Status.NOT_CHECKED}
    assert any("simulated" in note for note in report.notes)


def test_platform_without_graph_api_leaves_graph_claims_unchecked() -> None:
    report = run_conformance("torch", max_examples=0, platform="cpu,nographs", only=["graph", "seq_len_fill"])
    assert not report.ok and report.results and not report.falsified
    assert all(r.status is Status.NOT_CHECKED and "has no graph API" in r.detail for r in report.results)
    # waived, it still verified nothing: a run that checks no claim does not pass
    waived = run_conformance("torch", max_examples=0, platform="cpu,nographs", only=["graph", "seq_len_fill"],
                             allow_unchecked=True)
    assert not waived.ok and waived.format().splitlines()[-1] == \
        "FAIL: nothing verified here (a run that checks no claim cannot pass)"
