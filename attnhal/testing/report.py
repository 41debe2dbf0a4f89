"""``run_conformance``: every claim of one backend, checked in this process, as a report.

>>> report = run_conformance("torch")                      # doctest: +SKIP
>>> print(report.format())                                 # claim | status | s | detail
>>> report.ok                                              # all verified (or waived)

Each claim is *verified*, *falsified* (with the shrunk counterexample; *flaky* when it
did not repeat), *not checked here* (with the reason: no device of that vendor, no
graph API, ...) or a *kit error* (the kit failed on that claim; the others are still
reported). Nothing passes silently: a report is ``ok`` only when it verified at least
one claim here, nothing was falsified or hit a kit error, and every claim not checked
here is either waived with ``allow_unchecked`` or a vendor claim whose device this
process lacks (``vendor[cuda]`` on a CPU machine: listed, not a failure unless
``strict``). The last line of :meth:`ConformanceReport.format` is the verdict and says
which of these decided it. No pytest is involved: the checks of
:mod:`attnhal.testing.checks` are called directly, so a plain process (the
``attnhal conformance`` command) can run them.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from attnhal.backend import AttentionBackend
from attnhal.lookup import backend_class
from attnhal.platform import Platform, as_platform
from attnhal.reasons import fmt_set
from attnhal.testing.checks import (
    THOROUGH_EXAMPLES,
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
from attnhal.testing.checks.coverage import format_coverage
from attnhal.testing.checks.run import depends_on
from attnhal.testing.settings import BUDGET, EXAMPLES
from attnhal.testing.strategies import DEFAULT_MAX_COST, DEFAULT_MAX_SEQ_LEN

#: Called when a claim starts (``result`` None) and when its result is known:
#: ``progress(index, total, claim, result)``.
Progress = Callable[[int, int, Claim, "ClaimResult | None"], None]

__all__ = ["ConformanceInterrupted", "ConformanceReport", "format_results", "resolve_backend", "run_conformance"]


def resolve_backend(backend: str | type[AttentionBackend]) -> type[AttentionBackend]:
    """A backend class from a class, a registered name (``"torch"``) or ``"module:attr"``
    (:func:`attnhal.lookup.backend_class`).

    Raises :class:`~attnhal.registry.BackendUnavailable` (a ``LookupError``) with the
    reasons when the reference names nothing, fails to load, or names a descriptor with no
    implementation (a file, a catalogue name such as ``sglang:aiter``).
    """
    return backend_class(backend)


@dataclass
class ConformanceReport:
    """The outcome of every claim of one backend on one platform.

    Attributes
    ----------
    backend: the backend's registry name; ``backend_class`` its ``module.qualname``.
    platform, device, graph_kind: where the checks ran and how graphs were captured.
    max_examples: random examples per check on top of the fixed ones (with ``budget``: the most).
    results: one :class:`~attnhal.testing.checks.ClaimResult` per claim, in report order.
    notes: facts about the run that are not claims (e.g. an unclaimed platform).
    allow_unchecked: claims not checked here are waived (``ok`` despite them).
    strict: vendor claims whose device is not here fail the run too (by default they are
        listed and do not).
    budget: seconds the run was given (spread over the claims), or None.
    thorough: the costlier fixed examples ran too.
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
    allow_unchecked: bool = False
    budget: float | None = None
    thorough: bool = False
    strict: bool = False
    #: Stopped by Ctrl-C: ``results`` are the claims run so far, and the run does not pass.
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        """The run passes: something verified here, none falsified, no kit error, and no claim
        left unchecked that fails the run (:attr:`failing_unchecked`)."""
        return (bool(self.verified_here) and not self.falsified and not self.errors
                and not self.failing_unchecked and not self.interrupted)

    @property
    def verified_here(self) -> list[ClaimResult]:
        """Claims this run verified by running the backend (``vendor[V]`` only says where the
        others ran: alone it verifies nothing)."""
        return [r for r in self.results if r.status is Status.VERIFIED and r.claim.kind is not ClaimKind.VENDOR]

    @property
    def elsewhere(self) -> list[ClaimResult]:
        """Vendor claims whose device this process lacks (see :attr:`ClaimResult.device_elsewhere`)."""
        return [r for r in self.unchecked if r.device_elsewhere]

    @property
    def failing_unchecked(self) -> list[ClaimResult]:
        """The claims not checked here that make the run fail: none when ``allow_unchecked``;
        else every one, except the vendor claims of devices elsewhere unless ``strict``."""
        if self.allow_unchecked:
            return []
        return [r for r in self.unchecked if self.strict or not r.device_elsewhere]

    @property
    def falsified(self) -> list[ClaimResult]:
        return [r for r in self.results if r.status is Status.FALSIFIED]

    @property
    def errors(self) -> list[ClaimResult]:
        return [r for r in self.results if r.status is Status.ERROR]

    @property
    def unchecked(self) -> list[ClaimResult]:
        return [r for r in self.results if r.status is Status.NOT_CHECKED]

    def counts(self) -> dict[str, int]:
        return {s.value: sum(r.status is s for r in self.results) for s in Status}

    def format(self, coverage: bool = False) -> str:
        """A header, the table ``claim | status | detail``, totals, then each falsified
        claim with its counterexample; with ``coverage``, then where each claim's examples
        reached (:func:`format_coverage_section`)."""
        head = [f"attnhal conformance: backend {self.backend!r} ({self.backend_class})",
                f"platform: {self.platform} ({self.device}), graphs: {self.graph_kind}; {self._effort()}"]
        head += [f"note: {n}" for n in self.notes]
        return "\n".join([*head, "", format_results(self.results), "", f"{self._totals()} ({self.seconds:.1f} s)",
                          *self._verdict(), *_failures(self.falsified + self.errors),
                          *([format_coverage_section(self.results)] if coverage else [])])

    def _totals(self) -> str:
        """The count of each status; ``verified`` counts what the verdict counts (a ``vendor[V]``
        claim says where the others ran and is named beside it, not counted)."""
        where = [r for r in self.results if r.status is Status.VERIFIED and r.claim.kind is ClaimKind.VENDOR]
        counts = {**self.counts(), Status.VERIFIED.value: len(self.verified_here)}
        text = ", ".join(f"{n} {s}" for s, n in counts.items())
        return text + (f"; ran on: {_names(where)}" if where else "")

    def _effort(self) -> str:
        drawn = f"{self.max_examples} random example{'' if self.max_examples == 1 else 's'} per check"
        if self.budget is not None:
            drawn = f"random examples for {self.budget:g} s spread over the claims"
        return drawn + " on top of the fixed ones" + (" (thorough)" if self.thorough else "")

    def _verdict(self) -> list[str]:
        """What did not fail the run and why, then the verdict line (``PASS: ...`` / ``FAIL: ...``)."""
        failing = self.failing_unchecked
        out = []
        if self.allow_unchecked and self.unchecked:
            out.append(f"not checked here, waived by --allow-unchecked: {_names(self.unchecked)}")
        elif self.elsewhere and not self.strict:
            out.append(f"not checked here, needs a device this process lacks (not a failure; --strict fails on "
                       f"it): {_names(self.elsewhere)}")
        reasons = [_names(self.falsified + self.errors)] if self.falsified or self.errors else []
        if self.interrupted:
            reasons.append(f"interrupted after {len(self.results)} claims (the table shows those)")
        if not self.verified_here:
            reasons.append("nothing verified here (a run that checks no claim cannot pass)")
        if failing:
            reasons.append(f"not checked here (waive with --allow-unchecked): {_names(failing)}")
        if reasons:
            return out + ["FAIL: " + "; ".join(reasons)]
        return out + [f"PASS: {len(self.verified_here)} claim{'' if len(self.verified_here) == 1 else 's'} "
                      "verified here"]

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "backend_class": self.backend_class, "platform": self.platform,
                "device": self.device, "graph_kind": self.graph_kind, "max_examples": self.max_examples,
                "budget": self.budget, "thorough": self.thorough, "allow_unchecked": self.allow_unchecked,
                "strict": self.strict, "interrupted": self.interrupted, "ok": self.ok, "verdict": self._verdict()[-1], "counts": self.counts(),
                "notes": list(self.notes), "unchecked": [r.claim.name for r in self.unchecked],
                "device_elsewhere": [r.claim.name for r in self.elsewhere],
                "failing_unchecked": [r.claim.name for r in self.failing_unchecked],
                "seconds": round(self.seconds, 3), "claims": [r.to_dict() for r in self.results]}


class ConformanceInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_conformance`; ``report`` holds the claims run until then."""

    def __init__(self, report: ConformanceReport) -> None:
        super().__init__(f"interrupted after {len(report.results)} claims")
        self.report = report


def _names(results: Iterable[ClaimResult]) -> str:
    return ", ".join(r.claim.name for r in results)


def format_coverage_section(results: Iterable[ClaimResult]) -> str:
    """``coverage`` then, per claim that ran examples, the ranges they reached (batch sizes,
    context, extend and acceptance lengths, pool slots, layers and their patterns)."""
    lines = [f"  {r.claim.name}: {format_coverage(r.coverage)}" for r in results if r.coverage]
    return "\n".join(["", "coverage (the ranges each claim's examples reached):", *(lines or ["  (no claim ran)"])])


def format_results(results: Iterable[ClaimResult], width: int = 120) -> str:
    """The table ``claim | status | s | detail``; details wrap to fit ``width`` (never cut).
    The detail of a claim that compares numbers ends with the tolerance it was checked with."""
    rows = [("claim", "status", "s", "detail")] + [
        (r.claim.name, r.label, f"{r.seconds:.1f}", _detail_with_tolerance(r)) for r in results]
    w0, w1, w2 = (max(len(row[i]) for row in rows) for i in (0, 1, 2))
    room = max(30, width - w0 - w1 - w2 - 9)
    lines = []
    for a, b, s, c in rows:
        wrapped = textwrap.wrap(" ".join(c.split()), room, break_on_hyphens=False) or [""]
        lines.append(f"{a:<{w0}} | {b:<{w1}} | {s:>{w2}} | {wrapped[0]}".rstrip())
        lines += [f"{'':<{w0}} | {'':<{w1}} | {'':>{w2}} | {more}" for more in wrapped[1:]]
    detail = min(room, max(len(" ".join(r[3].split())) for r in rows))
    lines.insert(1, f"{'-' * w0}-+-{'-' * w1}-+-{'-' * w2}-+-{'-' * detail}")
    return "\n".join(lines)


def _detail_with_tolerance(result: ClaimResult) -> str:
    if not result.tolerance or result.status is Status.NOT_CHECKED:
        return result.detail
    return f"{result.detail} [tolerance {result.tolerance}]"


def _failures(results: list[ClaimResult]) -> list[str]:
    out: list[str] = []
    for r in results:
        out += ["", f"claim {r.claim.name} {r.label}: {r.detail}"]
        if r.counterexample:
            out += ["  " + line for line in r.counterexample.splitlines()]
    return out


def _notes(target: Target) -> list[str]:
    caps, platform = target.caps, target.platform
    out = []
    if platform.vendor not in caps.vendors and not process_reasons(target):
        out.append(f"platform {platform.name} is not among the backend's vendors {fmt_set(caps.vendors)}: "
                   "its kernels ran here as they would run there")
    if platform.simulated:
        out.append(f"platform {platform.name} is simulated: tensors live on {platform.torch_device}")
    if (target.max_seq_len, target.max_cost) != (DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_COST):
        out.append(f"bounds lowered: contexts up to {target.max_seq_len} tokens, batch cost up to {target.max_cost} "
                   f"(the kit's defaults: {DEFAULT_MAX_SEQ_LEN}, {DEFAULT_MAX_COST}); longer contexts are unchecked")
    return out


def run_conformance(backend: str | type[AttentionBackend], *, max_examples: int | None = None,
                    platform: Platform | str | None = None, only: Iterable[str] | None = None,
                    backend_kwargs: Mapping[str, Any] | None = None, derandomize: bool = True,
                    budget: float | None = None, thorough: bool = False, allow_unchecked: bool = False,
                    strict: bool = False, progress: Progress | None = None, max_seq_len: int | None = None,
                    max_cost: int | None = None) -> ConformanceReport:
    """Check every claim of ``backend``'s descriptor by running it, in this process.

    Parameters
    ----------
    backend: a registered name (``"torch"``), ``"module:attr"``, or the class itself.
    max_examples: random examples per check on top of the fixed ones (block boundaries,
        long contexts, head layouts, edge rows, input variations, every claimed head
        size); default ``$ATTNHAL_CONFORMANCE_EXAMPLES``, else 25 when ``thorough``, else 3;
        ``0`` runs the fixed examples only. With ``budget``: the most per check (default
        unbounded).
    platform: a :class:`~attnhal.platform.Platform` or spec (``"cpu"``, ``"hip:gfx942"``
        simulated on the CPU); default :func:`attnhal.platform.detect`.
    only: claim names or name prefixes to run (``"graph"``, ``"phase[decode"``); others are left out.
    backend_kwargs: passed to every backend constructor.
    derandomize: the same examples on every run (a report is reproducible; with a
        ``budget`` the count of rounds depends on the time).
    budget: seconds for the random examples of the whole run, spread over the claims
        still to run (each claim: its fixed examples, then rounds of random ones until
        its share is spent).
    thorough: also the costlier fixed examples (more long contexts), for release checks.
    allow_unchecked: claims not checked here do not make the report fail.
    strict: vendor claims whose device is not here make the report fail (by default they do not).
    progress: called when each claim starts and when its result is known.
    max_seq_len, max_cost: bounds of drawn batches and fixed examples (default: the kit's,
        :data:`~attnhal.testing.strategies.DEFAULT_MAX_SEQ_LEN` and ``DEFAULT_MAX_COST``;
        an interpreter needs smaller ones). Lowered bounds are named in the report's notes.

    Raises ``LookupError`` when ``backend`` cannot be resolved (see :func:`resolve_backend`), and
    :class:`ConformanceInterrupted` (a ``KeyboardInterrupt``) with the partial report on Ctrl-C.
    A backend that cannot run here (e.g. Triton on a CPU platform without
    ``TRITON_INTERPRET=1``) gives a report of claims "not checked here", not an error.
    """
    if budget is not None:
        budget = BUDGET.check(budget)  # finite and at most a day: each claim's share is finite
    if max_examples is not None:
        EXAMPLES.check(max_examples, "max_examples")
    cls = resolve_backend(backend)
    if max_examples is None:
        max_examples = 10**9 if budget is not None else examples_from_env(THOROUGH_EXAMPLES if thorough else None)
    target = Target(cls, as_platform(platform), max_examples=max_examples, thorough=thorough,
                    backend_kwargs=dict(backend_kwargs or {}), derandomize=derandomize, database=None,
                    max_seq_len=DEFAULT_MAX_SEQ_LEN if max_seq_len is None else max_seq_len,
                    max_cost=DEFAULT_MAX_COST if max_cost is None else max_cost)
    report = ConformanceReport(cls.capabilities.name, f"{cls.__module__}.{cls.__qualname__}", target.platform.name,
                               target.platform.device_name or target.device, target.platform.graph_kind.value,
                               target.max_examples, notes=_notes(target), allow_unchecked=allow_unchecked,
                               budget=budget, thorough=thorough, strict=strict)
    start = time.perf_counter()
    prefixes = tuple(only) if only is not None else None
    todo = [c for c in claims(cls.capabilities) if prefixes is None or c.name.startswith(prefixes)]
    done: dict[str, ClaimResult] = {}
    try:
        for i, claim in enumerate(todo):
            if progress is not None:
                progress(i, len(todo), claim, None)
            why = depends_on(claim, done)
            share = None if budget is None else max(0.0, budget - (time.perf_counter() - start)) / (len(todo) - i)
            result = (ClaimResult(claim, Status.NOT_CHECKED, why) if why
                      else verify(replace(target, seconds=share), claim))
            done[claim.name] = result
            report.results.append(result)
            if progress is not None:
                progress(i, len(todo), claim, result)
    except KeyboardInterrupt as exc:  # a long run stopped by hand keeps what it checked
        report.seconds, report.interrupted = time.perf_counter() - start, True
        raise ConformanceInterrupted(report) from exc
    report.seconds = time.perf_counter() - start
    return report
