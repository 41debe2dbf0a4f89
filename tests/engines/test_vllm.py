"""vLLM adapter: descriptor <-> AttentionCGSupport, the minimum over groups, the graph mode."""

from __future__ import annotations

import json

import pytest

from attnhal import catalog
from attnhal.cli import main
from attnhal.engines.flags import EngineArgError
from attnhal_vllm import (
    CGSupport,
    GraphMode,
    catalog_support,
    descriptor_for_level,
    from_engine_args,
    min_support,
    resolve_mode,
    support_level,
)
from attnhal_vllm import config as vllm_config
from attnhal.platform import parse

PLATFORM = {"cuda": "cuda:sm90", "hip": "hip:gfx942", "cpu": "cpu"}


@pytest.mark.parametrize("level", list(CGSupport))
def test_level_to_descriptor_and_back(level: CGSupport) -> None:
    caps = descriptor_for_level("x", level, ["cuda", "hip"])
    for spec in ("cuda:sm90", "hip:gfx942"):
        # ALWAYS comes back as UNIFORM_BATCH: mixed prefill+decode graphs have no attnhal phase.
        assert support_level(caps, parse(spec)) is min(level, CGSupport.UNIFORM_BATCH)


@pytest.mark.parametrize("entry", catalog.entries("vllm"), ids=lambda e: e.name)
def test_catalogued_descriptors_earn_their_recorded_level(entry: catalog.CatalogEntry) -> None:
    vendor = min(entry.descriptor.vendors, key=lambda v: v.value)
    recorded = catalog_support(entry.qualified_name)
    archs = entry.descriptor.archs.get(vendor)  # a backend vLLM takes on some archs only: the first of them
    platform = f"{vendor.value}:{archs.items[0].partition('..')[0]}" if archs else PLATFORM[vendor.value]
    assert support_level(entry.descriptor, parse(platform)) is min(recorded, CGSupport.UNIFORM_BATCH)


def test_minimum_over_attention_groups_names_the_backend() -> None:
    groups = {"FlashAttentionBackend": CGSupport.ALWAYS, "Mamba2AttentionBackend": CGSupport.UNIFORM_BATCH,
              "CutlassMLABackend": CGSupport.UNIFORM_SINGLE_TOKEN_DECODE}
    assert min_support(groups) == (CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "CutlassMLABackend")
    assert min_support({}) == (CGSupport.ALWAYS, None)


@pytest.mark.parametrize("requested,support,query_len,split,expected", [
    (GraphMode.FULL_AND_PIECEWISE, CGSupport.ALWAYS, 4, True, GraphMode.FULL_AND_PIECEWISE),
    (GraphMode.FULL_AND_PIECEWISE, CGSupport.UNIFORM_BATCH, 4, True, GraphMode.FULL_AND_PIECEWISE),
    (GraphMode.FULL, CGSupport.UNIFORM_BATCH, 1, True, GraphMode.FULL_AND_PIECEWISE),
    (GraphMode.FULL, CGSupport.UNIFORM_BATCH, 1, False, GraphMode.FULL_DECODE_ONLY),
    (GraphMode.FULL_AND_PIECEWISE, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, 1, True, GraphMode.FULL_AND_PIECEWISE),
    (GraphMode.FULL_AND_PIECEWISE, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, 4, True, GraphMode.PIECEWISE),
    (GraphMode.FULL_DECODE_ONLY, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, 4, False, GraphMode.NONE),
    (GraphMode.FULL_AND_PIECEWISE, CGSupport.NEVER, 1, True, GraphMode.PIECEWISE),
    (GraphMode.PIECEWISE, CGSupport.NEVER, 4, True, GraphMode.PIECEWISE),
    (GraphMode.NONE, CGSupport.ALWAYS, 1, True, GraphMode.NONE),
])
def test_resolve_mode_follows_vllm(requested: GraphMode, support: CGSupport, query_len: int, split: bool,
                                   expected: GraphMode) -> None:
    result = resolve_mode(requested, support, query_len, attention_split=split)
    assert result.mode is expected and result.error is None
    assert len(result.steps) == (0 if expected is requested else len(result.steps))
    assert all("->" in step for step in result.steps)


def test_full_with_never_is_an_error_and_piecewise_needs_a_piecewise_model() -> None:
    result = resolve_mode(GraphMode.FULL, CGSupport.NEVER)
    assert result.mode is None and "PIECEWISE" in (result.error or "")
    assert resolve_mode(GraphMode.FULL_AND_PIECEWISE, CGSupport.ALWAYS,
                        piecewise_available=False).mode is GraphMode.FULL_DECODE_ONLY
    assert resolve_mode(GraphMode.PIECEWISE, CGSupport.ALWAYS, piecewise_available=False).mode is GraphMode.NONE


