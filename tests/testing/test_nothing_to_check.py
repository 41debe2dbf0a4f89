"""A check left with no example (no fixed one fits the bounds, ``examples=0``) is *not checked
here*, never verified by nothing, and never a kit error."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from attnhal.platform import parse
from attnhal.testing.checks import Status, claims, common, run
from attnhal.testing.checks.claims import NothingToCheck
from attnhal.testing.checks.target import Target
from attnhal_torch import TorchBackend


def _target(examples: int) -> Target:
    return Target(TorchBackend, parse("cpu"), max_examples=examples)


def test_no_fixed_example_and_none_drawn_is_nothing_to_check() -> None:
    ran: list[int] = []
    with pytest.raises(NothingToCheck, match="examples=0"):
        common.run_examples(_target(0), "some_check", st.integers(), [], ran.append)
    assert ran == []
    assert common.run_examples(_target(0), "some_check", st.integers(), [7], ran.append) == 1  # a fixed one runs
    assert ran == [7]


def test_the_report_says_not_checked_here(monkeypatch: pytest.MonkeyPatch) -> None:
    claim = next(c for c in claims(TorchBackend.capabilities) if c.name == "deterministic")

    def nothing(target: Target, claim: object) -> tuple[str, int]:
        raise NothingToCheck("no fixed example of deterministic fits this run's bounds")

    monkeypatch.setattr(run, "check", nothing)
    result = run.verify(_target(0), claim)
    assert result.status is Status.NOT_CHECKED and "no fixed example" in result.detail
