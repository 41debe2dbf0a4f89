"""``run_conformance``: every claim of one backend, checked in this process, as a report.

>>> report = run_conformance("torch", max_examples=2)      # doctest: +SKIP
>>> print(report.format())                                 # claim | status | detail
>>> report.ok                                              # no claim falsified

Each claim is *verified*, *falsified* (with the shrunk counterexample) or *not checked
here* (with the reason: no device of that vendor, no graph API, bf16 under the Triton
interpreter, ...). Nothing passes silently. No pytest is involved: the checks of
:mod:`attnhal.testing.checks` are called directly, so a plain process (the
``attnhal conformance`` command) can run them.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnhal.backend import AttentionBackend
from attnhal.capabilities import BackendCapabilities, fmt_set
from attnhal.platform import Platform, current
from attnhal.registry import BackendUnavailable, default_registry
from attnhal.testing.checks import (
    Claim,
    ClaimKind,
    ClaimResult,
    Status,
    Target,
    claims,
    examples_from_env,
    process_reasons,
    verify,
)

__all__ = ["ConformanceReport", "format_results", "resolve_backend", "run_conformance"]


def resolve_backend(backend: str | type[AttentionBackend]) -> type[AttentionBackend]:
    """A backend class from a class, a registered name (``"torch"``) or ``"module:attr"``.

    Raises :class:`~attnhal.registry.BackendUnavailable` (a ``LookupError``) with the
    reasons when the name is unknown or its entry point fails to load.
    """
    if isinstance(backend, type):
        cls: object = backend
    elif ":" in backend:
        module, _, attr = backend.partition(":")
        try:
            cls = importlib.import_module(module)
            for part in attr.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError) as exc:
            raise LookupError(f"backend={backend} (supported: 'module:attr' naming an importable class): "
                              f"{type(exc).__name__}: {exc}") from exc
    else:
        entry = default_registry().get(backend)
        if entry.backend is None:
            raise BackendUnavailable(backend, entry.unavailable_reasons())
        cls = entry.backend
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)
            and isinstance(getattr(cls, "capabilities", None), BackendCapabilities)):
        raise LookupError(f"backend={backend} (supported: an AttentionBackend subclass with class attribute "
                          "capabilities: BackendCapabilities)")
    return cls


@dataclass
class ConformanceReport:
    """The outcome of every claim of one backend on one platform.

    Attributes
    ----------
    backend: the backend's registry name; ``backend_class`` its ``module.qualname``.
    platform, device, graph_kind: where the checks ran and how graphs were captured.
    max_examples: random examples per check on top of the fixed ones.
    results: one :class:`~attnhal.testing.checks.ClaimResult` per claim, in report order.
    notes: facts about the run that are not claims (e.g. an unclaimed platform).
    """

    backend: str
    backend_class: str
    platform: str
    device: str
    graph_kind: str
    max_examples: int
    results: list[ClaimResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No claim falsified (claims not checked here do not make it fail)."""
        return not self.falsified

    @property
    def falsified(self) -> list[ClaimResult]:
        return [r for r in self.results if r.status is Status.FALSIFIED]

    def counts(self) -> dict[str, int]:
        return {s.value: sum(r.status is s for r in self.results) for s in Status}

    def format(self) -> str:
        """A header, the table ``claim | status | detail``, totals, then each falsified
        claim with its counterexample."""
        head = [f"attnhal conformance: backend {self.backend!r} ({self.backend_class})",
                f"platform: {self.platform} ({self.device}), graphs: {self.graph_kind}; "
                f"{self.max_examples} random example{'' if self.max_examples == 1 else 's'} per check "
                "on top of the fixed ones"]
        head += [f"note: {n}" for n in self.notes]
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items())
        return "\n".join([*head, "", format_results(self.results), "", f"{counts} ({self.seconds:.1f} s)",
                          *_failures(self.falsified)])

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "backend_class": self.backend_class, "platform": self.platform,
                "device": self.device, "graph_kind": self.graph_kind, "max_examples": self.max_examples,
                "ok": self.ok, "counts": self.counts(), "notes": list(self.notes),
                "seconds": round(self.seconds, 3), "claims": [r.to_dict() for r in self.results]}


