"""``attnhal`` command line: info | plan | explain | conformance | demo | docs, plus plugin commands.

Exit status: 0 yes; 1 a valid question with a negative answer (an invalid plan, a
backend that does not fit, a falsified claim, a stale file); 2 bad input, with one
line ``attnhal <command>: error: ...`` naming the flag, the value and what is
allowed; 3 an internal error (a bug: ``--debug`` shows the traceback); 130
interrupted; 141 the reader of the output went away (``attnhal info | head -2``).

Each command is a pair ``add_<name>_parser(sub)`` / ``cmd_<name>(args)``. Commands
raise :class:`UsageError` (or let the API's ``ValueError``/``TypeError``/``LookupError``/
``OSError`` through) for bad input; :func:`main` is the one error boundary.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import fields
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
from attnhal.commands import Command, CommandUnavailable, load_commands
from attnhal.descriptors import load_descriptor
from attnhal.plan import AttentionMode, GraphPlan, GraphPolicy, PhaseBackends, SpecConfig, plan
from attnhal.platform import ENV_VAR, Platform, PlatformSpecError, detect, parse
from attnhal.registry import BackendEntry, BackendUnavailable, Registry, default_registry
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm

__all__ = ["LIMITS", "UsageError", "build_parser", "format_plan", "main"]

#: Bounds of every number that sizes work, so no input runs away in time or memory.
LIMITS: dict[str, tuple[int, int]] = {
    "--spec-steps": (0, 16),
    "--topk": (1, 16),
    "--draft-tokens": (2, 256),
    "--max-bs": (1, 4096),
    "--batch-size": (1, 32),
    "--max-new-tokens": (1, 256),
    "--prompt-len": (1, 256),
    "--cases": (1, 100_000),
    "--seed": (0, 2**31 - 1),
    "--examples": (0, 10_000),
    "--head-size": (1, 4096),
    "--page-size": (1, 4096),
    "--num-q-heads": (1, 4096),
    "--num-kv-heads": (1, 4096),
    "--capture-max-tokens": (1, 4096 * 1024),
}

#: Internal errors exit with this status; expected failures never do.
INTERNAL_ERROR = 3
#: 128 + SIGPIPE, the status a Unix tool gets when its reader goes away.
BROKEN_PIPE = 141
INTERRUPTED = 130


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


#: Exceptions that mean bad input (the API's validation errors); anything else is a bug.
BAD_INPUT: tuple[type[BaseException], ...] = (UsageError, ValueError, TypeError, LookupError, OSError)


# --- argument types --------------------------------------------------------------------

def bounded(flag: str, limit: str | None = None) -> Callable[[str], int]:
    """An int converter for ``flag`` within ``LIMITS[limit or flag]``; the message shows the bound."""
    low, high = LIMITS[limit or flag]

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            shown = text[:20] + "..." if len(text) > 20 else text
            shown = repr(shown) if value is None else shown
            raise argparse.ArgumentTypeError(f"{flag}={shown} (supported: an integer {low}..{high})")
        return value
    return convert


def choice(flag: str, allowed: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} (supported: {', '.join(allowed)})")
        return text
    return convert


def limit_help(limit: str) -> str:
    low, high = LIMITS[limit]
    return f"{low}..{high}"


# --- shared helpers ----------------------------------------------------------------------

def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def one_line(text: str) -> str:
    """A multi-line message (a reason list) as one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def resolve_platform(spec: str | None) -> Platform:
    """``--platform``, else ``ATTNHAL_PLATFORM``, else the detected device; errors name the source."""
    try:
        return parse(spec) if spec is not None else detect()
    except PlatformSpecError as exc:
        source = "--platform" if spec is not None else f"{ENV_VAR}={os.environ.get(ENV_VAR, '')!r} (environment)"
        raise UsageError(f"{source}: {exc}") from None


def resolve_backend(value: str, flag: str, registry: Registry,
                    platform: Platform | None = None) -> BackendCapabilities:
    """A registered backend's descriptor (the one for ``platform``'s vendor), or one read from a file."""
    if value.endswith((".json", ".toml")) or Path(value).is_file():
        try:
            return load_descriptor(value)
        except OSError as exc:
            raise UsageError(f"{flag}={value}: {exc.strerror or exc}") from None
        except (ValueError, UnicodeError) as exc:
            raise UsageError(f"{flag}={value}: {one_line(str(exc))}") from None
    try:
        entry = registry.get(value, platform)
    except BackendUnavailable as exc:
        raise UsageError(f"{flag}: {exc.reasons[0].message}") from None
    if entry.capabilities is None:
        raise UsageError(f"{flag}={value}: {entry.unavailable_reasons()[0].message}")
    return entry.capabilities


