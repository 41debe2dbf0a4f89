"""The conformance kit on SGLang 0.5.23's own attention backends: fixed examples and one drawn per check.

``TorchNativeAttnBackend``, ``TritonAttnBackend`` (Triton interpreter) and
``TritonMultiStepDraftBackend`` run through the adapter of ``attnhal_sglang.kit``
against the catalogue entries ``sglang:torch_native`` and ``sglang:triton``. The report is
printed; the sets of falsified and not-checked claims are asserted exactly, so a change in
SGLang or in the kit shows up here. Each falsification is written down in docs/catalog.md
(an SGLang defect, **shown on CPU**) — none is waived.
"""

from __future__ import annotations

import os
import time

import pytest

from attnhal import catalog
from attnhal_sglang.kit import run_kit, unrunnable
from attnhal.testing.checks import ClaimKind, Status, claims

_DEVICES = {"vendor[cuda]", "vendor[hip]"}
#: Left to ATTNHAL_SLOW=1 under the interpreter (attnhal_sglang.kit.certify).
_SLOW = set() if os.environ.get("ATTNHAL_SLOW") == "1" else {"batch_invariant"}
_TRITON_BF16 = {f"phase[{p}, bfloat16]" for p in ("prefill", "decode", "draft_decode", "draft_extend",
                                                    "target_verify")}

#: Per entry: (falsified, not checked here). torch_native's target verify reads seq_lens as the
#: KV length, which verify batches count without the draft (docs/catalog.md D8): its three phase
#: claims fail, and so do the every-phase properties through the same verify cases.
EXPECTED = {
    "sglang:torch_native": ({"phase[target_verify, float32]", "phase[target_verify, float16]",
                             "phase[target_verify, bfloat16]", "deterministic", "inputs_unchanged",
                             "batch_invariant", "layer_pattern"}, _DEVICES),
    # A batch of 0 requests, passed as SGLang's IDLE mode (an idle data-parallel rank's batch):
    # TritonAttnBackend.init_forward_metadata divides by the request count (get_num_kv_splits,
    # triton_backend.py:441). Shown in SGLang's code on CPU; whether SGLang's own idle path
    # reaches it without graphs is not shown yet (docs/conformance.md).
    # fp8 KV: SGLang stores it as uint8 bytes, the kit's pool is attnhal's fp8 tensor (attnhal_sglang.kit.certify).
    "sglang:triton": ({"empty_batch"}, _DEVICES | _TRITON_BF16 | _SLOW | {"kv_dtype[fp8_e4m3]", "kv_dtype[fp8_e5m2]"}),
}
#: Random examples per check on top of the fixed ones (the kit's default is 3). SGLang's Triton
#: kernels under the interpreter are this tier's cost: 451 s of CPU for the file at 3 (2026-12-02),
#: 268 s at 1 (2026-12-05; docs/conformance.md). The fixed examples carry the block boundaries,
#: head sizes and page sizes; one drawn example per check keeps a random batch in every claim.
TIER_EXAMPLES = 1


@pytest.mark.parametrize("ref", sorted(EXPECTED))
def test_sglang_backend_through_the_kit(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    report = run_kit(ref, platform="cpu", max_examples=TIER_EXAMPLES)
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n{report.format()}\n[{ref}: {seconds:.0f} s]")
    falsified, unchecked = EXPECTED[ref]
    assert not report.errors, [r.detail for r in report.errors]
    assert {r.claim.name for r in report.falsified} == falsified
    assert {r.claim.name for r in report.unchecked} == unchecked
    descriptor = catalog.load(ref).descriptor
    assert [r.claim.name for r in report.results] == [c.name for c in claims(descriptor)]  # each one, in order
    verified_phases = {r.claim.subject for r in report.results
                       if r.claim.kind is ClaimKind.PHASE and r.status is Status.VERIFIED}
    failing_phases = {name.split("[")[1].split(",")[0] for name in falsified if name.startswith("phase[")}
    assert verified_phases == {p.value for p in descriptor.phases} - failing_phases


def test_other_sglang_entries_are_reported_not_checked_with_the_reason() -> None:
    from attnhal.cli import main

    report = unrunnable("sglang:aiter", "cpu")
    assert [r.claim.name for r in report.results] == [c.name for c in claims(catalog.load("sglang:aiter").descriptor)]
    assert {r.status for r in report.results} == {Status.NOT_CHECKED} and not report.ok
    assert "aiter backend is not run on cpu: its kernels are native code for {hip}" in report.results[0].detail
    assert main(["conformance", "sglang:aiter", "--platform", "cpu"]) == 1
    # nothing verified here: waiving the unchecked claims does not make it pass
    assert main(["conformance", "sglang:aiter", "--platform", "cpu", "--allow-unchecked"]) == 1


def test_the_command_runs_the_kit(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``attnhal conformance sglang:triton`` hands its options to the kit and prints its report."""
    from attnhal.cli import main
    from attnhal_sglang.kit import certify

    calls: list[tuple[str, dict[str, object]]] = []

    def fake(ref: str, **kwargs: object) -> object:
        calls.append((ref, kwargs))
        report = unrunnable(ref, "cpu")  # a report of the entry, without running the kit
        report.backend = "kit report"
        return report

    monkeypatch.setattr(certify, "run_kit", fake)
    assert main(["conformance", "sglang:triton", "--platform", "cpu", "--examples", "2"]) == 1
    assert calls and calls[0][0] == "sglang:triton" and calls[0][1]["max_examples"] == 2
    assert "attnhal conformance: backend 'kit report'" in capsys.readouterr().out
