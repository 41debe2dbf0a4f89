"""Every ``attnhal`` console example in README.md and docs/*.md runs and prints what it shows.

Doctest-style: in a ```console block, ``$ attnhal ...`` is run in-process and its output
(stdout then stderr) compared with the lines below it. ``...`` alone on a line stands for
any number of lines; ``...`` inside a line for any text. An example with no lines below
it must run as a valid command (exit 0, 1 or 4 — `plan --engine`'s "the engine runs otherwise",
never 2 or 3); one that shows an error must
exit 2. A command
continued with a trailing backslash is joined. Commands other than ``attnhal`` (``pytest``,
``pip``) are not run here.
"""

import ast
import re
import shlex
import textwrap

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
    assert code in ((2,) if shows_error else (0, 1, 4)), f"{path.name}: `{command}` exited {code}:\n{out.err}"
    if expected:
        assert pattern(expected).fullmatch(text), \
            f"{path.name}: `{command}` printed\n{text}\nexpected\n" + "\n".join(expected)


# --- python examples: every module and attnhal name they use is imported ----------------------------

#: Names the snippets use for objects the text around them describes, although a module of that
#: name exists (``platform``: the Platform at hand, and a standard-library module).
CONTEXT_NAMES = {"platform"}
PY_BLOCKS = [(p, b) for p in FILES for b in re.findall(r"```python\n(.*?)```", p.read_text(encoding="utf-8"), re.S)]


def _bound(tree):
    """Names a block binds: imports, assignments, definitions, arguments, handlers, builtins."""
    import builtins

    names = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def missing_imports(block):
    """Names ``block`` uses without importing that name a module (``os``, ``torch``) or a name
    ``attnhal`` exports (``Phase``); None when the block is not Python (a signature listing).

    A snippet may lean on objects the text around it describes (``backend``, ``pool``), but
    a reader who pastes it must not hit a NameError on an import the snippet left out."""
    import importlib.util

    import attnhal

    try:
        tree = ast.parse(textwrap.dedent(block))
    except SyntaxError:
        return None
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    free = used - _bound(tree) - CONTEXT_NAMES
    return sorted(n for n in free if n in attnhal.__all__ or importlib.util.find_spec(n) is not None)


def test_missing_imports_finds_an_unimported_module():
    assert missing_imports("import attnhal_sglang as sglang\nconfig = sglang.x(env=os.environ)\n") == ["os"]
    assert missing_imports("import os\nprint(os.environ, backend, Phase.DECODE)\n") == ["Phase"]
    assert missing_imports("def forward(self) -> Tensor\n") is None


@pytest.mark.parametrize("path, block", PY_BLOCKS, ids=[f"{p.name}:{b[:30]}" for p, b in PY_BLOCKS])
def test_python_example_imports_what_it_uses(path, block):
    assert missing_imports(block) in ([], None), f"{path.name}: a python example uses names it does not import"


def test_most_python_examples_are_checked():
    assert sum(missing_imports(b) is not None for _, b in PY_BLOCKS) >= 10