def add_spec_flags(p: argparse.ArgumentParser, *, max_bs: bool = True) -> None:
    p.add_argument("--platform", help="simulate a platform: cuda:sm90, hip:gfx942, cpu, ... (append ,nographs "
                                      f"for a device without graphs); default: ${ENV_VAR}, else the detected device")
    p.add_argument("--spec-steps", type=bounded("--spec-steps"), default=0,
                   help=f"EAGLE draft steps, {limit_help('--spec-steps')} (0 = no speculative decoding)")
    p.add_argument("--topk", type=bounded("--topk"), default=1,
                   help=f"draft branches per step, {limit_help('--topk')} (a tree when > 1)")
    p.add_argument("--draft-tokens", type=bounded("--draft-tokens"), default=None,
                   help=f"tokens verified per request, {limit_help('--draft-tokens')} "
                        "(default: spec steps + 1; required when --topk > 1)")
    p.add_argument("--no-graphs", action="store_true", help="graph capture disabled by policy")
    if max_bs:
        p.add_argument("--max-bs", type=bounded("--max-bs"), default=32,
                       help=f"largest capture batch size, {limit_help('--max-bs')}")


def spec_from(args: argparse.Namespace) -> SpecConfig:
    if args.spec_steps == 0:
        if args.topk != 1 or args.draft_tokens:
            raise UsageError("--topk/--draft-tokens need --spec-steps >= 1 (speculative decoding)")
        return SpecConfig()
    if args.topk > 1 and args.draft_tokens is None:
        raise UsageError(f"--draft-tokens is required with --topk={args.topk} (supported: "
                         f"{limit_help('--draft-tokens')}, the tree nodes verified per request)")
    try:
        return SpecConfig.eagle(args.spec_steps, args.topk, args.draft_tokens or 0,
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
        p.add_argument("--head-size", type=bounded("--head-size"), help=f"head dimension, {limit_help('--head-size')}")
        p.add_argument("--page-size", type=bounded("--page-size"),
                       help=f"KV page size in tokens, {limit_help('--page-size')}")
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
    p.add_argument("--capture-max-tokens", type=bounded("--capture-max-tokens"),
                   help="capture sizes from the spec width: batch sizes with bs x tokens per request <= N, "
                        f"{limit_help('--capture-max-tokens')}")


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
        raise UsageError(f"--backend: {one_line(str(exc))}") from None
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


def invalid_cause(p: GraphPlan) -> str:
    """Why a plan is invalid, in a few words (the reasons are in the table)."""
    if any(d.blocking for d in p.phases.values()):
        return "a phase that runs has no capable backend"
    return "a step count of the adaptive set does not fit"


def format_plan(p: GraphPlan, verdict: bool = True) -> str:
    """The plan as a table; ``verdict`` adds the closing ``plan: valid|INVALID`` line."""
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
    text = f"{head}\ngraphs: {graphs}\n{body}" + "".join(f"\nconditional claim applied: {n}" for n in notes)
    for n, sub in sorted(p.adaptive.items()):
        captured = ", ".join(ph.value for ph in sub.captured) or "none"
        text += f"\nadaptive num_steps={n}: {'valid' if sub.valid else 'INVALID'}; captured: {captured}"
    for n, unfit in sorted(p.unfit_steps.items()):
        text += f"\nadaptive num_steps={n}: INVALID; {unfit}"
    if verdict:
        text += "\nplan: valid" if p.valid else f"\nplan: INVALID ({invalid_cause(p)})"
    return text


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


# --- plan ---------------------------------------------------------------------------------

def add_plan_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="which attention phases run and are captured as graphs")
    add_spec_flags(p)
    p.add_argument("--backend", help="registered name or descriptor file (.json/.toml) for every role "
                                     "(default: the registry's choice for the platform)")
    p.add_argument("--target-backend", help="backend of prefill, decode and target verify (over --backend)")
    p.add_argument("--draft-backend", help="the multi-step draft (draft_decode) backend (over --backend)")
    p.add_argument("--draft-extend-backend", help="the draft-extend backend (over --backend)")
    add_plan_input_flags(p, context=True, roles=True)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_engine_flags(p)
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.engine or args.engine_args:
        return _engine_command("cmd_engine_plan", args)
    platform = resolve_platform(args.platform)
    spec = spec_from(args)
    registry = default_registry()
    result = plan(spec, platform, phase_backends(args, spec, platform, registry), policy_from(args),
                  context_from(args))
    if args.json:
        print_json(result.to_dict())
    else:
        print(format_plan(result))
    return 0 if result.valid else 1


