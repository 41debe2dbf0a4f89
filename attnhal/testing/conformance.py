"""The conformance suite as pytest mixins: certify a backend in one line.

.. code-block:: python

    # tests/test_conformance.py of your backend package
    from attnhal.testing.conformance import BackendConformance
    from my_backend import MyBackend

    class TestMyBackend(BackendConformance):
        backend_cls = MyBackend

:class:`BackendConformance` has no ``Test`` prefix, so pytest collects only your
subclass. Each test method checks one claim of the backend's descriptor (see
:mod:`attnhal.testing.checks`); a claim the descriptor does not make is skipped as "not
claimed", one this process cannot check is skipped as "not checked here: <why>", and a
falsified claim fails with the claim's name and the shrunk counterexample.

:class:`BackendConformance` is the sum of one mixin per claim family (the modules of
:mod:`attnhal.testing.checks`); subclass one alone, or several, to run only those claims
(the phase claims while graph support is still being written, say):

=============================  =========================================================
mixin                          claims
=============================  =========================================================
:class:`PhaseConformance`      ``phase[P, dtype]``, ``unclaimed[P]``
:class:`FeatureConformance`    ``feature[F]``, ``unclaimed_feature[F]``, ``page_size[N]``,
                               ``kv_dtype[D]``
:class:`GraphConformance`      ``graph[P]``, ``seq_len_fill[P]``
:class:`MultiStepConformance`  ``multi_step``
:class:`PropertyConformance`   ``deterministic``, ``inputs_unchanged``, ``batch_invariant``,
                               ``layer_pattern``, ``scale_edges``, ``empty_batch``
=============================  =========================================================

:class:`BackendConformance` adds ``vendor[V]``: where the other claims ran.

Settings, each a class attribute or a fixture of the same name (the attribute wins):

``backend_cls`` (required)
    the backend class, a registered name (``"torch"``) or ``"module:attr"``.
``platform``
    a :class:`~attnhal.platform.Platform` or spec (``"hip:gfx942"`` simulated on CPU);
    default ``--attnhal-platform``, else :func:`attnhal.platform.detect`.
``max_examples``
    random examples per check on top of the fixed ones; ``--attnhal-examples`` and
    ``$ATTNHAL_CONFORMANCE_EXAMPLES`` override it; default 3 (25 with ``thorough``).
``thorough``
    also the costlier fixed examples and more random ones; ``--attnhal-thorough``.
``budget``
    seconds of random examples per check (rounds until spent; ``max_examples`` then caps
    them); ``--attnhal-budget`` spreads its total over the checks of the class.
``allow_unchecked``
    a claim this process cannot check is skipped instead of failing; ``--attnhal-allow-unchecked``.
    A vendor claim whose device is not here (``vendor[cuda]`` on a CPU machine) skips anyway.
``strict``
    such vendor claims fail unless waived; ``--attnhal-strict``.
``max_seq_len``, ``max_cost``: bounds of drawn batches and fixed examples (small for an interpreter).
``backend_kwargs``: keyword arguments for every backend the kit builds, beside its platform."""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from hypothesis.errors import Flaky

from attnhal.backend import AttentionBackend
from attnhal.bounds import Bound, FloatBound
from attnhal.errors import InvalidValue
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import Platform, Vendor, as_platform
from attnhal.spec import DTYPES, KV_DTYPES
from attnhal.testing.checks import (
    DEFAULT_EXAMPLES,
    THOROUGH_EXAMPLES,
    Claim,
    ClaimFalsified,
    ClaimKind,
    ClaimResult,
    Status,
    Target,
    check,
    claims,
    not_checked_reason,
    verify,
)
from attnhal.testing.checks.claims import METAMORPHIC, NothingToCheck
from attnhal.testing.checks.run import depends_on, flaky_result, with_tolerance
from attnhal.testing.report import resolve_backend
from attnhal.testing.settings import BUDGET, EXAMPLES, env_examples

__all__ = [
    "BackendConformance",
    "FeatureConformance",
    "GraphConformance",
    "MultiStepConformance",
    "PhaseConformance",
    "PropertyConformance",
]

_PHASES = [p.value for p in Phase]
_GRAPH_PHASES = [p.value for p in GRAPH_PHASES]
#: Page sizes a descriptor may claim beyond 1, and KV dtypes beyond the compute dtypes.
_PAGE_SIZES = [8, 16, 32, 64, 128, 256]
_EXTRA_KV_DTYPES = [d for d in KV_DTYPES if d not in DTYPES]


def _setting(request: pytest.FixtureRequest, name: str) -> Any:
    """Class attribute ``name`` if set, else the fixture ``name`` if one exists, else None."""
    value = getattr(request.cls, name, None)
    if value is not None:
        return value
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        return None


