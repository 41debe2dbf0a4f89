"""``attnhal`` command line: info | plan | explain | conformance | demo | compile-check.

Bad input exits with status 2 and a message naming the flag, the value and what
is allowed. ``plan`` exits 1 when the plan is invalid, so engines can use it in
their config checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attnhal.capabilities import (
    DTYPES,
    KV_DTYPES,
    AttentionRequest,
    BackendCapabilities,
    Feature,
    Phase,
    not_supported_reasons,
)
from attnhal.descriptors import DescriptorError, load_descriptor
from attnhal.plan import AttentionMode, GraphPlan, GraphPolicy, PhaseBackends, SpecConfig, plan
from attnhal.platform import Platform, PlatformSpecError, detect, parse
from attnhal.registry import BackendUnavailable, Registry, default_registry
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm

__all__ = ["main"]


class UsageError(Exception):
    """Bad command-line input: printed, exit status 2."""


# --- shared helpers ------------------------------------------------------------------

def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def resolve_platform(spec: str | None) -> Platform:
    try:
        return parse(spec) if spec else detect()
    except PlatformSpecError as exc:
        raise UsageError(f"--platform: {exc}") from None


def resolve_backend(value: str, flag: str, registry: Registry,
                    platform: Platform | None = None) -> BackendCapabilities:
    """A registered backend's descriptor (the one for ``platform``'s vendor), or one read from a file."""
    if value.endswith((".json", ".toml")) or Path(value).is_file():
        try:
            return load_descriptor(value)
        except (OSError, DescriptorError) as exc:
            raise UsageError(f"{flag}: {exc}") from None
    try:
        entry = registry.get(value, platform)
    except BackendUnavailable as exc:
        raise UsageError(f"{flag}: {exc.reasons[0].message}") from None
    if entry.capabilities is None:
        raise UsageError(f"{flag}={value}: {entry.unavailable_reasons()[0].message}")
    return entry.capabilities


def positive(flag: str, minimum: int = 1) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} (supported: an integer >= {minimum})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{flag}={value} (supported: an integer >= {minimum})")
        return value
    return convert


def choice(flag: str, allowed: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} (supported: {', '.join(allowed)})")
        return text
    return convert


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--platform", help="simulate a platform: cuda:sm90, hip:gfx942, cpu, ...,nographs")
    p.add_argument("--spec-steps", type=positive("--spec-steps", 0), default=0,
                   help="EAGLE draft steps (0 = no speculative decoding)")
    p.add_argument("--topk", type=positive("--topk"), default=1)
    p.add_argument("--draft-tokens", type=positive("--draft-tokens", 2), default=0,
                   help="tokens verified per request (default num_steps + 1 for topk 1)")
    p.add_argument("--no-graphs", action="store_true", help="graph capture disabled by policy")
    p.add_argument("--max-bs", type=positive("--max-bs"), default=32, help="largest capture batch size")


def spec_from(args: argparse.Namespace) -> SpecConfig:
    try:
        if args.spec_steps == 0:
            if args.topk != 1 or args.draft_tokens:
                raise UsageError("--topk/--draft-tokens need --spec-steps >= 1 (speculative decoding)")
            return SpecConfig()
        return SpecConfig.eagle(args.spec_steps, args.topk, args.draft_tokens,
                                algorithm=getattr(args, "spec_algorithm", None) or "eagle")
    except ValueError as exc:
        flag = {"num_draft_tokens": "--draft-tokens", "topk": "--topk", "num_steps": "--spec-steps"}
        name = str(exc).split("=")[0]
        raise UsageError(f"{flag.get(name, '--spec-steps')}: {exc}") from None


def policy_from(args: argparse.Namespace) -> GraphPolicy:
    try:
        return GraphPolicy(enabled=not args.no_graphs, max_batch_size=args.max_bs,
                           disabled_phases=frozenset(getattr(args, "no_graph_phase", None) or ()),
                           step_counts=getattr(args, "adaptive_steps", None),
                           max_tokens=getattr(args, "capture_max_tokens", None))
    except ValueError as exc:
        flag = {"max_batch_size": "--max-bs", "step_counts": "--adaptive-steps", "max_tokens": "--capture-max-tokens"}
        name = str(exc).split("=")[0].split(" ")[0]
        raise UsageError(f"{flag.get(name, '--max-bs')}: {exc}") from None


def add_plan_input_flags(p: argparse.ArgumentParser, *, context: bool, roles: bool) -> None:
    """Flags of plan/explain beyond add_spec_flags: algorithm, model/KV context, roles, graph policy."""
    p.add_argument("--spec-algorithm", type=choice("--spec-algorithm", [a.value for a in SpecAlgorithm][1:]),
                   help="speculative algorithm with --spec-steps (default eagle; ngram runs target_verify only)")
    p.add_argument("--model", type=choice("--model", [m.value for m in ModelKind]),
                   help="model attention layout: mha, gqa, mla (default: not checked)")
    if context:
        p.add_argument("--dtype", type=choice("--dtype", DTYPES), help="compute dtype (default: not checked)")
        p.add_argument("--kv-dtype", type=choice("--kv-dtype", KV_DTYPES), help="KV-cache dtype")
        p.add_argument("--head-size", type=positive("--head-size"), help="head dimension")
        p.add_argument("--page-size", type=positive("--page-size"), help="KV page size in tokens")
    if roles:
        p.add_argument("--prefill-backend", help="backend of prefill (over --target-backend)")
        p.add_argument("--decode-backend", help="backend of decode and of the multi-step draft (over --target-backend)")
        p.add_argument("--speculative-attention-mode", type=choice("--speculative-attention-mode",
                                                                   [m.value for m in AttentionMode]),
                       default="prefill", help="target_verify and draft_extend follow the prefill or decode backend")
    p.add_argument("--no-graph-phase", action="append", type=choice("--no-graph-phase", [ph.value for ph in Phase]),
                   help="never capture this phase (repeatable)")
    p.add_argument("--adaptive-steps", type=int_list("--adaptive-steps"),
                   help="adaptive speculation: other step counts the plan must be valid for, e.g. 1,3,5")
    p.add_argument("--capture-max-tokens", type=positive("--capture-max-tokens"),
                   help="capture sizes from the spec width: batch sizes with bs x tokens per request <= N")


def int_list(flag: str) -> Callable[[str], tuple[int, ...]]:
    def convert(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} (supported: integers separated by commas)") from None
    return convert


def context_from(args: argparse.Namespace) -> RequestContext:
    try:
        return RequestContext(model=args.model, dtype=args.dtype, kv_dtype=args.kv_dtype,
                              head_size=args.head_size, page_size=args.page_size)
    except ValueError as exc:
        raise UsageError(f"--{str(exc).split('=')[0].replace('_', '-')}: {exc}") from None


def default_backend(platform: Platform, registry: Registry) -> BackendCapabilities:
    try:
        caps = registry.select(platform).capabilities
    except LookupError as exc:
        raise UsageError(f"--backend: {exc}") from None
    assert caps is not None
    return caps


def phase_backends(args: argparse.Namespace, spec: SpecConfig, platform: Platform,
                   registry: Registry) -> PhaseBackends:
    """--backend for every role, overridden per role; the default is the registry's choice."""
    def pick(value: str | None, flag: str, fallback: BackendCapabilities | None = None) -> BackendCapabilities:
        if value:
            return resolve_backend(value, flag, registry, platform)
        if fallback is not None:
            return fallback
        if args.backend:
            return resolve_backend(args.backend, "--backend", registry, platform)
        return default_backend(platform, registry)

    mode = AttentionMode(args.speculative_attention_mode)
    target = pick(args.target_backend, "--target-backend")
    prefill = pick(args.prefill_backend, "--prefill-backend", target)
    decode = pick(args.decode_backend, "--decode-backend", target)
    follow = prefill if mode is AttentionMode.PREFILL else decode
    multi = spec.num_steps > 1 or bool(getattr(args, "adaptive_steps", None))
    draft = pick(args.draft_backend, "--draft-backend", decode if args.decode_backend else None) if multi else None
    extend = pick(args.draft_extend_backend, "--draft-extend-backend",
                  follow if args.prefill_backend or args.decode_backend else None)
    return PhaseBackends(target=target, prefill=prefill, decode=decode, draft_decode=draft, draft_extend=extend,
                         speculative_attention_mode=mode)


