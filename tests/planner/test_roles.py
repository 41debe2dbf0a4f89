"""The role rule: PhaseBackends.build, phase_roles, and the constructors and engines that use them."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from attnhal.capabilities import BackendCapabilities, SpecLimits
import attnhal_sglang as sglang
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.planner import AttentionMode, GraphPolicy, PhaseBackends, needs_draft_backend, phase_roles, plan
from attnhal.spec import SpecConfig

A = BackendCapabilities(name="a", vendors={"cuda", "hip"}, phases=tuple(Phase),
                        graph={p: SpecLimits() for p in GRAPH_PHASES}, multi_step=SpecLimits(),
                        features={"custom_mask"})
B, C, D, E = (replace(A, name=n) for n in "bcde")
SPECS = (None, SpecConfig(), SpecConfig(num_steps=3), SpecConfig.eagle(1), SpecConfig.eagle(3),
         SpecConfig.eagle(2, topk=2, num_draft_tokens=4), SpecConfig.ngram(4))
MODES = (AttentionMode.PREFILL, AttentionMode.DECODE, "decode")


def old_multi(spec):
    return spec is None or spec.num_steps > 1


@pytest.mark.parametrize("spec", SPECS)
def test_same_is_build_with_one_target(spec):
    want = PhaseBackends(target=A, draft_decode=A if old_multi(spec) else None, draft_extend=A)
    assert PhaseBackends.same(A, spec) == want
    assert PhaseBackends.build(None, None, spec, target=A) == want


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefill,decode", [(A, B), (B, A), (A, A)])
def test_split_is_build_of_prefill_and_decode(spec, mode, prefill, decode):
    follow = prefill if AttentionMode(mode) is AttentionMode.PREFILL else decode
    want = PhaseBackends(target=None, prefill=prefill, decode=decode, draft_extend=follow,
                         draft_decode=decode if old_multi(spec) else None, speculative_attention_mode=mode)
    assert PhaseBackends.split(prefill, decode, spec, mode) == want
    assert PhaseBackends.build(prefill, decode, spec, mode) == want


def old_cli_rule(spec, mode, backend, target=None, prefill=None, decode=None, draft=None, extend=None,
                 adaptive=None):
    """The role rule of ``attnhal plan``'s flags as the CLI implemented it before build (already resolved)."""
    def pick(value, fallback=None):
        return value if value is not None else fallback if fallback is not None else backend
    target_b = pick(target)
    prefill_b, decode_b = pick(prefill, target_b), pick(decode, target_b)
    follow = prefill_b if AttentionMode(mode) is AttentionMode.PREFILL else decode_b
    multi = spec.num_steps > 1 or bool(adaptive)
    draft_b = pick(draft, decode_b if decode is not None else None) if multi else None
    extend_b = pick(extend, follow if prefill is not None or decode is not None else None)
    return PhaseBackends(target=target_b, prefill=prefill_b, decode=decode_b, draft_decode=draft_b,
                         draft_extend=extend_b, speculative_attention_mode=mode)


def cli_via_build(spec, mode, backend, target=None, prefill=None, decode=None, draft=None, extend=None,
                  adaptive=None):
    """The same flags through PhaseBackends.build: what the CLI passes once it delegates."""
    target_b = target or backend
    split = prefill is not None or decode is not None
    return PhaseBackends.build(prefill or target_b, decode or target_b, spec, mode,
                               draft=draft or (None if decode is not None else backend),
                               draft_extend=extend or (None if split else backend),
                               target=target_b, step_counts=adaptive or ())


FLAGS = ("target", "prefill", "decode", "draft", "extend")


@pytest.mark.parametrize("spec", [SpecConfig.eagle(1), SpecConfig.eagle(3), SpecConfig.ngram(4)])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("adaptive", [None, (2, 4)])
def test_build_serves_the_cli_flags(spec, mode, adaptive):
    for given in itertools.product((False, True), repeat=len(FLAGS)):
        flags = {name: backend for name, backend, on in zip(FLAGS, (B, C, D, E, A), given) if on}
        want = old_cli_rule(spec, mode, A, adaptive=adaptive, **flags)
        assert cli_via_build(spec, mode, A, adaptive=adaptive, **flags) == want, flags