def _examples(request: pytest.FixtureRequest) -> int:
    option = request.config.getoption("attnhal_examples", default=None)
    if option is not None:
        return _within(EXAMPLES, option, "--attnhal-examples")
    env = _within_env()
    if env is not None:
        return env
    value = _setting(request, "max_examples")
    if value is not None:
        return int(value)
    return THOROUGH_EXAMPLES if _flag(request, "thorough") else DEFAULT_EXAMPLES


def _flag(request: pytest.FixtureRequest, name: str) -> bool:
    """``--attnhal-NAME`` given, or the class attribute / fixture ``name`` true."""
    return bool(request.config.getoption(f"attnhal_{name}", default=False) or _setting(request, name))


def _budget(request: pytest.FixtureRequest, checks: int) -> float | None:
    """Seconds per check: ``--attnhal-budget`` spread over the class's checks, else ``budget``."""
    total = request.config.getoption("attnhal_budget", default=None)
    if total is not None:
        return _within(BUDGET, total, "--attnhal-budget") / max(checks, 1)
    value = _setting(request, "budget")
    return None if value is None else _within(BUDGET, value, "budget")


def _within(bound: Bound | FloatBound, value: Any, name: str) -> Any:
    """``value`` within ``bound``, else a usage error naming the option or setting ``name``."""
    try:
        return bound.check(value, name)
    except InvalidValue as exc:
        raise pytest.UsageError(str(exc)) from None


def _within_env() -> int | None:
    try:
        return env_examples()
    except InvalidValue as exc:
        raise pytest.UsageError(f"{exc} (environment)") from None


def _backend(request: pytest.FixtureRequest) -> type[AttentionBackend]:
    option = request.config.getoption("attnhal_backend", default=None)
    spec = option if getattr(request.cls, "from_option", False) else None
    spec = spec or _setting(request, "backend_cls") or option
    if spec is None:
        raise pytest.UsageError(f"{request.cls.__name__ if request.cls else 'BackendConformance'}: no backend "
                                "(supported: class attribute backend_cls = YourBackend, a fixture backend_cls, "
                                "or pytest --attnhal-backend NAME|module:attr)")
    try:
        return resolve_backend(spec)
    except LookupError as exc:
        raise pytest.UsageError(f"backend {spec!r}: {exc}") from exc


def _platform(request: pytest.FixtureRequest) -> Platform:
    option = request.config.getoption("attnhal_platform", default=None)
    return as_platform(option or _setting(request, "platform"))


class _Conformance:
    """The settings and the target shared by every claim family (see the module docs)."""

    backend_cls: ClassVar[type[AttentionBackend] | str | None] = None
    platform: ClassVar[Platform | str | None] = None
    max_examples: ClassVar[int | None] = None
    backend_kwargs: ClassVar[Mapping[str, Any] | None] = None
    thorough: ClassVar[bool | None] = None
    budget: ClassVar[float | None] = None
    allow_unchecked: ClassVar[bool | None] = None
    strict: ClassVar[bool | None] = None
    max_seq_len: ClassVar[int | None] = None
    max_cost: ClassVar[int | None] = None
    #: The plugin's generated suite reads the backend from ``--attnhal-backend`` first.
    from_option: ClassVar[bool] = False
    #: The claim kinds a family's tests check (a combined class runs the union).
    claim_kinds: ClassVar[frozenset[ClaimKind]] = frozenset()

    @pytest.fixture(scope="class")
    @classmethod
    def attnhal_target(cls, request: pytest.FixtureRequest) -> Target:
        """What every test of the class runs: backend, platform, example count, bounds."""
        target = Target(_backend(request), _platform(request), max_examples=_examples(request),
                        backend_kwargs=dict(_setting(request, "backend_kwargs") or {}),
                        thorough=_flag(request, "thorough"))
        seq, cost = _setting(request, "max_seq_len"), _setting(request, "max_cost")
        target = replace(target, max_seq_len=int(seq or target.max_seq_len), max_cost=int(cost or target.max_cost))
        seconds = _budget(request, len(_claims_of(cls, target)))
        if seconds is not None:
            unset = _setting(request, "max_examples") is None and request.config.getoption(
                "attnhal_examples", default=None) is None
            target = replace(target, seconds=seconds, max_examples=10**9 if unset else target.max_examples)
        return target


def _claims_of(cls: type, target: Target) -> list[Claim]:
    """The claims of ``target``'s descriptor that the families ``cls`` combines check."""
    kinds: set[ClaimKind] = set()
    for family in cls.__mro__:
        kinds |= getattr(family, "claim_kinds", frozenset())
    return [c for c in claims(target.caps) if c.kind in kinds]


