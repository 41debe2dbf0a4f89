"""SGLang adapter: SGLang's server arguments in, attnhal's plan inputs and plan out."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from attnhal.cli import main
import attnhal_sglang as sglang
from attnhal.phases import Phase

EAGLE = {"attention_backend": "triton", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
         "speculative_eagle_topk": 1}


def test_parse_cli_forms() -> None:
    argv = ["--attention-backend", "aiter", "--speculative-num-steps=2", "--disable-cuda-graph",
            "--cuda-graph-bs-decode", "1", "2", "4", "--port", "30000"]
    assert sglang.parse_cli(argv) == {"attention_backend": "aiter", "speculative_num_steps": "2",
                                      "disable_cuda_graph": True, "cuda_graph_bs_decode": "1 2 4", "port": "30000"}
    with pytest.raises(sglang.EngineArgError, match="--page-size needs a value"):
        sglang.parse_cli(["--page-size"])


def test_dict_and_namespace_give_the_same_config() -> None:
    a = sglang.from_server_args(EAGLE, model="mha")
    b = sglang.from_server_args(argparse.Namespace(**EAGLE), model="mha")
    assert a == b
    assert a.spec.num_steps == 3 and a.spec.num_draft_tokens == 4 and a.context.page_size == 1


@pytest.mark.parametrize("args,flag", [
    ({"attention_backend": "fa9"}, "--attention-backend"),
    ({"decode_attention_backend": "nope", "attention_backend": "triton"}, "--decode-attention-backend"),
    ({**EAGLE, "enable_dp_attention": True}, "--enable-dp-attention"),
    ({**EAGLE, "speculative_algorithm": "DFLASH"}, "--speculative-algorithm"),
    ({**EAGLE, "speculative_eagle_topk": 0}, "--speculative-eagle-topk"),
    ({**EAGLE, "speculative_eagle_topk": 2}, "--speculative-num-draft-tokens"),
    ({**EAGLE, "page_size": "x"}, "--page-size"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 1}, "--model"),
    ({**EAGLE, "speculative_num_steps": None}, "--speculative-num-steps"),
])
def test_bad_flags_name_the_flag(args: dict[str, object], flag: str) -> None:
    with pytest.raises(sglang.EngineArgError) as info:
        sglang.from_server_args(args)
    assert info.value.flag == flag and str(info.value).startswith(flag)


def test_harmless_flags_are_listed_as_ignored() -> None:
    config = sglang.from_server_args({**EAGLE, "model_path": "x", "tp_size": 8, "port": 1})
    assert config.ignored == ("model_path", "port", "tp_size")


def test_roles_follow_sglang() -> None:
    args = {**EAGLE, "prefill_attention_backend": "fa3", "decode_attention_backend": "flashinfer"}
    assert sglang.from_server_args(args).roles == {
        "prefill": "fa3", "decode": "flashinfer", "target_verify": "fa3", "draft_decode": "flashinfer",
        "draft_extend": "fa3"}
    decode_mode = sglang.from_server_args({**args, "speculative_attention_mode": "decode"}).roles
    assert decode_mode["target_verify"] == decode_mode["draft_extend"] == "flashinfer"
    draft = sglang.from_server_args({**args, "speculative_draft_attention_backend": "triton"}).roles
    assert draft["draft_decode"] == draft["draft_extend"] == "triton" and draft["target_verify"] == "fa3"
    one_step = sglang.from_server_args({**EAGLE, "speculative_num_steps": 1}).roles
    assert one_step["draft_decode"] is None
    # cute-dsl MLA is decode-only: prefill and draft extend run trtllm_mla (aliases resolve too).
    cute = sglang.from_server_args({**EAGLE, "attention_backend": "tokenspeed_mla"}).roles
    assert cute["decode"] == "cutedsl_mla" and cute["prefill"] == cute["draft_extend"] == "trtllm_mla"
    split = sglang.from_server_args({**EAGLE, "attention_backend": "fa3", "decode_attention_backend": "cutedsl_mla"})
    assert split.roles["prefill"] == "trtllm_mla"  # SGLang fills the prefill backend (overrides.py:1233-1260)
    assert sglang.from_server_args({**EAGLE, "attention_backend": "nsa"}).roles["decode"] == "dsa"


def test_topk_1_sets_draft_tokens_like_sglang_and_says_so() -> None:
    config = sglang.from_server_args({**EAGLE, "speculative_num_draft_tokens": 9, "cuda_graph_max_bs": 8})
    assert config.spec.num_draft_tokens == 4
    assert config.notes == ("speculative_num_draft_tokens=9 -> 4: SGLang sets num_steps + 1 for topk 1",)
    assert "GPU memory" in sglang.from_server_args(EAGLE).notes[0]


def test_dtypes_reach_the_context() -> None:
    config = sglang.from_server_args({**EAGLE, "dtype": "half", "kv_cache_dtype": "fp8_e4m3"})
    assert (config.context.dtype, config.context.kv_dtype) == ("float16", "fp8_e4m3")
    auto = sglang.from_server_args({**EAGLE, "dtype": "auto", "kv_cache_dtype": "auto"}).context
    assert (auto.dtype, auto.kv_dtype) == (None, None)
    # SGLang swaps fa3 for triton with fp8 e5m2 KV (fa3 reads fp8 as e4m3 only), and says so.
    fa3 = sglang.from_server_args({**EAGLE, "attention_backend": "fa3", "kv_cache_dtype": "fp8_e5m2"})
    assert fa3.roles["decode"] == "triton" and fa3.plan("cuda:sm90")[Phase.TARGET_VERIFY].backend == "sglang:triton"
    assert any(n.startswith("attention backend: triton (set by SGLang: fa3 takes fp8 KV") for n in fa3.notes)


def test_graph_switches() -> None:
    for off in ({"disable_cuda_graph": True}, {"disable_decode_cuda_graph": "true"},
                {"cuda_graph_backend_decode": "disabled"}):
        assert not sglang.plan_server_args({**EAGLE, **off}, "cuda:sm90", model="mha").captured
    # SGLang's EnvBool rule: true/1/yes/y (any case) turn it off; anything else is its default.
    for raw, off in (("1", True), ("yes", True), ("Y", True), ("TRUE", True), ("no", False), ("on", False),
                     (" 1", False), ("", False)):
        result = sglang.plan_server_args(EAGLE, "cuda:sm90", env={sglang.DRAFT_EXTEND_GRAPH_OFF: raw}, model="mha")
        assert result[Phase.DRAFT_EXTEND].capture is not off and result[Phase.TARGET_VERIFY].capture, raw
    sizes = sglang.from_server_args({**EAGLE, "cuda_graph_bs_decode": "1 3 5"}).policy
    assert sizes.capture_sizes() == (1, 3, 5) and sizes.max_batch_size == 5
    policy = sglang.from_server_args({**EAGLE, "cuda_graph_max_bs": 40}).policy
    assert policy.max_batch_size == 40
    assert policy.capture_sizes() == (*range(1, 9), *range(10, 33, 2), 40)  # SGLang's speculative list
    plain = sglang.from_server_args({"attention_backend": "triton", "cuda_graph_max_bs": 40}).policy
    assert plain.capture_sizes() == (1, 2, 4, 8, 12, 16, 24, 32, 40)
    unpadded = sglang.from_server_args({**EAGLE, "cuda_graph_max_bs": 5, "disable_cuda_graph_padding": True})
    assert unpadded.policy.capture_sizes() == (1, 2, 3, 4, 5)


def test_ngram_verifies_only() -> None:
    result = sglang.plan_server_args({"attention_backend": "flashinfer", "speculative_algorithm": "NGRAM",
                                      "speculative_num_draft_tokens": 8,
                                      "speculative_ngram_max_bfs_breadth": 2}, "cuda:sm90", model="mha")
    assert result.valid and [p for p in Phase if result[p].runs] == [Phase.PREFILL, Phase.TARGET_VERIFY]
    roles = sglang.from_server_args({"attention_backend": "flashinfer", "speculative_algorithm": "NGRAM",
                                     "speculative_num_draft_tokens": 8}).roles
    assert roles["draft_decode"] is None and roles["draft_extend"] is None and roles["target_verify"] == "flashinfer"
    assert result[Phase.TARGET_VERIFY].capture


def test_aiter_trees_are_invalid_at_draft_extend() -> None:
    result = sglang.plan_server_args({**EAGLE, "attention_backend": "aiter", "speculative_eagle_topk": 2,
                                      "speculative_num_draft_tokens": 5}, "hip:gfx942", model="mha")
    assert not result.valid
    codes = {r.code.value for r in result[Phase.DRAFT_EXTEND].reasons}
    assert "spec_limit" in codes


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


SEED = ["--", "--attention-backend", "aiter", "--speculative-algorithm", "EAGLE",
        "--speculative-num-steps", "1", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2",
        "--platform", "hip:gfx942"]


def test_cli_seed_scenario_captures_draft_extend(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--engine", "sglang", *SEED)
    assert code == 4, out  # attnhal's plan captures draft_extend; SGLang's rule (D1) runs it eagerly
    extend = next(line for line in out.splitlines() if line.startswith("draft_extend"))
    assert extend.split()[1:4] == ["yes", "yes", "sglang:aiter"]
    assert "roles:" in out and "plan: valid" in out
    assert "why: draft_extend is captured" in out
    assert "engine differs (sglang:aiter)" in out and "eagle_worker_v2.py:546-565" in out and "D1" in out
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--json", *SEED, "--port", "30000")
    data = json.loads(out)
    assert data["plan"]["phases"]["draft_extend"]["capture"] is True and data["ignored"] == ["port"]


def test_cli_tree_with_more_draft_tokens_than_branches_plans_valid(capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang verifies the best num_draft_tokens - 1 of topk + (steps - 1) * topk^2 candidates:
    3 steps, topk 4 -> up to 37 tokens; 16 is valid, 38 is not (and says the bound)."""
    tree = ["--attention-backend", "fa3", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "4"]
    code, out, err = run(capsys, "plan", "--engine", "sglang", "--platform", "cuda:sm90", "--", *tree,
                         "--speculative-num-draft-tokens", "16")
    assert code == 0 and "plan: valid" in out, out + err
    assert sglang.from_server_args(dict(sglang.parse_cli([*tree, "--speculative-num-draft-tokens", "37"]))
                                   ).spec.num_draft_tokens == 37
    code, _, err = run(capsys, "plan", "--engine", "sglang", "--platform", "cuda:sm90", "--", *tree,
                       "--speculative-num-draft-tokens", "38")
    assert code == 2 and "--speculative-num-draft-tokens" in err and "2..37" in err


