"""The old module paths, the callable attnhal.plan, and the vocabulary layers (the layer order itself:
tests/core/test_layers.py)."""

from __future__ import annotations

import ast
import re
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from repo import ROOT


def attnhal_imports(module: str) -> set[str]:
    from module_graph import import_graph

    return import_graph()[module]


def test_the_vocabulary_layers_import_nothing_above_the_platform():
    assert attnhal_imports("attnhal.reasons") == set()
    assert attnhal_imports("attnhal.phases") == {"attnhal.reasons", "attnhal.spec"}


#: ``attnhal.capabilities`` when it was one module: its ``__all__`` and the other names code imported from it.
OLD_CAPABILITIES = (
    "DTYPES", "GRAPH_PHASES", "KV_DTYPES", "AttentionRequest", "BackendCapabilities", "Facts", "Feature",
    "FillTerm", "IntSet", "Phase", "Reason", "ReasonCode", "SeqLenFill", "SpecLimits", "Tolerance", "Variant",
    "When", "not_supported_reasons", "request_reasons", "tokens_per_request",
    "VARIANT_FIELDS", "Vendor", "fmt_set", "reason", "ArchSet", "Fp8Flavor", "Platform", "PlatformSpecError",
    "ModelKind", "RequestContext", "SpecAlgorithm", "SpecConfig", "arch_at_least", "arch_sets",
)
OLD_PLAN = (
    "ALGORITHM_PHASES", "MAX_BATCH_SIZE", "AttentionMode", "GraphPlan", "GraphPolicy", "ModelKind", "PhaseBackends",
    "PhasePlan", "RequestContext", "SpecAlgorithm", "SpecConfig", "plan", "plan_phase", "MAX_CAPTURE_SIZES",
    "MAX_STEP_COUNTS",
)
OLD_DESCRIPTORS = ("SCHEMA_VERSION", "DescriptorError", "dump_descriptor", "load_descriptor", "parse_descriptor")


@pytest.mark.parametrize("module,names", [("attnhal.capabilities", OLD_CAPABILITIES), ("attnhal.plan", OLD_PLAN),
                                          ("attnhal.descriptors", OLD_DESCRIPTORS)])
def test_old_module_paths_keep_their_names(module, names):
    old = importlib.import_module(module)
    missing = [n for n in names if not hasattr(old, n)]
    assert not missing, f"{module} lost {missing}"


def test_the_old_paths_give_the_same_objects():
    import attnhal.capabilities as caps
    import attnhal.descriptors as descriptors
    import attnhal.plan as shim
    from attnhal import phases, planner, reasons, spec
    from attnhal.capabilities import files

    assert caps.Phase is phases.Phase and caps.ReasonCode is reasons.ReasonCode and caps.reason is reasons.reason
    assert shim.ALGORITHM_PHASES is phases.ALGORITHM_PHASES and shim.PhaseBackends is planner.PhaseBackends
    assert shim.plan is planner.plan and shim.SpecConfig is spec.SpecConfig
    assert descriptors.load_descriptor is files.load_descriptor


def test_the_planner_does_not_re_export_the_spec_records():
    from attnhal import planner

    assert not {"SpecConfig", "RequestContext", "ModelKind", "SpecAlgorithm"} & set(planner.__all__)
    assert {"plan", "plan_phase", "GraphPlan", "PhasePlan", "GraphPolicy", "PhaseBackends", "AttentionMode",
            "ALGORITHM_PHASES", "MAX_BATCH_SIZE"} <= set(planner.__all__)