class PhaseConformance(_Conformance):
    """``phase[P, dtype]`` and ``unclaimed[P]``: every claimed phase against the fp64 reference."""

    claim_kinds = frozenset({ClaimKind.PHASE, ClaimKind.UNCLAIMED})

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("phase", _PHASES)
    def test_phase(self, attnhal_target: Target, request: pytest.FixtureRequest, phase: str, dtype: str) -> None:
        """Every claimed head size of ``phase`` in ``dtype`` matches the fp64 reference."""
        _claim(attnhal_target, request, Claim(ClaimKind.PHASE, phase, dtype))

    @pytest.mark.parametrize("phase", _PHASES)
    def test_unclaimed_phase(self, attnhal_target: Target, request: pytest.FixtureRequest, phase: str) -> None:
        """A phase the descriptor leaves out raises ``UnsupportedPhase``."""
        _claim(attnhal_target, request, Claim(ClaimKind.UNCLAIMED, phase))


class FeatureConformance(_Conformance):
    """``feature[F]``, ``unclaimed_feature[F]``, ``page_size[N]``, ``kv_dtype[D]``: the variants
    of the phase cases, eager and (for claimed graph phases) captured."""

    claim_kinds = frozenset({ClaimKind.FEATURE, ClaimKind.UNCLAIMED_FEATURE, ClaimKind.PAGE_SIZE,
                             ClaimKind.KV_DTYPE})

    @pytest.mark.parametrize("feature", [f.value for f in Feature])
    def test_feature(self, attnhal_target: Target, request: pytest.FixtureRequest, feature: str) -> None:
        """A claimed feature works (``custom_mask``: draft-tree masks in ``target_verify``)."""
        _claim(attnhal_target, request, Claim(ClaimKind.FEATURE, feature))

    @pytest.mark.parametrize("feature", [f.value for f in Feature if f is not Feature.CUSTOM_MASK])
    def test_unclaimed_feature(self, attnhal_target: Target, request: pytest.FixtureRequest, feature: str) -> None:
        """A feature the backend does not claim is refused with ``UnsupportedPhase``, not ignored."""
        _claim(attnhal_target, request, Claim(ClaimKind.UNCLAIMED_FEATURE, feature))

    @pytest.mark.parametrize("page_size", _PAGE_SIZES)
    def test_page_size(self, attnhal_target: Target, request: pytest.FixtureRequest, page_size: int) -> None:
        """A claimed page size > 1: every phase (and graph phase) with requests owning whole pages."""
        _claim(attnhal_target, request, Claim(ClaimKind.PAGE_SIZE, str(page_size)))

    @pytest.mark.parametrize("kv_dtype", _EXTRA_KV_DTYPES)
    def test_kv_dtype(self, attnhal_target: Target, request: pytest.FixtureRequest, kv_dtype: str) -> None:
        """A claimed KV dtype beyond the compute dtypes (fp8 per flavour, with per-layer scales)."""
        _claim(attnhal_target, request, Claim(ClaimKind.KV_DTYPE, kv_dtype))


class GraphConformance(_Conformance):
    """``graph[P]`` and ``seq_len_fill[P]``: captured phases replay padded batches as eager runs them."""

    claim_kinds = frozenset({ClaimKind.GRAPH, ClaimKind.SEQ_LEN_FILL})

    @pytest.mark.parametrize("phase", _GRAPH_PHASES)
    def test_graph(self, attnhal_target: Target, request: pytest.FixtureRequest, phase: str) -> None:
        """A claimed graph phase captures, replays equal to eager, without host sync or allocation."""
        _claim(attnhal_target, request, Claim(ClaimKind.GRAPH, phase))

    @pytest.mark.parametrize("phase", _GRAPH_PHASES)
    def test_seq_len_fill(self, attnhal_target: Target, request: pytest.FixtureRequest, phase: str) -> None:
        """Padded rows (seq len = the declared fill value) are finite and leave real rows alone."""
        _claim(attnhal_target, request, Claim(ClaimKind.SEQ_LEN_FILL, phase))


class MultiStepConformance(_Conformance):
    """``multi_step``: the backend as every step of a :class:`~attnhal.backend.MultiStepDraft`."""

    claim_kinds = frozenset({ClaimKind.MULTI_STEP})

    def test_multi_step(self, attnhal_target: Target, request: pytest.FixtureRequest) -> None:
        """``MultiStepDraft``: every forward matches the reference as the draft tree re-parents."""
        _claim(attnhal_target, request, Claim(ClaimKind.MULTI_STEP))


class PropertyConformance(_Conformance):
    """``deterministic``, ``inputs_unchanged`` and the metamorphic claims: what every backend owes."""

    claim_kinds = frozenset({ClaimKind.DETERMINISTIC, ClaimKind.INPUTS_UNCHANGED, *METAMORPHIC})

    def test_deterministic(self, attnhal_target: Target, request: pytest.FixtureRequest) -> None:
        """Two eager forwards of one batch, and two replays of one graph, are bitwise equal."""
        _claim(attnhal_target, request, Claim(ClaimKind.DETERMINISTIC))

    def test_inputs_unchanged(self, attnhal_target: Target, request: pytest.FixtureRequest) -> None:
        """q/k/v, the batch, the pool's table and other layers are untouched by a forward."""
        _claim(attnhal_target, request, Claim(ClaimKind.INPUTS_UNCHANGED))

    @pytest.mark.parametrize("kind", [k.value for k in METAMORPHIC])
    def test_metamorphic(self, attnhal_target: Target, request: pytest.FixtureRequest, kind: str) -> None:
        """Batch composition, layer patterns, scale edges and empty batches (what every backend owes)."""
        _claim(attnhal_target, request, Claim(ClaimKind(kind)))


class BackendConformance(PhaseConformance, FeatureConformance, GraphConformance, MultiStepConformance,
                         PropertyConformance):
    """Every claim of ``backend_cls``'s descriptor, checked by running it (see the module docs).

    Subclass it with a ``Test`` name and set ``backend_cls``; nothing else is required.
    """

    claim_kinds = frozenset({ClaimKind.VENDOR})

    @pytest.mark.parametrize("vendor", [v.value for v in Vendor])
    def test_vendor(self, attnhal_target: Target, request: pytest.FixtureRequest, vendor: str) -> None:
        """Where the claims ran: the claimed vendors without a device here are reported skipped."""
        _claim(attnhal_target, request, Claim(ClaimKind.VENDOR, vendor))


def _claim(target: Target, request: pytest.FixtureRequest, claim: Claim) -> None:
    """Skip an unmade claim; fail (or, when waived, skip) one not checkable here; else check it."""
    if claim not in claims(target.caps):
        pytest.skip(f"{claim.name} is not claimed by {target.caps.name!r}: not tested")
    why = not_checked_reason(target, claim) or depends_on(claim, _done(request, target))
    if why is not None:
        result = ClaimResult(claim, Status.NOT_CHECKED, why)
        _record(request, target, result)
        if result.device_elsewhere and not _flag(request, "strict"):
            pytest.skip(f"not checked here: {claim.name}: {why}")
        _unchecked(request, f"{claim.name}: {why}")
        return
    if claim.kind is ClaimKind.VENDOR:  # where the claims ran: nothing to run for it
        _record(request, target, verify(target, claim))
        return
    start = time.perf_counter()
    try:
        detail, count = check(target, claim)
    except ClaimFalsified as exc:
        notes = "\n".join(getattr(exc, "__notes__", ()))
        _record(request, target, ClaimResult(claim, Status.FALSIFIED, exc.detail, counterexample=notes or None,
                                             seconds=time.perf_counter() - start))
        failure = "\n".join(filter(None, (str(exc), notes, _cause(exc))))
    except NothingToCheck as exc:  # no example fits this run's bounds: said, never verified by nothing
        _record(request, target, ClaimResult(claim, Status.NOT_CHECKED, str(exc)))
        pytest.skip(f"not checked here: {claim.name}: {exc}")
    except Flaky as exc:
        result = flaky_result(claim, exc)
        result.seconds = time.perf_counter() - start
        _record(request, target, result)
        failure = "\n".join(filter(None, (f"claim {claim.name} falsified (flaky): {result.detail}",
                                            result.counterexample)))
    else:
        _record(request, target, ClaimResult(claim, Status.VERIFIED, detail, examples=count,
                                             seconds=time.perf_counter() - start))
        return
    pytest.fail(failure, pytrace=False)  # outside the handler: no "during handling" chain in the output


def _unchecked(request: pytest.FixtureRequest, what: str) -> None:
    """A claim not checked here fails the run unless waived (``allow_unchecked``)."""
    if _flag(request, "allow_unchecked"):
        pytest.skip(f"not checked here: {what}")
    pytest.fail(f"not checked here: {what} (waive with --attnhal-allow-unchecked or allow_unchecked = True)",
                pytrace=False)


def _cause(exc: BaseException) -> str:
    """Where in the backend an exception behind a falsification came from."""
    if exc.__cause__ is None:
        return ""
    lines = traceback.format_exception(exc.__cause__)
    return "caused by:\n" + "".join(lines[-12:]).rstrip()


def _record(request: pytest.FixtureRequest, target: Target, result: ClaimResult) -> None:
    from attnhal.testing.plugin import record

    record(request.config, _key(target), with_tolerance(target, result))


def _done(request: pytest.FixtureRequest, target: Target) -> dict[str, ClaimResult]:
    from attnhal.testing.plugin import recorded

    return recorded(request.config, _key(target))


def _key(target: Target) -> str:
    return f"{target.caps.name} on {target.platform.name}"