def format_plan(p: GraphPlan) -> str:
    spec = p.spec
    head = f"platform: {p.platform}    speculative: {spec.algorithm.value}"
    if spec.speculative:
        head += f" (num_steps={spec.num_steps}, topk={spec.topk}, num_draft_tokens={spec.num_draft_tokens})"
    graphs = ("capture sizes " + ",".join(map(str, p.capture_sizes))) if p.policy.enabled else "disabled"
    context = " ".join(f"{k}={getattr(v, 'value', v)}" for k, v in vars(p.context).items() if v is not None)
    if context:
        head += f"\ncontext: {context}"
    rows = []
    for phase, d in p.phases.items():
        why = "; ".join(str(r) for r in d.reasons) or "-"
        backend = d.backend or "-"
        if d.runs and d.role not in (None, phase.value):
            backend += f" ({d.role} role)"
        rows.append((phase.value, yes_no(d.runs), yes_no(d.capture), backend, why))
    body = table(("phase", "runs", "captured", "backend", "reasons"), rows)
    notes = sorted({n for d in p.phases.values() if d.runs for n in d.variants})
    extra = "".join(f"\nconditional claim applied: {n}" for n in notes)
    for n, sub in sorted(p.adaptive.items()):
        captured = ", ".join(ph.value for ph in sub.captured) or "none"
        extra += f"\nadaptive num_steps={n}: {'valid' if sub.valid else 'INVALID'}; captured: {captured}"
    verdict = "plan: valid" if p.valid else "plan: INVALID (a phase that runs has no capable backend)"
    return f"{head}\ngraphs: {graphs}\n{body}{extra}\n{verdict}"


