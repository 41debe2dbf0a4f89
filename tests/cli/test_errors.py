"""The CLI's error boundary: every bad input is one line, exit 2, no traceback, no runaway.

Runs the CLI in-process (fast); only the broken-pipe test needs a real process.
"""

import resource
import subprocess
import sys
import time

import pytest

from attnhal.cli import build_parser, info, main
from attnhal.cli.args import Bounded

TRITON_LIKE = "docs/examples/triton-like.toml"
#: Seconds a rejected input may take (parsing, loading descriptors; never the work itself).
BOUND_S = 20.0
#: Peak memory the whole list of rejected inputs may add (importing torch and the backends included).
BOUND_MIB = 1024


@pytest.fixture
def binary_toml(tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe\x00name = \x81\x82")
    return str(path)


@pytest.fixture
def folder_toml(tmp_path):
    path = tmp_path / "folder.toml"
    path.mkdir()
    return str(path)


def bad_inputs(binary, folder, tmp):
    """(argv, a substring the one-line message must contain) for every command."""
    huge = "1" + "0" * 9
    return [
        # plan
        (["plan", "--max-bs", huge], "--max-bs=1000000000 (supported: an integer 1..4096)"),
        (["plan", "--max-bs", "0"], "--max-bs=0"),
        (["plan", "--spec-steps", "100000"], "--spec-steps=100000 (supported: an integer 0..64)"),
        (["plan", "--topk", "100000"], "--topk=100000"),
        (["plan", "--draft-tokens", "100000"], "--draft-tokens=100000"),
        (["plan", "--spec-steps", "1.5"], "--spec-steps='1.5'"),
        (["plan", "--spec-steps", "9" * 5000], "--spec-steps='99999999999999999999...'"),
        (["plan", "--platform", "rocm"], "--platform: platform='rocm'"),
        (["plan", "--platform", ""], "--platform"),
        (["plan", "--backend", binary], "--backend="),
        (["plan", "--backend", folder], "--backend="),
        (["plan", "--backend", "missing.toml"], "--backend=missing.toml"),
        (["plan", "--backend", "no-such-backend"], "backend=no-such-backend"),
        (["plan", "--spec-steps", "2", "--topk", "2"], "--draft-tokens is required with --topk=2"),
        (["plan", "--spec-steps", "2", "--draft-tokens", "9"], "num_draft_tokens=9"),
        (["plan", "--no-such-flag"], "attnhal plan: error: unrecognized arguments: --no-such-flag "
                                     "(see 'attnhal plan --help')"),
        (["plan", "--spec"], "attnhal plan: error: unrecognized arguments: --spec"),  # no abbreviations
        (["info", "--no-such-flag"], "attnhal info: error: unrecognized arguments: --no-such-flag"),
        (["--debug", "conformance", "torch", "--nope"], "attnhal conformance: error: unrecognized arguments: --nope"),
        # explain
        (["explain", "--backend", TRITON_LIKE, "--head-size", "100000"], "--head-size=100000"),
        (["explain", "--backend", TRITON_LIKE, "--dtype", "float64"], "--dtype='float64'"),
        (["explain", "--backend", binary], "--backend="),
        (["explain"], "--backend"),
        (["explain", "--backend", TRITON_LIKE, "--max-bs", huge], "--max-bs=1000000000"),
        # info
        (["info", "--platform", "rocm"], "--platform: platform='rocm'"),
        (["info", "--platform", "cuda:banana"], "arch='banana'"),
        # demo
        (["demo", "--spec-steps", "100000"], "--spec-steps=100000"),
        (["demo", "--batch-size", "100000"], "--batch-size=100000 (supported: an integer 1..32)"),
        (["demo", "--max-new-tokens", "0"], "--max-new-tokens=0"),
        (["demo", "--max-bs", "4096"], "--max-bs=4096 (supported: an integer 1..32)"),
        (["demo", "--topk", "4"], "--draft-tokens is required with --topk=4"),
        (["demo", "--spec-steps", "3", "--topk", "4", "--draft-tokens", "16"],
         "--draft-tokens: num_draft_tokens=16 (supported: 2..13 in the reference worker"),
        (["demo", "--spec-steps", "0"], "--spec-steps=0"),
        (["demo", "--backend", "no-such-backend", "--max-new-tokens", "1"], "backend=no-such-backend"),
        (["demo", "--seed", "-1"], "--seed=-1"),
        (["demo", "--cases", "0"], "--cases=0"),
        (["demo", "--cases", "1000000"], "--cases=1000000 (supported: an integer 1..100000)"),
        (["demo", "--cases", "3", "--topk", "2"], "--topk with --cases"),
        (["demo", "--cases", "3", "--backend", "no-such-backend"], "backend=no-such-backend"),
        # conformance
        (["conformance", "no-such-backend"], "no-such-backend"),
        (["conformance", "--examples", huge], "--examples=1000000000"),
        (["conformance", "--platform", "rocm"], "--platform"),
        # docs
        (["docs", "--path", tmp + "/no/such/folder/capabilities.md"], "does not exist"),
        (["docs", "--path", tmp], "is a folder"),
        (["docs", "--check", "--path", tmp + "/missing.md"], "no such file"),
        # top level
        (["no-such-command"], "invalid choice"),
        ([], "required: COMMAND"),
    ]


def test_every_bad_input_is_one_line_exit_2(binary_toml, folder_toml, tmp_path, capsys):
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for argv, needle in bad_inputs(binary_toml, folder_toml, str(tmp_path)):
        start = time.perf_counter()
        code = main(argv)
        seconds = time.perf_counter() - start
        out = capsys.readouterr()
        lines = out.err.strip().splitlines()
        assert code == 2, (argv, code, out.err)
        assert len(lines) == 1 and lines[0].startswith("attnhal") and ": error: " in lines[0], (argv, out.err)
        assert needle in lines[0], (argv, lines[0])
        assert "Traceback" not in out.err and out.out == "", argv
        assert seconds < BOUND_S, (argv, seconds)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kib) / 1024
    assert grown_mib < BOUND_MIB, f"rejecting bad input raised the peak memory by {grown_mib:.0f} MiB"