def format_results(results: Iterable[ClaimResult], width: int = 120) -> str:
    """The table ``claim | status | detail`` (details cut to fit ``width``)."""
    rows = [("claim", "status", "detail")] + [(r.claim.name, r.status.value, r.detail) for r in results]
    w0, w1 = (max(len(row[i]) for row in rows) for i in (0, 1))
    room = max(20, width - w0 - w1 - 6)

    def cut(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= room else text[:room - 3] + "..."

    lines = [f"{a:<{w0}} | {b:<{w1}} | {cut(c)}" for a, b, c in rows]
    lines.insert(1, f"{'-' * w0}-+-{'-' * w1}-+-{'-' * min(room, max(len(line) for line in lines) - w0 - w1 - 6)}")
    return "\n".join(lines)


def _failures(results: list[ClaimResult]) -> list[str]:
    out: list[str] = []
    for r in results:
        out += ["", f"claim {r.claim.name} falsified: {r.detail}"]
        if r.counterexample:
            out += ["  " + line for line in r.counterexample.splitlines()]
    return out


def _notes(target: Target) -> list[str]:
    caps, platform = target.caps, target.platform
    out = []
    if platform.vendor not in caps.vendors and not process_reasons(target):
        out.append(f"platform {platform.spec} is not among the backend's vendors {fmt_set(caps.vendors)}: "
                   "its kernels ran here as they would run there")
    if platform.simulated:
        out.append(f"platform {platform.spec} is simulated: tensors live on {platform.torch_device}")
    return out


def _depends_on(claim: Claim, done: Mapping[str, ClaimResult]) -> str | None:
    """Why ``claim`` is not run: the graph claim its check needs was falsified."""
    if claim.kind is ClaimKind.SEQ_LEN_FILL:
        graph = done.get(f"graph[{claim.subject}]")
        if graph is not None and graph.status is Status.FALSIFIED:
            return f"graph[{claim.subject}] is falsified; padding is checked through a working graph"
    return None


def run_conformance(backend: str | type[AttentionBackend], *, max_examples: int | None = None,
                    platform: Platform | str | None = None, only: Iterable[str] | None = None,
                    backend_kwargs: Mapping[str, Any] | None = None, derandomize: bool = True,
                    progress: Callable[[ClaimResult], None] | None = None) -> ConformanceReport:
    """Check every claim of ``backend``'s descriptor by running it, in this process.

    Parameters
    ----------
    backend: a registered name (``"torch"``), ``"module:attr"``, or the class itself.
    max_examples: random examples per check on top of the fixed ones (one per claimed
        head size and phase edge cases); default ``$ATTNHAL_CONFORMANCE_EXAMPLES`` or 2;
        ``0`` runs the fixed examples only.
    platform: a :class:`~attnhal.platform.Platform` or spec (``"cpu"``, ``"hip:gfx942"``
        simulated on the CPU); default :func:`attnhal.platform.detect`.
    only: claim names or name prefixes to run (``"graph"``, ``"phase[decode"``); others are left out.
    backend_kwargs: passed to every backend constructor.
    derandomize: the same examples on every run (a report is reproducible).
    progress: called with each claim's result as soon as it is known.

    Raises ``LookupError`` when ``backend`` cannot be resolved (see :func:`resolve_backend`).
    A backend that cannot run here (e.g. Triton on a CPU platform without
    ``TRITON_INTERPRET=1``) gives a report of claims "not checked here", not an error.
    """
    cls = resolve_backend(backend)
    target = Target(cls, current(platform), max_examples=examples_from_env() if max_examples is None else max_examples,
                    backend_kwargs=dict(backend_kwargs or {}), derandomize=derandomize, database=None)
    report = ConformanceReport(cls.capabilities.name, f"{cls.__module__}.{cls.__qualname__}", target.platform.spec,
                               target.platform.device_name or target.device, target.platform.graph_kind.value,
                               target.max_examples, notes=_notes(target))
    start = time.perf_counter()
    prefixes = tuple(only) if only is not None else None
    done: dict[str, ClaimResult] = {}
    for claim in claims(cls.capabilities):
        if prefixes is not None and not claim.name.startswith(prefixes):
            continue
        why = _depends_on(claim, done)
        result = ClaimResult(claim, Status.NOT_CHECKED, why) if why else verify(target, claim)
        done[claim.name] = result
        report.results.append(result)
        if progress is not None:
            progress(result)
    report.seconds = time.perf_counter() - start
    return report
