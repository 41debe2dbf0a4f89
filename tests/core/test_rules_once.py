"""Each rule written once: the request built from its sources, the draft-decode rule, one
constructor per speculative algorithm."""

from __future__ import annotations

import ast

import pytest
from repo import ROOT

from attnhal import InvalidValue
from attnhal.capabilities import AttentionRequest, Feature, Phase
from attnhal.phases import draft_decode_runs, phases_run
from attnhal.planner import needs_draft_backend
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm, SpecConfig


def test_a_request_is_built_from_a_context_a_config_and_a_pool() -> None:
    import torch

    from attnhal.backend import AttentionConfig, KVPool

    context = RequestContext(model=ModelKind.GQA, dtype="bfloat16", kv_dtype="float16", head_size=64, page_size=16)
    assert AttentionRequest.of(context) == AttentionRequest(model=ModelKind.GQA, dtype="bfloat16", kv_dtype="float16",
                                                            head_size=64, page_size=16)
    config = AttentionConfig(num_q_heads=8, num_kv_heads=2, head_size=128, dtype=torch.float16, sliding_window=4)
    pool = KVPool(num_layers=1, num_slots=32, num_kv_heads=2, head_dim=128, dtype=torch.float8_e5m2, max_reqs=1,
                  max_context_len=32, page_size=16)
    request = AttentionRequest.of(context, config, pool, phase=Phase.DECODE)
    assert request == AttentionRequest(phase=Phase.DECODE, model=ModelKind.GQA, dtype="float16", kv_dtype="fp8_e5m2",
                                       head_size=128, page_size=16, num_q_heads=8, num_kv_heads=2,
                                       features=frozenset({Feature.SLIDING_WINDOW}))
    assert AttentionRequest.of() == AttentionRequest()
    with pytest.raises(TypeError, match="phse="):
        AttentionRequest.of(phse=Phase.DECODE)


def test_the_request_is_built_by_its_constructor_only() -> None:
    """``AttentionRequest(...)`` with fields is written in one place, :meth:`AttentionRequest.of`
    (the empty request, "check nothing", stays a plain call)."""
    sites = []
    for tree in ("attnhal", "backends", "engines"):
        for path in (ROOT / tree).rglob("*.py"):
            if "tests" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "AttentionRequest"
                        and (node.args or len(node.keywords) > 1)):
                    sites.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert sites == []


@pytest.mark.parametrize("steps, runs", [(1, False), (2, True), (64, True)])
def test_one_draft_decode_rule_for_the_plan_and_the_roles(steps: int, runs: bool) -> None:
    spec = SpecConfig.eagle(steps)
    assert draft_decode_runs(steps) is runs
    assert (Phase.DRAFT_DECODE in phases_run(spec)) is runs is needs_draft_backend(spec)
    assert needs_draft_backend(SpecConfig.eagle(1), step_counts=(1, steps)) is runs


def _step_comparisons(path: str) -> list[int]:
    """Lines comparing a step count with 1 (``spec.num_steps == 1``, ``n > 1``) outside draft_decode_runs."""
    tree = ast.parse((ROOT / path).read_text())
    rule = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "draft_decode_runs"]
    inside = {id(n) for r in rule for n in ast.walk(r)}

    def steps(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "num_steps") or (
            isinstance(node, ast.Name) and node.id in ("num_steps", "n"))

    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare) and id(n) not in inside
            and any(steps(o) for o in (n.left, *n.comparators))
            and any(isinstance(o, ast.Constant) and o.value == 1 for o in (n.left, *n.comparators))]


def test_the_draft_decode_rule_is_written_once() -> None:
    """The planner's "not run" reason and the role rule read phases.draft_decode_runs; neither
    compares a step count with 1 itself."""
    assert {m: _step_comparisons(m) for m in ("attnhal/phases.py", "attnhal/planner/roles.py")} == {
        "attnhal/phases.py": [], "attnhal/planner/roles.py": []}
    assert _step_comparisons("attnhal/phases.py") == [] and "draft_decode_runs" in (
        ROOT / "attnhal/planner/roles.py").read_text()


@pytest.mark.parametrize("build, algorithm", [
    (SpecConfig.eagle, SpecAlgorithm.EAGLE), (SpecConfig.eagle3, SpecAlgorithm.EAGLE3),
    (SpecConfig.mtp, SpecAlgorithm.MTP), (SpecConfig.standalone, SpecAlgorithm.STANDALONE),
])
def test_each_draft_algorithm_has_its_constructor(build, algorithm) -> None:
    spec = build(3, 2, 6)
    assert (spec.algorithm, spec.num_steps, spec.topk, spec.num_draft_tokens) == (algorithm, 3, 2, 6)
    assert build(2).num_draft_tokens == 3


def test_eagle_builds_eagle_configs_only() -> None:
    assert SpecConfig.eagle(2, algorithm="eagle3").algorithm is SpecAlgorithm.EAGLE3
    for other in ("mtp", "standalone", "ngram", "none"):
        with pytest.raises(InvalidValue) as info:
            SpecConfig.eagle(2, algorithm=other)
        assert info.value.field == "algorithm" and "SpecConfig.mtp()" in info.value.supported
    assert SpecConfig.ngram(4).algorithm is SpecAlgorithm.NGRAM
