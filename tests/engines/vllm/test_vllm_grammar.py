"""attnhal reads a vLLM command line as vLLM's own ``FlexibleArgumentParser`` does.

Each spelling goes through vLLM's ``vllm serve`` parser (``make_arg_parser``, ``parse_args``,
``EngineArgs.from_cli_args``) and through attnhal's (``attnhal_vllm.parse_cli`` and
``from_engine_args``): both accept or both refuse, and where both accept they agree on the backend,
the requested ``cudagraph_mode`` (an explicit one, else the optimization level's default from vLLM's
own ``OPTIMIZATION_LEVEL_TO_CONFIG``; ``NONE`` under ``--enforce-eager``) and the speculative method
and token count. A flag attnhal does not model is refused by name, never taken as another's value.

Abbreviations: the recorded option strings (``attnhal_vllm.options``) are the parser's; every prefix
of every long option is looked up by argparse (``_parse_optional``: the option, ambiguous, or none)
and by :func:`attnhal_vllm.grammar.full_name`, and they agree. ``ATTNHAL_RECORD=1`` rewrites the
recorded options of the installed release.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any

import pytest

import attnhal_vllm
import harness
from attnhal.engines.flags import EngineArgError
from attnhal_vllm import FLAGS, HARMLESS
from attnhal_vllm.grammar import full_name
from attnhal_vllm.options import OPTIONS
from tier_summary import LINES as SUMMARY

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
    # argparse's prefixes (allow_abbrev on), after vLLM's underscore rewrite
    (["--attention-back", "FLASH_ATTN"], True), (["--attention_back=TRITON_ATTN"], True),
    ([*BASE, "--enforce", "-O2"], True), ([*BASE, "--compilation-c.cudagraph_mode", "NONE"], True),
    ([*BASE, "--speculative-c", EAGLE], True), ([*BASE, "--optimization-lev", "1"], True),
    ([*BASE, "--max-num", "16"], True), ([*BASE, "--attention", "FLASH_ATTN"], True),
    ([*BASE, "--spec-me", "eagle", "--spec-to", "3", "--spec-mod", harness.model_dir("mha")], True),
    ([*BASE, "--spec-method", "eagle", "--speculative-config", EAGLE], True),  # vLLM: mutually exclusive
]


def _serve_parser() -> Any:
    """``vllm serve``'s parser (its model is a positional ``model_tag`` added by the subcommand; the
    tests give ``--model``, which the parser keeps)."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def _vllm(argv: list[str]) -> dict[str, Any] | str:
    """vLLM's reading, or its refusal's first line."""
    from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG, OptimizationLevel
    from vllm.engine.arg_utils import EngineArgs

    parser = _serve_parser()
    try:
        # a local model: EngineArgs resolves its default model on the Hub otherwise
        args = EngineArgs.from_cli_args(parser.parse_args(["--model", harness.model_dir("mha"), *argv]))
    except (SystemExit, ValueError, TypeError, KeyError, AttributeError) as exc:  # KeyError: CUDAGraphMode[name.upper()]
        return f"refused: {type(exc).__name__}"
    mode = getattr(args.compilation_config, "cudagraph_mode", None)
    if mode is None:
        # the parser keeps the level's text; VllmConfig's field makes it an OptimizationLevel
        level = OptimizationLevel(int(args.optimization_level))
        mode = OPTIMIZATION_LEVEL_TO_CONFIG[level]["compilation_config"]["cudagraph_mode"]
    spec = dict(args.speculative_config or {})
    # EngineArgs.create_speculative_config (engine/arg_utils.py:2100-2120) merges --spec-* into it
    for key, value in (("method", args.spec_method), ("num_speculative_tokens", args.spec_tokens)):
        if value is not None:
            if key in spec:
                return "refused: ValueError (mutually exclusive)"
            spec[key] = value
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


def test_the_recorded_options_are_the_parsers() -> None:
    """``attnhal_vllm.options`` holds this release's ``vllm serve`` option strings."""
    found = frozenset(_serve_parser()._option_string_actions)
    if os.environ.get("ATTNHAL_RECORD") == "1":
        import vllm_options

        vllm_options.update(harness.release(), found)
        return
    assert OPTIONS[harness.release()] == found, sorted(found ^ OPTIONS[harness.release()])[:20]


def _argparse(parser: Any, spelling: str) -> str | None:
    """The option argparse takes ``spelling`` for (None: none, or ambiguous)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            found = parser._parse_optional(spelling)
        except SystemExit:  # ambiguous
            return None
    action = found[0] if isinstance(found, tuple) else (found[0][0] if found else None)
    return None if action is None else action.option_strings[-1] if spelling not in action.option_strings \
        else spelling


def test_every_prefix_of_every_option_is_read_as_argparse_reads_it() -> None:
    """Each prefix (3 characters on) of each long option, with and without ``=value``: argparse's
    option, or its refusal, is attnhal's; where the releases differ attnhal refuses, which is allowed
    only for options it neither models nor ignores as harmless (it refuses those by name anyway)."""
    parser = _serve_parser()
    read = {o for o in OPTIONS[harness.release()] if o.startswith("--")}
    mine = {"--" + n.replace("_", "-") for n in (*FLAGS, *HARMLESS)}
    spellings = sorted({o[:n] for o in read for n in range(3, len(o) + 1)})
    differ = 0
    for spelling in spellings:
        for written in (spelling, spelling + "=1"):
            engine = _argparse(parser, written)
            try:
                ours: str | None = full_name(spelling)
            except EngineArgError as exc:
                ours = None
                if "read differently" in str(exc):
                    differ += 1
                    assert engine not in mine, (written, engine)
                    continue
            if ours is not None and ours not in read:
                ours = None  # a name of no option: attnhal refuses it later, as vLLM does
            engine_action = parser._option_string_actions.get(engine) if engine else None
            ours_action = parser._option_string_actions.get(ours) if ours else None
            assert engine_action is ours_action, (written, engine, ours)
    SUMMARY.append(f"option prefixes: {len(spellings)} spellings x 2 forms read as argparse reads them; "
                   f"{differ} refused as read differently by the releases (none of them an option attnhal reads)")


def test_every_advice_flag_set_over_the_recorded_grid_parses_with_vllms_parser() -> None:
    """``attnhal advise --engine vllm`` over the user configurations of the recorded grid
    (``vllm_recording.load``: the recording of the installed release): every flag set it prints (the user's and each
    recommendation, ``Option.argv()``) goes through ``vllm serve``'s parser and ``EngineArgs.from_cli_args``
    and reads back the backend, the cudagraph mode and the speculative method and tokens attnhal meant."""
    import vllm_recording
    from vllm.engine.arg_utils import EngineArgs

    from attnhal.engines import advise

    parser = _serve_parser()
    users = {(c.backend, c.model, c.spec, c.mode, c.platform) for c in vllm_recording.load(harness.release())}
    bad: list[str] = []
    parsed = 0
    for backend, model, spec, mode, platform in sorted(users, key=str):
        flags: dict[str, Any] = {"attention_backend": backend}
        if mode is not None:
            flags["compilation_config"] = json.dumps({"cudagraph_mode": mode})
        if spec is not None:
            flags.update(spec_method=spec, spec_tokens="3", **({"spec_model": "M"} if spec != "ngram" else {}))
        advice = advise("vllm", flags, platform, model, top=5, trtllm_cubins=False)
        for option in (advice.current, *advice.recommended):
            parsed += 1
            try:
                args = EngineArgs.from_cli_args(parser.parse_args(["--model", harness.model_dir("mha"),
                                                                   *option.argv()]))
            except SystemExit:
                bad.append(f"{option.command()}: refused")
                continue
            cudagraph = getattr(args.compilation_config, "cudagraph_mode", None)
            read = (str(args.attention_backend).rsplit(".", 1)[-1].upper(), args.spec_method, args.spec_tokens,
                    getattr(cudagraph, "name", cudagraph))
            meant = (option.flags["attention_backend"].upper(), spec, 3 if spec else None, mode)
            if read != meant:
                bad.append(f"{option.command()}: vLLM read {read}, attnhal meant {meant}")
    SUMMARY.append(f"advice over the recorded grid: {parsed} flag sets ({len(users)} user configurations) "
                   f"parsed by vLLM's parser; refused or misread: {len(bad)}")
    assert not bad, f"{len(bad)}:\n" + "\n".join(bad[:8])
