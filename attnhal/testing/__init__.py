"""Testing tools for backend authors: hypothesis strategies and the conformance kit.

* :mod:`attnhal.testing.strategies` — hypothesis strategies, most bound to a backend's
  descriptor (batches of each phase drawing only what it claims);
* :mod:`attnhal.testing.cases` — :class:`CaseRecipe` / :func:`build_case`, the valid forwards
  those strategies draw (``CaseSpec``: the record's former name; :mod:`attnhal.testing.batches`:
  the package's former module, re-exporting it);
* :mod:`attnhal.testing.oracle` — the fp64 reference attention (formerly
  :mod:`attnhal.testing.reference`, which re-exports it);
* :mod:`attnhal.testing.conformance` — :class:`BackendConformance`, the pytest mixin, and
  its per-family parts (:class:`~attnhal.testing.conformance.PhaseConformance`, ...);
* :mod:`attnhal.testing.report` — :func:`run_conformance` and :class:`ConformanceReport`;
* :mod:`attnhal.testing.plugin` — the pytest plugin (``pytest --attnhal-backend NAME``).

Importing ``attnhal.testing`` itself is light; its submodules need ``hypothesis`` and
``torch`` (``pip install 'attnhal[test]'``). See docs/conformance.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnhal.testing.cases import Case, CaseRecipe, CaseSpec, build_case
    from attnhal.testing.checks import Claim, ClaimFalsified, ClaimResult, Status
    from attnhal.testing.conformance import BackendConformance
    from attnhal.testing.report import ConformanceReport, run_conformance

__all__ = [
    "BackendConformance",
    "Case",
    "CaseRecipe",
    "CaseSpec",
    "Claim",
    "ClaimFalsified",
    "ClaimResult",
    "ConformanceReport",
    "Status",
    "build_case",
    "run_conformance",
]

_WHERE = {
    "BackendConformance": "conformance",
    "Case": "cases", "CaseRecipe": "cases", "CaseSpec": "cases", "build_case": "cases",
    "Claim": "checks", "ClaimFalsified": "checks", "ClaimResult": "checks", "Status": "checks",
    "ConformanceReport": "report", "run_conformance": "report",
}


def __getattr__(name: str) -> Any:
    # Lazy: `import attnhal.testing.plugin` (loaded by every pytest run) must not pull in
    # torch or hypothesis through this package.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"attnhal.testing.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'attnhal.testing' has no attribute {name!r}")
