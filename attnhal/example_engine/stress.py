"""The reliability run behind ``attnhal demo --cases N``: random lossless cases.

Each case is an ``attnhal demo`` command line drawn at random over the
configuration space (:data:`AXES`); a case passes when speculative decoding
returns exactly the plain greedy tokens of the target. A failing case is printed
with that command line, which reproduces it on its own.

Workers are expensive to build (graph capture), cases are cheap: the run draws
one *worker configuration* (platform, backend, spec config, graphs) per
:func:`cases_per_worker` cases (at most :data:`CASES_PER_WORKER`) and reuses the
built worker for them, drawing each case's batch size, prompt lengths, token count and seed afresh. Every case
carries ``--max-bs`` and ``--model-seed`` so its reproduction builds the same
capture sizes and model.

Adding an axis is one line in :data:`AXES` (its ``attnhal demo`` flag and how to
draw it), as ``page_size`` and ``kv_dtype`` are.
"""

from __future__ import annotations

import math
import random
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from attnhal.capabilities import AttentionRequest, not_supported_reasons
from attnhal.example_engine.demo import MODEL_LAYOUTS, DemoConfig
from attnhal.example_engine.limits import worker_tree_tokens
from attnhal.example_engine.model import ModelConfig, TinyLlama
from attnhal.example_engine.worker import SpecWorker
from attnhal.planner import GraphPolicy
from attnhal.kv_format import KV_FORMATS
from attnhal.platform import Fp8Flavor, parse
from attnhal.registry import default_registry
from attnhal.spec import ModelKind, SpecConfig

__all__ = ["AXES", "Axis", "DrawnCase", "StressConfig", "StressSummary", "cases_per_worker", "run_cases"]

#: The most cases that share one built worker (one draw of the worker axes).
CASES_PER_WORKER = 16
#: Capture sizes of every worker in the run: 1, 2, 4 (batches above 4 run in chunks).
MAX_BS = 4
#: The model every case uses (``--model-seed``).
MODEL_SEED = 0
PLATFORMS = ("cuda:sm90", "cuda:sm80", "hip:gfx942", "hip:gfx90a", "cpu", "hip:gfx942,nographs")