# --- commands ------------------------------------------------------------------------

def cmd_plan(args: argparse.Namespace) -> int:
    if args.engine or args.engine_args:
        return _engine_command("cmd_engine_plan", args)
    platform = resolve_platform(args.platform)
    spec = spec_from(args)
    registry = default_registry()
    result = plan(spec, platform, phase_backends(args, spec, platform, registry), policy_from(args),
                  context_from(args))
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_plan(result))
    return 0 if result.valid else 1


def request_from(args: argparse.Namespace) -> AttentionRequest:
    return AttentionRequest(
        phase=Phase(args.phase) if args.phase else None, dtype=args.dtype, kv_dtype=args.kv_dtype,
        head_size=args.head_size, page_size=args.page_size, num_q_heads=args.num_q_heads,
        num_kv_heads=args.num_kv_heads, features=frozenset(Feature(f) for f in args.feature or ()),
        model=ModelKind(args.model) if args.model else None,
    )


def cmd_explain(args: argparse.Namespace) -> int:
    if args.engine or args.engine_args:
        return _engine_command("cmd_engine_explain", args)
    if not args.backend:
        raise UsageError("--backend is required (a registered name, a descriptor file, or sglang:NAME / vllm:NAME; "
                         "or --engine sglang|vllm -- ENGINE_FLAGS)")
    platform = resolve_platform(args.platform)
    registry = default_registry()
    caps = resolve_backend(args.backend, "--backend", registry, platform)
    reasons = not_supported_reasons(caps, request_from(args), platform)
    spec = spec_from(args)
    result = plan(spec, platform, PhaseBackends.same(caps, spec), policy_from(args), context_from(args))
    if args.json:
        print(json.dumps({"backend": caps.name, "platform": platform.spec, "fits": not reasons,
                          "reasons": [r.to_dict() for r in reasons], "plan": result.to_dict()}, indent=2))
        return 0 if not reasons else 1
    print(f"backend {caps.name!r} on {platform.spec}:")
    print("  fits this request" if not reasons else "\n".join(f"  does not fit: {r}" for r in reasons))
    print(f"\nwith {caps.name!r} in every role:\n{format_plan(result)}")
    return 0 if not reasons else 1


