"""``attnhal advise``: the engine flags that capture the most, checked against the engines' own recorded decisions.

SGLang: every recommendation whose flag set is a case of the recorded grid
(``tests/engines/recorded/``, SGLang 0.5.23's executed decisions) must be a case SGLang accepts
and captures at least the phases advise claims; recommendations outside the grid are counted and
printed. vLLM's recommendations are checked against its executed code in the vLLM tier
(``tests/engines/vllm/test_vllm_advise.py``).
"""

from __future__ import annotations

import collections
import json

import pytest

import sglang_grid
import sglang_recording
from attnhal.cli import main
from attnhal.engines import advise
from attnhal.engines.advice import MAX_COMBINATIONS, Option
from attnhal.engines.flags import EngineArgError
from attnhal.phases import Phase

SEED = {"attention_backend": "aiter", "speculative_algorithm": "EAGLE", "speculative_num_steps": 1,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}
SEED_ARGV = ["--attention-backend", "aiter", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2"]
_, RECORDED = sglang_recording.load()


def grid_case(option: Option, case: sglang_grid.Case) -> sglang_grid.Case | None:
    """The recorded case whose flags are exactly ``option``'s (``None``: outside the grid)."""
    flags = dict(option.flags)
    candidate = sglang_grid.Case(flags.get("attention_backend"), case.platform, case.model,
                                 flags.get("speculative_num_steps", case.num_steps), case.topk, case.page_size,
                                 flags.get("decode_attention_backend"), flags.get("speculative_attention_mode"),
                                 case.algorithm)
    return candidate if candidate in RECORDED and candidate.args() == flags else None


def confirmed(option: Option, case: sglang_grid.Case) -> bool:
    """SGLang's recorded decision captures at least the speculative phases advise claims."""
    engine = RECORDED[case]
    claimed = {p.value for p in option.captured} & set(sglang_grid.SPEC_PHASES)
    return engine.accepted and claimed <= engine.captured


def test_seed_recommends_flags_whose_draft_extend_sglang_captures_and_names_d1() -> None:
    advice = advise("sglang", SEED, "hip:gfx942", "mha")
    assert advice.current.captured == {Phase.TARGET_VERIFY}
    assert "docs/catalog.md D1" in advice.current.eager[Phase.DRAFT_EXTEND]
    best = advice.recommended[0]
    assert best.captures_every_phase and Phase.DRAFT_EXTEND in best.captured
    assert any("D1" in why and "draft_extend" in why for why in advice.why_better(best))
    case = grid_case(best, sglang_grid.Case("aiter", "hip:gfx942", "mha", 1, 1))
    assert case is not None and confirmed(best, case)
    assert "draft_extend" in RECORDED[case].captured  # SGLang's executed code captures it
    assert advice.every_phase is best


def test_every_recommendation_on_the_recorded_grid_is_confirmed_by_the_recording(capsys) -> None:
    """One user flag set per (platform, model, spec, page size) of the grid; with the flags the
    grid varies (the backend; the step count, except in the algorithms' part, which has no two-step
    cases), every recommendation is a recorded case."""
    groups = {}
    for case in RECORDED:
        if case.decode_backend is None and case.backend is not None:
            groups.setdefault((case.platform, case.model, case.num_steps, case.topk, case.page_size, case.algorithm),
                              case)
    counts = collections.Counter[str]()
    contradicted = []
    for grid_only in (True, False):
        for case in groups.values():
            vary = None
            if grid_only:
                steps_on_grid = case.algorithm in ("EAGLE", "NGRAM")
                vary = ("attention_backend", "speculative_num_steps") if steps_on_grid else ("attention_backend",)
            advice = advise("sglang", case.args(), case.platform, case.model, top=20, vary=vary)
            for option in advice.recommended:
                on_grid = grid_case(option, case)
                where = "the grid's flags" if grid_only else "every flag"
                if on_grid is None:
                    counts[f"outside the grid (varying {where})"] += 1
                elif confirmed(option, on_grid):
                    counts[f"confirmed (varying {where})"] += 1
                else:
                    contradicted.append(f"{case} -> {option.command()}: SGLang {RECORDED[on_grid]}")
    with capsys.disabled():
        print(f"\nadvise on the recorded SGLang grid ({len(groups)} user flag sets): {dict(counts)}")
    assert contradicted == []
    assert counts["outside the grid (varying the grid's flags)"] == 0
    assert counts["confirmed (varying the grid's flags)"] > 100


def test_advise_reads_each_recorded_case_as_sglang_decided() -> None:
    """The user's own flags, as advise predicts SGLang's decision, for every recorded case: the
    captured phases SGLang recorded, or blocked where SGLang starts and a catalogued entry says why."""
    wrong = []
    for case, engine in RECORDED.items():
        if case.backend is None:
            continue
        current = advise("sglang", case.args(), case.platform, case.model, vary=()).current
        if engine.accepted and current.blocked is None:
            predicted = {p.value for p in current.captured} & set(sglang_grid.SPEC_PHASES)
            if predicted != engine.captured:
                wrong.append(f"{case}: advise {sorted(predicted)}, SGLang {sorted(engine.captured)}")
        elif engine.accepted and "starts with it" not in (current.blocked or ""):
            wrong.append(f"{case}: SGLang starts, advise: {current.blocked}")
    assert wrong == []


def test_a_combinatorial_blow_up_is_refused_before_planning() -> None:
    with pytest.raises(EngineArgError) as info:
        advise("sglang", {**SEED, "attention_backend": "triton"}, "cuda:sm100", "mla", limit=10)
    assert info.value.flag == "--vary" and "at most 10" in str(info.value)
    narrow = advise("sglang", {**SEED, "attention_backend": "triton"}, "cuda:sm100", "mla", limit=10,
                    vary=("attention_backend",))
    assert narrow.considered <= 10
    assert MAX_COMBINATIONS >= 1000


def test_vllm_recommends_a_backend_whose_mode_keeps_full_graphs() -> None:
    args = {"attention_backend": "FLASHINFER", "spec_method": "eagle", "spec_tokens": "3"}
    advice = advise("vllm", args, "cuda:sm90", "mha", trtllm_cubins=False)
    assert Phase.TARGET_VERIFY in advice.current.missed and advice.current.costs
    best = advice.recommended[0]
    assert best.captures_every_phase and not best.costs
    assert [str(c) for c in best.changes] == [f"--attention-backend FLASHINFER -> {best.flags['attention_backend']}"]


def test_vllm_advice_names_its_release_and_the_v1_drafter_as_why_drafts_run_eager(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal.cli import main

    argv = ["advise", "--engine", "vllm", "--platform", "cuda:sm90", "--model", "mha", "--", "--attention-backend",
            "FLASH_ATTN", "--spec-method", "eagle", "--spec-tokens", "3", "--vllm-version"]
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # vLLM 0.33's V1 runner (its default is V2)
    assert main([*argv, "0.33.0"]) == 0
    old = capsys.readouterr().out
    assert old.startswith("advise: vLLM 0.33.0 on cuda:sm90") and "captured: target_verify\n" in old
    assert "draft_decode (vLLM 0.33.0's drafter runs PIECEWISE: " in old
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    assert main([*argv, "0.33.0"]) == 0
    assert "captured: target_verify, draft_decode, draft_extend" in capsys.readouterr().out
    assert main([*argv, "0.34.0"]) == 0
    new = capsys.readouterr().out
    assert new.startswith("advise: vLLM 0.34.0") and "captured: target_verify, draft_decode, draft_extend" in new


@pytest.mark.parametrize("argv,flag", [
    (["--engine", "sglang", "--platform", "hip:gfx942", "--model", "mha", "--", *SEED_ARGV, "--no-such-flag", "1"],
     "--no-such-flag"),
    (["--engine", "sglang", "--platform", "hip:gfx942", "--", *SEED_ARGV], "--model"),
    (["--engine", "vllm", "--platform", "cpu", "--model", "mla", "--", "--attention-backend", "CPU_ATTN"], "--model"),
    (["--engine", "vllm", "--platform", "cuda:sm90", "--model", "mha", "--", "--attention-backend", "NOPE"],
     "--attention-backend"),
    (["--engine", "sglang", "--platform", "hip:gfx942", "--model", "mha", "--vary", "port", "--", *SEED_ARGV],
     "--vary"),
])
def test_bad_input_exits_2_naming_the_flag(argv: list[str], flag: str, capsys) -> None:
    assert main(["advise", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnhal advise: error: {flag}"), err


def test_the_command_prints_the_flags_to_paste_and_json_for_tools(capsys) -> None:
    assert main(["advise", "--engine", "sglang", "--platform", "hip:gfx942", "--model", "mha", "--", *SEED_ARGV]) == 0
    out = capsys.readouterr().out
    assert "1. --attention-backend aiter --speculative-algorithm EAGLE --speculative-num-steps 2" in out
    assert "docs/catalog.md D1" in out
    assert main(["advise", "--engine", "sglang", "--platform", "hip:gfx942", "--model", "mha", "--json", "--",
                 *SEED_ARGV]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["every_phase"] == report["recommended"][0]["flags"]
    assert report["current"]["eager"]["draft_extend"].startswith("SGLang 0.5.23 runs it eagerly")


def test_sglang_advice_reads_the_model_config_as_the_plan_does(capsys) -> None:
    """``--model-config`` was accepted by ``advise --engine sglang`` and then dropped: without
    ``--model`` it exited 2 asking for the kind the config gives. Now the advice for a DeepSeek
    (MLA) config.json is the advice for ``--model mla``, with no backend flag given too."""
    common = ["advise", "--engine", "sglang", "--platform", "hip:gfx942", "--json"]
    argv = ["--", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "2"]
    assert main([*common, "--model-config", "tests/engines/models/mla/config.json", *argv]) == 0
    from_config = json.loads(capsys.readouterr().out)
    assert main([*common, "--model", "mla", *argv]) == 0
    assert from_config == json.loads(capsys.readouterr().out) and from_config["model"] == "mla"


@pytest.mark.parametrize("args,platform,model,cause", [
    ({"attention_backend": "flashinfer", "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 3},
     "cuda:sm90", "mla", "docs/catalog.md D3"),
    ({"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 3}, "hip:gfx942", "mha", "Late failures"),
])
def test_a_late_failure_or_engine_bug_is_shown_never_recommended(args: dict[str, object], platform: str, model: str,
                                                                 cause: str) -> None:
    advice = advise("sglang", {**SEED, **args}, platform, model, top=20)
    assert advice.current.blocked is not None and cause in advice.current.blocked
    assert "starts with it" in advice.current.blocked  # SGLang accepts these flags at startup
    assert advice.recommended and all(o.blocked is None for o in advice.recommended)
    assert advice.why_better(advice.recommended[0]) == [f"yours: {advice.current.blocked}"]


def test_candidates_that_fail_late_are_listed_apart_with_their_cause() -> None:
    args = {**SEED, "attention_backend": "triton", "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 3}
    advice = advise("sglang", args, "hip:gfx942", "mha")
    late = [o for o in advice.blocked if "Late failures" in (o.blocked or "")]
    assert late and late[0].flags["attention_backend"] == "aiter"
    assert not any(o.flags == late[0].flags for o in advice.recommended)