# Run in a fresh interpreter: which object ``attnhal.plan`` is depends on what was imported first.
CALLABLE_SHIM = """
import attnhal
from attnhal import BackendCapabilities, PhaseBackends, Phase, SpecConfig, SpecLimits
from attnhal.planner import plan as the_plan
assert attnhal.plan is the_plan, type(attnhal.plan)  # before the shim is imported: the function

caps = BackendCapabilities(name="x", vendors={"cuda"}, phases=tuple(Phase), multi_step=SpecLimits(),
                           graph={Phase.DECODE: SpecLimits()})
spec = SpecConfig.eagle(2)
want = the_plan(spec, "cuda:sm90", PhaseBackends.same(caps, spec))

import attnhal.plan
assert attnhal.plan is sys.modules["attnhal.plan"], type(attnhal.plan)  # the import system set the module
assert attnhal.plan(spec, "cuda:sm90", PhaseBackends.same(caps, spec)) == want
import attnhal.plan as m
assert callable(m) and m is attnhal.plan and m(spec, platform="cuda:sm90", backends=PhaseBackends.same(caps)) == want
from attnhal import plan
assert plan(spec, "cuda:sm90", PhaseBackends.same(caps, spec)) == want
print("ok")
"""

SHIM_FIRST = """
import attnhal.plan as m
import attnhal
assert callable(m) and isinstance(m, type(sys)) and m.GraphPlan is attnhal.GraphPlan
print("ok")
"""


@pytest.mark.parametrize("script", [CALLABLE_SHIM, SHIM_FIRST], ids=["function-then-shim", "shim-first"])
def test_attnhal_plan_stays_callable_after_importing_the_shim(script):
    done = subprocess.run([sys.executable, "-c", "import sys\n" + script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


#: Former module -> where its names live now.
FORMER_MODULES = {"attnhal.plan": "attnhal.planner", "attnhal.descriptors": "attnhal.capabilities.files",
                  "attnhal.commands": "attnhal.cli.plugins", "attnhal.testing.batches": "attnhal.testing.cases",
                  "attnhal.testing.reference": "attnhal.testing.oracle",
                  "attnhal_torch.capabilities": "attnhal_torch.descriptor", "attnhal.reference": "attnhal.example_engine"}

WARNS = """
import importlib, warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    importlib.import_module({old!r})
print([str(w.message) for w in seen if w.category is DeprecationWarning])
"""


@pytest.mark.parametrize("old", sorted(FORMER_MODULES))
def test_a_former_module_warns_and_names_the_new_one(old):
    done = subprocess.run([sys.executable, "-c", WARNS.format(old=old)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    messages = ast.literal_eval(done.stdout.strip() or "[]")
    assert len(messages) == 1 and FORMER_MODULES[old] in messages[0], (messages, done.stderr)


def test_the_repository_imports_no_former_module():
    """Code in the repository imports names from their own modules at the top (tests of the former
    modules import them inside the test)."""
    pattern = re.compile(r"^(from|import)\s+(" + "|".join(re.escape(m) for m in FORMER_MODULES) + r")\b", re.M)
    former = {ROOT / "attnhal" / "plan.py", ROOT / "attnhal" / "descriptors.py", ROOT / "attnhal" / "commands.py",
              ROOT / "attnhal" / "reference" / "__init__.py",
              Path(__file__).resolve()}  # this file runs the former modules in scripts
    hits = [f"{p.relative_to(ROOT)}" for tree in ("attnhal", "backends", "tests", "benchmarks")
            for p in (ROOT / tree).rglob("*.py") if p not in former and pattern.search(p.read_text())]
    assert hits == []
    # a relative import (``from .capabilities import X`` in attnhal_torch) reaches them too
    relative = [f"{p.relative_to(ROOT)}: {m}" for tree, base in (("attnhal", ROOT), ("backends", ROOT / "backends"))
                for p in (ROOT / tree).rglob("*.py") if p not in former
                for m in _relative_imports(p, base) if m in FORMER_MODULES]
    assert relative == []


def _relative_imports(path: Path, base: Path) -> list[str]:
    """The absolute module names of ``path``'s relative ``from . import`` statements."""
    package = list(path.relative_to(base).with_suffix("").parts)[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            parent = package[:len(package) - node.level + 1]
            out += [".".join([*parent, node.module])] if node.module else [".".join([*parent, a.name])
                                                                            for a in node.names]
    return out


def test_the_former_example_engine_paths_are_the_same_modules():
    done = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c",
                           "import attnhal.reference.worker as old, attnhal.example_engine.worker as new\n"
                           "from attnhal.reference.stress import DrawnCase\n"
                           "print(old is new and old.SpecWorker is new.SpecWorker)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr
