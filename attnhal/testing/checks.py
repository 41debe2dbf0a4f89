"""The claim checks of the conformance kit: each one proves a descriptor claim by running it.

A backend's :class:`~attnhal.capabilities.BackendCapabilities` is a list of claims.
:func:`claims` enumerates them as :class:`Claim` records; :func:`check` runs one claim
(hypothesis-driven: fixed examples plus ``max_examples`` random ones) and raises
:class:`ClaimFalsified` naming the claim, with the shrunk counterexample attached by
hypothesis as a note; :func:`verify` turns that into a :class:`ClaimResult`
(verified / falsified / not checked here). The pytest mixin
(:mod:`attnhal.testing.conformance`) and :func:`attnhal.testing.report.run_conformance`
both drive these functions.

=========================  ================================================================
claim                      what is run
=========================  ================================================================
``phase[P, dtype]``        every claimed head size of phase ``P`` in ``dtype``, eager, against
                           the fp64 reference within ``caps.tolerance(dtype)``; the K/V cache
                           changes only at ``out_cache_loc``
``unclaimed[P]``           a phase not in ``caps.phases`` raises ``UnsupportedPhase``
``feature[custom_mask]``   ``target_verify`` with draft-tree masks (``topk > 1``)
``graph[P]``               capture with :class:`~attnhal.graphs.GraphRunner` at several sizes;
                           padded replays equal eager and the reference; no host sync at
                           capture or in ``init_replay_metadata``; no allocation at replay;
                           K/V written only at real slots and the padding slot.
                           ``graph[draft_decode]`` captures every step of a
                           :class:`~attnhal.backend.MultiStepDraft` in one graph
``seq_len_fill[P]``        padded rows (seq len = the declared fill value) give finite
                           outputs and leave real rows as eager computes them
``multi_step``             :class:`~attnhal.backend.MultiStepDraft`: every forward matches the
                           reference while the draft tree re-parents between forwards
=========================  ================================================================

A claim that cannot be run in this process (no device of a claimed vendor, no graph
API, a Triton backend on a CPU platform without the interpreter, ...) is reported
"not checked here" with the reason — never passed silently.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase

from attnhal.backend import (
    AttentionBackend,
    AttentionConfig,
    ForwardBatch,
    KVPool,
    MultiStepDraft,
    UnsupportedPhase,
)
from attnhal.capabilities import (
    DTYPES,
    GRAPH_PHASES,
    BackendCapabilities,
    Feature,
    Phase,
    ReasonCode,
    SpecLimits,
    Tolerance,
)
from attnhal.graphs import CaptureError, EmulatedGraph, GraphCaptureWarning, GraphRunner, PhaseStep
from attnhal.graphs.emulator import OpKind
from attnhal.plan import GraphPlan, GraphPolicy, PhasePlan, SpecConfig
from attnhal.platform import GraphKind, Platform, Vendor
from attnhal.testing import strategies as ast
from attnhal.testing.batches import (
    Case,
    CaseSpec,
    PoolSize,
    attention_config,
    build_case,
    make_pool,
    new_qkv,
    pool_size,
    reparent_rows,
)
from attnhal.testing.reference import real_tokens, reference_forward

__all__ = [
    "Claim",
    "ClaimFalsified",
    "ClaimKind",
    "ClaimResult",
    "Status",
    "Target",
    "canonical_cases",
    "check",
    "claims",
    "not_checked_reason",
    "verify",
]

#: Environment variable: random examples per check (on top of the fixed examples).
EXAMPLES_ENV = "ATTNHAL_CONFORMANCE_EXAMPLES"
DEFAULT_EXAMPLES = 2


class Status(str, Enum):
    VERIFIED = "verified"
    FALSIFIED = "falsified"
    NOT_CHECKED = "not checked here"


class ClaimKind(str, Enum):
    PHASE = "phase"
    UNCLAIMED = "unclaimed"
    FEATURE = "feature"
    GRAPH = "graph"
    SEQ_LEN_FILL = "seq_len_fill"
    MULTI_STEP = "multi_step"
    PAGE_SIZE = "page_size"
    KV_DTYPE = "kv_dtype"
    VENDOR = "vendor"


@dataclass(frozen=True)
class Claim:
    """One claim of a descriptor: ``kind`` about ``subject`` (a phase, feature, vendor...)."""

    kind: ClaimKind
    subject: str = ""
    dtype: str | None = None

    @property
    def name(self) -> str:
        """``phase[decode, float16]``, ``graph[target_verify]``, ``multi_step``, ..."""
        if not self.subject:
            return self.kind.value
        inner = f"{self.subject}, {self.dtype}" if self.dtype else self.subject
        return f"{self.kind.value}[{inner}]"

    @property
    def phase(self) -> Phase:
        return Phase(self.subject)

    def __str__(self) -> str:
        return self.name


class ClaimFalsified(AssertionError):
    """Running the backend contradicted ``claim``; ``detail`` says how.

    Raised from inside a hypothesis test, it carries the shrunk counterexample in
    ``__notes__`` ("Falsifying example: ...").
    """

    def __init__(self, claim: Claim | str, detail: str) -> None:
        self.claim, self.detail = str(claim), detail
        super().__init__(f"claim {self.claim} falsified: {detail}")

    def __reduce__(self) -> tuple[type[ClaimFalsified], tuple[str, str]]:
        return (ClaimFalsified, (self.claim, self.detail))


@dataclass
class ClaimResult:
    """The outcome of one claim. ``counterexample``: the falsifying example, as hypothesis printed it."""

    claim: Claim
    status: Status
    detail: str
    counterexample: str | None = None
    examples: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim.name, "kind": self.claim.kind.value, "subject": self.claim.subject,
                "dtype": self.claim.dtype, "status": self.status.value, "detail": self.detail,
                "counterexample": self.counterexample, "examples": self.examples,
                "seconds": round(self.seconds, 3)}


_PROFILE_DATABASE: Any = object()  # sentinel: use the loaded hypothesis profile's database


@dataclass
class Target:
    """What the checks run: a backend class on a platform, and how hard to look.

    Attributes
    ----------
    backend_cls: the :class:`~attnhal.backend.AttentionBackend` subclass under test.
    platform: where tensors live (``torch_device``) and how graphs are captured
        (``graph_kind``): the real device, or a simulated platform on the CPU.
    max_examples: random hypothesis examples per check, on top of the fixed ones
        (one per claimed head size, plus edge cases); ``0`` runs the fixed ones only.
    backend_kwargs: passed to every ``backend_cls(config, pool, **backend_kwargs)``.
    capture_sizes: graph capture sizes (requests).
    max_requests, max_seq_len: bounds of drawn batches (keep them small for interpreters).
    derandomize, database: hypothesis settings (``database`` defaults to the profile's).
    """

    backend_cls: type[AttentionBackend]
    platform: Platform
    max_examples: int = DEFAULT_EXAMPLES
    backend_kwargs: Mapping[str, Any] = field(default_factory=dict)
    capture_sizes: tuple[int, ...] = (1, 2, 4)
    max_requests: int = 3
    max_seq_len: int = 48
    derandomize: bool = False
    database: ExampleDatabase | None = _PROFILE_DATABASE

    @property
    def caps(self) -> BackendCapabilities:
        return self.backend_cls.capabilities

    @property
    def device(self) -> str:
        return self.platform.torch_device

    def new_backend(self, config: AttentionConfig, pool: KVPool) -> AttentionBackend:
        return self.backend_cls(config, pool, **self.backend_kwargs)

    def hypothesis_settings(self) -> settings:
        kwargs: dict[str, Any] = {
            "max_examples": max(1, self.max_examples), "deadline": None, "derandomize": self.derandomize,
            "suppress_health_check": list(HealthCheck), "report_multiple_bugs": False, "print_blob": False}
        # No "explain" phase: its list of code lines run by failing cases is noise in a report.
        kwargs["phases"] = (HypothesisPhase.explicit,) if self.max_examples == 0 else tuple(
            p for p in HypothesisPhase if p.name != "explain")
        if self.database is not _PROFILE_DATABASE:
            kwargs["database"] = self.database
        return settings(**kwargs)


def examples_from_env(default: int = DEFAULT_EXAMPLES) -> int:
    """``$ATTNHAL_CONFORMANCE_EXAMPLES`` if set, else ``default``."""
    raw = os.environ.get(EXAMPLES_ENV, "").strip()
    return int(raw) if raw else default


# --- which claims, and which can run here -----------------------------------------------------------

def claims(caps: BackendCapabilities) -> list[Claim]:
    """Every claim of ``caps`` the kit knows, in report order."""
    phases = [p for p in Phase if p in caps.phases]
    out = [Claim(ClaimKind.PHASE, p.value, d) for p in phases for d in DTYPES if d in caps.dtypes]
    out += [Claim(ClaimKind.UNCLAIMED, p.value) for p in Phase if p not in caps.phases]
    out += [Claim(ClaimKind.FEATURE, f.value) for f in Feature if f in caps.features]
    graphs = [p for p in GRAPH_PHASES if p in caps.graph]
    out += [Claim(ClaimKind.GRAPH, p.value) for p in graphs]
    out += [Claim(ClaimKind.SEQ_LEN_FILL, p.value) for p in graphs]
    if caps.multi_step is not None:
        out.append(Claim(ClaimKind.MULTI_STEP))
    out += [Claim(ClaimKind.PAGE_SIZE, str(s)) for s in sorted(caps.page_sizes) if s != 1]
    out += [Claim(ClaimKind.KV_DTYPE, d) for d in sorted(set(caps.kv_dtypes or ()) - set(caps.dtypes))]
    out += [Claim(ClaimKind.VENDOR, v.value) for v in Vendor if v in caps.vendors]
    return out


def process_reasons(target: Target) -> list[str]:
    """Why no claim of the backend can run in this process (empty: they can).

    Sources: the backend's required modules and the contract's
    :meth:`~attnhal.backend.AttentionBackend.runtime_reasons` (e.g. Triton on a host
    device without its interpreter).
    """
    caps = target.caps
    out = [f"module {m} is not installed" for m in caps.requires if importlib.util.find_spec(m) is None]
    if out:
        return out
    return [str(r) for r in target.backend_cls.runtime_reasons(target.platform)]


def checkable_dtypes(target: Target) -> list[str]:
    """Claimed dtypes, in the order checks use them."""
    return [d for d in DTYPES if d in target.caps.dtypes]


def not_checked_reason(target: Target, claim: Claim) -> str | None:
    """Why ``claim`` cannot be checked in this process, or None if it can."""
    caps, platform = target.caps, target.platform
    if claim.kind is ClaimKind.VENDOR:
        if platform.vendor.value == claim.subject and not platform.simulated:
            return None
        arch = caps.min_arch.get(Vendor(claim.subject))
        return (f"no {claim.subject} device in this process (platform {platform.spec}); native kernels "
                f"and real graphs there are unchecked" + (f", as is min_arch {arch}" if arch else ""))
    if claim.kind is ClaimKind.PAGE_SIZE:
        return f"page_size={claim.subject}: the kit's KV pool has page size 1"
    if claim.kind is ClaimKind.KV_DTYPE:
        return f"kv_dtype={claim.subject}: the kit runs caches in the compute dtype"
    whole = process_reasons(target)
    if whole:
        return "; ".join(whole)
    if claim.kind is ClaimKind.FEATURE and claim.subject != Feature.CUSTOM_MASK.value:
        return f"the kit has no batch field for feature {claim.subject} yet"
    if claim.kind is ClaimKind.FEATURE and Phase.TARGET_VERIFY not in caps.phases:
        return "custom_mask applies to target_verify, which the backend does not claim"
    if claim.kind in (ClaimKind.GRAPH, ClaimKind.SEQ_LEN_FILL) and platform.graph_kind is GraphKind.NONE:
        return f"platform {platform.spec} has no graph API"
    if claim.kind in (ClaimKind.GRAPH, ClaimKind.SEQ_LEN_FILL, ClaimKind.MULTI_STEP):
        if _graph_specs(target, claim).is_empty:
            return f"no spec config satisfies the claim's limits {_limits(target, claim).to_dict()}"
    return None


# --- running a claim -----------------------------------------------------------------------------

def verify(target: Target, claim: Claim) -> ClaimResult:
    """Run ``claim`` and report it: verified, falsified (with the counterexample) or not checked here."""
    why = not_checked_reason(target, claim)
    if why is not None:
        return ClaimResult(claim, Status.NOT_CHECKED, why)
    if claim.kind is ClaimKind.VENDOR:
        return ClaimResult(claim, Status.VERIFIED, f"the other claims ran here, on {target.platform.spec} "
                                                   f"({target.platform.device_name or target.device})")
    start = time.perf_counter()
    try:
        detail, count = check(target, claim)
    except ClaimFalsified as exc:
        detail = exc.detail if exc.claim == claim.name else f"{exc.claim} falsified: {exc.detail}"
        return ClaimResult(claim, Status.FALSIFIED, detail, counterexample=_counterexample(exc),
                           seconds=time.perf_counter() - start)
    return ClaimResult(claim, Status.VERIFIED, detail, examples=count, seconds=time.perf_counter() - start)


def _counterexample(exc: BaseException) -> str | None:
    notes = [n for n in getattr(exc, "__notes__", ()) if "example" in n.lower() or "test case" in n.lower()]
    return "\n".join(notes) if notes else None


def check(target: Target, claim: Claim) -> tuple[str, int]:
    """Run ``claim``; returns ``(what was verified, examples run)`` or raises :class:`ClaimFalsified`."""
    runners: dict[ClaimKind, Callable[[Target, Claim], tuple[str, int]]] = {
        ClaimKind.PHASE: _check_phase,
        ClaimKind.UNCLAIMED: _check_unclaimed,
        ClaimKind.FEATURE: _check_feature,
        ClaimKind.GRAPH: _check_graph,
        ClaimKind.SEQ_LEN_FILL: _check_fill,
        ClaimKind.MULTI_STEP: _check_multi_step,
    }
    if claim.kind not in runners:
        raise ValueError(f"claim={claim} (supported: {', '.join(k.value for k in runners)} run; "
                         "the others are reported by verify())")
    return runners[claim.kind](target, claim)


def _run(target: Target, name: str, strategy: st.SearchStrategy[Any], fixed: Sequence[Any],
         body: Callable[[Any], None]) -> int:
    """Run ``body`` on the fixed examples then ``target.max_examples`` drawn ones; returns the count."""
    count = [0]

    def test(case: Any) -> None:
        body(case)
        count[0] += 1

    test.__name__ = test.__qualname__ = name  # hypothesis names the counterexample after it
    wrapped: Any = test
    for case in reversed(fixed):
        wrapped = example(case=case)(wrapped)
    target.hypothesis_settings()(given(case=strategy)(wrapped))()
    return count[0]


@contextlib.contextmanager
def _blame(claim: Claim, what: str) -> Iterator[None]:
    """Any error of the backend inside is a falsification of ``claim``."""
    try:
        yield
    except ClaimFalsified:
        raise
    except Exception as exc:  # noqa: BLE001 - a crash of a claimed capability is a broken claim
        raise ClaimFalsified(claim, f"{what} raised {type(exc).__name__}: {exc}") from exc


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _heads(spec: CaseSpec) -> str:
    kind = "MHA" if spec.num_q_heads == spec.num_kv_heads else "MQA" if spec.num_kv_heads == 1 else "GQA"
    return f"{spec.num_q_heads} q / {spec.num_kv_heads} kv heads ({kind})"


def _mismatch(got: torch.Tensor, want: torch.Tensor, tokens: Sequence[int], tol: Tolerance,
              names: tuple[str, str] = ("out", "ref")) -> str | None:
    """Why ``got`` is not ``want`` within ``atol + rtol * |want|`` on ``tokens``, or None."""
    if not tokens:
        return None
    index = torch.tensor(list(tokens), dtype=torch.int64)
    g, w = got.detach().cpu().double()[index], want.detach().cpu().double()[index]
    if not torch.isfinite(g).all():
        bad = (~torch.isfinite(g)).nonzero()[0].tolist()
        return f"non-finite output at token {tokens[bad[0]]}, head {bad[1]}"
    diff = (g - w).abs()
    excess = diff - (tol.atol + tol.rtol * w.abs())
    if excess.max() <= 0:
        return None
    t, h, _ = (int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    over = int((excess > 0).sum())
    a, b = names
    return (f"max |{a} - {b}| = {diff.max():.3g} (token {tokens[t]}, head {h}: |{a}| {g[t, h].abs().max():.3g} "
            f"vs |{b}| {w[t, h].abs().max():.3g}) exceeds atol {tol.atol:g} + rtol {tol.rtol:g}*|{b}| "
            f"in {over} of {excess.numel()} elements")


def _check_output(claim: Claim, out: object, q: torch.Tensor, want: torch.Tensor, batch: ForwardBatch,
                  tol: Tolerance, what: str) -> None:
    if not isinstance(out, torch.Tensor):
        raise ClaimFalsified(claim, f"{what} returned {type(out).__name__} (supported: a tensor)")
    if out.shape != q.shape or out.dtype != q.dtype:
        raise ClaimFalsified(claim, f"{what} returned {list(out.shape)} {out.dtype} "
                                    f"(supported: q's shape {list(q.shape)} and dtype {q.dtype})")
    problem = _mismatch(out, want, real_tokens(batch), tol)
    if problem is None and out.numel() and not torch.isfinite(out).all():
        problem = "non-finite output in padding tokens (they must be finite)"
    if problem is not None:
        raise ClaimFalsified(claim, f"{what}: {problem}")


def _check_cache(claim: Claim, pool: KVPool, layer: int, before: tuple[torch.Tensor, torch.Tensor],
                 batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor, what: str) -> None:
    """Only ``out_cache_loc`` (and the padding slot) of ``layer`` changed, to the new K/V."""
    for name, cache, old, new in (("K", pool.k[layer], before[0], k), ("V", pool.v[layer], before[1], v)):
        want = old.clone()
        want.index_copy_(0, batch.out_cache_loc, new.to(want.dtype))
        wrong = (cache != want).flatten(1).any(1)
        wrong[0] = False  # the padding slot: padding tokens write there, in any order
        if wrong.any():
            slots = wrong.nonzero().flatten().tolist()
            raise ClaimFalsified(claim, f"{what}: the {name} cache differs from the expected write at slots "
                                        f"{slots[:8]} (only out_cache_loc may change, to the new tokens' {name})")


# --- eager phases ---------------------------------------------------------------------------------------

def canonical_cases(caps: BackendCapabilities, phase: Phase, dtype: str, head_size: int) -> list[CaseSpec]:
    """The fixed examples of ``phase``: GQA, two layers, scattered slots, uneven rows, and the
    length edges (``prefill`` rows with 0 new tokens and prefix 0, ``decode`` seq len 1)."""
    tree = Feature.CUSTOM_MASK in caps.features
    fields: dict[Phase, dict[str, Any]] = {
        Phase.PREFILL: {"prefix_lens": (0, 9, 5), "new_lens": (6, 3, 0)},
        Phase.DECODE: {"prefix_lens": (0, 21)},
        Phase.TARGET_VERIFY: {"prefix_lens": (0, 13), "spec": SpecConfig.eagle(2, 2, 4),
                              "tree_parents": ((-1, 0, 0, 1), (-1, 0, 1, 2))} if tree
        else {"prefix_lens": (0, 13), "spec": SpecConfig.eagle(3)},
        Phase.DRAFT_EXTEND: {"prefix_lens": (6, 0), "new_lens": (1, 4), "spec": SpecConfig.eagle(3)},
        Phase.DRAFT_DECODE: {"prefix_lens": (5, 12), "spec": SpecConfig.eagle(3, 2, 5), "draft_step": 1,
                             "draft_picks": (((1,), (1,)), ((0,), (1,)))},
    }
    return [CaseSpec(phase, dtype=dtype, num_q_heads=4, num_kv_heads=2, head_size=head_size, num_layers=2,
                     layer=1, slot_seed=7, seed=1, host_seq_lens=caps.needs_host_seq_lens, **fields[phase])]


def _eager_body(target: Target, claim: Claim) -> Callable[[CaseSpec], None]:
    def body(spec: CaseSpec) -> None:
        case = build_case(spec, device=target.device)
        want = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale)
        before = case.pool.k[case.layer].clone(), case.pool.v[case.layer].clone()
        what = f"head_size={spec.head_size}, {_heads(spec)}"
        with _blame(claim, f"{what}: the backend"):
            backend = target.new_backend(case.config, case.pool)
            backend.init_forward_metadata(case.batch)
            out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
        _check_output(claim, out, case.q, want, case.batch, target.caps.tolerance(spec.dtype), what)
        _check_cache(claim, case.pool, case.layer, before, case.batch, case.k, case.v, what)

    return body


def _check_phase(target: Target, claim: Claim) -> tuple[str, int]:
    caps, phase, dtype = target.caps, claim.phase, claim.dtype
    assert dtype is not None
    sizes = sorted(caps.head_sizes)
    fixed = [c for h in sizes for c in canonical_cases(caps, phase, dtype, h)]
    strategy = ast.case_specs(caps, phase, dtype=dtype, max_requests=target.max_requests,
                              max_seq_len=target.max_seq_len)
    count = _run(target, f"{claim.kind.value}_{phase.value}_{dtype}", strategy, fixed, _eager_body(target, claim))
    return f"head sizes {', '.join(map(str, sizes))}; {_plural(count, 'example')} ({len(fixed)} fixed)", count


def _check_feature(target: Target, claim: Claim) -> tuple[str, int]:
    caps = target.caps
    dtypes = checkable_dtypes(target)
    fixed = [c for h in sorted(caps.head_sizes)[:1] for c in canonical_cases(caps, Phase.TARGET_VERIFY, dtypes[0], h)]
    strategy = st.sampled_from(dtypes).flatmap(lambda d: ast.case_specs(
        caps, Phase.TARGET_VERIFY, dtype=d, tree=True, max_requests=target.max_requests,
        max_seq_len=target.max_seq_len))
    count = _run(target, "feature_custom_mask", strategy, fixed, _eager_body(target, claim))
    return f"target_verify with draft-tree masks; {_plural(count, 'example')}", count


def _check_unclaimed(target: Target, claim: Claim) -> tuple[str, int]:
    caps, phase = target.caps, claim.phase
    dtype = next(d for d in DTYPES if d in caps.dtypes)
    spec = canonical_cases(caps, phase, dtype, min(caps.head_sizes))[0]
    case = build_case(spec, device=target.device)
    try:
        backend = target.new_backend(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    except UnsupportedPhase as exc:
        return f"UnsupportedPhase: {exc}", 1
    except Exception as exc:  # noqa: BLE001 - anything else is the wrong refusal
        raise _with_example(ClaimFalsified(claim, f"{phase.value} is not claimed, yet the backend raised "
                                                  f"{type(exc).__name__}: {exc} (supported: UnsupportedPhase)"),
                            spec) from exc
    shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    raise _with_example(ClaimFalsified(claim, f"{phase.value} is not claimed, yet forward returned {shape} "
                                              "instead of raising UnsupportedPhase"), spec)


def _with_example(exc: ClaimFalsified, spec: CaseSpec) -> ClaimFalsified:
    """Attach the (fixed) example as hypothesis attaches a drawn one."""
    exc.__notes__ = [*getattr(exc, "__notes__", []), f"Failing example: {spec!r}"]
    return exc


# --- graphs -------------------------------------------------------------------------------------------------

def _limits(target: Target, claim: Claim) -> SpecLimits:
    caps = target.caps
    if claim.kind is ClaimKind.MULTI_STEP:
        return caps.multi_step or SpecLimits()
    return caps.graph_limits(claim.phase) or SpecLimits()


def _multi_step_graph(target: Target, claim: Claim) -> bool:
    return claim.subject == Phase.DRAFT_DECODE.value and target.caps.multi_step is not None


def _graph_specs(target: Target, claim: Claim) -> st.SearchStrategy[SpecConfig]:
    caps = target.caps
    if claim.kind is ClaimKind.MULTI_STEP:
        return ast.spec_configs_for(caps, Phase.DRAFT_DECODE, _limits(target, claim))
    if claim.phase is Phase.DECODE:
        return st.just(SpecConfig())
    limits = _limits(target, claim)
    if _multi_step_graph(target, claim):
        limits = ast._tighter(limits, caps.multi_step or SpecLimits())
    return ast.spec_configs_for(caps, claim.phase, limits)


class _Watched:
    """A graph step's metadata owner whose ``init_replay_metadata`` is checked: recorded by
    the capture emulator, any host sync or allocation there falsifies ``claim``."""

    def __init__(self, owner: Any, claim: Claim, check: bool) -> None:
        self.owner, self.claim, self.check = owner, claim, check

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.owner.init_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.owner.init_forward_metadata(batch)

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        self.owner.init_capture_metadata(batch)

    def graph_seq_len_fill_value(self, spec: SpecConfig | None = None) -> int:
        return int(self.owner.graph_seq_len_fill_value(spec))

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        if not self.check:  # a backend needing host seq lens reads a host tensor here, legitimately
            self.owner.init_replay_metadata(batch)
            return
        recorder = EmulatedGraph()
        try:
            recorder.capture(lambda: self.owner.init_replay_metadata(batch))
        except CaptureError as exc:
            raise ClaimFalsified(self.claim, f"init_replay_metadata syncs with the host: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            raise ClaimFalsified(self.claim, f"init_replay_metadata raised {type(exc).__name__}: {exc}") from exc
        fresh = sorted({op.name for op in recorder.recorded_ops
                        if op.kind is OpKind.ALLOC or (op.kind is OpKind.FUNCTIONAL and op.fresh)})
        if fresh:
            raise ClaimFalsified(self.claim, f"init_replay_metadata allocates ({', '.join(fresh[:4])}); it may only "
                                             "write into buffers made by init_graph_state")


@dataclass
class _Graph:
    """One captured phase: the runner, its step's backends, and the last captured output."""

    runner: GraphRunner
    pool: KVPool
    layer: int
    fill: int
    outputs: dict[str, Any] = field(default_factory=dict)


def _pool_for(specs: Sequence[CaseSpec], device: str) -> KVPool:
    size = functools.reduce(PoolSize.union, (pool_size(s) for s in specs))
    return make_pool(specs[0], size, device)


def _inputs(config: AttentionConfig, steps: int, multi: bool) -> dict[str, tuple[str, tuple[int, ...], torch.dtype]]:
    h, kv, d, dt = config.num_q_heads, config.num_kv_heads, config.head_size, config.dtype
    out: dict[str, tuple[str, tuple[int, ...], torch.dtype]] = {}
    for s in range(steps):
        out |= {f"q{s}": ("token", (h, d), dt), f"k{s}": ("token", (kv, d), dt), f"v{s}": ("token", (kv, d), dt)}
        if multi and s:
            out[f"parent{s}"] = ("row", (), torch.int64)
    return out


def _owner(target: Target, claim: Claim, config: AttentionConfig, pool: KVPool, spec: SpecConfig,
           multi: bool) -> tuple[Any, list[AttentionBackend]]:
    """The metadata owner of a graph step (a backend, or a MultiStepDraft) and its step backends."""
    with _blame(claim, "constructing the backend"):
        if multi:
            draft = MultiStepDraft(target.backend_cls, config, pool, spec, **target.backend_kwargs)
            return draft, [draft.backend(s) for s in range(draft.num_forwards)]
        backend = target.new_backend(config, pool)
        return backend, [backend]


def _step_forward(owner: Any, steps: list[AttentionBackend], layer: int, multi: bool, scratch: torch.Tensor,
                  outputs: dict[str, Any]) -> Callable[[ForwardBatch, dict[str, torch.Tensor]], Any]:
    """What the graph records: the attention of every step, re-parenting the draft tree in
    between with ``out=`` ops (no allocation), keeping each size's static outputs."""
    def forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> Any:
        batches = owner.step_batches(batch) if multi else [batch]
        outs = []
        for s, (backend, step_batch) in enumerate(zip(steps, batches)):
            if s:
                path, rows = step_batch._spec().draft_path, batch.batch_size
                torch.index_select(path, 0, x[f"parent{s}"], out=scratch[:rows])
                path[:, :s].copy_(scratch[:rows, :s])
            outs.append(backend.forward(x[f"q{s}"], x[f"k{s}"], x[f"v{s}"], layer, step_batch))
        outputs[str(batch.batch_size)] = outs  # the last call of a size is its capture: static outputs
        return tuple(outs) if multi else outs[0]

    return forward


def _capture(target: Target, claim: Claim, specs: Sequence[CaseSpec], sizes: tuple[int, ...]) -> _Graph:
    """Capture ``claim``'s phase at ``sizes`` over a pool that holds every case of ``specs``."""
    first, phase = specs[0], specs[0].phase
    pool = _pool_for(specs, target.device)
    config, spec = attention_config(first), first.spec or SpecConfig()
    multi = _multi_step_graph(target, claim)
    owner, steps = _owner(target, claim, config, pool, spec, multi)
    outputs: dict[str, Any] = {}
    scratch = torch.zeros((max(sizes) * spec.topk, spec.num_steps), dtype=torch.int64, device=target.device)
    step = PhaseStep(metadata=_Watched(owner, claim, check=not target.caps.needs_host_seq_lens),
                     forward=_step_forward(owner, steps, first.layer, multi, scratch, outputs),
                     inputs=_inputs(config, len(steps), multi),
                     rows_per_request=spec.topk if phase is Phase.DRAFT_DECODE else 1)
    plan = GraphPlan(platform=target.platform.spec, spec=spec, policy=GraphPolicy(batch_sizes=sizes),
                     phases={phase: PhasePlan(runs=True, capture=True, backend=target.caps.name)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphCaptureWarning)  # the failure is read from the runner
        runner = GraphRunner(plan, target.platform, {phase: step})
    failure = runner.summary()[phase].failure
    if failure is not None:
        raise ClaimFalsified(claim, f"capture failed ({target.platform.graph_kind.value} graph): {failure}")
    return _Graph(runner, pool, first.layer, step.metadata.graph_seq_len_fill_value(spec), outputs)


@dataclass
class _Expected:
    """Eager outputs and fp64 references of every forward of one case (one per draft step)."""

    inputs: dict[str, torch.Tensor]
    eager: list[torch.Tensor]
    reference: list[torch.Tensor]
    batches: list[ForwardBatch]


def _eager_steps(target: Target, case: Case, multi: bool) -> tuple[list[AttentionBackend], list[ForwardBatch]]:
    """Fresh backends with the eager metadata of ``case``: one per draft step when ``multi``."""
    if multi:
        draft = MultiStepDraft(target.backend_cls, case.config, case.pool, case.spec.spec or SpecConfig(),
                               **target.backend_kwargs)
        draft.init_forward_metadata(case.batch)
        return [draft.backend(s) for s in range(draft.num_forwards)], draft.step_batches(case.batch)
    backend = target.new_backend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    return [backend], [case.batch]


def _expected(target: Target, claim: Claim, case: Case, multi: bool) -> _Expected:
    """Run ``case`` eagerly (every draft step, re-parenting in between), then restore the
    pool and the draft path so that a replay starts from the same state."""
    pool, layer = case.pool, case.layer
    saved = pool.k[layer].clone(), pool.v[layer].clone()
    path = case.batch.spec.draft_path if case.batch.spec is not None else None
    saved_path = path.clone() if path is not None else None
    gen = torch.Generator().manual_seed(case.spec.seed + 1)
    with _blame(claim, "eager run (the graph's expected result)"):
        backends, batches = _eager_steps(target, case, multi)
        out = _Expected({}, [], [], list(batches))
        for s, (backend, batch) in enumerate(zip(backends, batches)):
            q, k, v = (case.q, case.k, case.v) if s == 0 else new_qkv(case.config, batch.num_tokens, gen, target.device)
            out.inputs |= {f"q{s}": q, f"k{s}": k, f"v{s}": v}
            if s and path is not None:
                rows = torch.tensor(reparent_rows(case.spec, s), dtype=torch.int64, device=target.device)
                out.inputs[f"parent{s}"] = rows
                path[:, :s].copy_(path[rows, :s])
            out.reference.append(reference_forward(q, k, v, layer, batch, pool, case.config.sm_scale))
            out.eager.append(backend.forward(q, k, v, layer, batch).clone())
    pool.k[layer].copy_(saved[0])
    pool.v[layer].copy_(saved[1])
    if path is not None and saved_path is not None:
        path.copy_(saved_path)
    return out


def _replay(target: Target, claim: Claim, graph: _Graph, spec: CaseSpec, multi: bool,
            fill_claim: Claim | None = None) -> None:
    """Replay one case through ``graph`` and compare it with eager and the reference."""
    case = build_case(spec, pool=graph.pool)
    exp = _expected(target, claim, case, multi)
    phase, runner, layer = spec.phase, graph.runner, graph.layer
    stats = runner.summary()[phase]
    sizes = [s for s in runner.captured_sizes(phase) if s >= spec.requests]
    where = _plural(spec.requests, "request") + (
        f" padded to {sizes[0]}" if sizes and sizes[0] > spec.requests else "")
    before = graph.pool.k[layer].clone(), graph.pool.v[layer].clone()
    with _blame(claim, f"replay ({where})"):
        got = runner.run(phase, case.batch, exp.inputs)
    after = runner.summary()[phase]
    if after.replays != stats.replays + 1:
        raise ClaimFalsified(claim, f"{where}: ran eagerly instead of replaying a captured graph")
    if after.replay_allocations != stats.replay_allocations:
        raise ClaimFalsified(claim, f"replay allocated {after.replay_allocations - stats.replay_allocations} "
                                    "tensors (a replay may only write into buffers the graph owns)")
    outs = list(got) if isinstance(got, tuple) else [got]
    tol = target.caps.tolerance(spec.dtype)
    for s, (out, eager, ref, batch) in enumerate(zip(outs, exp.eager, exp.reference, exp.batches)):
        step = f"forward {s} of {len(outs)}, " if multi else ""
        for name, want in (("eager", eager), ("reference", ref)):
            problem = _mismatch(out, want, real_tokens(batch), tol, ("replay", name))
            if problem is not None:
                raise ClaimFalsified(fill_claim or claim, f"{step}replay != {name} ({where}, seq_len_fill="
                                                          f"{graph.fill}): {problem}")
    if not multi:
        _check_cache(claim, graph.pool, layer, before, case.batch, case.k, case.v, f"replay ({where})")
    if fill_claim is not None and sizes:
        _check_padded_rows(fill_claim, graph, spec, sizes[0], where)


def _check_padded_rows(claim: Claim, graph: _Graph, spec: CaseSpec, size: int, where: str) -> None:
    """Every output of the captured batch, padded rows included, is finite."""
    rows = size * (spec.topk if spec.phase is Phase.DRAFT_DECODE else 1)
    for s, static in enumerate(graph.outputs.get(str(rows), [])):
        if not torch.isfinite(static).all():
            bad = int((~torch.isfinite(static)).flatten(1).any(1).nonzero()[0])
            raise ClaimFalsified(claim, f"padded rows with seq_len_fill={graph.fill} give non-finite output "
                                        f"({where}; forward {s}, token {bad} of the captured batch)")


def _graph_cases(target: Target, claim: Claim, sizes: tuple[int, ...],
                 replays: tuple[int, int]) -> st.SearchStrategy[tuple[CaseSpec, ...]]:
    caps, phase = target.caps, claim.phase
    multi = _multi_step_graph(target, claim)
    dtypes = checkable_dtypes(target)
    return st.sampled_from(dtypes).flatmap(lambda d: ast.graph_case_specs(
        caps, phase, capture_sizes=sizes, replays=replays, multi_step=multi, dtype=d,
        max_seq_len=target.max_seq_len))


def _fixed_graph_cases(target: Target, claim: Claim, requests: Sequence[int]) -> list[tuple[CaseSpec, ...]]:
    """One fixed example: the canonical case of the phase at ``requests`` requests per replay."""
    caps, phase = target.caps, claim.phase
    dtype, head = checkable_dtypes(target)[0], min(caps.head_sizes)
    base = canonical_cases(caps, phase, dtype, head)[0]
    spec = base.spec
    limits = _limits(target, claim)
    if _multi_step_graph(target, claim):
        limits = ast._tighter(limits, caps.multi_step or SpecLimits())
    if phase is not Phase.DECODE and spec is not None and limits.violations(spec, ReasonCode.GRAPH_LIMIT, ""):
        return []  # the canonical spec is outside this claim's limits: drawn examples only
    out = []
    for i, n in enumerate(requests):
        out.append(_resize(base, n, seed=base.seed + i))
    return [tuple(out)]


def _resize(spec: CaseSpec, n: int, seed: int) -> CaseSpec:
    """``spec`` with ``n`` requests (per-request fields cycled), at draft step 0 for
    ``draft_decode`` — where, without re-parenting drawn, every branch re-parents."""
    def cyc(values: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(values[i % len(values)] for i in range(n)) if values else values

    lens = tuple(p + 3 * i for i, p in enumerate(cyc(spec.prefix_lens)))
    out = replace(spec, prefix_lens=lens, new_lens=cyc(spec.new_lens), tree_parents=cyc(spec.tree_parents),
                  draft_picks=(), draft_step=0, reparent=tuple(cyc(r) for r in spec.reparent), seed=seed)
    if spec.phase is Phase.DRAFT_DECODE and spec.spec is not None and not spec.reparent:
        k = spec.topk
        flip = tuple(tuple((b + 1) % k for b in range(k)) for _ in range(n))
        out = replace(out, reparent=(flip,) * max(spec.spec.num_steps - 2, 0))
    return out


def _check_graph(target: Target, claim: Claim) -> tuple[str, int]:
    sizes = target.capture_sizes
    multi = _multi_step_graph(target, claim)

    def body(specs: tuple[CaseSpec, ...]) -> None:
        graph = _capture(target, claim, specs, sizes)
        for spec in specs:
            _replay(target, claim, graph, spec, multi)

    fixed = _fixed_graph_cases(target, claim, (3, 1))  # 3 requests replay the size-4 graph, padded
    count = _run(target, f"graph_{claim.subject}", _graph_cases(target, claim, sizes, (1, 2)), fixed, body)
    how = "all forwards of a MultiStepDraft in one graph, " if multi else ""
    return (f"{how}{target.platform.graph_kind.value} graphs at sizes {', '.join(map(str, sizes))}; "
            f"{_plural(count, 'example')}"), count


def _check_fill(target: Target, claim: Claim) -> tuple[str, int]:
    size = max(*target.capture_sizes, 2)  # at least one padded row
    multi = _multi_step_graph(target, claim)
    graph_claim = replace(claim, kind=ClaimKind.GRAPH)

    def body(specs: tuple[CaseSpec, ...]) -> None:
        small = tuple(_resize(s, min(s.requests, size - 1), s.seed) if s.requests >= size else s for s in specs)
        graph = _capture(target, graph_claim, small, (size,))
        for spec in small:
            _replay(target, graph_claim, graph, spec, multi, fill_claim=claim)

    fixed = _fixed_graph_cases(target, claim, (1,))
    count = _run(target, f"seq_len_fill_{claim.subject}", _graph_cases(target, claim, (size,), (1, 2)), fixed, body)
    return f"rows padded up to {size} requests: finite, real rows as eager; {_plural(count, 'example')}", count


def _check_multi_step(target: Target, claim: Claim) -> tuple[str, int]:
    caps = target.caps
    dtypes = checkable_dtypes(target)

    def body(spec: CaseSpec) -> None:
        case = build_case(spec, device=target.device)
        exp = _expected(target, claim, case, multi=True)
        tol = caps.tolerance(spec.dtype)
        for s, (eager, ref, batch) in enumerate(zip(exp.eager, exp.reference, exp.batches)):
            problem = _mismatch(eager, ref, real_tokens(batch), tol)
            if problem is not None:
                raise ClaimFalsified(claim, f"forward {s} of {len(exp.eager)} (draft_step={s}, {_heads(spec)}, "
                                            f"re-parented before each forward): {problem}")

    fixed = [_resize(c, c.requests, c.seed) for c in canonical_cases(caps, Phase.DRAFT_DECODE, dtypes[0],
                                                                     min(caps.head_sizes))]
    fixed = [c for c in fixed if c.spec is not None and not (caps.multi_step or SpecLimits()).violations(
        c.spec, ReasonCode.MULTI_STEP, "")]
    strategy = st.sampled_from(dtypes).flatmap(lambda d: ast.multi_step_specs(
        caps, dtype=d, max_requests=target.max_requests, max_seq_len=target.max_seq_len))
    count = _run(target, "multi_step", strategy, fixed, body)
    return (f"every forward against the reference, draft tree re-parented in between; "
            f"{_plural(count, 'example')}"), count
