"""Every error attnhal raises on purpose is an ``attnhal.AttnhalError`` and keeps its builtin base."""

import ast
import importlib

import pytest

import attnhal
from repo import ROOT



def error_classes():
    """(module, class name) of every exception class defined in attnhal/ and the packages beside it
    (the engine adapters, engines/attnhal_*/, and the backends, backends/attnhal_*/), by its bases' names."""
    beside = [p for top in ("engines", "backends") for p in (ROOT / top).rglob("*.py") if "tests" not in p.parts]
    for path in sorted([*(ROOT / "attnhal").rglob("*.py"), *beside]):
        base = next((ROOT / top for top in ("engines", "backends") if path.is_relative_to(ROOT / top)), ROOT)
        parts = path.relative_to(base).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b).endswith(("Error", "Exception", "Unavailable", "Fits", "Unsupported",
                                             "UnsupportedPhase", "BackendUnavailable", "DescriptorError"))
                    for b in node.bases):
                yield module, node.name


ERRORS = sorted(set(error_classes()) - {("attnhal.errors", "AttnhalError")})


def test_the_scan_finds_the_errors():
    assert ("attnhal.platform.vendors", "PlatformSpecError") in ERRORS and len(ERRORS) >= 15
    assert {("attnhal_cpu.buildcache", "BuildError"), ("attnhal_cpu.ops", "NativeUnavailable"),
            ("attnhal.engines.registry", "EngineUnavailable")} <= set(ERRORS)


@pytest.mark.parametrize("module,name", ERRORS, ids=[f"{m}.{n}" for m, n in ERRORS])
def test_an_error_is_an_attnhal_error_and_keeps_its_builtin_base(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, attnhal.AttnhalError)
    assert any(b.__module__ == "builtins" and b not in (Exception, BaseException, object) for b in cls.__mro__), cls
