"""``attnhal plan``: which attention phases run and which are captured as graphs, per phase with reasons."""

from __future__ import annotations

import argparse
from typing import Any

from attnhal.cli import engine
from attnhal.cli.inputs import (
    add_plan_input_flags,
    add_spec_flags,
    context_from,
    layout_from,
    phase_backends,
    policy_from,
    read_backends,
    resolve_platform,
    spec_from,
)
from attnhal.cli.output import format_plan, print_json
from attnhal.planner import plan

__all__ = ["EPILOG", "register", "run"]

#: ``attnhal plan --help``'s last lines: the exit status, with and without ``--engine``.
EPILOG = ("exit status: 0 the plan is valid (with --engine: and the engine's outcome is attnhal's plan); 1 the plan "
          "is invalid (with --engine: or the engine refuses the flags); 2 bad input; 4 with --engine: the plan is "
          "valid and the engine starts, but what it will do differs from attnhal's plan on a phase (the report "
          "says which and what changes it; --json: outcome_differs)")


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="which attention phases run and are captured as graphs", epilog=EPILOG)
    add_spec_flags(p)
    p.add_argument("--backend", help="registered name or descriptor file (.json/.toml) for every role "
                                     "(default: the registry's choice for the platform)")
    p.add_argument("--target-backend", help="backend of prefill, decode and target verify (over --backend)")
    p.add_argument("--draft-backend", help="the multi-step draft (draft_decode) backend (over --backend)")
    p.add_argument("--draft-extend-backend", help="the draft-extend backend (over --backend)")
    add_plan_input_flags(p, context=True, roles=True)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    engine.add_engine_flags(p)
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    """Exit 0 for a valid plan, 1 for an invalid one; with ``--engine``: :func:`attnhal.cli.engine.engine_status`."""
    if args.engine or args.engine_args:
        return engine.run_plan(args)
    spec, policy, context, layout = spec_from(args), policy_from(args), context_from(args), layout_from(args)
    read = read_backends(args, args.registry)
    platform = resolve_platform(args.platform)  # last: detecting the device imports torch
    result = plan(spec, platform, phase_backends(args, spec, platform, args.registry, read), policy, context, layout)
    if args.json:
        print_json(result.to_dict())
    else:
        print(format_plan(result))
    return 0 if result.valid else 1