# --- explain ------------------------------------------------------------------------------

def add_explain_parser(sub: Any) -> None:
    p = sub.add_parser("explain", help="why a backend does or does not fit a request, and its plan")
    add_spec_flags(p)
    p.add_argument("--backend", help="registered name, descriptor file (.json/.toml), or sglang:NAME / vllm:NAME")
    p.add_argument("--phase", type=choice("--phase", [ph.value for ph in Phase]),
                   help="the phase asked about (default: any)")
    p.add_argument("--dtype", type=choice("--dtype", DTYPES), help=f"query dtype: {', '.join(DTYPES)}")
    p.add_argument("--kv-dtype", type=choice("--kv-dtype", KV_DTYPES), help=f"KV cache dtype: {', '.join(KV_DTYPES)}")
    for flag, what in (("--head-size", "head size"), ("--page-size", "KV page size"),
                       ("--num-q-heads", "query heads"), ("--num-kv-heads", "KV heads")):
        p.add_argument(flag, type=bounded(flag), help=f"{what}, {limit_help(flag)}")
    p.add_argument("--feature", action="append", type=choice("--feature", [f.value for f in Feature]),
                   help=f"a feature the request needs (repeatable): {', '.join(f.value for f in Feature)}")
    add_plan_input_flags(p, context=False, roles=False)
    p.add_argument("--json", action="store_true", help="print request, reasons, plan and verdict as JSON")
    add_engine_flags(p)
    p.set_defaults(func=cmd_explain)


def request_from(args: argparse.Namespace) -> AttentionRequest:
    return AttentionRequest(
        phase=Phase(args.phase) if args.phase else None, dtype=args.dtype, kv_dtype=args.kv_dtype,
        head_size=args.head_size, page_size=args.page_size, num_q_heads=args.num_q_heads,
        num_kv_heads=args.num_kv_heads, features=frozenset(Feature(f) for f in args.feature or ()),
        model=ModelKind(args.model) if args.model else None,
    )


def request_fields(request: AttentionRequest) -> dict[str, object]:
    """The request as evaluated: unset fields shown as ``any`` (they are not checked)."""
    def shown(value: object) -> object:
        if isinstance(value, frozenset):
            return sorted(str(getattr(v, "value", v)) for v in value)
        return "any" if value is None else getattr(value, "value", value)
    return {f.name: shown(getattr(request, f.name)) for f in fields(request)}


def explain_verdict(fits: bool, valid: bool) -> str:
    if not fits:
        return "does not fit"
    return "fits" if valid else "plan invalid"


def cmd_explain(args: argparse.Namespace) -> int:
    if args.engine or args.engine_args:
        return _engine_command("cmd_engine_explain", args)
    if not args.backend:
        raise UsageError("--backend is required (a registered name, a descriptor file, or sglang:NAME / vllm:NAME; "
                         "or --engine sglang|vllm -- ENGINE_FLAGS)")
    platform = resolve_platform(args.platform)
    spec = spec_from(args)
    caps = resolve_backend(args.backend, "--backend", default_registry(), platform)
    request = request_from(args)
    reasons = not_supported_reasons(caps, request, platform)
    result = plan(spec, platform, PhaseBackends.same(caps, spec), policy_from(args), context_from(args))
    verdict = explain_verdict(not reasons, result.valid)
    if args.json:
        print_json({"backend": caps.name, "platform": platform.spec, "request": request_fields(request),
                    "fits": not reasons, "reasons": [r.to_dict() for r in reasons], "plan": result.to_dict(),
                    "verdict": verdict})
        return 0 if verdict == "fits" else 1
    echo = " ".join(f"{k}={','.join(map(str, v)) or 'none' if isinstance(v, list) else v}"
                    for k, v in request_fields(request).items())
    print(f"backend {caps.name!r} on {platform.spec}")
    print(f"request: {echo}  (any = not checked)")
    print("  fits this request" if not reasons else "\n".join(f"  does not fit: {r}" for r in reasons))
    print(f"\nwith {caps.name!r} in every role:\n{format_plan(result, verdict=False)}")
    why = {"fits": "fits the request and the plan is valid",
           "does not fit": f"does not fit ({len(reasons)} reason{'s' * (len(reasons) != 1)} above)",
           "plan invalid": "fits the request, but the plan is INVALID (see the reasons in the table)"}
    print(f"\nverdict: {caps.name!r} {why[verdict]}")
    return 0 if verdict == "fits" else 1


