"""Every bound is data, defined once: the records own them, the CLI declares its flags with them."""

from __future__ import annotations

import ast
import importlib
from collections import Counter

import pytest
from repo import ROOT

from attnhal.bounds import Bound, FloatBound

#: Every bound of attnhal and the backends: (module, name) -> (field, low, high). A new
#: ``Bound(...)`` is listed here, and its field is its own (no second bound of one value).
BOUNDS = {
    ("attnhal.spec", "NUM_STEPS"): ("num_steps", 1, 64),
    ("attnhal.spec", "TOPK"): ("topk", 1, 64),
    ("attnhal.spec", "DRAFT_TOKENS"): ("num_draft_tokens", 2, 1024),
    ("attnhal.spec", "HEAD_SIZE"): ("head_size", 1, 1024),
    ("attnhal.spec", "PAGE_SIZE"): ("page_size", 1, 4096),
    ("attnhal.planner.policy", "BATCH_SIZE"): ("max_batch_size", 1, 4096),
    ("attnhal.planner.policy", "CAPTURE_TOKENS"): ("max_tokens", 1, 4096 * 1024),
    ("attnhal.backend.kv_pool", "_COUNT"): ("count", 1, 1 << 40),
    ("attnhal.capabilities.claims", "FILL_BOUND"): ("seq_len_fill", 0, 1 << 20),
    ("attnhal.capabilities.claims", "TOLERANCE_BOUND"): ("tolerance", 0.0, 1.0),
    ("attnhal.capabilities.schema", "WHEN_BOUND"): ("when", 0, 4096),
    ("attnhal.cli.args", "seconds"): ("seconds", 0.001, 86_400.0),
    ("attnhal.testing.settings", "EXAMPLES"): ("examples", 0, 10_000),
    ("attnhal.testing.settings", "BUDGET"): ("budget", 0.001, 86_400.0),
}
#: The descriptor's spec limits: one bound per claim key, derived from the spec's bounds.
LIMITS = {"max_topk": "TOPK", "max_num_steps": "NUM_STEPS", "max_draft_tokens": "DRAFT_TOKENS"}


def _bound_calls() -> list[tuple[str, str]]:
    """(file, field) of every ``Bound("field", ...)`` / ``FloatBound("field", ...)`` in the code."""
    out = []
    for tree in ("attnhal", "backends", "engines"):
        for path in (ROOT / tree).rglob("*.py"):
            if "tests" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("Bound", "FloatBound") and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    out.append((str(path.relative_to(ROOT)), node.args[0].value))
    return out


def test_every_bound_is_listed_and_each_field_has_one_bound() -> None:
    calls = _bound_calls()
    twice = sorted(field for field, n in Counter(f for _, f in calls).items() if n > 1)
    assert twice == [], f"a value bounded twice: {twice}"
    listed = {field for field, _, _ in BOUNDS.values()} | set(LIMITS)
    assert {f for _, f in calls} == listed, "a bound missing from (or gone but still in) this test's table"
    for (module, name), (field, low, high) in BOUNDS.items():
        bound = getattr(importlib.import_module(module), name)
        bound = bound.bound if not isinstance(bound, (Bound, FloatBound)) else bound  # seconds: a Real
        assert (bound.field, bound.low, bound.high) == (field, low, high), (module, name)


def test_the_descriptor_limits_stop_where_the_spec_does() -> None:
    from attnhal import spec
    from attnhal.capabilities.claims import LIMIT_BOUNDS

    for key, name in LIMITS.items():
        assert LIMIT_BOUNDS[key].high == getattr(spec, name).high


def test_the_records_hold_their_bounds() -> None:
    from attnhal import spec
    from attnhal.capabilities.schema import MAX_HEAD_SIZE, MAX_PAGE_SIZE, WHEN_BOUND
    from attnhal.planner import GraphPolicy
    from attnhal.planner import policy

    assert dict(spec.SpecConfig.BOUNDS) == {"num_steps": spec.NUM_STEPS, "topk": spec.TOPK,
                                            "num_draft_tokens": spec.DRAFT_TOKENS}
    assert dict(spec.RequestContext.BOUNDS) == {"head_size": spec.HEAD_SIZE, "page_size": spec.PAGE_SIZE}
    assert GraphPolicy.BOUNDS["max_batch_size"] is policy.BATCH_SIZE
    assert GraphPolicy.BOUNDS["step_counts"] is spec.NUM_STEPS
    assert (MAX_HEAD_SIZE, MAX_PAGE_SIZE, WHEN_BOUND.high) == (spec.HEAD_SIZE.high, spec.PAGE_SIZE.high,
                                                                spec.PAGE_SIZE.high)
    assert (spec.NUM_STEPS.high, spec.TOPK.high, spec.DRAFT_TOKENS.high) == (64, 64, 1024)


@pytest.mark.parametrize("record, field, value", [
    ("SpecConfig", "num_steps", 65), ("SpecConfig", "topk", 65), ("SpecConfig", "num_draft_tokens", 1025),
    ("RequestContext", "head_size", 1025), ("RequestContext", "page_size", 0),
    ("GraphPolicy", "max_batch_size", 4097), ("GraphPolicy", "max_tokens", 0),
])
def test_a_record_refuses_out_of_its_bound_with_the_field_as_data(record, field, value) -> None:
    from attnhal import InvalidValue, planner, spec

    cls = getattr(spec, record, None) or getattr(planner, record)
    kwargs = {"num_steps": 2} if record == "SpecConfig" and field != "num_steps" else {}
    kwargs |= {"topk": 2} if field == "num_draft_tokens" else {}
    with pytest.raises(InvalidValue) as info:
        cls(**kwargs, **{field: value})
    bound = cls.BOUNDS[field]
    assert (info.value.field, info.value.value, info.value.supported) == (field, value, str(bound))


def test_every_flag_of_a_bounded_field_is_declared_with_the_records_bound() -> None:
    """``--spec-steps`` and the API take the same ``num_steps`` (no 16-vs-64 split); ``--page-size``
    is ``PAGE_SIZE`` in every command that has it."""
    import argparse

    from attnhal.cli import build_parser
    from attnhal.cli.args import IntList
    from attnhal.cli.inputs import FLAG_OF
    from attnhal.planner import GraphPolicy
    from attnhal.spec import PAGE_SIZE, RequestContext, SpecConfig

    bounds = {**SpecConfig.BOUNDS, **RequestContext.BOUNDS, **GraphPolicy.BOUNDS}
    flag_bound = {FLAG_OF[field]: bound for field, bound in bounds.items() if field in FLAG_OF}
    assert {"--spec-steps", "--topk", "--draft-tokens", "--head-size", "--page-size", "--max-bs",
            "--adaptive-steps", "--capture-max-tokens"} <= set(flag_bound)
    parsers = {name: sub for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
               for name, sub in a.choices.items()}
    checked = 0
    for command in ("plan", "explain", "demo"):
        for action in parsers[command]._actions:
            flag = action.option_strings[-1] if action.option_strings else None
            kind = action.type.item if isinstance(action.type, IntList) else action.type
            if flag == "--page-size":
                assert kind.bound is PAGE_SIZE, command
            if flag in flag_bound and command != "demo":  # demo's --max-bs is its own, smaller worker's
                assert kind.bound is flag_bound[flag], (command, flag)
                assert kind.high == flag_bound[flag].high, (command, flag)
                checked += 1
    assert checked >= 12
