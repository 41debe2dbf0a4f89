"""The attnhal pytest plugin: run the conformance kit on any backend from the command line.

Registered under the ``pytest11`` entry point ``attnhal`` (or load it with
``-p attnhal.testing.plugin``). Importing it imports neither torch nor hypothesis;
nothing happens unless an option below is given.

``--attnhal-backend NAME|module:attr``
    collect and run the whole conformance suite (:mod:`attnhal.testing.conformance`)
    on that backend: a registered name (``torch``) or an unregistered class
    (``my_pkg.backend:MyBackend``). ``pytest --attnhal-backend torch`` in an empty
    directory certifies the torch backend.
``--attnhal-examples N``
    random examples per check on top of the fixed ones (default
    ``$ATTNHAL_CONFORMANCE_EXAMPLES`` or 3; 0 = fixed examples only).
``--attnhal-platform SPEC``
    run on a simulated platform (``hip:gfx942``) instead of the detected one.
``--attnhal-budget SECONDS``
    random examples for that long, spread over the checks (rounds until each share is spent).
``--attnhal-thorough``
    release check: more random examples and the costlier fixed ones.
``--attnhal-allow-unchecked``
    claims this process cannot check are skipped; without it they fail, except the
    vendor claims whose device is not here (``vendor[cuda]`` on a CPU machine), which skip
    with their reason.
``--attnhal-strict``
    those vendor claims fail too.

At the end of a session that ran conformance tests it prints the claims table
(claim | status | detail) of each backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from attnhal.errors import InvalidValue
from attnhal.testing.settings import BUDGET, EXAMPLES, env_examples

if TYPE_CHECKING:
    from attnhal.testing.checks import ClaimResult

_RESULTS = pytest.StashKey[dict[str, list[Any]]]()
#: The module collected for ``--attnhal-backend``: one class subclassing the mixin.
SUITE = Path(__file__).with_name("_suite.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnhal", "attnhal conformance kit")
    group.addoption("--attnhal-backend", metavar="NAME|module:attr", default=None,
                    help="run the attnhal conformance suite on this backend (registered name or module:attr)")
    group.addoption("--attnhal-examples", metavar="N", type=int, default=None,
                    help="random examples per conformance check on top of the fixed ones "
                         "(default: $ATTNHAL_CONFORMANCE_EXAMPLES or 3, 25 with --attnhal-thorough; "
                         f"0: fixed examples only; {EXAMPLES})")
    group.addoption("--attnhal-budget", metavar="SECONDS", type=float, default=None,
                    help=f"seconds of random conformance examples, spread over the checks ({BUDGET})")
    group.addoption("--attnhal-thorough", action="store_true", default=False,
                    help="release check: more random examples and the costlier fixed ones")
    group.addoption("--attnhal-allow-unchecked", action="store_true", default=False,
                    help="skip (instead of failing) claims this process cannot check")
    group.addoption("--attnhal-strict", action="store_true", default=False,
                    help="fail (instead of skipping) vendor claims whose device is not here")
    group.addoption("--attnhal-platform", metavar="SPEC", default=None,
                    help="platform to run the conformance suite on, e.g. hip:gfx942 (simulated); "
                         "default: the detected one")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS] = {}
    for option, bound in (("attnhal_examples", EXAMPLES), ("attnhal_budget", BUDGET)):
        value = config.getoption(option)
        if value is not None:
            try:
                bound.check(value, "--" + option.replace("_", "-"))
            except InvalidValue as exc:
                raise pytest.UsageError(str(exc)) from None
    try:
        env_examples()  # refused once, here, rather than in every test that reads it
    except InvalidValue as exc:
        raise pytest.UsageError(f"{exc} (environment)") from None
    backend = config.getoption("attnhal_backend")
    if backend:
        _check_backend(backend)
        # Collected like a test file given on the command line, next to whatever else was asked for.
        config.args.append(str(SUITE))


def _check_backend(name: str) -> None:
    """Fail fast, before collection, on a backend that cannot be resolved."""
    from attnhal.testing.report import resolve_backend

    try:
        resolve_backend(name)
    except LookupError as exc:
        raise pytest.UsageError(f"--attnhal-backend {name}: {exc}") from exc


def record(config: pytest.Config, key: str, result: ClaimResult) -> None:
    """Keep ``result`` for the end-of-session table (no-op when the plugin is not loaded)."""
    results = config.stash.get(_RESULTS, None)
    if results is not None:
        results.setdefault(key, []).append(result)


def recorded(config: pytest.Config, key: str) -> dict[str, ClaimResult]:
    """The results kept so far for ``key``, by claim name (empty when the plugin is not loaded)."""
    return {r.claim.name: r for r in config.stash.get(_RESULTS, {}).get(key, [])}


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS, None)
    if not results:
        return
    from attnhal.testing.report import format_results

    for key, rows in results.items():
        terminalreporter.write_sep("=", f"attnhal conformance: {key}")
        terminalreporter.write_line(format_results(rows, width=max(120, terminalreporter._tw.fullwidth)))
