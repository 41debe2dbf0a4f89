"""``attnhal advise --engine NAME [--platform P] [--model M] -- <the server flags>``: the engine's
attention-backend flags that capture the most for this model on this GPU, before the server starts.

The answer is the engine adapter's (:class:`attnhal.engines.advice.Adviser`, optional: an adapter
without it is refused by name); this module names no engine: it splits attnhal's flags from the
engine's (as ``plan --engine`` does, :func:`attnhal.cli.engine.split_own_flags`) and prints it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from attnhal.cli.app import UsageError
from attnhal.cli.args import Registered, bounded, choice
from attnhal.cli.engine import (add_model_config_flag, check_model_config, check_values, engine_errors, own_flags,
                                split_own_flags)
from attnhal.cli.inputs import resolve_platform
from attnhal.cli.output import print_json
from attnhal.engines import registry

if TYPE_CHECKING:
    from attnhal.engines.advice import Advice, Option

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser("advise", help="the engine's attention-backend flags that capture the most, before it starts")
    p.add_argument("--engine", type=Registered(registry.names), required=True,
                   help="the engine whose flags follow `--` ({names})")
    p.add_argument("--platform", help="the GPU to advise for, e.g. hip:gfx942 (default: this machine's)")
    p.add_argument("--model", type=choice(("mha", "gqa", "mla")),
                   help="the model's attention kind (the engine reads it from the checkpoint)")
    add_model_config_flag(p)
    p.add_argument("--top", type=bounded(1, 20), default=3, help="how many flag sets to print at most")
    p.add_argument("--vary", type=lambda text: tuple(text.split(",")),
                   help="only these engine flags may change, comma-separated, without dashes (default: every flag "
                        "the engine's advice varies; an engine that varies one flag refuses it)")
    p.add_argument("--json", action="store_true", help="print the advice as JSON")
    p.add_argument("engine_args", nargs="*", metavar="-- ENGINE_FLAGS", help="the engine's own flags")
    p.set_defaults(func=run)


def advising() -> list[str]:
    """The registered engines whose adapter gives advice (loads every adapter)."""
    from attnhal.engines.advice import adviser  # here: another command's usage error does not load it

    return [a.name for a in registry.adapters() if adviser(a) is not None]


def run(args: argparse.Namespace) -> int:
    """Exit 0 with advice (the best flags: the user's or others), 1 when no flag set the engine takes is left;
    2 for bad input and for an engine whose adapter gives no advice."""
    adapter = registry.get(args.engine)
    from attnhal.engines.advice import adviser

    advises = adviser(adapter)
    if advises is None:
        raise UsageError(f"--engine={args.engine!r}: the {args.engine} adapter gives no advice (supported: "
                         f"{', '.join(advising())}; `attnhal plan --engine {args.engine}` plans its flags)")
    with engine_errors(args.engine, args.engine_args):
        names = own_flags(adapter)  # another engine's own flag reaches the parser: refused
        given, argv = split_own_flags(args.engine_args, names)
        own = {name: given.get(name) or getattr(args, name, getattr(args, name.replace("-", "_"), None))
               for name in names}
        values = adapter.parse(argv)
        check_values(adapter, values)
        check_model_config(own, adapter)
        platform = resolve_platform(own["platform"])  # last: detecting the device imports torch
        advice = advises.advise(values, platform, own, top=args.top, vary=args.vary)
    if args.json:
        print_json(advice.to_dict())
    else:
        print(format_advice(advice))
    return 0 if advice.recommended or advice.current.blocked is None else 1


def _phases(option: Option) -> str:
    from attnhal.engines.advice import PRIORITY

    captured = ", ".join(p.value for p in PRIORITY if p in option.captured) or "none"
    eager = "; ".join(f"{p.value} ({why})" for p, why in option.eager.items())
    return f"captured: {captured}" + (f"\n     eager: {eager}" if eager else "")


def format_advice(advice: Advice) -> str:
    """The advice as text: the user's flags, each recommendation with what it changes and why, the blocked ones."""
    current = advice.current
    lines = [f"advise: {advice.engine} on {advice.platform}, model {advice.model}: "
             f"{advice.considered} flag sets planned",
             f"yours: {current.command() or '(no flags)'}"]
    lines.append(f"  {current.label}: " + (current.blocked or _phases(current)))
    if not advice.recommended:
        lines.append("advice: keep your flags: " + ("they capture every phase that runs here"
                                                   if current.captures_every_phase
                                                   else "no flag set the engine takes captures more here"))
    for i, option in enumerate(advice.recommended, 1):
        lines += [f"{i}. {option.command()}", f"   backends: {option.label}",
                  "   changes: " + ", ".join(str(c) for c in option.changes)
                  + (" (changes the speculation)" if option.changes_speculation else ""),
                  f"   {_phases(option)}", *(f"   why: {why}" for why in advice.why_better(option))]
        lines += [f"   costs: {cost}" for cost in option.costs]
    if advice.blocked:
        lines.append("not recommended (the engine starts with them, then fails or computes without a tree mask):")
        lines += [f"  {o.command()}\n    {o.blocked}" for o in advice.blocked]
    lines += [f"note: {note}" for note in advice.notes]
    return "\n".join(lines)
