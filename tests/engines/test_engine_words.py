"""An engine's words in, the same words out: flags keep the user's spelling in errors (named
once), a positional model argument is taken where the engine has one, and advice prints a flag
list the engine's own parser takes back."""

from __future__ import annotations

import pytest

import attnhal_sglang as sglang
import attnhal_vllm as vllm
from attnhal.engines import advise
from attnhal.engines.advice import Option


def test_an_error_names_the_flag_as_the_user_typed_it_once() -> None:
    # SGLang 0.5.23's parser refuses underscores: attnhal_sglang.grammar refuses them as it does,
    # naming the flag as typed (its ambiguous prefixes: test_sglang_grammar_rules.py).
    for argv, flag, said in ((["--cuda_graph_max_bs_decode", "0"], "--cuda_graph_max_bs_decode",
                              " is not an option of SGLang's server"),
                             (["--cuda-graph-max-bs-decode", "0"], "--cuda-graph-max-bs-decode",
                              "='0' (supported: an integer"),
                             (["--no_such_flag", "1"], "--no_such_flag", " is not an option of SGLang's server")):
        with pytest.raises(sglang.EngineArgError) as caught:
            sglang.from_server_args(sglang.parse_cli(argv))
        assert str(caught.value).startswith(flag + said) and str(caught.value).count(flag) == 1


def test_vllm_takes_its_positional_model_and_sglang_refuses_one() -> None:
    parsed = vllm.parse_cli(["meta-llama/Llama-3.1-8B", "--attention-backend", "FLASH_ATTN"])
    assert parsed == {"model": "meta-llama/Llama-3.1-8B", "attention_backend": "FLASH_ATTN"}
    assert "model" in vllm.from_engine_args(parsed, "cuda:sm90").ignored
    with pytest.raises(vllm.EngineArgError, match=r"'x' \(supported: flags written --name value, after one MODEL\)"):
        vllm.parse_cli(["m", "x"])
    with pytest.raises(sglang.EngineArgError, match=r"'m' \(supported: flags written --name value\)"):
        sglang.parse_cli(["m", "--attention-backend", "triton"])


def test_advice_prints_a_flag_list_the_engines_parser_takes_back() -> None:
    flags = {"attention_backend": "FLASH_ATTN", "speculative_config": {"method": "eagle", "num_speculative_tokens": 3},
             "enforce_eager": True}
    option = Option(flags=flags, label="FLASH_ATTN")
    assert option.command() == ("--attention-backend FLASH_ATTN --speculative-config "
                                "'{\"method\":\"eagle\",\"num_speculative_tokens\":3}' --enforce-eager")
    again, given = (vllm.from_engine_args(f, "cuda:sm90") for f in (vllm.parse_cli(option.argv()), flags))
    assert (again.backend, again.spec, again.requested) == (given.backend, given.spec, given.requested)
    advice = advise("sglang", {"attention_backend": "triton", "speculative_algorithm": "EAGLE",
                               "speculative_num_steps": 2}, "cuda:sm90", "mha", top=3)
    for option in (advice.current, *advice.recommended):
        again = sglang.parse_cli(option.argv())
        assert sglang.from_server_args(again, model="mha").values == \
            sglang.from_server_args(option.flags, model="mha").values, option.command()