# --- info ---------------------------------------------------------------------------------

def add_info_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="platform, Triton, registered backends and their capabilities")
    p.add_argument("--platform", help=f"simulate a platform (default: ${ENV_VAR}, else the detected device)")
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    p.add_argument("--build", action="store_true", help="also build/load native kernels and print their build time")
    p.set_defaults(func=cmd_info)


def triton_status() -> dict[str, Any]:
    """Which distribution provides ``triton``, its version and vendor backends — without importing it."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return {"installed": False, "distributions": {}, "vendor_backends": [],
                "hint": "pip install 'attnhal[triton]'; on ROCm it comes with torch as pytorch-triton-rocm"}
    dists: dict[str, str] = {}
    for dist in packages_distributions().get("triton", []):
        try:
            dists[dist] = version(dist)
        except PackageNotFoundError:
            dists[dist] = "unknown"
    backends_dir = Path(next(iter(spec.submodule_search_locations))) / "backends"
    vendors = sorted(d.name for d in backends_dir.iterdir() if d.is_dir() and not d.name.startswith("_")) \
        if backends_dir.is_dir() else []
    return {"installed": True, "distributions": dists, "vendor_backends": vendors}


def triton_info() -> str:
    status = triton_status()
    if not status["installed"]:
        return f"not installed ({status['hint']})"
    dists = ", ".join(f"{d} {v}" for d, v in status["distributions"].items()) or "unknown distribution"
    return f"{dists}; backends: {', '.join(status['vendor_backends']) or 'none'}"


def capability_summary(c: BackendCapabilities) -> dict[str, Any]:
    """The capability columns of ``info`` (text and JSON share them)."""
    def names(xs: Any) -> list[str]:
        return sorted(str(getattr(x, "value", x)) for x in xs)
    return {"vendors": names(c.vendors), "phases": names(c.phases), "graph": names(c.graph),
            "multi_step": c.multi_step is not None, "dtypes": names(c.dtypes),
            "head_sizes": sorted(int(h) for h in c.head_sizes), "features": names(c.features)}


def backend_status(entry: BackendEntry, platform: Platform) -> dict[str, Any]:
    """One backend as ``info`` reports it: available on this platform or why not."""
    reasons = entry.reasons(AttentionRequest(), platform)
    caps = entry.capabilities
    return {"available": not reasons, "reasons": [r.to_dict() for r in reasons], "source": entry.source,
            "capabilities": capability_summary(caps) if caps is not None else None}


def cmd_info(args: argparse.Namespace) -> int:
    p = resolve_platform(args.platform)
    backends = {e.name: backend_status(e, p) for e in default_registry().ordered(p)}
    builds = native_builds(p) if args.build else None
    if args.json:
        print_json({"platform": p.spec, "device": p.device_name, "simulated": p.simulated,
                    "vendor": p.vendor.value, "arch": p.arch, "warp_size": p.warp_size,
                    "fp8": p.fp8_flavor.value, "graph_api": p.has_graph_api, "graph_kind": p.graph_kind.value,
                    "torch_device": p.torch_device, "triton": triton_status(), "backends": backends,
                    **({"builds": builds} if builds is not None else {})})
        return 0
    print(f"platform: {p.spec} ({p.device_name}{', simulated' if p.simulated else ''})")
    print(f"  vendor={p.vendor.value} arch={p.arch} warp_size={p.warp_size} fp8={p.fp8_flavor.value} "
          f"graph_api={yes_no(p.has_graph_api)} graph_kind={p.graph_kind.value} device={p.torch_device}")
    print(f"triton: {triton_info()}")
    rows = [(name, "available" if b["available"] else "unavailable",
             "; ".join(f"[{r['code']}] {r['message']}" for r in b["reasons"]) or "-", b["source"])
            for name, b in backends.items()]
    print("\nbackends:\n" + table(("name", "status", "reasons", "source"), rows))
    caps = [(name, *(_cell(v) for v in b["capabilities"].values()))
            for name, b in backends.items() if b["capabilities"] is not None]
    print("\ncapabilities:\n" + table(("name", "vendors", "phases", "graph", "multi_step", "dtypes",
                                       "head_sizes", "features"), caps))
    if builds is not None:
        print("\nnative builds (first use builds, later runs load the cache):\n"
              + table(("name", "build"), list(builds.items()) or [("-", "none")]))
    return 0


def native_builds(platform: Platform) -> dict[str, str]:
    """Each backend's native build (``build_info()``: the cpu kernel's cache entry and state), where it has one."""
    infos = {e.name: e.backend.build_info() for e in default_registry().ordered(platform) if e.backend is not None}
    return {name: info for name, info in infos.items() if info is not None}


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value)


# --- demo ---------------------------------------------------------------------------------

#: Flags a reliability run (``--cases``) draws itself; giving them too is an error.
DRAWN_FLAGS = ("--spec-steps", "--topk", "--draft-tokens", "--batch-size", "--max-new-tokens", "--no-graphs",
               "--prompt-len", "--max-bs", "--model-seed")


def add_demo_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="the reference speculative worker end to end, checked lossless")
    add_spec_flags(p, max_bs=False)
    p.set_defaults(spec_steps=3)
    p.add_argument("--backend", help="registered backend name for every role (default: the registry's choice)")
    p.add_argument("--batch-size", type=bounded("--batch-size"), default=4,
                   help=f"requests, {limit_help('--batch-size')} (the largest capture size too, unless --max-bs)")
    p.add_argument("--max-new-tokens", type=bounded("--max-new-tokens"), default=32,
                   help=f"tokens generated per request, {limit_help('--max-new-tokens')}")
    p.add_argument("--prompt-len", type=bounded("--prompt-len"), default=16,
                   help=f"longest prompt, {limit_help('--prompt-len')}; prompt lengths are drawn in "
                        "min(3, N)..N")
    p.add_argument("--max-bs", type=bounded("--max-bs", "--batch-size"), default=None,
                   help=f"largest capture batch size, {limit_help('--batch-size')} (default: --batch-size)")
    p.add_argument("--seed", type=bounded("--seed"), default=0,
                   help=f"seeds the prompts and the model (with --cases: the drawing), {limit_help('--seed')}")
    p.add_argument("--model-seed", type=bounded("--model-seed", "--seed"), default=None,
                   help="seeds the model instead of --seed (default: --seed)")
    p.add_argument("--cases", type=bounded("--cases"), default=None,
                   help=f"reliability run: N random lossless cases, {limit_help('--cases')}, drawn over "
                        "platforms, spec configs, batch sizes, prompt lengths, graphs and backends "
                        "(--platform/--backend pin those axes)")
    p.add_argument("--page-size", type=bounded("--page-size"), default=1,
                   help=f"tokens per KV page, {limit_help('--page-size')}")
    p.add_argument("--kv-dtype", type=choice("--kv-dtype", KV_DTYPES), default="float32",
                   help=f"KV-cache dtype: {', '.join(KV_DTYPES)}; fp8_e4m3 is stored in the platform's flavour")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_demo)


def format_demo(report: Any) -> str:
    lines = [format_plan(report.plan), "", "backends: " + ", ".join(f"{k}={v}" for k, v in report.backends.items())]
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
                         "lossless"), rows)]
    lines += ["", f"lossless: {yes_no(report.lossless)} (speculative tokens == plain greedy tokens of the target)"]
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.cases is not None:
        return demo_cases(args)
    from attnhal.reference.demo import run_demo
    from attnhal.reference.worker import PlanInvalid

    try:
        report = run_demo(demo_config(args))
    except PlanInvalid as exc:  # a valid question with a negative answer
        print(f"attnhal demo: {one_line(str(exc))}", file=sys.stderr)
        return 1
    if args.json:
        print_json(report.to_dict())
    else:
        print(format_demo(report))
    return 0 if report.lossless else 1


def demo_config(args: argparse.Namespace) -> Any:
    """The :class:`~attnhal.reference.demo.DemoConfig` of parsed ``demo`` arguments."""
    from attnhal.reference.demo import DemoConfig

    spec = spec_from(args)
    if not spec.speculative:
        raise UsageError(f"--spec-steps=0 (supported: 1..{LIMITS['--spec-steps'][1]}; the demo runs "
                         "speculative decoding)")
    from attnhal.backend.kv_pool import kv_storage_dtype

    platform = resolve_platform(args.platform)
    try:  # fp8_e4m3 needs the platform's flavour: never guessed
        kv_storage_dtype(args.kv_dtype, platform.fp8_flavor)
    except ValueError as exc:
        raise UsageError(f"--kv-dtype: {exc}") from None
    return DemoConfig(spec=spec, platform=platform, backend=args.backend,
                      batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, graphs=not args.no_graphs,
                      seed=args.seed, max_prompt_len=args.prompt_len, max_bs=args.max_bs,
                      model_seed=args.model_seed, page_size=args.page_size, kv_dtype=args.kv_dtype)


@functools.lru_cache(maxsize=1)
def _demo_parser() -> argparse.ArgumentParser:
    return build_parser()


def parsed_demo_config(argv: list[str]) -> Any:
    """The DemoConfig of a ``demo ...`` command line (a drawn reliability case)."""
    try:
        args = _demo_parser().parse_args(argv)
    except SystemExit:
        raise ValueError(f"argv={argv} (supported: a valid `attnhal demo` command line)") from None
    return demo_config(args)


def demo_cases(args: argparse.Namespace) -> int:
    """``demo --cases N``: the reliability run (see :mod:`attnhal.reference.stress`)."""
    from attnhal.reference.stress import StressConfig, run_cases

    given = [flag for flag in DRAWN_FLAGS if any(a == flag or a.startswith(flag + "=") for a in args.argv)]
    if given:
        raise UsageError(f"{given[0]} with --cases (supported: --cases draws {', '.join(DRAWN_FLAGS)}; "
                         "pin only --platform and --backend)")
    platform = resolve_platform(args.platform) if args.platform is not None else None
    cfg = StressConfig(cases=args.cases, seed=args.seed, platform=platform.spec if platform else None,
                       backend=args.backend)
    summary = run_cases(cfg, parsed_demo_config, progress=sys.stderr)
    if args.json:
        print_json(summary.to_dict())
    else:
        print(summary.format())
    return INTERRUPTED if summary.interrupted else 0 if summary.ok else 1


# --- conformance --------------------------------------------------------------------------

def add_conformance_parser(sub: Any) -> None:
    p = sub.add_parser("conformance", help="check every claim of a backend's descriptor by running it")
    p.add_argument("backend", nargs="?", help="registered name or module:attr (default: every registered backend)")
    p.add_argument("--platform", help="simulate a platform (default: the detected device)")
    p.add_argument("--examples", type=bounded("--examples"), default=None,
                   help=f"random examples per check on top of the fixed ones, {limit_help('--examples')} "
                        "(default: 3; 25 with --thorough; with --budget: the most per check)")
    p.add_argument("--budget", type=_seconds, default=None, metavar="SECONDS",
                   help="seconds for random examples, spread over the claims (each runs rounds until its share "
                        "is spent)")
    p.add_argument("--thorough", action="store_true",
                   help="release check: more random examples and the costlier fixed ones (more long contexts)")
    p.add_argument("--allow-unchecked", action="store_true",
                   help="exit 0 despite claims not checked here (e.g. device-only claims on a CPU machine); "
                        "the report still lists them")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=cmd_conformance)


def add_catalog_parser(sub: Any) -> None:
    p = sub.add_parser("catalog", help="the catalogued attention backends of real engines (sglang:NAME, vllm:NAME)")
    p.add_argument("--engine", help="only this engine's backends (sglang, vllm)")
    p.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    p.set_defaults(func=lambda args: _engine_command("cmd_catalog", args))


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
            raise UsageError(f"backend={name}: {one_line(str(exc))}") from None
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


# --- docs ---------------------------------------------------------------------------------

def add_docs_parser(sub: Any) -> None:
    p = sub.add_parser("docs", help="write the generated capability matrix (docs/capabilities.md)")
    p.add_argument("--path", default="docs/capabilities.md",
                   help="the file to write or check, relative to the current folder")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is not current (write nothing)")
    p.set_defaults(func=cmd_docs)


def cmd_docs(args: argparse.Namespace) -> int:
    from attnhal.docgen import capability_matrix

    path = Path(args.path)
    if path.is_dir():
        raise UsageError(f"--path={path} is a folder (supported: a file path)")
    if args.check and not path.exists():
        raise UsageError(f"--path={path}: no such file (supported: an existing file; run in the repository "
                         "root or give --path)")
    if not args.check and not path.parent.is_dir():
        raise UsageError(f"--path={path}: folder {path.parent} does not exist (supported: a path in an "
                         "existing folder)")
    text = capability_matrix() + "\n"
    if args.check:
        if path.read_text(encoding="utf-8", errors="replace") != text:
            print(f"attnhal docs: {path} is stale: run `attnhal docs --path {path}`", file=sys.stderr)
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


# --- parser -------------------------------------------------------------------------------

class _Help(argparse.HelpFormatter):
    """Shows each option's default, unless it is unset or a flag's ``False``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default:" in text or not action.option_strings or default is None
                or default is False or default is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """One-line errors in the CLI's voice; no abbreviated flags (they break as flags are added)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        # "argument --topk: --topk=x (...)" names the flag twice: keep one.
        message = re.sub(r"^argument [^:]+: (?=-)", "", message)
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


class _CommandParser(_Parser):
    """A subcommand's parser: also takes ``--debug`` after the command name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parents", [_debug_parent()])
        super().__init__(*args, **kwargs)


