"""SGLang's command line read as its argparse parser reads it (``attnhal_sglang.grammar``): the
recorded option strings, prefixes, ambiguity and underscores. The SGLang tier checks the same
spellings through SGLang's own parser (``sglang/test_sglang_grammar.py``)."""

from __future__ import annotations

import pytest

from attnhal.engines.flags import EngineArgError
from attnhal_sglang import parse_cli


@pytest.mark.parametrize("argv,values", [
    (["--attention-back", "triton"], {"attention_backend": "triton"}),
    (["--attention-backend=triton", "--speculative-algo", "EAGLE"],
     {"attention_backend": "triton", "speculative_algorithm": "EAGLE"}),
    (["--disable-cuda-graph"], {"disable_cuda_graph": True}),  # an exact option wins over longer ones
])
def test_prefixes_argparse_takes(argv: list[str], values: dict[str, object]) -> None:
    assert parse_cli(argv) == values


@pytest.mark.parametrize("argv,flag,says", [
    (["--cuda-graph-max-bs", "8"], "--cuda-graph-max-bs", "ambiguous"),
    (["--attention_backend", "triton"], "--attention_backend", "SGLang spells it --attention-backend"),
    (["--no-such-flag", "1"], "--no-such-flag", "not an option of SGLang's server"),
])
def test_spellings_sglangs_parser_refuses_are_refused_by_name(argv: list[str], flag: str, says: str) -> None:
    with pytest.raises(EngineArgError) as refused:
        parse_cli(argv)
    assert refused.value.flag == flag and says in str(refused.value)
