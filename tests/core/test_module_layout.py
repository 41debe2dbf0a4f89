"""The vocabulary layers and the planner's public face (the layer order itself: tests/core/test_layers.py).

The former module paths and aliases were removed in 0.2.0 (``CHANGELOG.md``); one test keeps them gone."""

from __future__ import annotations


import pytest
from repo import ROOT


def attnhal_imports(module: str) -> set[str]:
    from module_graph import import_graph

    return import_graph()[module]


def test_the_vocabulary_layers_import_nothing_above_the_platform():
    assert attnhal_imports("attnhal.reasons") == set()
    # attnhal.errors is the root of every layer (InvalidValue for a bad StepLayout)
    assert attnhal_imports("attnhal.phases") == {"attnhal.errors", "attnhal.reasons", "attnhal.spec"}


def test_the_planner_does_not_re_export_the_spec_records():
    from attnhal import planner

    assert not {"SpecConfig", "RequestContext", "ModelKind", "SpecAlgorithm"} & set(planner.__all__)
    assert {"plan", "plan_phase", "GraphPlan", "PhasePlan", "GraphPolicy", "PhaseBackends", "AttentionMode",
            "ALGORITHM_PHASES", "BATCH_SIZE"} <= set(planner.__all__)


#: Removed in 0.2.0 (CHANGELOG.md): the former module paths.
REMOVED_MODULES = ("attnhal.plan", "attnhal.descriptors", "attnhal.commands", "attnhal.reference", "attnhal._compat",
                   "attnhal.testing.batches", "attnhal.testing.reference", "attnhal_torch.capabilities",
                   "attnhal.engines.sglang", "attnhal.engines.vllm", "attnhal.catalog.sglang", "attnhal.catalog.vllm")


@pytest.mark.parametrize("module", REMOVED_MODULES)
def test_the_removed_modules_stay_removed_and_the_changelog_names_them(module):
    # by file, not by import: an editable install of another checkout could still answer the import
    parts = module.split(".")
    base = ROOT / "backends" if parts[0].startswith("attnhal_") else ROOT
    assert not base.joinpath(*parts).with_suffix(".py").exists() and not base.joinpath(*parts).is_dir()
    assert f"`{module}`" in (ROOT / "CHANGELOG.md").read_text()


def test_the_removed_aliases_stay_removed():
    import attnhal.graphs as graphs
    import attnhal.platform as platform
    import attnhal.testing.cases as cases
    from attnhal.example_engine import stress

    gone = [(platform, "current"), (platform.Platform, "spec"), (graphs, "InputSpec"), (stress, "Case"),
            (cases, "CaseSpec")]
    assert [f"{getattr(o, '__name__', o)}.{n}" for o, n in gone if hasattr(o, n)] == []


def test_no_source_file_is_over_400_lines() -> None:
    """One concept per module: past 400 lines a module holds more than one (tests are not counted)."""
    sources = [p for top in ("attnhal", "backends", "engines") for p in (ROOT / top).rglob("*.py")
               if "tests" not in p.relative_to(ROOT).parts]
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > 400}
    assert sources and long == {}
