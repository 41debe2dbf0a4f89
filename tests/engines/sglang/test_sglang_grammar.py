"""attnhal reads an SGLang command line as SGLang's own parser does.

SGLang's server parser (``ServerArgs.add_cli_args`` on an ``argparse.ArgumentParser``) is asked,
for every spelling of the grid, which option it takes it for (argparse's own lookup, prefixes and
ambiguity included) and attnhal's :func:`attnhal_sglang.grammar.full_name` is asked the same: both
refuse, or both take the same option and attnhal stores it under SGLang's ``dest``. The grid: every
option string, its underscore spelling, each of its prefixes, each with ``=value``. The issue's
command lines go through ``parse_args`` whole. ``ATTNHAL_RECORD=1`` rewrites the recorded options.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import textwrap
from pathlib import Path

import pytest

import harness
from attnhal.engines.flags import EngineArgError
from attnhal_sglang import options
from attnhal_sglang.grammar import full_name
from tier_summary import LINES as SUMMARY


def _parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


PARSER = _parser()


def _sglang(spelling: str) -> str | None:
    """The ``dest`` SGLang's parser takes ``spelling`` for (None: it refuses it)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            found = PARSER._parse_optional(spelling)
        except SystemExit:  # ambiguous: argparse's error
            return None
    if found is None or (found[0] if isinstance(found, tuple) else found[0][0]) is None:
        return None
    action = found[0] if isinstance(found, tuple) else found[0][0]
    return str(action.dest)


def _attnhal(spelling: str) -> str | None:
    name, _, _ = spelling.partition("=")
    try:
        return options.dest(full_name(name))
    except EngineArgError:
        return None


def _spellings() -> list[str]:
    out = set()
    for option in sorted(options.OPTIONS):
        out.add(option)
        out.add("--" + option[2:].replace("-", "_"))
        out.update(option[:n] for n in range(5, len(option)))
    return sorted(out | {f"{s}=1" for s in out})


def test_the_recorded_options_are_sglangs() -> None:
    import os

    dests = {o: a.dest for a in PARSER._actions for o in a.option_strings if o.startswith("--")}
    renamed = {o: d for o, d in sorted(dests.items()) if d != o[2:].replace("-", "_")}
    if os.environ.get("ATTNHAL_RECORD") == "1":
        path = Path(options.__file__)
        text = path.read_text(encoding="utf-8")
        head = text[:text.index('OPTIONS = frozenset("""')]
        tail = text[text.index("\n\ndef dest("):]
        body = textwrap.fill(" ".join(sorted(dests)), 110, break_on_hyphens=False, break_long_words=False)
        table = "".join(f'\n    "{o}": "{d}",' for o, d in renamed.items())
        path.write_text(f'{head}OPTIONS = frozenset("""\n{body}\n""".split())\n\n#: The options whose ``dest`` is '
                        f'not their name with underscores (aliases and renamed fields).\nRENAMED: dict[str, str] = '
                        f'{{{table}\n}}{tail}', encoding="utf-8")
    assert set(dests) == options.OPTIONS and renamed == options.RENAMED


def test_every_spelling_is_read_as_sglangs_parser_reads_it() -> None:
    spellings = _spellings()
    differ = [(s, _sglang(s), _attnhal(s)) for s in spellings if _sglang(s) != _attnhal(s)]
    refused = sum(_sglang(s) is None for s in spellings)
    SUMMARY.append(f"SGLang grammar: {len(spellings)} spellings through SGLang's parser and attnhal's, "
                   f"{refused} refused by both, {len(differ)} differ")
    assert not differ, differ[:10]


@pytest.mark.parametrize("argv,accepted", [
    (["--attention-back", "triton"], True),
    (["--cuda-graph-max-bs", "8"], False),
    (["--attention_backend", "triton"], False),
    (["--attention-backend=triton", "--speculative-algo", "EAGLE"], True),
])
def test_the_issues_command_lines(argv: list[str], accepted: bool) -> None:
    from attnhal_sglang import parse_cli

    with contextlib.redirect_stderr(io.StringIO()):
        try:
            PARSER.parse_args(["--model-path", harness.model_dir("mha"), *argv])
            engine = True
        except SystemExit:
            engine = False
    try:
        parse_cli(argv)
        ours = True
    except EngineArgError:
        ours = False
    assert engine is ours is accepted
