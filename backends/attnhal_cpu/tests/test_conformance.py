"""The conformance kit on the cpu backend (the real C++ kernel, built on first use).

``TestCpuConformance`` is the one-line certification every backend package writes;
the report test checks that every claim this machine can run is verified.
"""

from __future__ import annotations

import pytest

from attnhal.platform import parse
from attnhal.testing.checks import ClaimKind, Status
from attnhal.testing.conformance import BackendConformance
from attnhal.testing.report import run_conformance
from attnhal_cpu import CpuBackend

if CpuBackend.runtime_reasons(parse("cpu")):
    pytest.skip(f"cpu kernel unavailable here: {CpuBackend.runtime_reasons(parse('cpu'))[0]}",
                allow_module_level=True)


class TestCpuConformance(BackendConformance):
    backend_cls = CpuBackend


def test_report_verifies_every_claim_it_can_run_here() -> None:
    report = run_conformance("cpu", max_examples=0, platform="cpu")
    assert report.ok, report.format()
    not_checked = sorted(r.claim.name for r in report.results if r.status is Status.NOT_CHECKED)
    assert not_checked == []  # every claim, every page size included, runs on a CPU
    verified = {r.claim.name for r in report.results if r.status is Status.VERIFIED}
    assert {f"page_size[{p}]" for p in CpuBackend.capabilities.page_sizes if p > 1} <= verified
    kinds = {r.claim.kind for r in report.results if r.status is Status.VERIFIED}
    assert {ClaimKind.PHASE, ClaimKind.FEATURE, ClaimKind.GRAPH, ClaimKind.SEQ_LEN_FILL,
            ClaimKind.MULTI_STEP, ClaimKind.VENDOR} <= kinds
