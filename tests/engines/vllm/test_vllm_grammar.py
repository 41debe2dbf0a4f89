"""attnhal reads a vLLM command line as vLLM's own ``FlexibleArgumentParser`` does.

Each spelling goes through vLLM's parser (``EngineArgs.add_cli_args``, ``parse_args``,
``EngineArgs.from_cli_args``) and through attnhal's (``attnhal_vllm.parse_cli`` and
``from_engine_args``): both accept or both refuse, and where both accept they agree on the backend,
the requested ``cudagraph_mode`` (an explicit one, else the optimization level's default from vLLM's
own ``OPTIMIZATION_LEVEL_TO_CONFIG``; ``NONE`` under ``--enforce-eager``) and the speculative method
and token count. A flag attnhal does not model is refused by name, never taken as another's value.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import attnhal_vllm
import harness
from attnhal.engines.flags import EngineArgError

EAGLE = json.dumps({"method": "eagle", "num_speculative_tokens": 3, "model": harness.model_dir("mha")})
BASE = ["--attention-backend", "FLASH_ATTN"]
#: (spelling, whether attnhal models every flag in it): the issue's spellings and each flag's forms.
SPELLINGS: list[tuple[list[str], bool]] = [
    ([*BASE, "--max-num-seqs", "16", "-O0"], True),
    ([*BASE, "-O0"], True), ([*BASE, "-O=1"], True), ([*BASE, "-O", "3"], True), ([*BASE, "-O2"], True),
    ([*BASE, "--optimization-level", "1"], True), ([*BASE, "--optimization_level=0"], True),
    ([*BASE, "-cc.cudagraph_mode=PIECEWISE"], True), ([*BASE, "-cc.cudagraph_mode", "FULL"], True),
    ([*BASE, "--compilation-config.cudagraph_mode", "NONE"], True),
    ([*BASE, "--compilation_config.cudagraph_mode=FULL_DECODE_ONLY"], True),
    ([*BASE, "--compilation-config", '{"cudagraph_mode": "full_decode_only"}'], True),
    ([*BASE, "-cc", '{"cudagraph_mode": "Piecewise"}'], True),
    ([*BASE, "-O1", "-cc.cudagraph_mode=FULL"], True),
    ([*BASE, "--enforce-eager", "-O2"], True),
    ([*BASE, "--speculative-config", EAGLE], True), ([*BASE, "-sc", EAGLE], True),
    ([*BASE, "--speculative-config.method", "eagle", "--speculative-config.num_speculative_tokens", "3",
      "--speculative-config.model", harness.model_dir("mha")], True),
    (["--attention_backend", "TRITON_ATTN", "-tp", "2"], True),
    ([*BASE, "--compilation-config", '{"cudagraph_mode": "SOMETIMES"}'], True),
    ([*BASE, "-O", "fast"], True),
    ([*BASE, "--max-num-seqs", "16", "-dcp", "2"], False),
    ([*BASE, "--compilation-config.mode", "3"], False),
]


def _vllm(argv: list[str]) -> dict[str, Any] | str:
    """vLLM's reading, or its refusal's first line."""
    from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG, OptimizationLevel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    try:
        # a local model: EngineArgs resolves its default model on the Hub otherwise
        args = EngineArgs.from_cli_args(parser.parse_args(["--model", harness.model_dir("mha"), *argv]))
    except (SystemExit, ValueError, TypeError, KeyError) as exc:  # KeyError: CUDAGraphMode[name.upper()]
        return f"refused: {type(exc).__name__}"
    mode = getattr(args.compilation_config, "cudagraph_mode", None)
    if mode is None:
        # the parser keeps the level's text; VllmConfig's field makes it an OptimizationLevel
        level = OptimizationLevel(int(args.optimization_level))
        mode = OPTIMIZATION_LEVEL_TO_CONFIG[level]["compilation_config"]["cudagraph_mode"]
    spec = args.speculative_config or {}
    return {"backend": str(args.attention_backend).upper().rsplit(".", 1)[-1],
            "mode": "NONE" if args.enforce_eager else mode.name,
            "method": spec.get("method"), "tokens": spec.get("num_speculative_tokens")}


def _attnhal(argv: list[str]) -> dict[str, Any] | str:
    try:
        config = attnhal_vllm.from_engine_args(attnhal_vllm.parse_cli(argv), "cuda:sm90", version="0.33.0")
    except (EngineArgError, ValueError) as exc:
        return f"refused: {exc}"
    spec = config.spec
    drafts = spec.algorithm.value != "none"
    return {"backend": config.backend.removeprefix("vllm:"), "mode": config.requested.value,
            "method": spec.algorithm.value if drafts else None, "tokens": spec.num_steps if drafts else None}


@pytest.mark.parametrize("argv,modelled", SPELLINGS, ids=[" ".join(a[2:]) or "base" for a, _ in SPELLINGS])
def test_attnhal_reads_each_spelling_as_vllms_parser(argv: list[str], modelled: bool) -> None:
    engine, ours = _vllm(argv), _attnhal(argv)
    if not modelled:  # vLLM takes it; attnhal names the flag it does not model
        assert isinstance(engine, dict) and isinstance(ours, str) and "not modelled" in ours, (engine, ours)
        return
    if isinstance(engine, str) or isinstance(ours, str):
        assert isinstance(engine, str) and isinstance(ours, str), (argv, engine, ours)
        return
    assert ours == engine, (argv, engine, ours)
