"""``attnhal advise --engine sglang|vllm [--platform P] [--model M] -- <the server flags>``: the engine's
attention-backend flags that capture the most for this model on this GPU, before the server starts.

The answer is :func:`attnhal.engines.advise`'s; this module splits attnhal's flags from the
engine's (as ``plan --engine`` does, :func:`attnhal.cli.engine.split_own_flags`) and prints it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from attnhal.cli.app import UsageError
from attnhal.cli.args import bounded, choice
from attnhal.cli.engine import engine_message, own_flags, split_own_flags
from attnhal.cli.inputs import resolve_platform
from attnhal.cli.output import print_json
from attnhal.engines import ENGINES, advise, registry
from attnhal.engines.advice import PRIORITY, Advice, Option
from attnhal.engines.flags import EngineArgError

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser("advise", help="the engine's attention-backend flags that capture the most, before it starts")
    p.add_argument("--engine", type=choice(ENGINES), required=True, help="the engine whose flags follow `--`")
    p.add_argument("--platform", help="the GPU to advise for, e.g. hip:gfx942 (default: this machine's)")
    p.add_argument("--model", type=choice(("mha", "gqa", "mla")),
                   help="the model's attention kind (the engine reads it from the checkpoint)")
    p.add_argument("--top", type=bounded(1, 20), default=3, help="how many flag sets to print at most")
    p.add_argument("--vary", type=lambda text: tuple(text.split(",")),
                   help="with --engine sglang: only these flags may change, comma-separated (attention-backend, "
                        "decode-attention-backend, speculative-draft-attention-backend, speculative-attention-mode, "
                        "speculative-num-steps; default: all)")
    p.add_argument("--json", action="store_true", help="print the advice as JSON")
    p.add_argument("engine_args", nargs="*", metavar="-- ENGINE_FLAGS", help="the engine's own flags")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 with advice (the best flags: the user's or others), 1 when no flag set the engine takes is left."""
    try:
        names = own_flags(registry.get(args.engine))  # another engine's own flag reaches the parser: refused
        given, argv = split_own_flags(args.engine_args, names)
        own = {name: given.get(name) or getattr(args, name.replace("-", "_"), None) for name in names}
        advice = _advise(args, own, argv)
    except EngineArgError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(engine_message(args.engine, exc, args.engine_args)) from None
    if args.json:
        print_json(advice.to_dict())
    else:
        print(format_advice(advice))
    return 0 if advice.recommended or advice.current.blocked is None else 1


def _advise(args: argparse.Namespace, own: dict[str, str | None], argv: list[str]) -> Advice:
    from attnhal.engines import sglang, vllm

    platform = resolve_platform(own["platform"])
    options: dict[str, Any] = {"top": args.top}
    if args.engine == "sglang":
        if own.get("trtllm-cubins"):
            raise EngineArgError("--trtllm-cubins", "--trtllm-cubins is vLLM's FlashInfer assumption (supported: "
                                                    "with --engine vllm)")
        env = {sglang.DRAFT_EXTEND_GRAPH_OFF: os.environ.get(sglang.DRAFT_EXTEND_GRAPH_OFF, "")}
        return advise("sglang", sglang.parse_cli(argv), platform, own["model"], env=env, vary=args.vary, **options)
    if args.vary is not None:
        raise EngineArgError("--vary", "--vary (supported: with --engine sglang; vLLM's choice is one flag, "
                                       "--attention-backend)")
    cubins = own.get("trtllm-cubins") or "yes"
    if cubins not in ("yes", "no"):
        raise EngineArgError("--trtllm-cubins", f"--trtllm-cubins={cubins!r} (supported: yes, no)")
    return advise("vllm", vllm.parse_cli(argv), platform, own["model"], trtllm_cubins=cubins == "yes", **options)


def _phases(option: Option) -> str:
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