BUILTIN: tuple[Callable[[Any], None], ...] = (
    add_info_parser, add_plan_parser, add_explain_parser, add_conformance_parser, add_demo_parser,
    add_catalog_parser, add_docs_parser)
BUILTIN_NAMES = ("info", "plan", "explain", "conformance", "demo", "catalog", "docs")


def _debug_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    return parent


def add_plugin_parser(sub: Any, command: Command) -> None:
    p = sub.add_parser(command.name, help=command.help)
    command.add_arguments(p)
    p.set_defaults(func=command.run)


def build_parser(plugins: Sequence[Command] = (), unavailable: Sequence[CommandUnavailable] = ()
                 ) -> argparse.ArgumentParser:
    """The parser: built-in commands, then the plugin commands that work here."""
    epilog = "exit status: 0 yes, 1 a negative answer, 2 bad input, 3 internal error (see docs/cli.md)"
    if unavailable:
        epilog += "\nplugin commands not available here:\n" + "\n".join(
            f"  {u.name}: {u.reason}" for u in unavailable)
    parser = _Parser(prog="attnhal", description="Plan, explain and check attention backends for speculative decoding on "
                     "CUDA, HIP and CPU.", epilog=epilog,
                     formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog))
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    for add in BUILTIN:
        add(sub)
    for command in plugins:
        add_plugin_parser(sub, command)
    return parser


