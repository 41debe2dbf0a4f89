"""The CLI's layout and its engine side: one table of commands, ``--engine`` checks, the adapter packages."""

import ast
import subprocess
import sys

import pytest

import attnhal.cli as cli
from attnhal.cli import app
from repo import ROOT

AITER = ["--", "--attention-backend", "aiter", "--platform", "hip:gfx942"]


def _commands(parser):
    return next(a for a in parser._actions if a.dest == "command").choices


def test_one_table_lists_every_builtin_command_in_help_order():
    parsers = _commands(cli.build_parser())
    assert list(parsers) == list(cli.BUILTIN) == list(cli.BUILTIN_NAMES)
    assert all(p.prog == f"attnhal {name}" for name, p in parsers.items())


def test_plan_and_explain_carry_their_own_parser():
    parser = cli.build_parser()
    for name in ("plan", "explain"):
        args = parser.parse_args([name])
        assert args.parser is _commands(parser)[name] and args.parser.get_default("max_bs") == 32


@pytest.mark.parametrize("flags, mixed", [
    (["--topk", "2"], "--topk"),
    (["--max-bs", "8"], "--max-bs"),
    (["--no-graph-phase", "decode"], "--no-graph-phase"),
    (["--speculative-attention-mode", "decode"], "--speculative-attention-mode"),
])
def test_an_attnhal_flag_beside_engine_is_refused_without_a_second_parser(flags, mixed, monkeypatch, capsys):
    args = cli.build_parser().parse_args(["plan", "--engine", "sglang", *flags, *AITER])
    args.argv, args.registry = [], None

    def no_parser(*_a, **_k):
        raise AssertionError("the --engine check built a parser")
    monkeypatch.setattr(app, "root_parser", no_parser)
    monkeypatch.setattr(cli, "build_parser", no_parser)
    assert app.run(args) == 2
    assert capsys.readouterr().err.startswith(f"attnhal plan: error: {mixed} with --engine sglang (supported: ")


def test_flags_at_their_defaults_beside_engine_are_not_mixed(capsys):
    assert cli.main(["plan", "--engine", "sglang", "--max-bs", "32", "--spec-steps", "0", "--json", *AITER]) == 0
    assert '"engine": "sglang"' in capsys.readouterr().out


SGLANG_NAMES = ("ADAPTER", "DEFAULT_MAX_BS", "DEFAULT_PAGE_SIZE", "DRAFT_EXTEND_GRAPH_OFF", "FLAGS", "HARMLESS", "SGLANG_VERSION",
                "EngineArgError", "SglangConfig", "PageSize", "capture_sizes", "from_server_args", "parse_cli",
                "plan_server_args", "resolve_page_size", "roles")
VLLM_NAMES = ("ADAPTER", "FLAGS", "HARMLESS", "VLLM_VERSION", "CGSupport", "EngineArgError", "GraphMode", "ModeResolution",
              "VllmConfig", "Level", "catalog_support", "descriptor_for_level", "from_engine_args", "min_support",
              "parse_cli", "resolve_mode", "support_level", "support_on")


def test_each_adapter_package_keeps_its_public_names():
    import attnhal_sglang as sglang
    import attnhal_vllm as vllm
    from attnhal.engines import flags

    for module, names in ((sglang, SGLANG_NAMES), (vllm, VLLM_NAMES)):
        assert sorted(module.__all__) == sorted(names)
        assert all(hasattr(module, name) for name in names), module
    assert sglang.EngineArgError is vllm.EngineArgError is flags.EngineArgError


def test_the_engines_package_imports_neither_attnhal_nor_an_adapter_at_its_top():
    for path in (ROOT / "attnhal" / "engines").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert "attnhal" not in [a.name for a in node.names], path
            if isinstance(node, ast.ImportFrom):
                assert node.module != "attnhal", f"{path}: import the submodule (from attnhal.catalog import ...)"
    code = ("import sys, attnhal_vllm\n"
            "print(sorted(m for m in sys.modules if m.startswith('attnhal_sglang')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


SPEC_CONFIG = '{"method": "mtp", "num_speculative_tokens": 2}'


@pytest.mark.parametrize("engine, flags, message", [
    ("vllm", ["--spec-method", "eagle", "--spec-tokens", "100"], "--spec-tokens=100 (supported: 1..64)"),
    ("vllm", ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 200}'],
     "--speculative-config num_speculative_tokens=200 (supported: 1..64)"),
    ("sglang", ["--cuda-graph-max-bs-decode", "100000"], "--cuda-graph-max-bs-decode=100000 (supported: 1..4096)"),
    ("vllm", ["--spec-method", "eagle", "--spec-tokens", "2", "--speculative-config", SPEC_CONFIG],
     "--spec-method=eagle with --speculative-config method=mtp"),
    ("vllm", ["--spec-tokens", "3", "--speculative-config", SPEC_CONFIG],
     "--spec-tokens=3 with --speculative-config num_speculative_tokens=2"),
])
def test_engine_flag_errors_name_the_flags_the_user_typed(engine, flags, message, capsys):
    backend = "FLASH_ATTN" if engine == "vllm" else "fa3"
    code = cli.main(["plan", "--engine", engine, "--", "--attention-backend", backend, *flags,
                     "--platform", "cuda:sm90"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("attnhal plan: error: ") and message in err, err
    assert "num_steps" not in err and "max_batch_size" not in err


def test_agreeing_spec_flags_and_speculative_config_are_refused_as_vllm_refuses_them(capsys):
    """vLLM refuses ``--spec-*`` beside the same ``--speculative-config`` key even when they agree
    (engine/arg_utils.py:2108-2120; the vLLM tier's grammar test runs it)."""
    code = cli.main(["plan", "--engine", "vllm", "--", "--attention-backend", "FLASH_ATTN", "--spec-method", "mtp",
                     "--spec-tokens", "2", "--speculative-config", SPEC_CONFIG, "--platform", "cuda:sm90"])
    assert code == 2 and "mutually exclusive" in capsys.readouterr().err