@pytest.mark.parametrize("extra,needle", [
    (["--attention-backend", "fa9"], "--attention-backend"),
    (["--enable-dp-attention"], "--enable-dp-attention"),
    (["--platform"], "--platform"),
])
def test_cli_bad_engine_flags_exit_2(capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    code, _, err = run(capsys, "plan", "--engine", "sglang", *SEED, *extra)
    assert code == 2 and needle in err


def test_cli_engine_flags_need_engine_and_attnhal_flags_stay_out(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", *SEED)
    assert code == 2 and "need --engine" in err
    code, _, err = run(capsys, "plan", "--engine", "sglang", "--page-size", "16", *SEED)
    assert code == 2 and "--page-size with --engine" in err


@pytest.mark.parametrize("algorithm", ["EAGLE3", "NEXTN", "STANDALONE"])
@pytest.mark.parametrize("backend,platform", [("aiter", "hip:gfx942"), ("triton", "cuda:sm90"), ("fa3", "cuda:sm90")])
def test_eagle_family_plans_like_eagle(algorithm: str, backend: str, platform: str) -> None:
    for steps in (1, 3):
        base = {**EAGLE, "attention_backend": backend, "speculative_num_steps": steps}
        eagle = sglang.plan_server_args(base, platform, model="mha")
        other = sglang.plan_server_args({**base, "speculative_algorithm": algorithm}, platform, model="mha")
        assert other.spec.algorithm.value == {"EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "standalone"}[algorithm]
        assert [(p, d.runs, d.capture) for p, d in other.phases.items()] == \
            [(p, d.runs, d.capture) for p, d in eagle.phases.items()]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_BACKENDS = st.sampled_from(["triton", "aiter", "fa3", "fa4", "flashinfer", "flashmla", "nsa", "torch_native", "wave",
                             "cutedsl_mla", "trtllm_mha", "nope", None])  # None: SGLang's default
_VALUES = {
    "decode_attention_backend": st.sampled_from(["triton", "aiter", "flashinfer", "trtllm_mla"]),
    "speculative_num_draft_tokens": st.integers(2, 20),
    "speculative_attention_mode": st.sampled_from(["prefill", "decode"]),
    "page_size": st.sampled_from([1, 16, 32, 64, 128]),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8_e4m3", "fp8_e5m2"]),
    "disable_cuda_graph": st.booleans(),
    "cuda_graph_bs_decode": st.sampled_from(["1 2 4", [8, 16]]),
}


@settings(max_examples=150, deadline=None)
@given(args=st.fixed_dictionaries({"attention_backend": _BACKENDS, "speculative_num_steps": st.integers(1, 6),
                                   "speculative_eagle_topk": st.integers(1, 4),
                                   "speculative_algorithm": st.sampled_from(["EAGLE", "NEXTN", "NGRAM", "DFLASH"])},
                                  optional=_VALUES),
       platform=st.sampled_from(["cuda:sm90", "cuda:sm100", "hip:gfx942", "hip:gfx90a", "cpu"]),
       model=st.sampled_from([None, "mha", "mla"]))
def test_any_flags_give_a_plan_or_an_error_naming_a_flag(args: dict[str, object], platform: str,
                                                          model: str | None) -> None:
    try:
        config = sglang.from_server_args(args, model=model, platform=platform)
    except sglang.EngineArgError as exc:
        assert exc.flag.startswith("--") and str(exc).startswith(exc.flag)
        return
    result = config.plan(platform)  # never raises for any accepted flags
    for decision in result.phases.values():
        assert decision.capture <= decision.runs
        assert decision.capture or decision.reasons  # every "no" has a reason


def test_a_full_server_args_object_through_the_modelled_names() -> None:
    """docs/engine.md: from a ServerArgs-like object, pass the modelled names (unset ones are None)."""
    server_args = argparse.Namespace(**EAGLE, enable_dp_attention=False, tp_size=8, page_size=None)
    args = {name: getattr(server_args, name, None) for name in sglang.FLAGS}
    assert sglang.from_server_args(args).plan("cuda:sm90").valid
    with pytest.raises(sglang.EngineArgError, match="--enable-dp-attention"):
        sglang.from_server_args(server_args)


def test_cli_explain_with_engine_flags(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--", "--attention-backend", "fa3", "--decode-attention-backend", "flashinfer",
             "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2", "--platform", "cuda:sm100"]
    code, out, _ = run(capsys, "explain", "--engine", "sglang", *flags)
    assert code == 1
    assert "backend 'sglang:fa3' (prefill, target_verify, draft_extend) on cuda:sm100:" in out
    assert "does not fit: [arch] arch=sm100" in out
    assert "backend 'sglang:flashinfer' (decode, draft_decode) on cuda:sm100:\n  fits this request" in out
    assert "plan: INVALID" in out
    code, out, _ = run(capsys, "explain", "--engine", "sglang", "--json", *flags)
    data = json.loads(out)
    assert code == 1 and [b["fits"] for b in data["backends"]] == [False, True]
    code, out, _ = run(capsys, "explain", "--engine", "vllm", "--", "--attention-backend", "ROCM_AITER_FA",
                       "--platform", "hip:gfx942")
    assert code == 0 and "fits this request" in out and "AttentionCGSupport UNIFORM_BATCH" in out
    assert run(capsys, "explain", "--platform", "cuda:sm90")[0] == 2


TRTLLM_MLA = ["--attention-backend", "trtllm_mla", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_cli_plans_with_the_page_size_sglang_sets_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "--engine", "sglang", "--platform", "cuda:sm100", "--", *TRTLLM_MLA)
    assert code == 0 and "plan: valid" in out, out + err
    assert "context: page_size=64 (set by SGLang for trtllm_mla)" in out
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--json", "--platform", "cuda:sm100", "--", *TRTLLM_MLA,
                       "--page-size", "16")
    data = json.loads(out)
    assert code == 0 and data["page_size"] == {"value": 64, "given": 16, "set_by": "trtllm_mla"}
    assert data["plan"]["context"]["page_size"] == 64


@pytest.mark.parametrize("args,platform,model,page", [
    ({"attention_backend": "flashmla"}, "cuda:sm90", "mla", (64, None, "flashmla")),
    ({"attention_backend": "flashmla", "page_size": 32}, "cuda:sm90", "mla", (64, 32, "flashmla")),
    ({"attention_backend": "trtllm_mla", "page_size": 32}, "cuda:sm100", "mla", (32, 32, None)),
    ({"attention_backend": "fa3", "decode_attention_backend": "cutedsl_mla"}, "cuda:sm100", "mla", (64, None, "cutedsl_mla")),
    ({"attention_backend": "trtllm_mha", "page_size": 8}, "cuda:sm90", "mha", (64, 8, "trtllm_mha")),
    ({"attention_backend": "trtllm_mha", "page_size": 128}, "cuda:sm90", "mha", (128, 128, None)),
    ({"attention_backend": "triton", "speculative_draft_attention_backend": "trtllm_mha"}, "cuda:sm90", "mha",
     (64, None, "trtllm_mha")),
    ({"attention_backend": "fa4"}, "cuda:sm100", "mha", (128, None, "fa4")),
    ({"attention_backend": "fa4", "page_size": 16}, "cuda:sm100", "gqa", (128, 16, "fa4")),
    ({"attention_backend": "fa4"}, "cuda:sm90", "mha", (1, None, None)),  # SM100 only
    ({"attention_backend": "fa4"}, "cuda:sm100", "mla", (1, None, None)),  # non-MLA only
    ({"attention_backend": "fa4"}, "cuda:sm100", None, (1, None, None)),  # model unknown: not applied, said
    ({**EAGLE, "attention_backend": "fa4", "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 5},
     "cuda:sm100", "mha", (1, None, None)),  # EAGLE trees keep the page size
    ({"attention_backend": "triton", "page_size": 16}, "cuda:sm90", "mha", (16, 16, None)),
    ({"attention_backend": "triton"}, "cuda:sm90", "mha", (1, None, None)),  # SGLang's default
])
def test_page_size_follows_sglang_resolution(args: dict[str, object], platform: str, model: str | None,
                                             page: tuple[int, int | None, str | None]) -> None:
    config = sglang.from_server_args(args, model=model)
    got = config.page_size(platform)
    assert (got.value, got.given, got.set_by) == page
    assert config.plan(platform).context.page_size == page[0]


def _differs(argv: list[str], platform: str, model: str | None = "mha") -> list[str]:
    from attnhal_sglang.audit import engine_differs

    config = sglang.from_server_args(sglang.parse_cli(argv), model=model)
    return [d.entry for d in engine_differs(config, platform)]


SPEC_1 = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "2"]


@pytest.mark.parametrize("argv,platform,model,entries", [
    (["--attention-backend", "aiter"], "hip:gfx942", "mha", []),  # no speculation: no draft extend
    (["--attention-backend", "aiter", *SPEC_1], "hip:gfx942", "mha", ["D1"]),
    (["--attention-backend", "aiter", *SPEC_1, "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"],
     "hip:gfx942", "mha", []),  # an aiter multi-step draft decode exists: SGLang captures draft extend
    (["--attention-backend", "aiter", *SPEC_1], "cuda:sm90", "mha", []),  # the HIP branch only
    (["--attention-backend", "triton", *SPEC_1], "hip:gfx942", "mha", ["D2"]),
    (["--attention-backend", "triton", *SPEC_1], "cuda:sm90", "mha", []),
    # split: draft extend runs on triton (prefill mode), aiter runs none of it: D7 only, once
    (["--attention-backend", "triton", "--decode-attention-backend", "aiter", *SPEC_1], "hip:gfx942", "mha", ["D7"]),
    (["--attention-backend", "triton", "--decode-attention-backend", "aiter", *SPEC_1, "--speculative-num-steps", "3",
      "--speculative-num-draft-tokens", "4"], "hip:gfx942", "mha", []),
    (["--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
      "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "3"], "cuda:sm90", "mla", ["D3"]),
    (["--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
      "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "3"], "cuda:sm90", "mha", []),
    (["--attention-backend", "dsa", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
      "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "5"], "cuda:sm90", "mla", ["D4"]),
    (["--attention-backend", "dsa", *SPEC_1], "cuda:sm90", "mla", []),  # a chain needs no tree mask
    (["--attention-backend", "torch_native", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5",
      "--speculative-ngram-max-bfs-breadth", "2"], "cuda:sm90", "mha", ["D6"]),
    (["--attention-backend", "torch_native"], "cuda:sm90", "mha", []),
])
def test_engine_differs_notes_only_where_their_rule_applies(argv: list[str], platform: str, model: str,
                                                            entries: list[str]) -> None:
    assert _differs(argv, platform, model) == entries


def test_every_catalogued_engine_note_has_a_rule_and_a_docs_entry() -> None:
    from attnhal import catalog
    from attnhal_sglang.audit import RULES, entry_of
    from repo import ROOT

    headings = set(re.findall(r"^### (D\d+)\b", (ROOT / "docs" / "catalog.md").read_text(encoding="utf-8"),
                              flags=re.MULTILINE))
    for entry in catalog.entries("sglang"):
        for note in entry.meta.get("engine_differs", ()):
            assert entry_of(note) in RULES and entry_of(note) in headings, (entry.name, note)


def test_cli_prints_and_reports_engine_differs_in_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--platform", "hip:gfx942", "--", "--attention-backend",
                       "aiter")
    assert code == 0 and "engine differs" not in out  # a plain aiter server: no D7, no D1
    for command in ("plan", "explain"):
        code, out, _ = run(capsys, command, "--engine", "sglang", "--json", *SEED)
        data = json.loads(out)
        assert [d["entry"] for d in data["engine_differs"]] == ["D1"], command
        assert data["engine_differs"][0]["backend"] == "sglang:aiter"
        assert "eagle_worker_v2.py:546-565" in data["engine_differs"][0]["text"]
        assert data["page_size"] == {"value": 1, "given": None, "set_by": None}
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--", "--attention-backend", "triton",
                       "--decode-attention-backend", "aiter", *SEED[3:])
    said = [line for line in out.splitlines() if line.startswith("engine differs")]
    assert len(said) == 1 and said[0].startswith("engine differs (sglang:triton): ") and said[0].endswith("D7"), out


def test_resolution_choice_says_which_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal_sglang import executed as er

    monkeypatch.setattr(er, "importable", lambda: False)
    assert er.choose(None, True, "/m") == er.Choice("builtin", "SGLang is not importable")
    with pytest.raises(sglang.EngineArgError, match="--engine-resolution=engine cannot run here"):
        er.choose("engine", True, "/m")
    monkeypatch.setattr(er, "importable", lambda: True)
    assert er.choose(None, True, "/m").used == "engine"
    assert er.choose("engine", True, "/m").why == "--engine-resolution engine"
    assert "--platform names another" in er.choose(None, False, "/m").why
    assert "--model-path" in er.choose(None, True, None).why
    assert er.choose("builtin", True, "/m").used == "builtin"
    with pytest.raises(sglang.EngineArgError, match="--engine-resolution='x'"):
        er.choose("x", True, "/m")


def test_cli_says_which_resolution_it_used(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal_sglang import executed as er

    monkeypatch.setattr(er, "importable", lambda: False)  # as in the main suite's environment
    code, out, _ = run(capsys, "plan", "--engine", "sglang", *SEED)
    assert code == 4 and "resolution: attnhal's built-in: SGLang is not importable" in out
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--json", "--engine-resolution", "builtin", *SEED)
    assert json.loads(out)["resolution"] == {"used": "builtin", "why": "--engine-resolution builtin"}
    code, _, err = run(capsys, "plan", "--engine", "sglang", "--engine-resolution", "engine", *SEED)
    assert code == 2 and "--engine-resolution=engine cannot run here (SGLang is not importable" in err
    code, _, err = run(capsys, "plan", "--engine", "vllm", "--engine-resolution", "builtin", "--",
                       "--attention-backend", "TRITON_ATTN")
    assert code == 2 and "with --engine sglang" in err


def test_fa4_without_a_model_kind_says_the_page_size_rule_it_cannot_apply() -> None:
    notes = sglang.from_server_args({"attention_backend": "fa4"}).notes
    assert any(n.startswith("page size: SGLang sets 128 for fa4 on SM100") and "--model" in n for n in notes)
    assert not any(n.startswith("page size:") for n in sglang.from_server_args({"attention_backend": "fa4"},
                                                                                model="mha").notes)


NO_BACKEND = {k: v for k, v in EAGLE.items() if k != "attention_backend"}


@pytest.mark.parametrize("args,platform,model,roles,page", [
    ({}, "cuda:sm90", "mha", ("fa3", "fa3"), 1),
    ({**NO_BACKEND, "page_size": 16}, "cuda:sm90", "gqa", ("flashinfer", "flashinfer"), 16),  # page > 1: no fa3
    ({**NO_BACKEND, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}, "cuda:sm90", "mha",
     ("flashinfer", "flashinfer"), 1),
    (NO_BACKEND, "cuda:sm90", "mla", ("fa3", "fa3"), 1),
    (NO_BACKEND, "cuda:sm100", "mha", ("trtllm_mha", "trtllm_mha"), 64),
    ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4}, "cuda:sm100", "mha",
     ("flashinfer", "flashinfer"), 1),  # speculation without an EAGLE topk: no trtllm_mha
    ({}, "cuda:sm100", "mla", ("trtllm_mla", "trtllm_mla"), 64),  # the DeepSeek override
    ({**NO_BACKEND, "decode_attention_backend": "triton"}, "cuda:sm100", "mla", ("flashinfer", "triton"), 1),
    (NO_BACKEND, "hip:gfx942", "mha", ("aiter", "aiter"), 1),
    (NO_BACKEND, "hip:gfx942", "mla", ("aiter", "aiter"), 1),
    ({"kv_cache_dtype": "fp8_e5m2"}, "cuda:sm90", "mha", ("triton", "triton"), 1),  # fa3's fp8 fallback
    (NO_BACKEND, "cuda:sm80", "mha", ("flashinfer", "flashinfer"), 1),
    (NO_BACKEND, "cuda:sm80", "mla", ("triton", "triton"), 1),
])
def test_default_attention_backend_follows_sglang(args: dict[str, object], platform: str, model: str,
                                                  roles: tuple[str, str], page: int) -> None:
    """No --attention-backend: SGLang's pick per model kind, GPU and spec settings (the SGLang
    tier executes these choices over the grid's `default` part)."""
    config = sglang.from_server_args(args, model=model, platform=platform)
    assert (config.roles["prefill"], config.roles["decode"]) == roles
    assert config.page_size(platform).value == page and config.plan(platform).context.page_size == page
    assert any(n.startswith(f"attention backend: {roles[0]} (set by SGLang") for n in config.notes), config.notes


def test_default_attention_backend_needs_the_model_and_the_platform_it_was_picked_for() -> None:
    with pytest.raises(sglang.EngineArgError, match="^--model"):
        sglang.from_server_args(NO_BACKEND, platform="cuda:sm90")
    with pytest.raises(sglang.EngineArgError, match="^--attention-backend.*plan for a platform"):
        sglang.from_server_args(NO_BACKEND, model="mha")
    with pytest.raises(sglang.EngineArgError, match="^--attention-backend.*CUDA and HIP GPUs only"):
        sglang.from_server_args(NO_BACKEND, model="mha", platform="cpu")
    config = sglang.from_server_args(NO_BACKEND, model="mha", platform="cuda:sm90")
    with pytest.raises(sglang.EngineArgError, match="^--platform=.cuda:sm100.*picked for cuda:sm90"):
        config.plan("cuda:sm100")
    assert sglang.plan_server_args(NO_BACKEND, "cuda:sm100", model="mha").valid


def test_cli_says_sglang_picked_the_attention_backend(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]
    code, out, err = run(capsys, "plan", "--engine", "sglang", "--platform", "cuda:sm100", "--model", "mla",
                         "--engine-resolution", "builtin", "--", *flags)
    assert code == 0 and "plan: valid" in out, out + err
    assert "roles: prefill=trtllm_mla, decode=trtllm_mla" in out
    assert "note: attention backend: trtllm_mla (set by SGLang: SM100, DeepSeek-V3-family MLA model" in out
    assert "page_size=64 (set by SGLang for trtllm_mla)" in out
    code, _, err = run(capsys, "plan", "--engine", "sglang", "--platform", "cuda:sm100", "--", *flags)
    assert code == 2 and "--model" in err


def test_env_bool_refuses_a_variable_without_a_rule() -> None:
    from attnhal.errors import InvalidValue

    with pytest.raises(InvalidValue, match="name='SGLANG_OTHER'"):
        sglang.config.env_bool({}, "SGLANG_OTHER")


def test_cli_truthiness_repro_plans_draft_extend_eager(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30 item 4: ``yes`` is true to SGLang (``EnvBool``), so draft extend is eager."""
    monkeypatch.setenv(sglang.DRAFT_EXTEND_GRAPH_OFF, "yes")
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--platform", "cuda:sm90", "--", "--attention-backend",
                       "triton", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2")
    line = next(x for x in out.splitlines() if x.startswith("draft_extend"))
    assert code == 0 and line.split()[1:3] == ["yes", "no"] and "[graphs_disabled]" in line


@pytest.mark.parametrize(("steps", "extra", "when"), [
    (3, (), "during the draft-extend graph capture at server start-up"),
    (3, ("--disable-cuda-graph",), "at the first draft extend"),
    (2, ("--decode-attention-backend", "triton"), "at the first draft extend"),
])
def test_cli_aiter_tree_names_its_late_failure_and_when(capsys: pytest.CaptureFixture[str], steps: int,
                                                        extra: tuple[str, ...], when: str) -> None:
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--platform", "hip:gfx942", "--", "--attention-backend",
                       "aiter", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps),
                       "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4", *extra)
    head = "late failure (docs/catalog.md, Late failures; sglang:aiter)"
    late = [x for x in out.splitlines() if x.startswith(head)]
    assert code == 1 and len(late) == 1 and when in late[0] and "aiter_backend.py:1396-1401" in late[0]
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--json", "--platform", "hip:gfx942", "--",
                       "--attention-backend", "aiter", "--speculative-algorithm", "EAGLE", "--speculative-num-steps",
                       str(steps), "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4", *extra)
    assert [f["when"].startswith(when) for f in json.loads(out)["late_failures"]] == [True]


def test_no_late_failure_for_chains(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--platform", "hip:gfx942", "--", "--attention-backend",
                       "aiter", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    assert code == 0 and "late failure" not in out


def test_cli_plan_prints_the_graph_report_with_the_catalogued_engine_decision(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before launch: the plugin's start-up table, D1's phase marked eager by SGLang with the switch."""
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--platform", "hip:gfx942", "--", "--attention-backend",
                       "aiter", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2")
    rows = out[out.index("attnhal graph report: SGLang 0.5.23 on hip:gfx942"):].splitlines()
    assert rows[1].split()[:4] == ["phase", "capture", "sizes", "graph"]
    extend = next(row for row in rows if row.startswith("draft_extend"))
    assert extend.split()[1:4] == ["-", "eager", "(SGLang)"] and "docs/catalog.md D1 (sglang:aiter)" in extend
    assert extend.endswith("ATTNHAL_SGLANG_GRAPHS=enforce")
    verify = next(row for row in rows if row.startswith("target_verify"))
    assert verify.split()[1:5] == ["1..32", "(20", "sizes)", "captured"] and code == 4


def test_graph_report_sizes_and_a_switch_for_the_env_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal.engines.report import sizes_text
    from attnhal_sglang.report import plan_report

    assert (sizes_text(()), sizes_text((8,)), sizes_text((1, 2, 4))) == ("-", "8", "1..4 (3 sizes)")
    config = sglang.from_server_args(EAGLE, env={sglang.DRAFT_EXTEND_GRAPH_OFF: "y"}, model="mha")
    report = plan_report(config.plan("cuda:sm90"), (), "SGLang on cuda:sm90")
    extend = next(row for row in report.splitlines() if row.startswith("draft_extend"))
    assert "eager (attnhal's plan)" in extend and extend.endswith(f"unset {sglang.DRAFT_EXTEND_GRAPH_OFF}")
    off = sglang.from_server_args({**EAGLE, "disable_cuda_graph": True}, model="mha")
    assert "drop --disable-cuda-graph" in plan_report(off.plan("cuda:sm90"), (), "x")


def test_sglangs_resolution_is_chosen_only_where_it_can_run(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang installed on a machine without an accelerator: its resolution would import SGLang
    (minutes under load) and then refuse ("No accelerator ..."); the built-in one runs, with one
    line saying why, and SGLang is never imported."""
    import sys

    from attnhal.platform import parse
    from attnhal_sglang import executed as er

    monkeypatch.setattr(er, "importable", lambda: True)
    assert er.choose(None, True, "/m", accelerator=False) == er.Choice(
        "builtin", "SGLang's resolution asks the device and this machine has no accelerator")
    with pytest.raises(sglang.EngineArgError, match="cannot run here .*no accelerator"):
        er.choose("engine", True, "/m", accelerator=False)
    monkeypatch.delenv("ATTNHAL_PLATFORM", raising=False)
    monkeypatch.setattr("attnhal.cli.inputs.detect", lambda: parse("cpu"))  # this machine: no accelerator
    code, out, err = run(capsys, "plan", "--engine", "sglang", "--", "--attention-backend", "torch_native",
                         "--model-path", "/nonexistent/model")
    assert code == 0, err
    assert ("resolution: attnhal's built-in: SGLang's resolution asks the device and this machine has no "
            "accelerator") in out
    assert not any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)
