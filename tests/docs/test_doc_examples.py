"""Every ``attnhal`` console example in README.md and docs/*.md runs and prints what it shows.

Doctest-style: in a ```console block, ``$ attnhal ...`` is run in-process and its output
(stdout then stderr) compared with the lines below it. ``...`` alone on a line stands for
any number of lines; ``...`` inside a line for any text. An example with no lines below
it must run as a valid command (exit 0 or 1, never 2 or 3); one that shows an error must
exit 2. A command
continued with a trailing backslash is joined. Commands other than ``attnhal`` (``pytest``,
``pip``) are not run here.
"""

import re
import shlex

import pytest

from attnhal.cli import main
from repo import ROOT

FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples():
    for path in FILES:
        for block in re.findall(r"```console\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            command, expected = None, []
            for line in re.sub(r"\\\n\s*", "", block).splitlines():  # join continued lines
                if line.startswith("$ "):
                    if command:
                        yield path, command, expected
                    command, expected = line[2:], []
                elif command:
                    expected.append(line.rstrip())
            if command:
                yield path, command, expected


CASES = [(p, c, e) for p, c, e in examples() if c.startswith("attnhal ")]


def pattern(expected):
    parts = []
    for line in expected:
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(r"[^\n]*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def test_there_are_examples_to_run():
    assert len(CASES) >= 8


@pytest.mark.parametrize("path, command, expected", CASES,
                         ids=[f"{p.name}:{c[8:40]}" for p, c, _ in CASES])
def test_console_example(path, command, expected, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command.split(" #")[0])[1:]
    code = main(argv)
    out = capsys.readouterr()
    shows_error = any(": error: " in line for line in expected)
    # Progress on stderr (a first native build) is not part of the example unless it shows an error.
    text = "".join(line.rstrip() + "\n" for line in (out.out + (out.err if shows_error else "")).splitlines())
    assert code in ((2,) if shows_error else (0, 1)), f"{path.name}: `{command}` exited {code}:\n{out.err}"
    if expected:
        assert pattern(expected).fullmatch(text), \
            f"{path.name}: `{command}` printed\n{text}\nexpected\n" + "\n".join(expected)