# --- the error boundary -------------------------------------------------------------------

def _say(command: str, message: str) -> None:
    print(f"attnhal {command}: {message}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    """Run the command; every expected failure becomes one line and exit 2."""
    command = args.command
    try:
        with warnings.catch_warnings():
            warnings.showwarning = lambda message, *_a, **_k: _say(command, f"warning: {one_line(str(message))}")
            code: int = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        raise
    except KeyboardInterrupt:
        _say(command, "interrupted")
        return INTERRUPTED
    except BAD_INPUT as exc:
        if args.debug:
            traceback.print_exc()
        _say(command, f"error: {_message(exc)}")
        return 2
    except Exception as exc:  # noqa: BLE001 - the boundary: a bug, reported without a traceback
        if args.debug:
            traceback.print_exc()
        _say(command, f"internal error: {type(exc).__name__}: {one_line(str(exc))[:300]} "
                      "(a bug: rerun with --debug for the traceback)")
        return INTERNAL_ERROR


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    return one_line(str(exc)) or type(exc).__name__


def _silence_stdout() -> None:
    """After the reader went away: point stdout at /dev/null so the exit flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _unavailable_command(argv: Sequence[str], unavailable: Sequence[CommandUnavailable]) -> str | None:
    words = [a for a in argv if not a.startswith("-")]
    for u in unavailable:
        if words and words[0] == u.name:
            return f"attnhal {u.name}: error: command unavailable here: {u.reason}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The ``attnhal`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins, unavailable = load_commands(BUILTIN_NAMES)
    missing = _unavailable_command(argv, unavailable)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    try:
        args = build_parser(plugins, unavailable).parse_args(argv)
    except SystemExit as exc:  # --help, or a one-line argparse error already printed
        return exc.code if isinstance(exc.code, int) else 0
    args.argv = argv
    try:
        return _run(args)
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
