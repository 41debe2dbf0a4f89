"""The design invariants of docs/architecture.md checked as code: no vendor branches outside the platform layer (in the core and
every backend package); light import."""

import ast
import re
import subprocess
import sys

import pytest
from repo import ROOT

# One rule for the core and every backend package: the same sources, the same patterns (a backend's
# tests, beside it, simulate vendors on purpose and are not scanned).
SOURCES = sorted(p for d in ("attnhal", "backends", "engines") for p in (ROOT / d).rglob("*.py")
                 if "tests" not in p.parts)
#: The one module that may probe the device's vendor (it asks torch what it sees).
PROBE_HOME = "attnhal/platform/detection.py"
#: The one package that may compare vendors (its rows and records are keyed by them).
PLATFORM = "attnhal/platform/"
VENDOR_PROBES = re.compile(r"torch\.version\.(hip|cuda)|\b_?is_(hip|cuda|rocm|xpu|npu|musa)\b|gcnArchName"
                           r"|get_device_capability|torch\.(xpu|npu|musa)\.is_available|\bimport torch_(npu|musa)\b")
# "cpu" is left out: host-vs-device checks (`tensor.device.type == "cpu"`) are not vendor branches.
VENDOR_WORDS = {"cuda", "hip", "rocm", "nvidia", "amd", "xpu", "intel", "npu", "ascend", "musa", "mthreads"}


def _is_vendor(node: ast.AST) -> bool:
    """A vendor literal, a ``Vendor`` member or ``Vendor(...)``, or a collection holding one."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_vendor(e) for e in node.elts)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in VENDOR_WORDS
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "Vendor"
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Vendor"


def _is_vendor_field(node: ast.AST) -> bool:
    """``x.vendor`` or ``x.vendor.value``."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "vendor"


def vendor_compares(tree: ast.AST) -> list[int]:
    """Lines that branch on a vendor: ==/!=/is/in against a vendor literal or a Vendor member,
    a ``.vendor`` field tested against a list of choices, and any ``match`` statement."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            choices = any(isinstance(n, (ast.Tuple, ast.List, ast.Set, ast.Dict)) for n in sides)
            if any(_is_vendor(n) for n in sides) or (choices and any(_is_vendor_field(n) for n in sides)):
                lines.append(node.lineno)
        if isinstance(node, ast.Match):
            lines.append(node.lineno)
    return lines


def vendor_branches(rel: str, text: str) -> list[str]:
    """What ``rel`` (a path relative to the repository) may not contain: vendor probes outside
    :data:`PROBE_HOME`, vendor comparisons outside :data:`PLATFORM`."""
    found = []
    if rel != PROBE_HOME:
        found += [f"{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
                  if VENDOR_PROBES.search(line)]
    if not rel.startswith(PLATFORM):
        found += [f"{n}: vendor comparison" for n in vendor_compares(ast.parse(text))]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_vendor_branch_outside_platform(path):
    rel = path.relative_to(ROOT).as_posix()
    found = vendor_branches(rel, path.read_text())
    assert not found, (f"vendor branch in {rel} (vendor probes live in {PROBE_HOME}, vendor facts in "
                       f"{PLATFORM}):\n" + "\n".join(found))


def test_the_scan_catches_a_vendor_branch():
    assert vendor_compares(ast.parse("if platform.vendor == 'hip':\n    pass")) == [1]
    assert vendor_compares(ast.parse("x = p.vendor is Vendor.CUDA")) == [1]
    assert VENDOR_PROBES.search("if torch.version.hip:")
    assert VENDOR_PROBES.search("if torch.xpu.is_available():") and VENDOR_PROBES.search("import torch_npu")
    assert vendor_compares(ast.parse("if p.vendor.value in ('npu', 'musa'):\n    pass")) == [1]
    # What the Triton package's own scan used to catch, before this one covered backends/ too.
    for probe in ("if torch.version.cuda:", "if is_hip():", "ok = is_cuda", "if _is_rocm:",
                  "arch = props.gcnArchName", "major, minor = torch.cuda.get_device_capability()"):
        assert VENDOR_PROBES.search(probe), probe
    for compare in ("x = kind == 'amd'", "x = 'nvidia' != kind", "x = p.vendor is not Vendor.HIP",
                    "x = Vendor.CUDA in vendors", "x = row.vendor in (first, second)",
                    "x = p.vendor == Vendor(name)", "x = p.vendor.value in {a, b}"):
        assert vendor_compares(ast.parse(compare)) == [1], compare
    assert vendor_compares(ast.parse("x = row.vendor == platform.vendor.value")) == []  # a lookup key


def test_vendor_probes_are_allowed_in_one_module_only():
    probe = "if torch.version.hip:\n    pass\n"
    assert vendor_branches(PROBE_HOME, probe) == []
    assert vendor_branches("attnhal/platform/vendors.py", probe) != []  # the platform package: facts, no probes
    assert vendor_branches("backends/attnhal_triton/backend.py", probe) != []
    assert vendor_branches("attnhal/platform/facts.py", "x = p.vendor is Vendor.CPU\n") == []
    assert VENDOR_PROBES.search((ROOT / PROBE_HOME).read_text()), "the allowance names a module that probes nothing"


def test_every_vendor_is_a_platform_row():
    from attnhal.platform import VENDORS, Vendor, parse

    assert set(VENDORS) == set(Vendor)
    for vendor, row in VENDORS.items():
        p = parse(vendor.value if vendor is Vendor.CPU else f"{vendor.value}:{next(iter(row.known))}")
        assert p.vendor is vendor and p.known_arch and p.graph_api == row.graph_api


def test_import_attnhal_is_light():
    code = ("import sys, attnhal, attnhal.planner, attnhal.registry, attnhal.capabilities.files, attnhal.cli\n"
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
            assert not any(n.startswith(("attnhal_torch", "attnhal_triton", "attnhal_cpu")) for n in names), path
