"""The step layout: draft steps as extends (no draft_decode) and phases captured as one graph."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.cli.output import format_plan
from attnhal.errors import InvalidValue
from attnhal.phases import GRAPH_PHASES, DraftSteps, GraphGroup, Phase, StepLayout, not_run_reason, phases_run
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.reasons import ReasonCode
from attnhal.spec import SpecConfig
from attnhal.testing.strategies import descriptors, graph_policies, platforms, spec_configs

ALL = tuple(Phase)
FULL = BackendCapabilities(name="full", vendors={"cuda", "hip"}, phases=ALL,
                           graph={p: SpecLimits() for p in GRAPH_PHASES}, multi_step=SpecLimits())
#: No draft-extend graph; target_verify graphs only up to 4 draft tokens.
PARTIAL = replace(FULL, name="partial", graph={Phase.DECODE: SpecLimits(), Phase.DRAFT_DECODE: SpecLimits(),
                                               Phase.TARGET_VERIFY: SpecLimits()})
ONE_MODEL = StepLayout(graph_groups=(GraphGroup("one_model", {"draft_extend", "draft_decode", "target_verify"}),))
EXTENDS = StepLayout(DraftSteps.EXTEND)


def test_draft_steps_as_extends_run_no_draft_decode_whatever_the_step_count() -> None:
    for steps in (1, 3):
        spec = SpecConfig.eagle(steps)
        assert phases_run(spec, EXTENDS) == {Phase.PREFILL, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY}
        p = plan(spec, "cuda:sm90", PhaseBackends.same(FULL, spec), layout=EXTENDS)
        assert not p["draft_decode"].runs and p["draft_extend"].capture and p.valid
    why = not_run_reason(Phase.DRAFT_DECODE, SpecConfig.eagle(3), EXTENDS)
    assert why is not None and why.code is ReasonCode.PHASE_NOT_RUN and why.message.startswith("draft_steps=extend")
    assert p.to_dict()["layout"] == {"draft_steps": "extend", "graph_groups": {}}
    assert "draft steps: extends (draft_extend runs once per draft step, 3 per step" in format_plan(p)


def test_a_graph_group_is_captured_together_at_the_sizes_all_of_it_captures() -> None:
    spec = SpecConfig.eagle(3)
    policy = GraphPolicy(max_batch_size=64, max_tokens=64)  # target_verify (4 tokens) stops at 16, draft_decode at 64
    p = plan(spec, "hip:gfx942", PhaseBackends.same(FULL, spec), policy, layout=ONE_MODEL)
    members = p.graph_groups["one_model"]
    assert members == (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)
    sizes = {p[ph].capture_sizes for ph in members}
    assert len(sizes) == 1 and max(next(iter(sizes))) == 16
    assert all(p[ph].capture and p[ph].graph == "one_model" for ph in members)
    assert p["decode"].graph is None and p.to_dict()["phases"]["target_verify"]["graph"] == "one_model"
    assert "one graph 'one_model': draft_decode, draft_extend, target_verify -> captured together" in format_plan(p)


def test_one_phase_not_captured_leaves_its_whole_graph_eager_naming_it() -> None:
    spec = SpecConfig.eagle(3)
    alone = plan(spec, "cuda:sm90", PhaseBackends.same(PARTIAL, spec))
    assert alone["target_verify"].capture and not alone["draft_extend"].capture
    p = plan(spec, "cuda:sm90", PhaseBackends.same(PARTIAL, spec), layout=ONE_MODEL)
    assert p.valid and p.captured == ()
    said = p["target_verify"].reasons[-1]
    assert said.code is ReasonCode.GRAPH_GROUP and said.message.startswith("graph=one_model")
    assert "draft_extend does not: [graph_unsupported]" in said.message
    assert p["draft_extend"].reasons == alone["draft_extend"].reasons  # its own reason, unchanged
    assert "-> eager" in format_plan(p)
    failed = plan(spec, "cuda:sm90", PhaseBackends.same(FULL, spec), layout=ONE_MODEL).with_capture_failure(
        Phase.TARGET_VERIFY, "out of memory")
    assert failed.captured == ()


def test_a_phase_that_does_not_run_leaves_the_group_to_the_others() -> None:
    spec = SpecConfig.eagle(1)  # no draft_decode
    p = plan(spec, "cuda:sm90", PhaseBackends.same(FULL, spec), layout=ONE_MODEL)
    assert p.graph_groups["one_model"] == (Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)
    assert p["draft_decode"].graph is None and p["draft_extend"].capture and p["target_verify"].capture


@pytest.mark.parametrize("build,field", [
    (lambda: GraphGroup("g", {"prefill", "decode"}), "graph_groups.g"),
    (lambda: GraphGroup("g", {"decode"}), "graph_groups.g"),
    (lambda: GraphGroup("", {"decode", "draft_extend"}), "graph_groups.name"),
    (lambda: GraphGroup("g", {"decode", "verify"}), "phase"),
    (lambda: StepLayout("loop"), "draft_steps"),
    (lambda: StepLayout(graph_groups=(GraphGroup("a", {"decode", "draft_extend"}),
                                      GraphGroup("b", {"draft_extend", "target_verify"}))), "graph_groups.b"),
])
def test_bad_layouts_are_refused_naming_the_field(build, field) -> None:
    with pytest.raises(InvalidValue) as caught:
        build()
    assert caught.value.field == field
    with pytest.raises(TypeError, match="layout="):
        plan(SpecConfig(), "cuda:sm90", PhaseBackends.same(FULL), layout="extend")  # type: ignore[arg-type]


groups = st.sets(st.sampled_from(GRAPH_PHASES), min_size=2).map(lambda ps: GraphGroup("g", ps))
layouts = st.builds(StepLayout, st.sampled_from(DraftSteps), st.lists(groups, max_size=1).map(tuple))


@settings(max_examples=60, deadline=None)
@given(spec_configs(), platforms(), descriptors(), layouts, graph_policies())
def test_every_graph_group_gets_one_answer_and_every_no_a_reason(spec, platform, caps, layout, policy) -> None:
    p = plan(spec, platform, PhaseBackends.same(caps, spec), policy, layout=layout)
    alone = plan(spec, platform, PhaseBackends.same(caps, spec), policy)
    for phase, d in p.phases.items():
        assert d.runs == alone[phase].runs or (phase is Phase.DRAFT_DECODE and layout.draft_steps is DraftSteps.EXTEND)
        assert d.capture <= alone[phase].capture  # a group never captures what its phase's own backend does not
        if not d.capture:
            assert d.reasons
    for name, members in p.graph_groups.items():
        assert len({p[m].capture for m in members}) <= 1 and len({p[m].capture_sizes for m in members}) <= 1
        assert all(p[m].graph == name for m in members)
    if layout.draft_steps is DraftSteps.DECODE:  # a group changes captures, never whether a plan is valid
        assert p.valid == alone.valid


def test_attnhals_own_runner_refuses_a_plan_with_a_graph_group_rather_than_capture_it_per_phase() -> None:
    from attnhal.graphs import GraphRunner
    from attnhal.platform import parse

    spec = SpecConfig.eagle(3)
    p = plan(spec, "cpu", PhaseBackends.same(FULL, spec), layout=ONE_MODEL)
    with pytest.raises(InvalidValue, match="layout.graph_groups='one_model' .supported: none: GraphRunner captures"):
        GraphRunner(p, parse("cpu"), {})
