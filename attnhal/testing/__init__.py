"""Testing tools for backend authors: hypothesis strategies and the conformance kit.

* :mod:`attnhal.testing.strategies` — hypothesis strategies, most bound to a backend's
  descriptor (batches of each phase drawing only what it claims);
* :mod:`attnhal.testing.cases` — :class:`CaseRecipe` / :func:`build_case`, the valid forwards
  those strategies draw;
* :mod:`attnhal.testing.oracle` — the fp64 reference attention;
* :mod:`attnhal.testing.conformance` — :class:`BackendConformance`, the pytest mixin, and
  its per-family parts (:class:`~attnhal.testing.conformance.PhaseConformance`, ...);
* :mod:`attnhal.testing.report` — :func:`run_conformance` and :class:`ConformanceReport`;
* :mod:`attnhal.testing.plugin` — the pytest plugin (``pytest --attnhal-backend NAME``).

Importing ``attnhal.testing`` itself is light; its submodules need ``hypothesis`` and
``torch``: ``pip install 'attnhal[kit]'`` (:data:`KIT_EXTRA`; :func:`missing_kit` says
what is missing). See docs/conformance.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnhal.testing.cases import Case, CaseRecipe, build_case
    from attnhal.testing.checks import Claim, ClaimFalsified, ClaimResult, Status
    from attnhal.testing.conformance import BackendConformance
    from attnhal.testing.report import ConformanceReport, run_conformance

__all__ = [
    "KIT_EXTRA",
    "BackendConformance",
    "Case",
    "CaseRecipe",
    "Claim",
    "ClaimFalsified",
    "ClaimResult",
    "ConformanceReport",
    "Status",
    "build_case",
    "missing_kit",
    "run_conformance",
]

#: The extra that installs what the kit runs with (hypothesis draws the examples; the mixins are pytest's).
KIT_EXTRA = "attnhal[kit]"
#: The modules the kit's checks import beyond attnhal's own dependencies.
_KIT_MODULES = ("hypothesis",)


def missing_kit() -> str | None:
    """Why the conformance kit cannot run in this environment, or None when it can.

    A plain ``pip install attnhal`` has no hypothesis; the kit then tells what to install
    instead of failing with an import error deep inside a check.
    """
    import importlib.util

    for module in _KIT_MODULES:  # found, not imported: a usage error after this check stays fast
        if importlib.util.find_spec(module) is None:
            return (f"the conformance kit needs {module}, which is not installed here "
                    f"(install the kit's extra: pip install '{KIT_EXTRA}')")
    return None

_WHERE = {
    "BackendConformance": "conformance",
    "Case": "cases", "CaseRecipe": "cases", "build_case": "cases",
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