def triton_info() -> str:
    """Which distribution provides ``triton``, its version and vendor backends — without importing it."""
    import importlib.util
    from importlib.metadata import packages_distributions, version

    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return "not installed (pip install 'attnhal[triton]'; on ROCm it comes with torch as pytorch-triton-rocm)"
    dists = packages_distributions().get("triton", ["unknown"])
    backends_dir = Path(next(iter(spec.submodule_search_locations))) / "backends"
    vendors = sorted(d.name for d in backends_dir.iterdir() if d.is_dir() and not d.name.startswith("_")) \
        if backends_dir.is_dir() else []
    return ", ".join(f"{d} {version(d)}" for d in dists) + f"; backends: {', '.join(vendors) or 'none'}"


def capability_rows(entries: Sequence[Any]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for e in entries:
        c: BackendCapabilities | None = e.capabilities
        if c is None:
            continue
        names = lambda xs: ",".join(sorted(getattr(x, "value", str(x)) for x in xs))  # noqa: E731
        rows.append((c.name, names(c.vendors), names(c.phases), names(c.graph),
                     yes_no(c.multi_step is not None), names(c.dtypes),
                     ",".join(map(str, sorted(c.head_sizes))), names(c.features) or "-"))
    return rows


def cmd_info(args: argparse.Namespace) -> int:
    platform = resolve_platform(args.platform)
    entries = default_registry().ordered(platform)
    if args.json:
        print(json.dumps({
            "platform": platform.spec, "device": platform.device_name, "simulated": platform.simulated,
            "triton": triton_info(),
            "backends": {e.name: {"available": e.available,
                                  "reasons": [r.to_dict() for r in e.reasons(AttentionRequest(), platform)]}
                         for e in entries},
        }, indent=2))
        return 0
    p = platform
    print(f"platform: {p.spec} ({p.device_name}{', simulated' if p.simulated else ''})")
    print(f"  vendor={p.vendor.value} arch={p.arch} warp_size={p.warp_size} fp8={p.fp8_flavor.value} "
          f"graph_api={yes_no(p.has_graph_api)} graph_kind={p.graph_kind.value} device={p.torch_device}")
    print(f"triton: {triton_info()}")
    rows = []
    for e in entries:
        reasons = e.reasons(AttentionRequest(), platform)
        rows.append((e.name, "available" if not reasons else "unavailable",
                     "; ".join(str(r) for r in reasons) or "-", e.source))
    print("\nbackends:\n" + table(("name", "status", "reasons", "source"), rows))
    print("\ncapabilities:\n" + table(("name", "vendors", "phases", "graph", "multi_step", "dtypes",
                                       "head_sizes", "features"), capability_rows(entries)))
    if args.build:
        builds = [(e.name, e.backend.build_info()) for e in entries if e.backend is not None]
        print("\nnative builds (first use builds, later runs load the cache):\n"
              + table(("name", "build"), [(n, b) for n, b in builds if b is not None] or [("-", "none")]))
    return 0


def format_demo(report: Any) -> str:
    lines = [format_plan(report.plan), "", "backends: " + ", ".join(f"{k}={v}" for k, v in report.backends.items())]
    capture: list[tuple[object, ...]] = [
        (phase, ",".join(map(str, s["captured_sizes"])) or "-", s["replays"], s["eager_runs"], s["failure"] or "-")
        for phase, s in report.capture.items()]
    lines += ["", "capture (graphs run):",
              table(("phase", "captured sizes", "replays", "eager runs", "capture failure"), capture)]
    greedy = report.greedy_tokens_per_s
    rows: list[tuple[object, ...]] = [(mode, f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s'] / greedy:.2f}x", f"{r['mean_accept_length']:.2f}",
             r["verify_steps"], f"{r['capture_s']:.2f}", yes_no(r["lossless"])) for mode, r in report.runs.items()]
    rows.insert(0, ("greedy (no speculation, eager)", f"{greedy:.1f}", "1.00x", "-", "-", "-", "reference"))
    lines += ["", table(("run", "tokens/s", "vs greedy", "mean accepted length", "verify steps", "setup s",
                         "lossless"), rows)]
    lines += ["", f"lossless: {yes_no(report.lossless)} (speculative tokens == plain greedy tokens of the target)"]
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from attnhal.backend.kv_pool import kv_storage_dtype
    from attnhal.reference.demo import DemoConfig, run_demo
    from attnhal.reference.worker import PlanInvalid

    spec = spec_from(args)
    if not spec.speculative:
        raise UsageError("--spec-steps=0 (supported: >= 1; the demo runs speculative decoding)")
    platform = resolve_platform(args.platform)
    try:  # fp8_e4m3 needs the platform's flavour: never guessed
        kv_storage_dtype(args.kv_dtype, platform.fp8_flavor)
    except ValueError as exc:
        raise UsageError(f"--kv-dtype: {exc}") from None
    cfg = DemoConfig(spec=spec, platform=platform, backend=args.backend,
                     batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, graphs=not args.no_graphs,
                     seed=args.seed, page_size=args.page_size, kv_dtype=args.kv_dtype)
    try:
        report = run_demo(cfg)
    except (PlanInvalid, LookupError) as exc:
        print(f"attnhal demo: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_demo(report))
    return 0 if report.lossless else 1


def cmd_conformance(args: argparse.Namespace) -> int:
    from attnhal.testing.report import run_conformance

    platform = resolve_platform(args.platform)
    names = [args.backend] if args.backend else [e.name for e in default_registry().ordered(platform)]
    progress = _ConformanceProgress(sys.stderr) if sys.stderr.isatty() and not args.json else None
    reports = []
    for name in names:
        try:
            reports.append(run_conformance(name, max_examples=args.examples, platform=platform, budget=args.budget,
                                           thorough=args.thorough, allow_unchecked=args.allow_unchecked,
                                           progress=progress))
        except LookupError as exc:
            raise UsageError(f"backend={name}: {exc}") from None
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        print("\n\n".join(r.format() for r in reports))
    # falsified, a kit error, or a claim not checked here (unless waived): the run fails
    return 0 if all(r.ok for r in reports) else 1


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--budget={text!r} (supported: seconds > 0)")
    return value


class _ConformanceProgress:
    """One line per claim on a terminal: ``[3/40] graph[decode] ...`` then its result and time."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __call__(self, index: int, total: int, claim: Any, result: Any) -> None:
        head = f"[{index + 1}/{total}] {claim.name}"
        if result is None:
            self.stream.write(f"\r\033[K{head} ...")
        else:
            self.stream.write(f"\r\033[K{head}: {result.label} ({result.seconds:.1f} s)\n")
        self.stream.flush()


def cmd_docs(args: argparse.Namespace) -> int:
    from attnhal.docgen import capability_matrix

    text = capability_matrix() + "\n"
    path = Path(args.path)
    if args.check:
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != text:
            print(f"{path} is stale: run `attnhal docs`", file=sys.stderr)
            return 1
        print(f"{path} is current")
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", type=choice("--engine", ("sglang", "vllm")),
                   help="read the engine's own flags after `--` (SGLang server / vLLM engine arguments)")
    p.add_argument("engine_args", nargs="*", metavar="-- ENGINE_FLAGS", help="with --engine: the engine's flags")


def _engine_command(name: str, args: argparse.Namespace) -> int:
    """The engine-vocabulary commands live with the adapters (attnhal.engines.command)."""
    from attnhal.engines import command

    if name != "cmd_catalog" and not args.engine:
        raise UsageError(f"{' '.join(args.engine_args)}: engine flags need --engine (supported: sglang, vllm)")
    code: int = getattr(command, name)(args)
    return code


# --- parser ----------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own errors exit 2 too; keep its wording
        self.print_usage(sys.stderr)
        self.exit(2, f"attnhal: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnhal", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("info", help="platform, Triton, registered backends and their capabilities")
    p.add_argument("--platform")
    p.add_argument("--json", action="store_true")
    p.add_argument("--build", action="store_true", help="also build/load native kernels and print their build time")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("plan", help="which attention phases run and are captured as graphs")
    add_spec_flags(p)
    p.add_argument("--backend", help="registered name or descriptor file, for every role")
    p.add_argument("--target-backend")
    p.add_argument("--draft-backend", help="the multi-step draft (draft_decode) backend")
    p.add_argument("--draft-extend-backend")
    add_plan_input_flags(p, context=True, roles=True)
    p.add_argument("--json", action="store_true")
    add_engine_flags(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("explain", help="why a backend does or does not fit")
    add_spec_flags(p)
    p.add_argument("--backend", help="registered name, descriptor file, or sglang:NAME / vllm:NAME")
    p.add_argument("--phase", type=choice("--phase", [ph.value for ph in Phase]))
    p.add_argument("--dtype", type=choice("--dtype", DTYPES))
    p.add_argument("--kv-dtype", type=choice("--kv-dtype", KV_DTYPES))
    p.add_argument("--head-size", type=positive("--head-size"))
    p.add_argument("--page-size", type=positive("--page-size"))
    p.add_argument("--num-q-heads", type=positive("--num-q-heads"))
    p.add_argument("--num-kv-heads", type=positive("--num-kv-heads"))
    p.add_argument("--feature", action="append", type=choice("--feature", [f.value for f in Feature]))
    add_plan_input_flags(p, context=False, roles=False)
    p.add_argument("--json", action="store_true")
    add_engine_flags(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="the reference speculative worker end to end, checked lossless")
    add_spec_flags(p)
    p.set_defaults(spec_steps=3)
    p.add_argument("--backend", help="registered backend name for every role (default: the registry's choice)")
    p.add_argument("--batch-size", type=positive("--batch-size"), default=4)
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), default=32)
    p.add_argument("--seed", type=positive("--seed", 0), default=0)
    p.add_argument("--page-size", type=positive("--page-size"), default=1, help="tokens per KV page")
    p.add_argument("--kv-dtype", type=choice("--kv-dtype", KV_DTYPES), default="float32",
                   help="KV-cache dtype; fp8_e4m3 is stored in the platform's flavour")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("conformance", help="check every claim of a backend's descriptor by running it")
    p.add_argument("backend", nargs="?", help="registered name or module:attr (default: every registered backend)")
    p.add_argument("--platform")
    p.add_argument("--examples", type=positive("--examples", 0), default=None,
                   help="random examples per check on top of the fixed ones (default 3; 25 with --thorough; "
                        "with --budget: the most per check)")
    p.add_argument("--budget", type=_seconds, default=None, metavar="SECONDS",
                   help="seconds for random examples, spread over the claims (each runs rounds until its share "
                        "is spent)")
    p.add_argument("--thorough", action="store_true",
                   help="release check: more random examples and the costlier fixed ones (more long contexts)")
    p.add_argument("--allow-unchecked", action="store_true",
                   help="exit 0 despite claims not checked here (e.g. device-only claims on a CPU machine); "
                        "the report still lists them")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_conformance)

    p = sub.add_parser("catalog", help="the catalogued attention backends of real engines (sglang:NAME, vllm:NAME)")
    p.add_argument("--engine", help="only this engine's backends")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda args: _engine_command("cmd_catalog", args))

    p = sub.add_parser("docs", help="write the generated capability matrix (docs/capabilities.md)")
    p.add_argument("--path", default="docs/capabilities.md")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    p.set_defaults(func=cmd_docs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except UsageError as exc:
        print(f"attnhal {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return code
