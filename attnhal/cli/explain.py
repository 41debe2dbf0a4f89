"""``attnhal explain``: whether a backend fits a request, the plan with it in every role, one verdict."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from attnhal.capabilities import AttentionRequest, not_supported_reasons
from attnhal.cli import engine
from attnhal.cli.app import UsageError
from attnhal.cli.args import bounded, choice, within
from attnhal.cli.inputs import (
    add_plan_input_flags,
    add_spec_flags,
    context_from,
    layout_from,
    policy_from,
    read_backends,
    resolve_backend,
    resolve_platform,
    spec_from,
)
from attnhal.cli.output import format_plan, print_json
from attnhal.phases import Feature, Phase
from attnhal.planner import PhaseBackends, plan
from attnhal.kv_format import KV_FORMATS
from attnhal.spec import DTYPES, HEAD_SIZE, PAGE_SIZE, ModelKind, RequestContext

__all__ = ["explain_verdict", "register", "request_fields", "request_from", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="why a backend does or does not fit a request, and its plan")
    add_spec_flags(p)
    p.add_argument("--backend", help="registered name, descriptor file (.json/.toml), or sglang:NAME / vllm:NAME")
    p.add_argument("--phase", type=choice([ph.value for ph in Phase]), help="the phase asked about (default: any)")
    p.add_argument("--dtype", type=choice(DTYPES), help=f"query dtype: {', '.join(DTYPES)}")
    p.add_argument("--kv-dtype", type=choice(tuple(KV_FORMATS)), help=f"KV cache dtype: {', '.join(KV_FORMATS)}")
    for flag, what, kind in (("--head-size", "head size", within(HEAD_SIZE)),
                             ("--page-size", "KV page size", within(PAGE_SIZE)),
                             ("--num-q-heads", "query heads", bounded(1, 4096)),
                             ("--num-kv-heads", "KV heads", bounded(1, 4096))):
        p.add_argument(flag, type=kind, help=f"{what}, %(type)s")
    p.add_argument("--feature", action="append", type=choice([f.value for f in Feature]),
                   help=f"a feature the request needs (repeatable): {', '.join(f.value for f in Feature)}")
    add_plan_input_flags(p, context=False, roles=False)
    p.add_argument("--json", action="store_true", help="print request, reasons, plan and verdict as JSON")
    engine.add_engine_flags(p)
    p.set_defaults(func=run, parser=p)


def request_from(args: argparse.Namespace) -> AttentionRequest:
    """The request of the parsed flags (unset fields are not checked)."""
    context = RequestContext(model=args.model, dtype=args.dtype, kv_dtype=args.kv_dtype, head_size=args.head_size,
                             page_size=args.page_size)
    return AttentionRequest.of(context, phase=Phase(args.phase) if args.phase else None, num_q_heads=args.num_q_heads,
                               num_kv_heads=args.num_kv_heads, features=frozenset(Feature(f) for f in args.feature or ()))


def request_fields(request: AttentionRequest) -> dict[str, object]:
    """The request as evaluated: unset fields shown as ``any`` (they are not checked)."""
    def shown(value: object) -> object:
        if isinstance(value, frozenset):
            return sorted(str(getattr(v, "value", v)) for v in value)
        return "any" if value is None else getattr(value, "value", value)
    return {f.name: shown(getattr(request, f.name)) for f in fields(request)}


def explain_verdict(fits: bool, valid: bool) -> str:
    """``fits``, ``does not fit`` or ``plan invalid``."""
    if not fits:
        return "does not fit"
    return "fits" if valid else "plan invalid"


def run(args: argparse.Namespace) -> int:
    """Exit 0 when the backend fits and the plan is valid, else 1."""
    if args.engine or args.engine_args:
        return engine.run_explain(args)
    if not args.backend:
        raise UsageError("--backend is required (a registered name, a descriptor file, or sglang:NAME / vllm:NAME; "
                         "or --engine sglang|vllm -- ENGINE_FLAGS)")
    spec, policy, context = spec_from(args), policy_from(args), context_from(args)
    request = request_from(args)
    read = read_backends(args, args.registry)
    platform = resolve_platform(args.platform)  # last: detecting the device imports torch
    caps = read.get(args.backend) or resolve_backend(args.backend, "--backend", args.registry, platform)
    reasons = not_supported_reasons(caps, request, platform)
    result = plan(spec, platform, PhaseBackends.same(caps, spec), policy, context, layout_from(args))
    verdict = explain_verdict(not reasons, result.valid)
    if args.json:
        print_json({"backend": caps.name, "platform": platform.name, "request": request_fields(request),
                    "fits": not reasons, "reasons": [r.to_dict() for r in reasons], "plan": result.to_dict(),
                    "verdict": verdict})
        return 0 if verdict == "fits" else 1
    echo = " ".join(f"{k}={','.join(map(str, v)) or 'none' if isinstance(v, list) else v}"
                    for k, v in request_fields(request).items())
    print(f"backend {caps.name!r} on {platform.name}")
    print(f"request: {echo}  (any = not checked)")
    print("  fits this request" if not reasons else "\n".join(f"  does not fit: {r}" for r in reasons))
    print(f"\nwith {caps.name!r} in every role:\n{format_plan(result, verdict=False)}")
    why = {"fits": "fits the request and the plan is valid",
           "does not fit": f"does not fit ({len(reasons)} reason{'s' * (len(reasons) != 1)} above)",
           "plan invalid": "fits the request, but the plan is INVALID (see the reasons in the table)"}
    print(f"\nverdict: {caps.name!r} {why[verdict]}")
    return 0 if verdict == "fits" else 1