Draw = Callable[[random.Random, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Axis:
    """One dimension of the configuration space.

    ``flag`` is the ``attnhal demo`` flag the drawn value becomes (``None`` leaves
    the flag out: the command's default); ``worker`` marks axes that need a new
    worker (drawn once per :func:`cases_per_worker` cases).
    """

    flag: str
    draw: Draw
    worker: bool = False

    def argv(self, value: Any) -> list[str]:
        if value is None or value is True:
            return []
        return [self.flag] if value is False else [self.flag, str(value)]


def _draft_tokens(r: random.Random, c: Mapping[str, Any]) -> int | None:
    """Chains mostly use the default (steps + 1); trees need a count in 2..topk*steps+1."""
    if c["topk"] == 1 and r.random() < 0.5:
        return None
    return r.randint(2, c["topk"] * c["spec_steps"] + 1)


def _claims(c: Mapping[str, Any]) -> Any:
    return default_registry().get(c["backend"], parse(c["platform"])).capabilities


def _page_size(r: random.Random, c: Mapping[str, Any]) -> int | None:
    """A page size the drawn backend claims (None: the default, 1)."""
    return r.choice([p for p in (1, 16, 64) if p in _claims(c).page_sizes]) if r.random() < 0.5 else None


def _model(r: random.Random, c: Mapping[str, Any]) -> str | None:
    """MLA where the drawn backend serves the demo's MLA model on the platform (None: gqa)."""
    mla = ModelConfig(**MODEL_LAYOUTS[ModelKind.MLA])
    request = AttentionRequest.of(config=mla.attention, dtype="float32", model=mla.kind)
    serves = not not_supported_reasons(_claims(c), request, parse(c["platform"]))
    return ModelKind.MLA.value if serves and r.random() < 0.25 else None


def _kv_dtype(r: random.Random, c: Mapping[str, Any]) -> str | None:
    """A KV-cache dtype the backend claims and the platform can store (None: float32)."""
    flavor = parse(c["platform"]).fp8_flavor
    scaled = [n for n, f in KV_FORMATS.items() if f.scaled and (not f.needs_flavor or flavor is not Fp8Flavor.NONE)]
    options = [d for d in scaled if d in _claims(c).kv_dtypes]
    return r.choice(options) if options and r.random() < 0.4 else None


#: The configuration space, drawn in this order (later draws may read earlier values).
#: ``platform`` and ``backend`` draw from the choices available here (see ``run_cases``).
AXES: dict[str, Axis] = {
    "platform": Axis("--platform", lambda r, c: r.choice(c["platforms"]), worker=True),
    "backend": Axis("--backend", lambda r, c: r.choice(c["backends"][c["platform"]]), worker=True),
    "model": Axis("--model", _model, worker=True),
    "spec_steps": Axis("--spec-steps", lambda r, c: r.randint(1, 4), worker=True),
    "topk": Axis("--topk", lambda r, c: r.choice((1, 1, 2, 3)), worker=True),
    "draft_tokens": Axis("--draft-tokens", _draft_tokens, worker=True),
    "graphs": Axis("--no-graphs", lambda r, c: r.random() < 0.6, worker=True),
    "page_size": Axis("--page-size", _page_size, worker=True),
    "kv_dtype": Axis("--kv-dtype", _kv_dtype, worker=True),
    "batch_size": Axis("--batch-size", lambda r, c: r.randint(1, 6)),
    "prompt_len": Axis("--prompt-len", lambda r, c: r.choice((1, 2, 5, 16, 24))),
    "max_new_tokens": Axis("--max-new-tokens", lambda r, c: r.randint(1, 10)),
    "seed": Axis("--seed", lambda r, c: r.randrange(2**31)),
}


@dataclass(frozen=True)
class DrawnCase:
    """One drawn case: its axis values and the command that reproduces it."""

    index: int
    values: Mapping[str, Any]

    def argv(self) -> list[str]:
        out = ["demo", "--max-bs", str(MAX_BS), "--model-seed", str(MODEL_SEED)]
        for name, axis in AXES.items():
            out += axis.argv(self.values[name])
        return out

    def command(self) -> str:
        return "attnhal " + shlex.join(self.argv())

    def worker_key(self) -> tuple[Any, ...]:
        return tuple(self.values[name] for name, axis in AXES.items() if axis.worker)


@dataclass(frozen=True)
class StressConfig:
    cases: int
    seed: int = 0
    platform: str | None = None  # pins the platform axis
    backend: str | None = None  # pins the backend axis


@dataclass
class Failure:
    case: DrawnCase
    reason: str


@dataclass
class StressSummary:
    cases: int = 0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    ties: list[Failure] = field(default_factory=list)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    not_drawn: dict[str, str] = field(default_factory=dict)  # backend -> why it is not available here
    workers: int = 0
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures and self.cases > 0 and not self.interrupted

    def to_dict(self) -> dict[str, Any]:
        return {"cases": self.cases, "interrupted": self.interrupted, "passed": self.cases - len(self.failures) - len(self.ties),
                "ties": len(self.ties), "failed": len(self.failures),
                "seconds": round(self.seconds, 1), "workers": self.workers,
                "counts": {k: dict(v) for k, v in self.counts.items()}, "not_drawn": self.not_drawn,
                "failures": [{"command": f.case.command(), "reason": f.reason} for f in self.failures],
                "tie_cases": [{"command": f.case.command(), "reason": f.reason} for f in self.ties]}

    def format(self) -> str:
        lines = ["interrupted: the summary covers the cases run so far"] if self.interrupted else []
        lines += [f"{self.cases} cases in {self.seconds:.0f} s over {self.workers} workers: "
                 f"{self.cases - len(self.failures) - len(self.ties)} lossless, {len(self.ties)} fp32 ties, "
                 f"{len(self.failures)} failed"]
        for name, counter in self.counts.items():
            lines.append(f"  {name}: " + ", ".join(f"{v}={n}" for v, n in sorted(counter.items())))
        for backend, why in self.not_drawn.items():
            lines.append(f"  backend {backend} not drawn: {why}")
        for f in self.ties:
            lines.append(f"TIE {f.case.command()}\n  {f.reason}")
        for f in self.failures:
            lines.append(f"FAILED {f.case.command()}\n  {f.reason}")
        return "\n".join(lines)


def _draw(rng: random.Random, index: int, choices: Mapping[str, Any],
          worker: Mapping[str, Any] | None) -> DrawnCase:
    values: dict[str, Any] = dict(choices)
    for name, axis in AXES.items():
        values[name] = worker[name] if worker is not None and axis.worker else axis.draw(rng, values)
    return DrawnCase(index, {name: values[name] for name in AXES})


def cases_per_worker(cases: int) -> int:
    """Cases that share one worker in a run of ``cases``: about the square root, at most
    :data:`CASES_PER_WORKER`, so that a short run still draws several worker configurations
    (16 cases: 4 workers of 4; 1000 cases: 63 workers of 16)."""
    return max(1, min(CASES_PER_WORKER, math.isqrt(cases)))


def draw_cases(cfg: StressConfig, choices: Mapping[str, Any]) -> Iterator[DrawnCase]:
    """The run's cases, worker by worker (reproducible from ``cfg.seed``)."""
    rng = random.Random(cfg.seed)
    per_worker = cases_per_worker(cfg.cases)
    worker: Mapping[str, Any] | None = None
    for index in range(cfg.cases):
        case = _draw(rng, index, choices, None if index % per_worker == 0 else worker)
        worker = case.values
        yield case


def _available_backends(platforms: Sequence[str], pinned: str | None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Per platform, the backends that can run the demo model there; and why others never can."""
    attn = ModelConfig().attention
    request = AttentionRequest.of(config=attn, dtype="float32", features=frozenset())
    entries = default_registry().entries()
    if pinned is not None:
        default_registry().get(pinned)  # an unknown name is bad input: LookupError
        entries = [e for e in entries if e.name == pinned]
    available: dict[str, list[str]] = {}
    why: dict[str, str] = {}
    for spec in platforms:
        platform = parse(spec)
        available[spec] = []
        for entry in entries:
            reasons = entry.reasons(request, platform)
            if reasons:
                why.setdefault(entry.name, f"{spec}: {reasons[0]}")
            else:
                available[spec].append(entry.name)
    usable = {p: names for p, names in available.items() if names}
    never = {name: reason for name, reason in why.items() if not any(name in v for v in usable.values())}
    if not usable:
        raise LookupError("no backend runs here: " + "; ".join(f"{n}: {r}" for n, r in why.items()))
    return usable, never


class _Workers:
    """The built worker of the current worker configuration, and greedy references per platform/backend."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.worker: SpecWorker | None = None
        self.greedy: dict[tuple[str, str | None, ModelKind, int, str], SpecWorker] = {}
        self._models: dict[tuple[int | None, ModelKind], tuple[TinyLlama, TinyLlama]] = {}

    def models(self, cfg: DemoConfig) -> tuple[TinyLlama, TinyLlama]:
        """The target and draft of ``cfg``'s model seed and layout, built once per run."""
        key = (cfg.model_seed, cfg.model)
        if key not in self._models:
            self._models[key] = cfg.models()
        return self._models[key]

    def spec_worker(self, case: DrawnCase, cfg: DemoConfig, context: int) -> SpecWorker:
        if case.worker_key() != self.key:
            self.worker = None  # free the previous worker's pools and graphs first
            target, draft = self.models(cfg)
            self.worker = SpecWorker(target, draft, cfg.spec, platform=cfg.platform, backend=cfg.backend,
                                     policy=GraphPolicy(enabled=cfg.graphs, batch_sizes=cfg.capture_sizes),
                                     max_context_len=context, max_requests=8, page_size=cfg.page_size,
                                     kv_dtype=cfg.kv_dtype)
            self.key = case.worker_key()
        assert self.worker is not None
        return self.worker

    def greedy_worker(self, cfg: DemoConfig, context: int) -> SpecWorker:
        key = (cfg.platform.name, cfg.backend, cfg.model, cfg.page_size, cfg.kv_dtype)  # greedy, same model and cache
        if key not in self.greedy:
            target, _ = self.models(cfg)
            self.greedy[key] = SpecWorker(target, None, SpecConfig(), platform=cfg.platform, backend=cfg.backend,
                                          policy=GraphPolicy(enabled=False, batch_sizes=cfg.capture_sizes),
                                          max_context_len=context, max_requests=8, page_size=cfg.page_size,
                                          kv_dtype=cfg.kv_dtype)
        return self.greedy[key]


#: KV room per request in every worker, as ``DemoConfig.context_len`` counts it, for the longest
#: prompt (24), generation (10) and worker tree (4 steps of topk 3) the axes draw.
CONTEXT = 24 + 10 + 2 * worker_tree_tokens(4, 3) + 8


#: Two greedy candidates whose fp32 logits are this close are a tie: batched and speculative
#: forwards sum in another order (differences ~1e-7), so either may win. Such a case is
#: reported as a tie with its gap, not as a failure.
TIE_GAP = 1e-5


def _greedy_top2(workers: _Workers, cfg: DemoConfig, tokens: list[int]) -> tuple[list[int], float]:
    """The target's two best next tokens after ``tokens`` (one request alone) and their logit gap."""
    target, _ = workers.models(cfg)
    logits: list[Any] = []
    hook = target.register_forward_hook(lambda module, args, out: logits.append(out[-1].detach().clone()))
    try:
        workers.greedy_worker(cfg, CONTEXT).generate([tokens], 1)
    finally:
        hook.remove()
    top = torch.topk(logits[0], 2)
    return top.indices.tolist(), float(top.values[0] - top.values[1])


def _run_case(case: DrawnCase, workers: _Workers,
              demo_config: Callable[[list[str]], DemoConfig]) -> tuple[str, str] | None:
    """None when the case is lossless, else ``("tie" | "failed", why)``.

    Where a request's tokens differ from greedy, the first differing token is a tie when
    the two tokens are greedy's top two candidates within :data:`TIE_GAP`.
    """
    cfg = demo_config(case.argv())
    target, _ = workers.models(cfg)
    prompts = cfg.prompts(target.cfg.vocab_size)
    if cfg.context_len(prompts) > CONTEXT:  # an axis drawn beyond what the shared workers hold
        raise ValueError(f"context={cfg.context_len(prompts)} (supported: <= CONTEXT={CONTEXT}; raise CONTEXT "
                         "with the axes)")
    reference = workers.greedy_worker(cfg, CONTEXT).generate(prompts, cfg.max_new_tokens).tokens
    out = workers.spec_worker(case, cfg, CONTEXT).generate(prompts, cfg.max_new_tokens).tokens
    ties = []
    for row, (got, want) in enumerate(zip(out, reference)):
        if got == want:
            continue
        pos = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        diff = f"request {row} differs from greedy at token {pos}: {got[pos:pos + 4]} vs {want[pos:pos + 4]}"
        if pos >= min(len(got), len(want)):
            return "failed", f"not lossless: {diff} (lengths {len(got)} vs {len(want)})"
        top, gap = _greedy_top2(workers, cfg, prompts[row] + want[:pos])
        if sorted(top) != sorted((got[pos], want[pos])) or gap > TIE_GAP:
            return "failed", f"not lossless: {diff}; greedy's top two there: {top}, logit gap {gap:.2e}"
        ties.append(f"{diff}: an fp32 tie (logit gap {gap:.1e} <= {TIE_GAP:.0e})")
    return ("tie", "; ".join(ties)) if ties else None


def _record(summary: StressSummary, case: DrawnCase, outcome: tuple[str, str] | None,
            progress: TextIO | None) -> None:
    if outcome is not None:
        kind, reason = outcome
        (summary.ties if kind == "tie" else summary.failures).append(Failure(case, reason))
        if progress is not None:
            print(f"{kind.upper()} case {case.index}: {case.command()}\n  {reason}", file=progress, flush=True)
    summary.cases += 1
    for name, counter in summary.counts.items():
        value = case.values[name]
        counter["default" if value is None else str(value)] += 1  # None: the flag left out


def _progress_line(summary: StressSummary, total: int, seconds: float, progress: TextIO) -> None:
    rate = summary.cases / seconds
    print(f"cases {summary.cases}/{total}  failed {len(summary.failures)}  ties {len(summary.ties)}  "
          f"{rate:.2f}/s  elapsed {seconds:.0f} s  eta {(total - summary.cases) / rate:.0f} s",
          file=progress, flush=True)


def run_cases(cfg: StressConfig, demo_config: Callable[[list[str]], DemoConfig],
              progress: TextIO | None = None, every_s: float = 30.0) -> StressSummary:
    """Run ``cfg.cases`` random cases; ``demo_config`` turns a case's argv into a DemoConfig.

    Going through the command line's own parser is what makes each printed
    reproduction command run exactly the case that was checked.
    """
    platforms = (cfg.platform,) if cfg.platform else PLATFORMS
    backends, never = _available_backends(platforms, cfg.backend)
    summary = StressSummary(not_drawn=never, counts={name: Counter() for name in AXES if name != "seed"})
    workers = _Workers()
    if progress is not None:
        offered = "; ".join(f"{p}: {', '.join(names)}" for p, names in backends.items())
        print(f"reliability run: {cfg.cases} cases, seed {cfg.seed}, {cases_per_worker(cfg.cases)} cases per worker; "
              f"backends: {offered}", file=progress, flush=True)
    start = last = time.perf_counter()
    try:
        for case in draw_cases(cfg, {"platforms": tuple(backends), "backends": backends}):
            if case.worker_key() != workers.key:
                summary.workers += 1
            try:
                outcome = _run_case(case, workers, demo_config)
            except Exception as exc:  # noqa: BLE001 - a crash is a failed case, reported with its command
                outcome, workers.key = ("failed", f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}"), None
            _record(summary, case, outcome, progress)
            now = time.perf_counter()
            if progress is not None and (now - last >= every_s or summary.cases == cfg.cases):
                last = now
                _progress_line(summary, cfg.cases, now - start, progress)
    except KeyboardInterrupt:  # a long run stopped by hand still reports what it saw
        summary.interrupted = True
    summary.seconds = time.perf_counter() - start
    return summary
