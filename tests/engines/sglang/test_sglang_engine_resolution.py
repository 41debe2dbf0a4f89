"""``--engine-resolution engine`` against ``builtin`` over the grid: attnhal's adapter fed by
SGLang 0.5.23's own ``ServerArgs`` resolution (``attnhal_sglang.executed``)
must plan what the built-in resolution plans, cell by cell, on each emulated platform; where
SGLang refuses, the engine resolution raises SGLang's refusal."""

from __future__ import annotations

import collections
import itertools

import harness
import platforms
import pytest
import sglang_grid as grid
from tier_summary import LINES as SUMMARY

import attnhal_sglang as sglang
from attnhal_sglang import executed


def _outcome(config: sglang.SglangConfig, platform: str) -> tuple[object, ...]:
    plan = config.plan(platform)
    return (config.page_size(platform).value, dict(config.roles), config.spec, plan.valid,
            frozenset(plan.captured))


def test_engine_resolution_plans_as_the_builtin_one_over_the_grid() -> None:
    cases = sorted(grid.all_cases(), key=lambda c: c.platform)
    counts: collections.Counter[str] = collections.Counter()
    differ = []
    for platform, group in itertools.groupby(cases, key=lambda c: c.platform):
        with platforms.emulate(platform):
            for case in group:
                args = {**case.args(), "model_path": harness.model_dir(case.model)}
                try:
                    engine = executed.from_engine(args, model=case.model, platform=platform)
                except executed.EngineRefused as exc:
                    counts["SGLang refuses"] += 1
                    assert str(exc).startswith("sglang: SGLang's own resolution refuses these flags: "), exc
                    continue
                builtin = sglang.from_server_args(case.args(), model=case.model, platform=platform)
                if _outcome(engine, platform) != _outcome(builtin, platform):
                    differ.append(f"{case}: engine {_outcome(engine, platform)}, builtin {_outcome(builtin, platform)}")
                counts["same plan"] += 1
                assert engine.resolved_by == "engine"
    SUMMARY.append(f"engine vs builtin resolution: {len(cases)} cases, " + ", ".join(
        f"{k} {n}" for k, n in sorted(counts.items())) + f", differ {len(differ)}")
    assert not differ, f"{len(differ)} cases:\n" + "\n".join(differ[:5])
    assert counts["same plan"] > 1000


def test_engine_resolution_says_the_page_size_sglang_set() -> None:
    args = {"attention_backend": "trtllm_mla", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "model_path": harness.model_dir("mla")}
    with platforms.emulate("cuda:sm100"):
        config = executed.from_engine(args, model="mla", platform="cuda:sm100")
    page = config.page_size("cuda:sm100")
    assert (page.value, page.given, page.set_by) == (64, None, "trtllm_mla")
    assert page.note == "set by SGLang for trtllm_mla" and config.plan("cuda:sm100").valid


def test_engine_resolution_fills_what_sglang_picks_and_the_builtin_cannot() -> None:
    """No --speculative-num-steps: SGLang picks steps, topk and draft tokens per model; the
    built-in resolution refuses (it does not model that choice)."""
    args = {"attention_backend": "fa3", "speculative_algorithm": "EAGLE", "model_path": harness.model_dir("mha")}
    with pytest.raises(sglang.EngineArgError, match="--speculative-num-steps"):
        sglang.from_server_args(args, model="mha")
    with platforms.emulate("cuda:sm90"):
        config = executed.from_engine(args, model="mha", platform="cuda:sm90")
    assert config.spec.speculative and config.spec.num_steps >= 1 and config.plan("cuda:sm90").valid


def test_engine_resolution_says_sglang_picked_the_attention_backend() -> None:
    """No --attention-backend: SGLang's own pick (the DeepSeek override on SM100), said in a note,
    and the page size its backend sets named as in the built-in resolution."""
    args = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "model_path": harness.model_dir("mla")}
    with platforms.emulate("cuda:sm100"):
        config = executed.from_engine(args, model="mla", platform="cuda:sm100")
    assert config.roles["decode"] == "trtllm_mla"
    assert "attention backend: trtllm_mla (set by SGLang's own resolution)" in config.notes
    page = config.page_size("cuda:sm100")
    assert (page.value, page.set_by) == (64, "trtllm_mla")


def test_engine_resolution_takes_the_model_kind_from_the_model_config() -> None:
    """``--model-config`` without ``--model``: the engine resolution plans the kind the config gives
    (it dropped the config: no kind, so no MLA check), and its checkpoint line says SGLang read it."""
    from attnhal.engines.model_config import read

    args = {"attention_backend": "trtllm_mla", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "model_path": harness.model_dir("mla")}
    with platforms.emulate("cuda:sm100"):
        by_kind = executed.from_engine(args, model="mla", platform="cuda:sm100")
        by_config = executed.from_engine(args, platform="cuda:sm100",
                                         model_config=read(f"{harness.model_dir('mla')}/config.json"))
    assert by_config.context == by_kind.context and by_config.context.model is not None
    assert _outcome(by_config, "cuda:sm100") == _outcome(by_kind, "cuda:sm100")
    (line,) = [line for line in by_config.ignored_lines() if line.startswith("not read: --model-path")]
    assert "SGLang's own resolution, for the backend and page size, read it; the plan takes it as mla)" in line