def test_adaptive_steps_of_one_give_no_draft_backend_and_the_same_plan():
    # The one place build differs from the CLI's former rule: adaptive steps that are all 1
    # keep the CLI's draft backend, which no plan reads (draft_decode never runs).
    spec, policy = SpecConfig.eagle(1), GraphPolicy(step_counts=(1,))
    old = old_cli_rule(spec, "prefill", A, adaptive=(1,))
    new = cli_via_build(spec, "prefill", A, adaptive=(1,))
    assert old.draft_decode is A and new.draft_decode is None
    assert plan(spec, "cuda:sm90", old, policy) == plan(spec, "cuda:sm90", new, policy)


def test_needs_draft_backend():
    assert needs_draft_backend(None)
    assert not needs_draft_backend(SpecConfig.eagle(1))
    assert needs_draft_backend(SpecConfig.eagle(2))
    assert needs_draft_backend(SpecConfig.eagle(1), (1, 3))
    assert not needs_draft_backend(SpecConfig.eagle(1), (1,))


def test_phase_roles_with_names():
    spec = SpecConfig.eagle(3)
    assert phase_roles("p", "d", spec) == {Phase.PREFILL: "p", Phase.DECODE: "d", Phase.TARGET_VERIFY: "p",
                                           Phase.DRAFT_DECODE: "d", Phase.DRAFT_EXTEND: "p"}
    assert phase_roles("p", "d", spec, "decode", draft="x") == {
        Phase.PREFILL: "p", Phase.DECODE: "d", Phase.TARGET_VERIFY: "d", Phase.DRAFT_DECODE: "x",
        Phase.DRAFT_EXTEND: "d"}
    one_step = phase_roles("p", "d", SpecConfig.eagle(1), draft="x", draft_extend="y")
    assert one_step[Phase.DRAFT_DECODE] is None and one_step[Phase.DRAFT_EXTEND] == "y"
    with pytest.raises(ValueError, match="speculative_attention_mode='verify'"):
        phase_roles("p", "d", spec, "verify")


def test_build_checks_its_arguments():
    with pytest.raises(TypeError, match="spec="):
        PhaseBackends.build(A, B, "eagle")
    with pytest.raises(TypeError, match="caps="):
        PhaseBackends.same("a")
    with pytest.raises(TypeError, match="prefill="):
        PhaseBackends.build("a", B)
    with pytest.raises(ValueError, match="speculative_attention_mode='verify'"):
        PhaseBackends.split(A, B, None, "verify")


def old_sglang_roles(values, spec):
    """``attnhal_sglang.roles`` as written before it used phase_roles and phases_run."""
    from attnhal.phases import ALGORITHM_PHASES
    from attnhal_sglang.config import _EXTEND_ON as on
    base = values.get("attention_backend")
    decode = values.get("decode_attention_backend", base)
    prefill = values.get("prefill_attention_backend") or on.get(decode) or base
    follow = decode if values.get("speculative_attention_mode") == "decode" else prefill
    draft = values.get("speculative_draft_attention_backend")
    extend = draft or follow
    names = {"prefill": prefill, "decode": decode, "target_verify": follow, "draft_decode": draft or decode,
             "draft_extend": on.get(extend, extend)}
    runs = ALGORITHM_PHASES[spec.algorithm] - ({Phase.DRAFT_DECODE} if spec.num_steps == 1 else set())
    runs |= {Phase.PREFILL, Phase.DECODE}
    return {role: name if Phase(role) in runs else None for role, name in names.items()}


@pytest.mark.parametrize("spec", [s for s in SPECS if s is not None])
def test_sglang_roles_keep_their_rule(spec):
    choices = {"attention_backend": ("triton", "fa3"), "decode_attention_backend": (None, "cutedsl_mla"),
               "prefill_attention_backend": (None, "flashinfer"), "speculative_attention_mode": (None, "decode"),
               "speculative_draft_attention_backend": (None, "", "triton", "cutedsl_mla")}
    for combo in itertools.product(*choices.values()):
        values = {k: v for k, v in zip(choices, combo) if v is not None}
        assert sglang.roles(values, spec) == old_sglang_roles(values, spec), values
