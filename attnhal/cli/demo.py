"""``attnhal demo``: the reference speculative worker end to end, checked lossless; ``--cases N`` draws N of them."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from attnhal.cli.app import INTERRUPTED, UsageError, root_parser
from attnhal.cli.args import bounded, choice, within
from attnhal.cli.inputs import SPEC_STEPS, add_spec_flags, refuse_unknown_name, resolve_platform, spec_from
from attnhal.cli.output import format_plan, one_line, print_json, table, yes_no
from attnhal.kv_format import KV_FORMATS, kv_format
from attnhal.registry import default_registry
from attnhal.spec import PAGE_SIZE, ModelKind

__all__ = ["DRAWN_FLAGS", "demo_cases", "demo_config", "format_demo", "parsed_demo_config", "register", "run"]

#: Flags a reliability run (``--cases``) draws itself; giving them too is an error.
DRAWN_FLAGS = ("--spec-steps", "--topk", "--draft-tokens", "--batch-size", "--max-new-tokens", "--no-graphs",
               "--prompt-len", "--max-bs", "--model-seed", "--model")

#: One bound for --batch-size and --max-bs (the largest capture size defaults to the batch size).
BATCH_SIZE = bounded(1, 32)
#: One bound for --seed and --model-seed (which defaults to --seed).
SEED = bounded(0, 2**31 - 1)


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="the reference speculative worker end to end, checked lossless")
    add_spec_flags(p, max_bs=False)
    p.set_defaults(spec_steps=3)
    p.add_argument("--backend", help="registered backend name for every role (default: the registry's choice)")
    p.add_argument("--batch-size", type=BATCH_SIZE, default=4,
                   help="requests, %(type)s (the largest capture size too, unless --max-bs)")
    p.add_argument("--max-new-tokens", type=bounded(1, 256), default=32,
                   help="tokens generated per request, %(type)s")
    p.add_argument("--prompt-len", type=bounded(1, 256), default=16,
                   help="longest prompt, %(type)s; prompt lengths are drawn in min(3, N)..N")
    p.add_argument("--max-bs", type=BATCH_SIZE, default=None,
                   help="largest capture batch size, %(type)s (default: --batch-size)")
    p.add_argument("--seed", type=SEED, default=0,
                   help="seeds the prompts and the model (with --cases: the drawing), %(type)s")
    p.add_argument("--model-seed", type=SEED, default=None, help="seeds the model instead of --seed (default: --seed)")
    p.add_argument("--cases", type=bounded(1, 100_000), default=None,
                   help="reliability run: N random lossless cases, %(type)s, drawn over "
                        "platforms, spec configs, batch sizes, prompt lengths, graphs and backends "
                        "(--platform/--backend pin those axes)")
    p.add_argument("--page-size", type=within(PAGE_SIZE), default=1, help="tokens per KV page, %(type)s")
    p.add_argument("--kv-dtype", type=choice(tuple(KV_FORMATS)), default="float32",
                   help=f"KV-cache dtype: {', '.join(KV_FORMATS)}; fp8_e4m3 is stored in the platform's flavour")
    p.add_argument("--model", type=choice([m.value for m in ModelKind]), default="gqa",
                   help="the target's attention: mha, gqa (4 query heads over 2 KV heads of 64) or mla "
                        "(DeepSeek's absorbed latent: one KV head of 576, V 512, 16 query heads) (default: gqa)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def format_demo(report: Any) -> str:
    """The text report of a :class:`~attnhal.example_engine.demo.DemoReport`: plan, capture, speed, lossless."""
    m = report.model
    lines = [format_plan(report.plan), "",
             f"model: {m['kind']}, {m['q_heads']} query heads over {m['kv_heads']} KV head(s) of {m['head_size']}"
             + (f", V {m['v_head_size']}" if m["v_head_size"] != m["head_size"] else ""),
             "backends: " + ", ".join(f"{k}={v}" for k, v in report.backends.items())]
    capture: list[tuple[object, ...]] = [
        (phase, ",".join(map(str, s["captured_sizes"])) or "-", s["replays"], s["eager_runs"],
         s["replay_allocations"], s["failure"] or "-")
        for phase, s in report.capture.items()]
    lines += ["", "capture (graphs run):",
              table(("phase", "captured sizes", "replays", "eager runs", "replay allocations", "capture failure"),
                    capture),
              "(replay allocations: tensors the captured forward allocates at replay, counted over the whole "
              "step — the tiny model's own ops, not only attention)"]
    greedy = report.greedy_tokens_per_s
    rows: list[tuple[object, ...]] = [
        (mode, f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s'] / greedy:.2f}x", f"{r['mean_accept_length']:.2f}",
         r["verify_steps"], f"{r['capture_s']:.2f}", yes_no(r["lossless"])) for mode, r in report.runs.items()]
    rows.insert(0, ("greedy (no speculation, eager)", f"{greedy:.1f}", "1.00x", "-", "-", "-", "reference"))
    lines += ["", table(("run", "tokens/s", "vs greedy", "mean accepted length", "verify steps", "setup s",
                         "lossless"), rows),
              "(tokens/s: each run timed after an untimed identical run, so no first-call cost is in it)"]
    lines += ["", f"lossless: {yes_no(report.lossless)} (speculative tokens == plain greedy tokens of the target)"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when the output is lossless, 1 when not or when the plan is invalid."""
    if args.cases is not None:
        return demo_cases(args)
    config = demo_config(args)  # every input checked before the demo (and torch) loads
    from attnhal.example_engine.demo import run_demo
    from attnhal.example_engine.worker import PlanInvalid

    try:
        report = run_demo(config)
    except PlanInvalid as exc:  # a valid question with a negative answer
        print(f"attnhal demo: {one_line(str(exc))}", file=sys.stderr)
        return 1
    if args.json:
        print_json(report.to_dict())
    else:
        print(format_demo(report))
    return 0 if report.lossless else 1