def test_resolve_mode_takes_names_and_refuses_other_values() -> None:
    by_name = resolve_mode("FULL", "UNIFORM_BATCH", 4)
    assert by_name == resolve_mode(GraphMode.FULL, CGSupport.UNIFORM_BATCH, 4)
    with pytest.raises(ValueError, match=r"requested='full' \(supported: GraphMode or one of its names NONE, "):
        resolve_mode("full", CGSupport.ALWAYS)
    with pytest.raises(ValueError, match=r"support=3 \(supported: CGSupport or one of its names NEVER, "):
        resolve_mode(GraphMode.FULL, 3)  # type: ignore[arg-type]


def test_catalog_support_refuses_other_engines() -> None:
    with pytest.raises(catalog.CatalogError, match="vllm"):
        catalog_support("sglang:aiter")


def test_engine_args_resolve_the_mode_and_plan() -> None:
    config = from_engine_args({"attention_backend": "flash_attn", "spec_method": "eagle3", "spec_tokens": 3},
                              model="mha")
    assert config.backend == "vllm:FLASH_ATTN" and config.spec.num_draft_tokens == 4
    assert config.requested is GraphMode.FULL_AND_PIECEWISE and config.resolution.mode is GraphMode.FULL_AND_PIECEWISE
    result = config.plan("cuda:sm90")
    assert result.valid and result["target_verify"].capture and result.spec.algorithm.value == "eagle3"
    cutlass = from_engine_args({"attention_backend": "CUTLASS_MLA",
                                "speculative_config": '{"method": "deepseek_mtp", "num_speculative_tokens": 2}'},
                               model="mla")
    assert cutlass.resolution.mode is GraphMode.PIECEWISE and not cutlass.plan("cuda:sm100").captured
    ngram = from_engine_args({"attention_backend": "TRITON_ATTN", "spec_method": "ngram", "spec_tokens": 4,
                              "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}, "max_model_len": 8})
    assert ngram.spec.algorithm.value == "ngram" and ngram.spec.num_draft_tokens == 5 and ngram.ignored == ("max_model_len",)
    assert from_engine_args({"attention_backend": "TRITON_ATTN", "enforce_eager": True}).resolution.mode is GraphMode.NONE


@pytest.mark.parametrize("args,flag", [
    ({}, "--attention-backend"),
    ({"attention_backend": "FLASH_ATTN4"}, "--attention-backend"),
    ({"attention_backend": "FLASH_ATTN", "spec_tokens": 3}, "--spec-tokens"),
    ({"attention_backend": "FLASH_ATTN", "compilation_config": '{"level": 3}'}, "--compilation-config.level"),
    ({"attention_backend": "FLASH_ATTN", "compilation_config": '{"cudagraph_mode": "ALL"}'},
     "--compilation-config.cudagraph_mode"),
    ({"attention_backend": "FLASH_ATTN", "kv_transfer_config": "{}"}, "--kv-transfer-config"),
    ({"attention_backend": "FLASH_ATTN", "spec_method": "eagle", "spec_tokens": 3,
      "speculative_config": '{"method": "mtp"}'}, "--spec-method"),
    ({"attention_backend": "FLASH_ATTN", "spec_method": "eagle", "spec_tokens": 3,
      "speculative_config": '{"num_speculative_tokens": 2}'}, "--spec-tokens"),
])
def test_bad_engine_args_name_the_flag(args: dict[str, object], flag: str) -> None:
    with pytest.raises(EngineArgError) as info:
        from_engine_args(args)
    assert info.value.flag == flag


def test_cli_plan_with_vllm_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--engine", "vllm", "--", "--attention-backend", "CUTLASS_MLA", "--spec-method", "mtp",
            "--spec-tokens", "3", "--platform", "cuda:sm100", "--model", "mla"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "AttentionCGSupport UNIFORM_SINGLE_TOKEN_DECODE" in out
    assert "cudagraph_mode: FULL_AND_PIECEWISE -> PIECEWISE" in out and "needs UNIFORM_BATCH" in out
    assert main(["plan", "--engine", "vllm", "--json", *argv[3:]]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cudagraph_mode"]["resolved"] == "PIECEWISE" and data["cg_support"] == "UNIFORM_SINGLE_TOKEN_DECODE"
    assert main(["plan", "--engine", "vllm", "--", "--attention-backend", "NOPE"]) == 2
    assert "--attention-backend" in capsys.readouterr().err


@pytest.mark.parametrize("backend,platform,tokens,cubins,level,assumes", [
    ("vllm:FLASH_ATTN", "cuda:sm80", 0, True, CGSupport.UNIFORM_BATCH, False),  # FA2
    ("vllm:FLASH_ATTN", "cuda:sm90", 0, True, CGSupport.ALWAYS, False),  # FA3
    ("vllm:FLASH_ATTN", "cuda:sm100", 0, True, CGSupport.ALWAYS, False),  # FA4
    ("vllm:FLASH_ATTN", "cuda:sm120", 0, True, CGSupport.UNIFORM_BATCH, False),  # FA2 again
    ("vllm:FLASHINFER", "cuda:sm80", 3, False, CGSupport.UNIFORM_BATCH, False),  # FA2 native decode
    ("vllm:FLASHINFER", "cuda:sm90", 3, True, CGSupport.UNIFORM_BATCH, True),
    ("vllm:FLASHINFER", "cuda:sm90", 3, False, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, True),
    ("vllm:FLASHINFER", "cuda:sm100", 0, False, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, True),
    ("vllm:HPC_ATTN", "cuda:sm90", 0, True, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, False),
    ("vllm:HPC_ATTN", "cuda:sm90", 2, True, CGSupport.UNIFORM_BATCH, False),
    ("vllm:TRITON_ATTN", "cuda:sm90", 0, False, CGSupport.ALWAYS, False),  # no rule: the catalogue's level
])
def test_builder_level_per_configuration(backend: str, platform: str, tokens: int, cubins: bool,
                                         level: CGSupport, assumes: bool) -> None:
    from attnhal_vllm import support_on
    from attnhal.platform import parse

    got = support_on(backend, parse(platform), tokens, cubins)
    assert got.support is level and bool(got.assumes) == assumes
    assert support_on(backend, None, tokens, cubins).support is catalog_support(backend)


def test_cli_flash_attn_on_sm80_is_fa2_and_full_becomes_full_and_piecewise(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--engine", "vllm", "--platform", "cuda:sm80", "--", "--attention-backend", "FLASH_ATTN",
            "--compilation-config", '{"cudagraph_mode": "FULL"}']
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "AttentionCGSupport UNIFORM_BATCH (FlashAttention 2 on sm80" in out
    assert "cudagraph_mode: FULL -> FULL_AND_PIECEWISE" in out


def test_cli_flashinfer_says_its_cubin_assumption_and_takes_the_other_one(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--engine", "vllm", "--json", "--platform", "cuda:sm90", "--", "--attention-backend", "FLASHINFER",
            "--spec-method", "ngram", "--spec-tokens", "3"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cudagraph_mode"]["resolved"] == "FULL_AND_PIECEWISE" and "cubins" in data["cg_level"]["assumes"]
    assert main([*argv, "--trtllm-cubins", "no"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cudagraph_mode"]["resolved"] == "PIECEWISE" and data["cg_support"] == "UNIFORM_SINGLE_TOKEN_DECODE"
    assert main([*argv, "--trtllm-cubins", "maybe"]) == 2
    assert "--trtllm-cubins='maybe' (supported: yes, no)" in capsys.readouterr().err


@pytest.mark.parametrize("here,release,chosen", [
    ("0.33.0", "0.33.0", "installed"), ("0.34.0", "0.34.0", "installed"),
    (None, "0.34.0", "no vLLM installed: the newest supported"),
    ("0.35.1", "0.34.0", "vLLM 0.35.1 installed, not modelled: the newest supported"),
])
def test_the_release_modelled_is_the_installed_one_else_the_newest(
        monkeypatch: pytest.MonkeyPatch, here: str | None, release: str, chosen: str) -> None:
    monkeypatch.setattr(vllm_config, "installed", lambda distribution: here)
    assert vllm_config.release_for(None)[0] == release and vllm_config.release_for(None)[1].startswith(chosen)
    assert vllm_config.release_for("0.33.0") == ("0.33.0", "--vllm-version")
    with pytest.raises(EngineArgError, match=r"--vllm-version='0.36' \(supported: 0.33.0, 0.34.0 and the patch"):
        vllm_config.release_for("0.36")


EAGLE = {"attention_backend": "FLASH_ATTN", "spec_method": "eagle", "spec_tokens": 3}


@pytest.mark.parametrize("mode,release,env,drafter,drafts_captured", [
    (None, "0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "PIECEWISE", False),  # V1's drafter: attention eager
    ("FULL_DECODE_ONLY", "0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "NONE", False),  # V1: no piecewise part
    (None, "0.33.0", {}, "FULL_DECODE_ONLY", True),  # 0.33's default runner is V2: draft decodes captured
    ("PIECEWISE", "0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "NONE", False),
    (None, "0.34.0", {}, "FULL_DECODE_ONLY", True),  # 0.34: V2 only
    (None, "0.34.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "FULL_DECODE_ONLY", True),  # 0.34 reads no switch
    ("PIECEWISE", "0.34.0", {}, "NONE", False),
])
def test_the_drafter_follows_the_runner_vllm_selects(mode: str | None, release: str, env: dict[str, str],
                                                     drafter: str, drafts_captured: bool) -> None:
    args = {**EAGLE, **({"compilation_config": {"cudagraph_mode": mode}} if mode else {})}
    config = from_engine_args(args, "cuda:sm90", version=release, env=env)
    v1 = release == "0.33.0" and env.get("VLLM_USE_V2_MODEL_RUNNER") == "0"
    assert config.runner is not None and config.runner.name == ("V1" if v1 else "V2")
    assert config.version == release and config.drafter is not None and config.drafter.mode == drafter
    result = config.plan("cuda:sm90")
    assert result["draft_decode"].capture is drafts_captured and result["draft_extend"].capture is drafts_captured
    assert result["target_verify"].capture is (mode != "PIECEWISE")
    assert any("drafter on the V1 runner runs" in note for note in config.notes) is v1
    assert from_engine_args({**EAGLE, "spec_method": "ngram"}, version=release, env=env).drafter is None


def test_the_runner_switch_is_read_as_vllm_reads_it() -> None:
    from attnhal_vllm.runner import select_runner

    assert select_runner("0.33.0", {}).assumes and select_runner("0.34.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}).name == "V2"
    assert [select_runner("0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": v}).name for v in ("0", "1", "2", "-1", "00")] == [
        "V1", "V2", "V2", "V2", "V1"]
    with pytest.raises(EngineArgError, match=r"VLLM_USE_V2_MODEL_RUNNER='yes' \(supported: an integer"):
        select_runner("0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "yes"})


def test_vllm_033s_v2_draft_model_speculator_captures_nothing() -> None:
    args = {"attention_backend": "FLASH_ATTN", "spec_method": "draft_model", "spec_tokens": 3}
    assert from_engine_args(args, "cuda:sm90", version="0.33.0").drafter.mode == "NONE"  # type: ignore[union-attr]
    assert from_engine_args(args, "cuda:sm90", version="0.34.0").drafter.mode == "FULL_DECODE_ONLY"  # type: ignore[union-attr]


def test_the_issues_repro_says_what_vllm_033s_v2_eagle_speculator_sets_up(capsys: pytest.CaptureFixture[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    argv = ["plan", "--engine", "vllm", "--platform", "cuda:sm90", "--json", "--", "--attention-backend",
            "FLASH_ATTN", "--spec-method", "eagle", "--spec-tokens", "3", "--spec-model", "M", "--vllm-version",
            "0.33.0"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runner"]["runner"] == "V2" and data["drafter"]["draft_decode"] == "FULL_DECODE_ONLY"
    phases = data["plan"]["phases"]
    assert phases["draft_decode"]["capture"] is True and phases["draft_extend"]["capture"] is True
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runner"]["runner"] == "V1" and data["drafter"]["draft_decode"] == "PIECEWISE"


def test_cli_plan_prints_the_start_up_report_of_the_release(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["plan", "--engine", "vllm", "--platform", "cuda:sm90", "--vllm-version", "0.33.0", "--",
            "--attention-backend", "FLASH_ATTN", "--spec-method", "eagle", "--spec-tokens", "3"]
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # the V1 runner's drafter (vLLM 0.33's default is V2)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "engine: vLLM 0.33.0 (--vllm-version)" in out and "drafter: draft decode PIECEWISE" in out
    table = out[out.index("attnhal graph report (before launch): vLLM 0.33.0 on cuda:sm90"):].splitlines()
    rows = {line.split()[0]: line for line in table[2:]}
    # with speculation the uniform batch is target_verify: no decode row, as the plan runs no decode
    assert set(rows) == {"prefill+decode", "target_verify", "draft_decode", "draft_extend"}
    assert "full" in rows["target_verify"] and "piecewise" in rows["draft_decode"] and "V2 model runner" in rows[
        "draft_decode"]
    assert "  piecewise  " in rows["draft_extend"] and "V2 model runner" in rows["draft_extend"]  # as the plan: eager
    assert main(["plan", "--engine", "vllm", "--json", *argv[3:]]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["release"] == {"version": "0.33.0", "chosen": "--vllm-version"}
    assert data["drafter"]["draft_decode"] == "PIECEWISE" and not data["drafter"]["captures_attention"]
    assert main([*argv[:5], "--vllm-version", "0.2", *argv[7:]]) == 2
    assert "--vllm-version='0.2' (supported: 0.33.0, 0.34.0 and the patch" in capsys.readouterr().err
