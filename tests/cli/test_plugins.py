"""Plugin commands (``attnhal.commands``): offered when they load, explained when they do not."""

import importlib.util
import json
import sys
import types
from importlib.metadata import EntryPoint

import pytest

import attnhal.cli as cli
from attnhal.cli.plugins import GROUP, Command, load_commands


def _hello_arguments(p):
    p.add_argument("--times", type=int, default=1, help="how often")


def _hello(args):
    if args.times < 1:
        raise ValueError(f"--times={args.times} (supported: >= 1)")
    print("hello " * args.times)
    return 0


@pytest.fixture
def plugin_module(monkeypatch):
    """A fake plugin package with a good command, a wrong object, a clash and a missing requirement."""
    module = types.ModuleType("fake_attnhal_plugin")
    module.HELLO = Command("hello", "say hello", _hello_arguments, _hello)
    module.NOT_A_COMMAND = object()
    module.CLASH = Command("plan", "a second plan", _hello_arguments, _hello)
    module.NEEDS = Command("needs", "needs a module", _hello_arguments, _hello, requires=("no_such_module_xyz",))
    monkeypatch.setitem(sys.modules, "fake_attnhal_plugin", module)
    eps = [EntryPoint("hello", "fake_attnhal_plugin:HELLO", GROUP),
           EntryPoint("broken", "fake_attnhal_plugin_that_raises:X", GROUP),
           EntryPoint("odd", "fake_attnhal_plugin:NOT_A_COMMAND", GROUP),
           EntryPoint("plan", "fake_attnhal_plugin:CLASH", GROUP),
           EntryPoint("needs", "fake_attnhal_plugin:NEEDS", GROUP)]
    monkeypatch.setattr(cli, "load_commands", lambda taken: load_commands(taken, lambda: eps))
    return module


def test_load_commands_reports_each_failure(plugin_module):
    commands, unavailable = cli.load_commands(cli.BUILTIN_NAMES)
    assert [c.name for c in commands] == ["hello"]
    why = {u.name: u.reason for u in unavailable}
    assert why["broken"].startswith("load=fake_attnhal_plugin_that_raises:X failed: ModuleNotFoundError")
    assert why["odd"] == "object=object (supported: an attnhal.cli.plugins.Command)"
    assert why["plan"].startswith("name=plan (supported: the entry point's name, not one of")
    assert why["needs"] == "module=no_such_module_xyz (supported: importable; pip install no_such_module_xyz)"


def test_help_lists_exactly_the_working_commands(plugin_module, capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = out.split("options:")[0]
    assert "hello" in listed and "say hello" in listed
    for name in ("broken", "odd", "needs"):
        assert f"    {name} " not in listed
    notes = out.split("plugin commands not available here:")[1]
    assert "broken: load=" in notes and "needs: module=no_such_module_xyz" in notes


def test_plugin_commands_run_behind_the_same_error_boundary(plugin_module, capsys):
    assert cli.main(["hello", "--times", "2"]) == 0
    assert capsys.readouterr().out.strip() == "hello hello"
    assert cli.main(["hello", "--times", "0"]) == 2
    assert capsys.readouterr().err.strip() == "attnhal hello: error: --times=0 (supported: >= 1)"
    assert cli.main(["needs"]) == 2
    assert capsys.readouterr().err.strip() == ("attnhal needs: error: command unavailable here: "
                                               "module=no_such_module_xyz (supported: importable; pip install "
                                               "no_such_module_xyz)")
    assert cli.main(["info", "--platform", "cpu"]) == 0  # the built-ins are unaffected


def test_the_core_imports_no_plugin():
    import ast
    from pathlib import Path

    for path in Path("attnhal").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith(("attnhal_triton", "attnhal_torch")) for n in names), path


def test_installed_compile_check_is_listed_when_triton_imports(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert ("compile-check" in out.split("options:")[0]) == (importlib.util.find_spec("triton") is not None)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_compile_check_command_json(capsys):
    argv = ["compile-check", "--json", "--kernels", "decode_reduce", "--targets", "cuda:80", "hip:gfx942",
            "--dtypes", "float16", "--head-sizes", "64", "--jobs", "1"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    rows = json.loads(capsys.readouterr().out)
    assert {r["target"] for r in rows} == {"cuda:80", "hip:gfx942"} and all(r["ok"] for r in rows)
    assert all(r["registers"] > 0 for r in rows)


@pytest.mark.parametrize("argv, needle", [
    (["compile-check", "--targets", "rocm"], "--targets='rocm' (supported: cuda:ARCH or hip:ARCH"),
    (["compile-check", "--head-sizes", "0"], "--head-sizes=0 (supported: an integer 1..512)"),
    (["compile-check", "--jobs", "1000"], "--jobs=1000"),
    (["compile-check", "--kernels", "nope"], "--kernels"),
])
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_compile_check_bad_input(argv, needle, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnhal compile-check: error: ") and needle in err[0], err


def _counted_arguments(p):
    from attnhal.cli.args import bounded

    p.add_argument("--times", type=bounded(1, 3), default=1, help="how often, %(type)s")


def test_a_plugin_flag_bounded_with_the_public_type(monkeypatch, capsys):
    """A plugin's ``type=bounded(1, 3)`` gets the built-in commands' help and message."""
    module = types.ModuleType("fake_counted_plugin")
    module.COUNTED = Command("counted", "say hello, a bounded number of times", _counted_arguments, _hello)
    monkeypatch.setitem(sys.modules, "fake_counted_plugin", module)
    eps = [EntryPoint("counted", "fake_counted_plugin:COUNTED", GROUP)]
    monkeypatch.setattr(cli, "load_commands", lambda taken: load_commands(taken, lambda: eps))
    assert cli.main(["counted", "--times", "3"]) == 0
    assert capsys.readouterr().out.strip() == "hello hello hello"
    for text, shown in (("4", "4"), ("0", "0"), ("two", "'two'")):
        assert cli.main(["counted", "--times", text]) == 2
        assert capsys.readouterr().err == (f"attnhal counted: error: --times={shown} (supported: an integer 1..3) "
                                           "(see 'attnhal counted --help')\n")
    assert cli.main(["counted", "--help"]) == 0
    assert "how often, 1..3 (default: 1)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_compile_check_flags_use_the_public_bounded_type(capsys):
    from attnhal.cli.args import Bounded

    parser = cli.build_parser(*load_commands(cli.BUILTIN_NAMES))
    sub = next(a for a in parser._actions if a.dest == "command")
    types_ = {a.option_strings[0]: a.type for a in sub.choices["compile-check"]._actions if a.option_strings}
    assert types_["--jobs"] == Bounded(1, 64) and types_["--head-sizes"] == Bounded(1, 512)
    # the plugin's own converter said --jobs=x; the public type quotes text that is no integer
    assert cli.main(["compile-check", "--jobs", "x"]) == 2
    assert capsys.readouterr().err.startswith("attnhal compile-check: error: --jobs='x' (supported: an integer 1..64)")