def test_environment_platform_is_named_as_such(monkeypatch, capsys):
    monkeypatch.setenv("ATTNHAL_PLATFORM", "rocm")
    assert main(["info"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnhal info: error: ATTNHAL_PLATFORM='rocm' (environment)") and "--platform" not in err


def test_negative_answers_exit_1(capsys):
    assert main(["explain", "--backend", TRITON_LIKE, "--head-size", "512", "--platform", "cuda:sm90"]) == 1
    out = capsys.readouterr().out
    assert "head_size=512" in out and out.count("verdict:") == 1 and "plan: valid" not in out
    assert main(["plan", "--target-backend", TRITON_LIKE, "--draft-backend", "docs/examples/decode-only.toml",
                 "--spec-steps", "3", "--platform", "cuda:sm90"]) == 1


def test_internal_errors_are_short_and_debug_shows_the_traceback(monkeypatch, capsys):
    import attnhal.cli as cli

    def boom(args):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(info, "run", boom)
    assert main(["info"]) == cli.INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.strip() == ("attnhal info: internal error: ZeroDivisionError: a bug "
                           "(a bug: rerun with --debug for the traceback)")
    for argv in (["--debug", "info"], ["info", "--debug"]):
        assert main(argv) == cli.INTERNAL_ERROR
        assert "Traceback" in capsys.readouterr().err


def test_warnings_are_one_line_in_the_cli_voice(monkeypatch, capsys):
    """attnhal's warnings (an engine's keep their origin: tests/cli/test_bad_input_items.py)."""
    import warnings

    from attnhal.platform import UnknownArchWarning

    def warn(args):
        warnings.warn("arch=gfx999 is not in the table: conservative facts", UnknownArchWarning)
        return 0
    monkeypatch.setattr(info, "run", warn)
    assert main(["info"]) == 0
    assert capsys.readouterr().err.strip() == \
        "attnhal info: warning: arch=gfx999 is not in the table: conservative facts"


def _options(parser):
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.option_strings and action.dest not in ("help",):
                yield name, action


def test_every_flag_has_help_and_every_number_a_bound():
    parser = build_parser()
    bounds = 0
    for name, action in _options(parser):
        flag = f"attnhal {name} {action.option_strings[0]}"
        assert action.help, f"{flag} has no help text"
        if action.type is int:
            pytest.fail(f"{flag}: a plain int has no bound (use bounded())")
        if isinstance(action.default, int) and not isinstance(action.default, bool):
            assert isinstance(action.type, Bounded), f"{flag}: a number without a bound"
        if isinstance(action.type, Bounded):  # the bound each flag declares
            assert action.type.low <= action.type.high, flag
            bounds += 1
    assert bounds >= 20


def test_help_shows_defaults(capsys):
    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert "largest capture batch size, 1..4096 (default: 32)" in " ".join(out.split())


def test_broken_pipe_is_silent():
    """``attnhal plan ... | head -0``: the reader is gone before the first write (as ``info | head -2``
    once the output outgrows the pipe). ``--platform`` keeps torch out of the process: it is fast."""
    argv = ["plan", "--backend", TRITON_LIKE, "--platform", "cpu", "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "attnhal", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b"", err


DESCRIPTOR = '"name": "x", "vendors": ["cpu"], "phases": ["decode"]'


@pytest.fixture
def hostile_descriptors(tmp_path):
    """Files a descriptor flag may be given by mistake or malice: (path, a substring of the message)."""
    import os

    nested = tmp_path / "nested.json"
    nested.write_text("{" + DESCRIPTOR + ', "variants": ' + "[" * 100_000 + "]" * 100_000 + "}")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    long_list = tmp_path / "long.json"
    long_list.write_text("{" + DESCRIPTOR + ', "head_sizes": [' + ", ".join(["64"] * 1000) + "]}")
    huge_value = tmp_path / "huge.json"
    huge_value.write_text("{" + DESCRIPTOR + ', "head_sizes": [64, 100000000000000000000]}')
    big_page = tmp_path / "page.toml"
    big_page.write_text('name = "x"\nvendors = ["cpu"]\nphases = ["decode"]\npage_sizes = [1, 1000000]\n')
    big_file = tmp_path / "big.json"
    big_file.write_text("{" + DESCRIPTOR + "}" + " " * (2 << 20))
    return [(nested, "nested too deeply"), (fifo, "not a regular file"),
            (long_list, "head_sizes: a list of 1000 entries (supported: at most 256)"),
            (huge_value, "head_sizes=[64, 100000000000000000000] (supported: a non-empty list of integers 1..1024)"),
            (big_page, "page_sizes=[1, 1000000] (supported: a non-empty list of integers 1..4096)"),
            (big_file, "bytes (supported: at most 1048576)")]


def test_hostile_descriptor_files_are_refused_at_once(hostile_descriptors, capsys):
    for path, needle in hostile_descriptors:
        start = time.perf_counter()
        code = main(["plan", "--backend", str(path), "--platform", "cpu"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("attnhal plan: error: --backend="), (path.name, code, err)
        assert needle in err and len(err) < 400 and "\n" not in err, (path.name, err)
        assert time.perf_counter() - start < BOUND_S, path.name
