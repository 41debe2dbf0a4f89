"""``attnhal conformance sglang:triton`` where SGLang is not installed (the main suite's case).

The runs with SGLang are in the SGLang tier (``tests/engines/sglang/test_kit.py``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from attnhal.cli import main
from attnhal_sglang.kit import runtime


@pytest.fixture
def no_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(runtime.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang" else real(name, *a))


def test_without_sglang_the_kit_names_what_to_install(no_sglang: None) -> None:
    assert runtime.engine_reasons() == [runtime.MISSING]
    assert "pip install --no-deps sglang==0.5.23" in runtime.MISSING


@pytest.mark.parametrize("name", ["sglang:triton", "sglang:torch_native"])
def test_conformance_without_sglang_exits_2_naming_it(no_sglang: None, name: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", name, "--platform", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"backend={name}" in err and "sglang==0.5.23" in err and err.count("\n") == 1


def test_other_catalogue_names_are_still_descriptors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "sglang:aiter", "--platform", "cpu"]) == 2
    assert "not an implementation" in capsys.readouterr().err


def test_the_kit_imports_no_sglang() -> None:
    code = ("import sys, attnhal_sglang.kit, attnhal.cli.conformance; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
