"""DESIGN.md invariants checked as code: no vendor branches outside the platform layer; light import."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("attnhal", "backends") for p in (ROOT / d).rglob("*.py")
                 if not p.relative_to(ROOT).as_posix().startswith("attnhal/platform"))
VENDOR_NAMES = re.compile(r"torch\.version\.(hip|cuda)|\b_?is_(hip|cuda|rocm|xpu|npu|musa)\b|gcnArchName"
                          r"|torch\.(xpu|npu|musa)\.is_available|\bimport torch_(npu|musa)\b")
# "cpu" is left out: host-vs-device checks (`tensor.device.type == "cpu"`) are not vendor branches.
VENDOR_WORDS = {"cuda", "hip", "rocm", "nvidia", "amd", "xpu", "intel", "npu", "ascend", "musa", "mthreads"}


def vendor_compares(tree: ast.AST) -> list[int]:
    """Lines with ==/!=/is/in comparisons against a vendor literal or a Vendor member."""
    def is_vendor(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_vendor(e) for e in node.elts)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.lower() in VENDOR_WORDS
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Vendor"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(is_vendor(n) for n in [node.left, *node.comparators]):
            lines.append(node.lineno)
        if isinstance(node, ast.Match):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_vendor_branch_outside_platform(path):
    text = path.read_text()
    found = [f"{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if VENDOR_NAMES.search(line)]
    found += [f"{n}: vendor comparison" for n in vendor_compares(ast.parse(text))]
    assert not found, f"vendor branch in {path.relative_to(ROOT)} (keep vendor facts in attnhal/platform):\n" + \
        "\n".join(found)


def test_the_scan_catches_a_vendor_branch():
    assert vendor_compares(ast.parse("if platform.vendor == 'hip':\n    pass")) == [1]
    assert vendor_compares(ast.parse("x = p.vendor is Vendor.CUDA")) == [1]
    assert VENDOR_NAMES.search("if torch.version.hip:")
    assert VENDOR_NAMES.search("if torch.xpu.is_available():") and VENDOR_NAMES.search("import torch_npu")
    assert vendor_compares(ast.parse("if p.vendor.value in ('npu', 'musa'):\n    pass")) == [1]


def test_every_vendor_is_a_platform_row():
    from attnhal.platform import VENDORS, Vendor, parse

    assert set(VENDORS) == set(Vendor)
    for vendor, row in VENDORS.items():
        p = parse(vendor.value if vendor is Vendor.CPU else f"{vendor.value}:{next(iter(row.known))}")
        assert p.vendor is vendor and p.known_arch and p.graph_api == row.graph_api


def test_import_attnhal_is_light():
    code = ("import sys, attnhal, attnhal.plan, attnhal.registry, attnhal.descriptors, attnhal.cli\n"
            "bad = sorted(m for m in sys.modules if m == 'triton' or m.startswith(('triton.', 'attnhal_')))\n"
            "assert not bad, bad\n"
            "assert 'torch' not in sys.modules or not sys.modules['torch'].cuda.is_initialized()\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "import attnhal should not even import torch"


def test_core_imports_no_backend():
    for path in (ROOT / "attnhal").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith(("attnhal_torch", "attnhal_triton")) for n in names), path
