"""Answers that were wrong (issue 32, item 4), each pinned by a test that failed before the fix;
and engine flags taking JSON refuse deep nesting naming the flag (exit 2, not a RecursionError)."""

from __future__ import annotations

import json

import pytest

from attnhal import AttentionRequest, not_supported_reasons, parse
from attnhal.cli import main
from attnhal.errors import InvalidValue
from attnhal.spec import SpecConfig
from attnhal.testing.report import run_conformance
from attnhal_torch import TorchBackend


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("backend", ["torch", "sglang:fa3"])
def test_fp8_e4m3_on_sm80_does_not_fit(capsys, backend) -> None:
    rc, out, _ = _run(capsys, "explain", "--backend", backend, "--platform", "cuda:sm80", "--kv-dtype", "fp8_e4m3")
    assert rc == 1 and "fits this request" not in out and "cuda:sm80 has none" in out
    assert not_supported_reasons(TorchBackend.capabilities, AttentionRequest(kv_dtype="fp8_e4m3"), parse("cuda:sm90")) == []


def test_catalog_prints_an_entrys_source_citations(capsys) -> None:
    rc, out, _ = _run(capsys, "catalog", "--backend", "sglang:aiter")
    assert rc == 0 and "aiter_backend.py:" in out and "run_limits.draft_extend" in out
    rc, out, _ = _run(capsys, "catalog", "--backend", "sglang:aiter", "--json")
    cited = json.loads(out)["citations"]
    assert rc == 0 and {"key": "vendors", "source": 'arg_groups/choices.py:92-93 ("AMD specific")'} in cited
    rc, _, err = _run(capsys, "catalog", "--backend", "sglang:nope")
    assert rc == 2 and "--backend" in err and "sglang:aiter" in err


@pytest.mark.parametrize("command", ["plan", "explain"])
def test_adaptive_steps_need_speculation(capsys, command) -> None:
    rc, _, err = _run(capsys, command, "--backend", "torch", "--platform", "cuda:sm90", "--adaptive-steps", "1,3,5")
    assert rc == 2 and "--adaptive-steps" in err and "--spec-steps" in err


def test_the_totals_count_what_the_verdict_counts() -> None:
    report = run_conformance("torch", max_examples=0, platform="cpu", only=["phase[decode, float32]", "vendor"])
    totals = report.format().splitlines()
    assert "1 verified, 0 falsified" in next(line for line in totals if "falsified" in line and "ran on" in line)
    assert totals[-1] == "PASS: 1 claim verified here"


def test_an_empty_backend_name_is_bad_input_like_an_empty_platform(capsys) -> None:
    rc, _, err = _run(capsys, "conformance", "")
    assert rc == 2 and "backend=''" in err
    rc, _, err = _run(capsys, "conformance", "torch", "--platform", "")
    assert rc == 2 and "--platform" in err


def test_not_supported_reasons_with_arguments_out_of_order_names_them() -> None:
    with pytest.raises(TypeError, match=r"platform=None \(supported: a Platform.*\(caps, request, platform\)"):
        not_supported_reasons(TorchBackend.capabilities, parse("cpu"), None)  # type: ignore[arg-type]


def test_an_ngram_draft_too_long_names_its_own_bound() -> None:
    with pytest.raises(InvalidValue) as err:
        SpecConfig.ngram(66)
    assert err.value.field == "num_draft_tokens" and "2..65" in err.value.supported
    assert "num_steps=" not in str(err.value)
    assert SpecConfig.ngram(65).num_steps == 64 and SpecConfig.ngram(100, breadth=2).num_draft_tokens == 100


@pytest.mark.parametrize("command, flag", [("plan", "--compilation-config"), ("plan", "--speculative-config"),
                                           ("explain", "--compilation-config")])
def test_deep_json_in_an_engine_flag_is_bad_input_naming_the_flag(capsys, command, flag) -> None:
    rc, _, err = _run(capsys, command, "--engine", "vllm", "--platform", "cuda:sm90", "--",
                      "--attention-backend", "FLASH_ATTN", flag, "[" * 3000)
    assert rc == 2 and flag in err and "levels deep" in err and "Recursion" not in err