def demo_config(args: argparse.Namespace) -> Any:
    """The :class:`~attnhal.example_engine.demo.DemoConfig` of parsed ``demo`` arguments.

    Every input is checked before the demo's modules (and torch) load; the platform last,
    as detecting it imports torch.
    """
    from attnhal.example_engine.limits import check_tree_size

    spec = spec_from(args)
    if not spec.speculative:
        raise UsageError(f"--spec-steps=0 (supported: 1..{SPEC_STEPS.high}; the demo runs "
                         "speculative decoding)")
    try:
        check_tree_size(spec)
    except ValueError as exc:
        raise UsageError(f"--draft-tokens: {exc}") from None
    if args.backend is not None:  # a drawn case's namespace carries no registry: the default one
        refuse_unknown_name(args.backend, getattr(args, "registry", None) or default_registry())
    platform = resolve_platform(args.platform)
    try:  # fp8_e4m3 needs the platform's flavour: never guessed
        kv_format(args.kv_dtype).storage_name(platform.fp8_flavor)
    except ValueError:  # the API's advice (pass a flavour) is not something a command line can do
        raise UsageError(f"--kv-dtype={args.kv_dtype} on platform {platform.name}, which has no fp8 "
                         "(supported: a platform with fp8, e.g. --platform cuda:sm90 for e4m3fn or "
                         "--platform hip:gfx942 for e4m3fnuz; or --kv-dtype fp8_e5m2, which needs no "
                         "flavour)") from None
    from attnhal.example_engine.demo import DemoConfig

    return DemoConfig(spec=spec, platform=platform, backend=args.backend,
                      batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, graphs=not args.no_graphs,
                      seed=args.seed, max_prompt_len=args.prompt_len, max_bs=args.max_bs,
                      model_seed=args.model_seed, page_size=args.page_size, kv_dtype=args.kv_dtype,
                      model=ModelKind(args.model))


@functools.lru_cache(maxsize=1)
def _demo_parser() -> argparse.ArgumentParser:
    """``attnhal`` with only the ``demo`` command: what a drawn case's command line is parsed with."""
    parser, sub = root_parser(epilog="")
    register(sub)
    return parser


def parsed_demo_config(argv: list[str]) -> Any:
    """The DemoConfig of a ``demo ...`` command line (a drawn reliability case)."""
    try:
        args = _demo_parser().parse_args(argv)
    except SystemExit:
        raise ValueError(f"argv={argv} (supported: a valid `attnhal demo` command line)") from None
    return demo_config(args)


def demo_cases(args: argparse.Namespace) -> int:
    """``demo --cases N``: the reliability run (see :mod:`attnhal.example_engine.stress`)."""
    given = [flag for flag in DRAWN_FLAGS if any(a == flag or a.startswith(flag + "=") for a in args.argv)]
    if given:
        raise UsageError(f"{given[0]} with --cases (supported: --cases draws {', '.join(DRAWN_FLAGS)}; "
                         "pin only --platform and --backend)")
    if args.backend is not None:
        refuse_unknown_name(args.backend, args.registry)
    platform = resolve_platform(args.platform) if args.platform is not None else None
    from attnhal.example_engine.stress import StressConfig, run_cases  # after the inputs: it imports torch

    cfg = StressConfig(cases=args.cases, seed=args.seed, platform=platform.name if platform else None,
                       backend=args.backend)
    summary = run_cases(cfg, parsed_demo_config, progress=sys.stderr)
    if args.json:
        print_json(summary.to_dict())
    else:
        print(summary.format())
    return INTERRUPTED if summary.interrupted else 0 if summary.ok else 1
