"""``attnhal conformance``: check every claim of a backend's descriptor by running it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from attnhal.cli.app import INTERRUPTED, UsageError
from attnhal.cli.args import within
from attnhal.errors import InvalidValue
from attnhal.testing.settings import BUDGET, EXAMPLES, EXAMPLES_ENV, env_examples
from attnhal.cli.inputs import resolve_platform
from attnhal.cli.output import one_line

__all__ = ["Progress", "register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser("conformance", help="check every claim of a backend's descriptor by running it")
    p.add_argument("backend", nargs="?", help="registered name, module:attr, or sglang:torch_native / sglang:triton "
                                             "(SGLang's own classes, when SGLang is installed; default: every "
                                             "registered backend)")
    p.add_argument("--platform", help="simulate a platform (default: the detected device)")
    p.add_argument("--examples", type=within(EXAMPLES), default=None,
                   help="random examples per check on top of the fixed ones, %(type)s "
                        f"(default: ${EXAMPLES_ENV}, else 3; 25 with --thorough; with --budget: the most per check)")
    p.add_argument("--budget", type=within(BUDGET), default=None, metavar="SECONDS",
                   help="seconds for random examples, %(type)s, spread over the claims (each runs rounds until its "
                        "share is spent)")
    p.add_argument("--thorough", action="store_true",
                   help="release check: more random examples and the costlier fixed ones (more long contexts)")
    p.add_argument("--allow-unchecked", action="store_true",
                   help="exit 0 despite claims not checked here (e.g. graph claims on a platform without graphs); "
                        "the report still lists them")
    p.add_argument("--strict", action="store_true",
                   help="fail on vendor claims whose device is not here too (vendor[cuda] on a CPU machine); "
                        "by default they are listed and do not fail the run")
    p.add_argument("--json", action="store_true", help="print the reports as JSON (with each claim's coverage)")
    p.add_argument("--coverage", action="store_true",
                   help="after the report, the ranges each claim's examples reached "
                        "(batch sizes, lengths, pools, layers)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 1 if nothing was verified, a claim is falsified, hit a kit error, or was not checked
    here (unless waived; vendor claims of devices elsewhere only with ``--strict``)."""
    from attnhal.testing import missing_kit

    missing = missing_kit()
    if missing:
        raise UsageError(missing)
    from attnhal.testing.report import ConformanceInterrupted, run_conformance

    if args.examples is None:
        try:
            env_examples()  # read again by the kit: refused here, as a usage error, before any claim runs
        except InvalidValue as exc:
            raise UsageError(f"{exc} (environment)") from None
    platform = resolve_platform(args.platform)
    if args.backend is not None and not args.backend.strip():
        raise UsageError(f"backend={args.backend!r} (supported: a registered name, module:attr or a package's "
                         "entry-point name; leave it out to check every registered backend)")
    names = [args.backend] if args.backend is not None else [e.name for e in args.registry.ordered(platform)]
    progress = Progress(sys.stderr) if sys.stderr.isatty() and not args.json else None
    reports = []
    for name in names:
        try:
            run = _engine_runner(name) or run_conformance
            reports.append(run(name, max_examples=args.examples, platform=platform, budget=args.budget,
                               thorough=args.thorough, allow_unchecked=args.allow_unchecked,
                               strict=args.strict, progress=progress))
        except LookupError as exc:
            raise UsageError(f"backend={name}: {one_line(str(exc))}") from None
        except ConformanceInterrupted as stop:  # Ctrl-C: the claims run so far are still reported
            _print(args, [*reports, stop.report])
            print("attnhal conformance: interrupted", file=sys.stderr)
            return INTERRUPTED
    _print(args, reports)
    # nothing verified, falsified, a kit error, or a claim not checked here that is not waived: the run fails
    return 0 if all(r.ok for r in reports) else 1


def _print(args: argparse.Namespace, reports: list[Any]) -> None:
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        print("\n\n".join(r.format(coverage=args.coverage) for r in reports))


def _engine_runner(name: str) -> Any:
    """How the engine's adapter checks catalogue name ``ENGINE:NAME`` (its optional ``conformance``,
    e.g. SGLang's kit on SGLang's own classes), or None for any other name."""
    from attnhal.engines import registry
    from attnhal.lookup import RefShape, shape

    if shape(name) is not RefShape.CATALOGUE:
        return None
    check = getattr(registry.get(name.partition(":")[0]), "conformance", None)
    return check(name) if callable(check) else None


class Progress:
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
