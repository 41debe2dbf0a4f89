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
