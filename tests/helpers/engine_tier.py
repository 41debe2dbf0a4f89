"""What every engine tier's conftest shares: the network refused, the hubs offline, and the grid's
counts (:mod:`tier_summary`) printed at the end of the run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import network_guard
from tier_summary import LINES


def isolate() -> None:
    """Refuse non-loopback connections in this process; subprocesses an engine starts are outside
    the socket guard, so the hubs' own offline switches cover them."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    network_guard.install()


@pytest.fixture(autouse=True)
def no_network() -> Iterator[None]:
    """Fails the test that tried to reach the network (the guard refused it already)."""
    network_guard.take_attempts()
    yield
    attempts = network_guard.take_attempts()
    assert not attempts, f"the test tried to reach the network: {attempts}"


def write_summary(terminalreporter: Any, title: str) -> None:
    """The tier's grid lines under ``title`` (``pytest_terminal_summary``'s body)."""
    if LINES:
        terminalreporter.write_sep("=", title)
        for line in LINES:
            terminalreporter.write_line(line)


def installed_entry_point(group: str, engine: str) -> Any:
    """attnhal's entry point in ``group`` as this environment's metadata lists it (asserts one is there)."""
    from importlib.metadata import distribution, entry_points

    found = [ep for ep in entry_points(group=group) if ep.name == "attnhal"]
    where = distribution("attnhal")._path  # type: ignore[attr-defined]
    assert found, (f"no attnhal entry point in group {group}; attnhal's metadata was read from {where} "
                   "(a stale attnhal.egg-info in the clone shadows the environment's: delete it, or rerun "
                   f"tests/engines/setup.sh {engine})")
    return found[0]
