"""vLLM's command-line rewriting as attnhal applies it (``attnhal_vllm.grammar``); the vLLM tier
checks the same spellings against vLLM's own parser (``vllm/test_vllm_grammar.py``)."""

from __future__ import annotations

import pytest

from attnhal.engines.flags import EngineArgError
from attnhal_vllm import from_engine_args, parse_cli
from attnhal_vllm.grammar import rewrite


@pytest.mark.parametrize("argv,rewritten", [
    (["--max-num-seqs", "16", "-O0"], ["--max-num-seqs", "16", "--optimization-level", "0"]),
    (["-O=1"], ["--optimization-level", "1"]), (["-O", "3"], ["--optimization-level", "3"]),
    (["-cc.cudagraph_mode=PIECEWISE"], ["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}']),
    (["--compilation_config.cudagraph_mode", "NONE", "--attention_backend=X"],
     ["--attention-backend=X", "--compilation-config", '{"cudagraph_mode": "NONE"}']),
    (["--speculative-config.num_speculative_tokens", "3", "-sc.method", "eagle"],
     ["--speculative-config", '{"num_speculative_tokens": 3, "method": "eagle"}']),
    (["-tp", "2", "--seed", "-1"], ["--tensor-parallel-size", "2", "--seed", "-1"]),
])
def test_vllms_rewriting(argv: list[str], rewritten: list[str]) -> None:
    assert rewrite(argv) == rewritten


@pytest.mark.parametrize("argv,mode", [
    (["-O0"], "NONE"), (["-O1"], "PIECEWISE"), (["-O3"], "FULL_AND_PIECEWISE"), ([], "FULL_AND_PIECEWISE"),
    (["-O1", "-cc.cudagraph_mode=full"], "FULL"), (["--compilation-config", '{"cudagraph_mode": "full_decode_only"}'],
                                                   "FULL_DECODE_ONLY"), (["-O3", "--enforce-eager"], "NONE"),
])
def test_the_requested_mode_follows_the_level_and_an_explicit_mode_wins(argv: list[str], mode: str) -> None:
    config = from_engine_args(parse_cli(["--attention-backend", "FLASH_ATTN", *argv]), "cuda:sm90", version="0.34.0")
    assert config.requested.value == mode


@pytest.mark.parametrize("argv,flag", [
    (["--max-num-seqs", "16", "-dcp", "2"], "-dcp"), (["-O", "fast"], "-O"), (["-x"], "-x"),
    (["--compilation-config.mode", "3"], "--compilation-config.mode"), (["-O7"], "--optimization-level"),
])
def test_a_flag_attnhal_does_not_model_is_named_never_swallowed(argv: list[str], flag: str) -> None:
    with pytest.raises(EngineArgError) as refused:
        from_engine_args(parse_cli(["--attention-backend", "FLASH_ATTN", *argv]), "cuda:sm90", version="0.34.0")
    assert refused.value.flag == flag, refused.value


def test_the_documented_speculative_config_form_plans() -> None:
    argv = ["--attention-backend", "FLASH_ATTN", "--speculative-config",
            '{"method": "eagle", "num_speculative_tokens": 3, "model": "M"}']
    config = from_engine_args(parse_cli(argv), "cuda:sm90", version="0.34.0")
    assert config.spec.algorithm.value == "eagle" and config.spec.num_steps == 3
