"""The bad inputs a new user tried (issue 42, "Why" 6): each refused with exit 2 naming the flag,
file or variable, or modelled as the engine does; none is an internal error (exit 3)."""

import json

import pytest

from attnhal.cli import main

TRITON_LIKE = "docs/examples/triton-like.toml"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_utf8_bom_in_a_descriptor_is_the_encoding_mark_not_text(tmp_path, capsys):
    """Windows editors write a BOM: the file plans as the same file without one (TOML and JSON)."""
    from attnhal.capabilities.files import dump_descriptor, load_descriptor

    texts = {".toml": open(TRITON_LIKE, "rb").read(),
             ".json": json.dumps(dump_descriptor(load_descriptor(TRITON_LIKE))).encode()}
    for suffix, text in texts.items():
        path = tmp_path / f"bom{suffix}"
        path.write_bytes(b"\xef\xbb\xbf" + text)
        code, with_bom, err = run(capsys, "plan", "--backend", str(path), "--platform", "cpu", "--json")
        assert code == 0, err
        assert json.loads(with_bom)["phases"]["decode"]["backend"] == "triton-like"


def test_a_bom_does_not_hide_a_real_parse_error(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xef\xbb\xbfname = \n")
    code, _, err = run(capsys, "plan", "--backend", str(path), "--platform", "cpu")
    assert code == 2 and "--backend=" in err and "bad.toml" in err and "line 1" in err


@pytest.mark.parametrize("value", ["x" * 10_000, "cuda:" + "9" * 10_000, "hip:gfx942," + "n" * 10_000])
def test_a_long_environment_value_is_echoed_cut_at_20_characters(monkeypatch, capsys, value):
    monkeypatch.setenv("ATTNHAL_PLATFORM", value)
    code, _, err = run(capsys, "plan")
    assert code == 2
    line, = err.strip().splitlines()
    assert line.startswith("attnhal plan: error: ATTNHAL_PLATFORM=") and "(environment)" in line
    assert len(line) < 600, line  # the value is cut where echoed, never repeated whole
    assert f"{value[:20]!r}"[:-1] + "...'" in line


def test_a_long_platform_flag_is_echoed_cut(capsys):
    code, _, err = run(capsys, "plan", "--platform", "z" * 5000)
    assert code == 2 and "platform='zzzzzzzzzzzzzzzzzzzz...'" in err and len(err) < 400


def test_an_unknown_conformance_backend_is_named_once(capsys):
    code, _, err = run(capsys, "conformance", "nosuch", "--platform", "cpu")
    assert code == 2
    assert err.count("backend=nosuch") == 1, err
    code, _, err = run(capsys, "conformance", "nosuch_module:Thing", "--platform", "cpu")
    assert code == 2 and err.count("backend=nosuch_module:Thing") == 1, err


@pytest.mark.parametrize("target", ["cuda:999", "hip:gfx9999", "cpu", "cuda:", "xpu:pvc"])
def test_compile_check_refuses_a_target_outside_the_arch_table_before_compiling(capsys, target):
    pytest.importorskip("triton")
    code, out, err = run(capsys, "compile-check", "--targets", "cuda:90", target)
    assert code == 2 and out == ""
    line, = err.strip().splitlines()
    assert line.startswith(f"attnhal compile-check: error: --targets={target!r} (supported: cuda:ARCH or hip:ARCH")
    assert "90, 100" in line and "gfx942" in line


@pytest.mark.parametrize("tokens", ["1e400", "3.5", "NaN", "-1", "true"])
def test_vllm_num_speculative_tokens_that_vllm_refuses_exit_2(capsys, tokens):
    """vLLM's typed config refuses a fraction, an infinity (JSON 1e400) and nan; it was exit 3
    (OverflowError) for 1e400 and planned as 3 for 3.5."""
    config = f'{{"method": "eagle", "num_speculative_tokens": {tokens}}}'
    code, out, err = run(capsys, "plan", "--engine", "vllm", "--", "--attention-backend", "FLASH_ATTN",
                         "--speculative-config", config, "--platform", "cuda:sm90")
    assert code == 2 and out == "", err
    assert "num_speculative_tokens=" in err and "(supported: an integer >= 1" in err


def test_vllm_takes_an_integral_json_number_as_vllm_does(capsys):
    code, out, err = run(capsys, "plan", "--engine", "vllm", "--", "--attention-backend", "FLASH_ATTN",
                         "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3.0}',
                         "--platform", "cuda:sm90")
    assert code == 0, err
    assert "num_steps=3, topk=1, num_draft_tokens=4" in out


@pytest.mark.parametrize("engine, flags, said", [
    ("vllm", ["--model", "deepseek-ai/DeepSeek-R1"], "--model"),
    ("vllm", ["deepseek-ai/DeepSeek-R1"], "--model"),  # vllm serve MODEL
    ("sglang", ["--model", "deepseek-ai/DeepSeek-V3", "--attention-backend", "fa3"], "--model-path"),
    ("sglang", ["--model-path", "deepseek-ai/DeepSeek-V3", "--attention-backend", "fa3"], "--model-path")])
def test_a_pasted_checkpoint_is_said_not_read_not_harmless(capsys, engine, flags, said):
    """A server's command line names its checkpoint (``--model`` is SGLang's alias of
    ``--model-path`` and vLLM's own flag): its attention kind can change a decision, attnhal opens
    no checkpoint, so it is listed as not read with the two ways to say the kind — in the text
    and in the JSON — never as a flag that cannot change anything (nor refused as attnhal's --model)."""
    argv = ["plan", "--engine", engine, "--", *flags, "--port", "8000", "--platform", "cuda:sm90"]
    code, out, err = run(capsys, *argv)
    assert code in (0, 4), err
    assert f"not read: {said} (the model's checkpoint:" in out and "--model-config PATH" in out
    assert "ignored (cannot change an attention-graph decision): --port\n" in out
    code, out, err = run(capsys, *argv[:3], "--json", *argv[3:])
    report = json.loads(out)
    assert (report["unread"], report["ignored"]) == ([said.removeprefix("--").replace("-", "_")], ["port"])
    code, out, _ = run(capsys, *argv[:3], "--model", "mla", *argv[3:])
    assert f"not read: {said} (the model's checkpoint:" in out and "the plan takes it as mla)" in out


def test_sglang_spec_flags_without_an_algorithm_are_said_to_be_ignored(capsys):
    """SGLang reads the speculative flags only with --speculative-algorithm: planned without
    speculation, as SGLang runs, and said in a note (JSON and text)."""
    argv = ["--attention-backend", "fa3", "--speculative-num-steps", "3", "--platform", "cuda:sm90"]
    code, out, err = run(capsys, "plan", "--engine", "sglang", "--json", "--", *argv)
    assert code == 0, err
    report = json.loads(out)
    assert not any(report["plan"]["phases"][p]["runs"] for p in ("draft_decode", "draft_extend", "target_verify"))
    assert ("--speculative-num-steps without --speculative-algorithm: SGLang ignores it (no speculative decoding)"
            in report["notes"])
    code, out, _ = run(capsys, "plan", "--engine", "sglang", "--", *argv)
    assert code == 0 and "note: --speculative-num-steps without --speculative-algorithm" in out


@pytest.mark.parametrize("flag", ["--json", "--debug"])
def test_a_command_flag_after_the_double_dash_says_put_it_before(capsys, flag):
    code, out, err = run(capsys, "plan", "--engine", "sglang", "--", "--attention-backend", "fa3", flag,
                         "--platform", "cuda:sm90")
    assert code == 2 and out == ""
    assert f"{flag} after `--` (supported: put it before `--`" in err
    assert f"attnhal plan --engine sglang {flag} -- ENGINE_FLAGS" in err


@pytest.mark.parametrize("engine, theirs, others", [("sglang", ["--engine-resolution"], ["--trtllm-cubins",
                                                                                         "--vllm-version"]),
                                                    ("vllm", ["--trtllm-cubins", "--vllm-version"],
                                                     ["--engine-resolution"])])
def test_the_flags_allowed_beside_an_engine_are_that_engines(capsys, engine, theirs, others):
    code, _, err = run(capsys, "plan", "--engine", engine, "--spec-steps", "2", "--", "--platform", "cpu")
    assert code == 2 and f"--spec-steps with --engine {engine}" in err
    assert all(flag in err for flag in theirs) and not any(flag in err for flag in others), err


def test_an_engines_warning_keeps_its_origin_and_attnhals_is_one_line(tmp_path, monkeypatch, capsys):
    """A warning raised in another package (an engine imported by a command) is shown as Python
    shows it, with its file; it is not relabelled ``attnhal COMMAND: warning:``."""
    import argparse
    import warnings

    from attnhal.cli import app
    from attnhal.platform import UnknownArchWarning

    (tmp_path / "some_engine.py").write_text("import warnings\n\ndef start():\n"
                                             "    warnings.warn('the engine says so', FutureWarning)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import some_engine

    def command(_args):
        some_engine.start()
        warnings.warn("arch=x is not in the table", UnknownArchWarning)
        return 0
    args = argparse.Namespace(command="plan", func=command, debug=False)
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, *rest: shown.append(
            warnings.formatwarning(message, category, filename, lineno).splitlines()[0])
        assert app.run(args) == 0
    err = capsys.readouterr().err
    assert len(shown) == 1 and shown[0].endswith("some_engine.py:4: FutureWarning: the engine says so"), shown
    assert "the engine says so" not in err
    assert err == "attnhal plan: warning: arch=x is not in the table\n"


def test_the_catalogue_labels_the_releases_a_plan_models(capsys):
    """Plans default to the installed or newest vLLM (0.34.0): the catalogue does not label every
    entry 0.33.0 alone; it names the release its citations come from apart."""
    code, out, _ = run(capsys, "catalog", "--engine", "vllm")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("vllm:")]
    assert rows and all("vllm 0.33.0, 0.34.0" in row for row in rows)
    assert out.rstrip().endswith("(the entries cite the source of vllm 0.33.0; a plan models each release listed)")
    code, out, _ = run(capsys, "catalog", "--engine", "vllm", "--json")
    entry = json.loads(out)[0]
    assert entry["releases"] == ["0.33.0", "0.34.0"] and entry["version"] == "0.33.0"


def test_a_vllm_report_of_a_plan_that_cannot_run_claims_no_graphs(capsys):
    code, out, _ = run(capsys, "plan", "--engine", "vllm", "--", "--attention-backend", "FLASH_ATTN",
                       "--spec-method", "eagle", "--spec-tokens", "3", "--platform", "hip:gfx942", "--model", "mha")
    assert code == 1
    report = out[out.index("attnhal graph report"):].splitlines()
    assert len(report) == 3 and report[2].startswith("all ") and "cannot run (attnhal's plan)" in report[2]
    assert "[vendor] vendor=hip" in report[2]
    code, out, _ = run(capsys, "plan", "--engine", "vllm", "--json", "--", "--attention-backend", "FLASH_ATTN",
                       "--platform", "hip:gfx942", "--model", "mha")
    assert [row["graph"] for row in json.loads(out)["engine_outcome"]] == ["cannot run"]


@pytest.mark.parametrize("flags, said", [
    (["--attention-backend", "FLASH_ATTN", "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}'],
     "disabled by cudagraph_mode PIECEWISE as asked (piecewise graphs leave attention outside the graph)"),
    (["--attention-backend", "FLASHINFER", "--spec-method", "eagle", "--spec-tokens", "3", "--trtllm-cubins", "no"],
     "disabled by vLLM's downgrade of cudagraph_mode FULL_AND_PIECEWISE to PIECEWISE"),
])
def test_a_vllm_mode_without_full_graphs_is_named_on_each_phase_not_called_policy(capsys, flags, said):
    code, out, _ = run(capsys, "plan", "--engine", "vllm", "--", *flags, "--platform", "cuda:sm90", "--model", "mha")
    assert code == 0
    disabled = [line for line in out.splitlines() if "[graphs_disabled]" in line]
    assert disabled and all(said in line for line in disabled) and "disabled by policy" not in out
