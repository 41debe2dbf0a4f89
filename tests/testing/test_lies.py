"""Each lying backend is flagged for the claim it lies about, and only for that claim.

See tests/doubles/lying_backends.py for the lies. Every other claim of these backends is true,
so the kit must verify it: a kit that flags everything would pass a weaker test.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from lying_backends import (
    LIES,
    AllocatingDecode,
    AnswersUnclaimed,
    BadBF16,
    BakedDraftPath,
    ForgetfulReplay,
    HostSyncDecode,
    IgnoresDraftStep,
    IgnoresSinks,
    IgnoresSoftcap,
    IgnoresWindow,
    MLAWrongScale,
    NaNPadding,
    PageBlind,
    SilentWindow,
    UnscaledFP8,
    ShortWindowDecode,
    StaleReplayDecode,
    WrongGQA,
)

from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.testing.cases import CaseRecipe
from attnhal.testing.checks import Claim, ClaimFalsified, ClaimKind, Status, Target, check
from attnhal.testing.checks.phases import eager_body
from attnhal.testing.report import ConformanceReport, run_conformance
from attnhal_torch import TorchBackend


def _run(cls: type, examples: int = 1, **kwargs: object) -> ConformanceReport:
    return run_conformance(cls, max_examples=examples, platform="cpu", **kwargs)  # type: ignore[arg-type]


def _falsified(report: ConformanceReport) -> dict[str, str]:
    return {r.claim.name: r.detail for r in report.falsified}


def _verified(report: ConformanceReport) -> set[str]:
    return {r.claim.name for r in report.results if r.status is Status.VERIFIED}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_each_lie_is_flagged_for_its_claim(lie: str) -> None:
    cls, claim = LIES[lie]
    # the short window hides from the fixed examples: random ones (deterministic here) find it
    report = _run(cls, examples=60 if cls is ShortWindowDecode else 1, only=[claim])
    assert not report.ok
    assert [r.claim.name for r in report.falsified] == [claim], report.format()
    text = report.format()
    assert f"claim {claim} falsified: " in text
    assert "CaseRecipe(Phase." in text.split(f"claim {claim} falsified: ")[1]  # the counterexample follows


def test_host_sync_fails_capture_naming_the_op() -> None:
    report = _run(HostSyncDecode)
    detail = _falsified(report)["graph[decode]"]
    assert detail.startswith("capture failed (emulated graph): CaptureError: aten._local_scalar_dense")
    assert set(_falsified(report)) == {"graph[decode]"}
    assert "phase[decode, float32]" in _verified(report)
    fill = next(r for r in report.results if r.claim.name == "seq_len_fill[decode]")
    assert fill.status is Status.NOT_CHECKED and "graph[decode] is falsified" in fill.detail


def test_stale_replay_metadata_is_replay_not_equal_eager() -> None:
    report = _run(StaleReplayDecode)
    assert set(_falsified(report)) == {"graph[decode]"}
    assert _falsified(report)["graph[decode]"].startswith("replay != eager (3 requests padded to 4")
    assert "phase[decode, float32]" in _verified(report)


def test_forgetful_replay_breaks_every_graph_claim_and_nothing_else() -> None:
    report = _run(ForgetfulReplay, only=["phase[decode", "graph", "multi_step"])
    assert set(_falsified(report)) == {"graph[decode]", "graph[draft_decode]", "graph[draft_extend]",
                                       "graph[target_verify]"}
    assert {"phase[decode, float32]", "multi_step"} <= _verified(report)


def test_wrong_gqa_mapping_breaks_the_phases_on_gqa_only() -> None:
    report = _run(WrongGQA, only=["phase"])
    assert set(_falsified(report)) == {r.claim.name for r in report.results}  # every phase and dtype
    assert all("(GQA)" in r.detail and r.counterexample for r in report.falsified)
    # MHA and MQA are right: only grouped heads expose the mapping
    body = eager_body(Target(WrongGQA, parse("cpu"), max_examples=0), Claim(ClaimKind.PHASE, "decode", "float32"))
    for q_heads, kv_heads in ((2, 2), (4, 1)):
        body(CaseRecipe(Phase.DECODE, num_q_heads=q_heads, num_kv_heads=kv_heads, prefix_lens=(5, 9)))
    with pytest.raises(ClaimFalsified, match=r"4 q / 2 kv heads \(GQA\)"):
        body(CaseRecipe(Phase.DECODE, num_q_heads=4, num_kv_heads=2, prefix_lens=(5, 9)))


def test_bad_bf16_is_flagged_for_bf16_only() -> None:
    report = _run(BadBF16, only=["phase"])
    assert set(_falsified(report)) == {f"phase[{p}, bfloat16]" for p in
                                       ("prefill", "decode", "draft_decode", "draft_extend", "target_verify")}
    assert {f"phase[decode, {d}]" for d in ("float32", "float16")} <= _verified(report)


@pytest.mark.parametrize("cls", [BakedDraftPath, IgnoresDraftStep], ids=lambda c: c.__name__)
def test_broken_multi_step_is_flagged(cls: type) -> None:
    report = _run(cls, only=["multi_step", "graph[draft_decode]", "phase[draft_decode, float32]"])
    falsified = _falsified(report)
    assert "multi_step" in falsified and "graph[draft_decode]" in falsified
    assert falsified["multi_step"].startswith("forward 1 of 2 (draft_step=1")  # step 0 is right
    if cls is BakedDraftPath:  # a single forward reads the path it was given: only re-parenting shows it
        assert "phase[draft_decode, float32]" in _verified(report)
    else:
        assert "phase[draft_decode, float32]" in falsified


def test_answering_an_unclaimed_phase_is_flagged() -> None:
    report = _run(AnswersUnclaimed, only=["unclaimed", "phase[decode, float32]"])
    assert _falsified(report) == {"unclaimed[prefill]": "prefill is not claimed, yet forward returned "
                                                        "[9, 4, 16] instead of raising UnsupportedPhase"}


def test_nan_in_padded_rows_falsifies_the_fill_value() -> None:
    report = _run(NaNPadding, only=["graph[decode]", "seq_len_fill[decode]"])
    assert set(_falsified(report)) == {"seq_len_fill[decode]"}
    assert "padded rows with seq_len_fill=0 give non-finite output" in _falsified(report)["seq_len_fill[decode]"]
    assert "graph[decode]" in _verified(report)


def test_replay_allocations_are_flagged() -> None:
    report = _run(AllocatingDecode, only=["graph[decode]"])
    assert _falsified(report)["graph[decode]"].startswith("replay allocated ")


def test_drawn_counterexample_is_shrunk() -> None:
    """The fixed examples stay below the hidden window; hypothesis finds it and shrinks it
    to the smallest failing batch: one request of seq len WINDOW + 1, one head."""
    # the fixed examples now reach past the window (KV block boundaries): keep them below it
    target = Target(ShortWindowDecode, parse("cpu"), max_examples=60, derandomize=True, database=None, max_seq_len=48)
    with pytest.raises(ClaimFalsified) as err:
        check(target, Claim(ClaimKind.PHASE, "decode", "float32"))
    assert err.value.claim == "phase[decode, float32]"
    notes = "\n".join(err.value.__notes__)
    assert "phase_decode_float32(" in notes and "explicit" not in notes  # a drawn example, not a fixed one
    assert f"prefix_lens=({ShortWindowDecode.WINDOW},)" in notes
    assert "CaseRecipe(Phase.DECODE, num_q_heads=1, num_kv_heads=1, prefix_lens=(30,))" in notes


# A feature liar is flagged for its own claim while a neighbouring claim stays verified.
FEATURE_LIES = [
    (IgnoresWindow, {"feature[sliding_window]"}, "feature[logit_softcap]"),
    (IgnoresSoftcap, {"feature[logit_softcap]"}, "feature[sinks]"),
    (IgnoresSinks, {"feature[sinks]"}, "feature[sliding_window]"),
    (MLAWrongScale, {"feature[mla]"}, "phase[decode, float32]"),
    (PageBlind, {"page_size[16]", "page_size[64]"}, "kv_dtype[fp8_e5m2]"),
    (UnscaledFP8, {"kv_dtype[fp8_e4m3]", "kv_dtype[fp8_e5m2]"}, "page_size[16]"),
    (SilentWindow, {"unclaimed_feature[sliding_window]"}, "feature[sinks]"),
]


@pytest.mark.parametrize("cls, claims, other", FEATURE_LIES, ids=[c.__name__ for c, _, _ in FEATURE_LIES])
def test_feature_lie_is_flagged_for_its_claim_only(cls: type, claims: set[str], other: str) -> None:
    report = _run(cls, examples=0, only=[*sorted(claims), other])
    assert set(_falsified(report)) == claims, report.format()
    assert other in _verified(report)


class UnscaledV(UnscaledFP8):
    """Applies ``k_scale`` but reads V without ``v_scale``: right only when the V scale is 1."""

    dropped: ClassVar[dict[str, Any]] = {"v_scale": None}


def test_a_backend_ignoring_only_the_v_scale_is_flagged() -> None:
    report = _run(UnscaledV, examples=0, only=["kv_dtype[fp8_e5m2]", "page_size[16]"])
    assert set(_falsified(report)) == {"kv_dtype[fp8_e5m2]"}, report.format()
    assert "page_size[16]" in _verified(report)


@pytest.mark.parametrize("platform, flavours", [("cpu", "e4m3fn and e4m3fnuz"), ("hip:gfx942", "e4m3fnuz"),
                                                ("cuda:sm90", "e4m3fn")])
def test_fp8_e4m3_runs_the_flavours_of_the_platform(platform: str, flavours: str) -> None:
    """A platform without fp8 stores both e4m3 flavours; gfx942 only e4m3fnuz, sm90 only e4m3fn."""
    report = run_conformance(TorchBackend, max_examples=0, platform=platform, only=["kv_dtype[fp8_e4m3]"])
    (result,) = report.results
    assert result.status is Status.VERIFIED and result.detail.startswith(f"stored as {flavours}; "), result.detail
