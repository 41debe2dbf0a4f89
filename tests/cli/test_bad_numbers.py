"""Every numeric flag of every command, and every environment variable the kit reads, refuses
``inf``, ``nan``, ``-1``, ``0``, ``1e308``, a huge integer and text with exit 2 naming it.

Generated from the parsers: a flag added to any command (plugin commands included) is
covered without editing this file. A value the flag's own bounds allow (``0`` for
``--examples``) is skipped, read from the same bound objects the flag is declared with.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator

import pytest

from attnhal.cli import BUILTIN_NAMES, build_parser, main
from attnhal.cli.args import Bounded, IntList, Real
from attnhal.cli.plugins import load_commands
from attnhal.testing.settings import ENV_FLAGS

BAD = ("inf", "nan", "-1", "0", "1e308", str(10 ** 30), "text")
NUMERIC = (Bounded, Real, IntList)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _numeric_flags() -> list[tuple[tuple[str, ...], str, object]]:
    out = []
    for command, sub in _commands(build_parser(load_commands(BUILTIN_NAMES)[0])):
        for action in sub._actions:
            if action.option_strings and (isinstance(action.type, NUMERIC) or action.type in (int, float)):
                out.append((command, action.option_strings[-1], action.type))
    return out


FLAGS = _numeric_flags()


def _allowed(kind: object, text: str) -> bool:
    """Whether the flag's own bounds allow ``text`` (then it is not a bad value for this flag)."""
    try:
        value = float(text)
    except ValueError:
        return False
    if isinstance(kind, Real):
        return math.isfinite(value) and kind.bound.low <= value <= kind.bound.high
    item = kind.item if isinstance(kind, IntList) else kind
    assert isinstance(item, Bounded)
    return value.is_integer() and item.low <= value <= item.high


def test_the_generated_cases_cover_the_numeric_flags_of_every_command() -> None:
    commands = {c[0] for c, _, _ in FLAGS}
    assert {"plan", "explain", "conformance", "demo"} <= commands
    assert ("conformance", "--budget") in {(c[0], f) for c, f, _ in FLAGS}


@pytest.mark.parametrize("command, flag, kind", FLAGS, ids=[f"{' '.join(c)} {f}" for c, f, _ in FLAGS])
def test_every_numeric_flag_refuses_bad_values_naming_itself(command, flag, kind, capsys) -> None:
    assert kind not in (int, float), f"{flag} of {' '.join(command)}: a bare {kind} has no bounds (use attnhal.cli.args)"
    for text in BAD:
        if _allowed(kind, text):
            continue
        assert main([*command, f"{flag}={text}"]) == 2, (flag, text)
        err = capsys.readouterr().err
        assert flag in err and "supported" in err and "Traceback" not in err, err


@pytest.mark.parametrize("variable", sorted(ENV_FLAGS))
def test_every_environment_variable_of_the_kit_refuses_what_its_flag_refuses(variable, monkeypatch, capsys) -> None:
    flag, bound = ENV_FLAGS[variable]
    for text in BAD:
        if _allowed(Bounded(bound.low, bound.high), text):
            continue
        monkeypatch.setenv(variable, text)
        assert main(["conformance", "torch", "--platform", "cpu"]) == 2, text
        err = capsys.readouterr().err
        assert variable in err and f"as {flag}" in err and str(bound) in err, err


#: Ways code has read a field back out of an error's text: ``str(exc).split("=")[0]``, an
#: adapter's ``message.partition("=")``, argparse's ``argument FLAG: TEXT`` matched by a regex,
#: a test for ``"(supported: " in text``, and the former helper that did it, ``flag_message``.
MESSAGE_PARSING = (
    re.compile(r"str\(\w+\)\.(split|partition|rpartition)\(\s*[\"'][=:(]"),
    re.compile(r"\b(message|msg|err|error|exc)\.(split|partition|rpartition)\(\s*[\"'][=:(]"),
    re.compile(r"[\"']argument \(\?P<"),
    re.compile(r"[\"']\(supported: [\"']\s+(not\s+)?in\b"),
    re.compile(r"\bflag_message\b"),
)


def message_parsing(source: str) -> list[str]:
    """The lines of ``source`` that read structure back out of an error message."""
    return [line.strip() for line in source.splitlines() if any(p.search(line) for p in MESSAGE_PARSING)]


def test_the_message_parsing_scan_catches_each_planted_form() -> None:
    planted = ['field = str(exc).split("=")[0]', 'name, eq, rest = message.partition("=")',
               '_ARGUMENT = re.compile(r"argument (?P<flag>[^:]+): (?P<text>.*)")',
               'if "(supported: " in text:', "message = flag_message(message)"]
    assert [message_parsing(line) for line in planted] == [[line] for line in planted]
    assert message_parsing('name, eq, value = argv[i].partition("=")') == []  # argv is input, not a message


def test_errors_name_their_flag_from_the_table_never_from_the_message() -> None:
    """An API error carries its field (``InvalidValue.field``), a refused argument its value
    (``BadArgument``); the CLI and the engine adapters map the field to a flag through a table
    declared beside the flags. Nothing in attnhal or the backends reads a field back out of a
    message, and every field the plan inputs can refuse has its flag."""
    import dataclasses

    from attnhal.cli.inputs import FLAG_OF
    from attnhal.spec import RequestContext, SpecConfig
    from repo import ROOT

    offenders = [f"{p.relative_to(ROOT)}: {line}" for tree in ("attnhal", "backends")
                 for p in (ROOT / tree).rglob("*.py") if "tests" not in p.parts
                 for line in message_parsing(p.read_text())]
    assert offenders == []
    fields = {f.name for f in dataclasses.fields(SpecConfig)} | {f.name for f in dataclasses.fields(RequestContext)}
    fields |= {"max_batch_size", "step_counts", "max_tokens", "phase"}
    assert fields <= set(FLAG_OF)
    declared = {a.option_strings[-1] for cmd in ("plan", "explain") for a in _parser_of(cmd)._actions if a.option_strings}
    assert set(FLAG_OF.values()) <= declared


def _parser_of(command: str) -> argparse.ArgumentParser:
    return dict(_commands(build_parser()))[(command,)]
