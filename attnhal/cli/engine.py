"""The engine side of the command line: ``attnhal catalog`` and ``plan``/``explain --engine sglang|vllm -- ...``.

The adapters (:mod:`attnhal.engines.sglang`, :mod:`attnhal.engines.vllm`) turn an
engine's own flags into the planner's inputs; this module is their command-line front:
it splits attnhal's flags from the engine's and prints what the adapters decide.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnhal.capabilities import AttentionRequest, Facts, not_supported_reasons
from attnhal.catalog import CatalogError, citations, entries, load
from attnhal.cli.app import UsageError
from attnhal.cli.args import choice
from attnhal.cli.inputs import resolve_platform
from attnhal.cli.output import format_plan, print_json, table
from attnhal.engines import sglang, vllm
from attnhal.engines.flags import EngineArgError
from attnhal.engines.sglang import engine_resolution
from attnhal.engines.sglang.differs import engine_differs
from attnhal.engines.sglang.late import late_failures
from attnhal.engines.sglang.report import plan_report
from attnhal.planner import GraphPlan
from attnhal.platform import ENV_VAR, Platform
from attnhal.spec import RequestContext, SpecConfig

__all__ = ["OWN_FLAGS", "add_engine_flags", "register_catalog", "run_catalog", "run_explain", "run_plan",
           "split_own_flags"]

#: attnhal's own flags accepted among the engine's flags (after ``--``), as in
#: ``attnhal plan --engine sglang -- --attention-backend aiter ... --platform hip:gfx942``.
#: ``--trtllm-cubins yes|no`` (vLLM only): the assumption FlashInfer's graph level rests on.
OWN_FLAGS = ("platform", "model", "trtllm-cubins")

#: What an engine command does with (args, attnhal's own flags, the engine's flags).
EngineCommand = Callable[[argparse.Namespace, dict[str, str | None], list[str]], int]

#: Per engine, a planner field an adapter's error may name -> the engine flags its value comes
#: from, in the adapter's order of precedence, each with how a message names it (the planner
#: validates the spec and the graph policy; the user never typed ``num_steps=``).
FIELD_FLAGS: Mapping[str, Mapping[str, tuple[tuple[str, str], ...]]] = {
    "vllm": {"num_steps": (("--spec-tokens", "--spec-tokens"),
                           ("--speculative-config", "--speculative-config num_speculative_tokens"))},
    "sglang": {"max_batch_size": (("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-decode"),
                                  ("--cuda-graph-max-bs", "--cuda-graph-max-bs"),
                                  ("--cuda-graph-bs-decode", "the largest --cuda-graph-bs-decode"),
                                  ("--cuda-graph-bs", "the largest --cuda-graph-bs")),
               "batch_sizes": (("--cuda-graph-bs-decode", "--cuda-graph-bs-decode"),
                               ("--cuda-graph-bs", "--cuda-graph-bs"))},
}
#: vLLM flags that ``--speculative-config`` can also set: flag -> its key there.
def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """``--engine E`` and the engine's flags after ``--`` (for ``plan`` and ``explain``)."""
    p.add_argument("--engine", type=choice(("sglang", "vllm")),
                   help="read the engine's own flags after `--` (SGLang server / vLLM engine arguments)")
    p.add_argument("--engine-resolution", type=choice(engine_resolution.RESOLUTIONS), default=None,
                   help="with --engine sglang: resolve the flags with SGLang's own code (engine) or attnhal's "
                        "(builtin); default: engine where SGLang is importable, the platform is this machine's "
                        "and --model-path is given")
    p.add_argument("engine_args", nargs="*", metavar="-- ENGINE_FLAGS", help="with --engine: the engine's flags")


def split_own_flags(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Pull attnhal's own ``--platform`` / ``--model`` out of an engine command line."""
    own: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].removeprefix("--").partition("=")
        if argv[i].startswith("--") and name in OWN_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise EngineArgError(f"--{name}", f"--{name} needs a value")
                value, i = argv[i + 1], i + 1
            own[name] = value
        else:
            rest.append(argv[i])
        i += 1
    return own, rest


#: Namespace entries that are not plan/explain flags, or that --engine accepts.
_NOT_MIXED = frozenset({"engine", "engine_args", "engine_resolution", "func", "parser", "json", "command", "argv",
                        "registry", "debug", *OWN_FLAGS})


def _attnhal_flags_given(args: argparse.Namespace) -> list[str]:
    """attnhal's own plan/explain flags given beside --engine (they would be silently dropped)."""
    parser: argparse.ArgumentParser = args.parser
    return ["--" + k.replace("_", "-") for k, v in vars(args).items()
            if k not in _NOT_MIXED and v != parser.get_default(k)]


def _run(args: argparse.Namespace, commands: Mapping[str, EngineCommand]) -> int:
    """Split the engine's flags from attnhal's and run the engine's command; bad input exits 2."""
    if not args.engine:
        raise UsageError(f"{' '.join(args.engine_args)}: engine flags need --engine (supported: sglang, vllm)")
    mixed = _attnhal_flags_given(args)
    if mixed:
        raise UsageError(f"{mixed[0]} with --engine (supported: the engine's own flags after `--`, "
                         f"and {', '.join('--' + f for f in (*OWN_FLAGS, 'json'))})")
    try:
        given, engine_argv = split_own_flags(args.engine_args)
        # attnhal's --platform / --model may stand before `--` as well as among the engine's flags.
        own: dict[str, str | None] = {name: given.get(name) or getattr(args, name, None) for name in OWN_FLAGS}
        return commands[args.engine](args, own, engine_argv)
    except EngineArgError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(engine_message(args.engine, str(exc), args.engine_args)) from None


def engine_message(engine: str, message: str, argv: Sequence[str]) -> str:
    """An adapter's ``field=value (supported: ...)`` in the engine's words: ``--flag=value (...)``,
    naming the flag of :data:`FIELD_FLAGS` the user gave (``argv``); else the message as it is."""
    field, eq, rest = message.partition("=")
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    shown = next((name for flag, name in FIELD_FLAGS.get(engine, {}).get(field, ()) if flag in given), None)
    return f"{shown}={rest}" if eq and shown else message


def run_plan(args: argparse.Namespace) -> int:
    """``attnhal plan --engine sglang|vllm -- <engine flags>``: the plan the engine's flags lead to."""
    return _run(args, _PLANS)


def run_explain(args: argparse.Namespace) -> int:
    """``attnhal explain --engine sglang|vllm -- <engine flags>``: whether each backend the flags
    name fits the request (platform, model, KV cache), with every reason; then the plan."""
    return _run(args, _EXPLAINS)


# --- explain ------------------------------------------------------------------------------

def _fits(names: dict[str, list[str]], platform: Platform, spec: SpecConfig, context: RequestContext,
          as_json: bool) -> tuple[bool, list[dict[str, object]]]:
    """Each backend's fit with the request, printed (unless ``as_json``); all fit?"""
    facts = Facts.of(platform, context, spec)
    request = AttentionRequest(dtype=context.dtype, kv_dtype=context.kv_dtype, page_size=context.page_size,
                               model=context.model)
    out = []
    for name, roles in names.items():
        caps = load(name).descriptor.resolve(facts)
        reasons = not_supported_reasons(caps, request, platform)
        out.append({"backend": name, "roles": roles, "fits": not reasons, "reasons": [r.to_dict() for r in reasons]})
        if not as_json:
            print(f"backend {name!r} ({', '.join(roles)}) on {platform.name}:")
            print("  fits this request" if not reasons else "\n".join(f"  does not fit: {r}" for r in reasons))
    return all(item["fits"] for item in out), out


def _explain(args: argparse.Namespace, own: dict[str, str | None], argv: list[str],
             names: dict[str, list[str]], platform: Platform, result: GraphPlan,
             extra: Mapping[str, object] | None = None) -> int:
    """Each backend's fit with the plan's request, then the plan (the engine's plan command prints it);
    ``extra``: the engine's own entries of the JSON report."""
    fits, report = _fits(names, platform, result.spec, result.context, args.json)
    if args.json:
        print_json({"engine": args.engine, "backends": report, **(extra or {}), "plan": result.to_dict()})
    else:
        print()
        _PLANS[args.engine](args, own, argv)
    return 0 if fits else 1


def _sglang_explain(args: argparse.Namespace, own: dict[str, str | None], argv: list[str]) -> int:
    platform = resolve_platform(own["platform"])
    config, choice = _sglang_config(args, argv, own, platform)
    names: dict[str, list[str]] = {}
    for role, name in config.roles.items():
        if name is not None:
            names.setdefault(f"sglang:{name}", []).append(role)
    return _explain(args, own, argv, names, platform, config.plan(platform), _sglang_json(config, platform, choice))


def _cubins(own: Mapping[str, str | None]) -> bool:
    value = own.get("trtllm-cubins") or "yes"
    if value not in ("yes", "no"):
        raise EngineArgError("--trtllm-cubins", f"--trtllm-cubins={value!r} (supported: yes, no)")
    return value == "yes"


def _vllm_config(own: Mapping[str, str | None], argv: list[str], platform: Platform,
                 resolution: str | None = None) -> vllm.VllmConfig:
    if resolution is not None:
        raise EngineArgError("--engine-resolution", f"--engine-resolution={resolution} (supported: with --engine "
                                                    "sglang; vLLM's flags are resolved by attnhal's adapter)")
    return vllm.from_engine_args(vllm.parse_cli(argv), platform, trtllm_cubins=_cubins(own))


def _vllm_explain(args: argparse.Namespace, own: dict[str, str | None], argv: list[str]) -> int:
    platform = resolve_platform(own["platform"])
    config = _vllm_config(own, argv, platform, args.engine_resolution)
    return _explain(args, own, argv, {config.backend: ["every role"]}, platform, config.plan(platform, own["model"]))


# --- plan ---------------------------------------------------------------------------------

def _vllm_plan(args: argparse.Namespace, own: dict[str, str | None], argv: list[str]) -> int:
    platform = resolve_platform(own["platform"])
    config = _vllm_config(own, argv, platform, args.engine_resolution)
    result = config.plan(platform, own["model"])
    entry = load(config.backend)
    level = config.level or vllm.support_on(config.backend, platform)
    r = config.resolution
    if args.json:
        print_json({"engine": "vllm", "version": vllm.VLLM_VERSION, "backend": config.backend,
                    "cg_support": level.support.name, "cg_level": level.to_dict(),
                    "cg_conditions": entry.meta.get("cg_conditions"),
                    "cudagraph_mode": {"requested": r.requested.value, "resolved": r.mode.value if r.mode else None,
                                       "steps": list(r.steps), "error": r.error},
                    "ignored": list(config.ignored), "plan": result.to_dict()})
        return 0 if result.valid and r.error is None else 1
    why = level.because or entry.meta.get("cg_conditions")
    print(f"engine: vLLM {vllm.VLLM_VERSION} -> {config.backend}: AttentionCGSupport {level.support.name}"
          + (f" ({why})" if why else ""))
    if level.assumes:
        print(f"assumes: {level.assumes}")
    resolved = r.mode.value if r.mode else f"error: {r.error}"
    print(f"cudagraph_mode: {r.requested.value} -> {resolved}" + "".join(f"\n  {step}" for step in r.steps))
    print(format_plan(result))
    _print_ignored(config.ignored)
    return 0 if result.valid and r.error is None else 1


def _print_ignored(ignored: tuple[str, ...]) -> None:
    if ignored:
        print("ignored (cannot change an attention-graph decision): "
              + ", ".join("--" + n.replace("_", "-") for n in ignored))


def _sglang_config(args: argparse.Namespace, argv: list[str], own: dict[str, str | None],
                   platform: Platform) -> tuple[sglang.EngineConfig, engine_resolution.Choice]:
    """The adapter's config, resolved by SGLang's own code or attnhal's (:func:`engine_resolution.choose`)."""
    if own.get("trtllm-cubins"):
        raise EngineArgError("--trtllm-cubins", "--trtllm-cubins is vLLM's FlashInfer assumption (supported: "
                                                "with --engine vllm)")
    env = {sglang.DRAFT_EXTEND_GRAPH_OFF: os.environ.get(sglang.DRAFT_EXTEND_GRAPH_OFF, "")}
    server_args = sglang.parse_cli(argv)
    local = own["platform"] is None and not os.environ.get(ENV_VAR)
    choice = engine_resolution.choose(args.engine_resolution, local, server_args.get("model_path"))
    if choice.used == "engine":
        return engine_resolution.from_engine(server_args, env, own["model"], platform), choice
    return sglang.from_server_args(server_args, env=env, model=own["model"], platform=platform), choice


def _sglang_json(config: sglang.EngineConfig, platform: Platform,
                 choice: engine_resolution.Choice) -> dict[str, object]:
    """What the SGLang adapter decided besides the plan: resolution, roles, page size, notes, engine differences."""
    return {"version": sglang.SGLANG_VERSION, "resolution": choice.to_dict(), "roles": dict(config.roles),
            "page_size": config.page_size(platform).to_dict(), "ignored": list(config.ignored),
            "notes": list(config.notes), "engine_differs": [d.to_dict() for d in engine_differs(config, platform)],
            "late_failures": [f.to_dict() for f in late_failures(config, platform)]}


def _sglang_plan(args: argparse.Namespace, own: dict[str, str | None], argv: list[str]) -> int:
    platform = resolve_platform(own["platform"])
    config, choice = _sglang_config(args, argv, own, platform)
    result = config.plan(platform)
    if args.json:
        print_json({"engine": "sglang", **_sglang_json(config, platform, choice), "plan": result.to_dict()})
        return 0 if result.valid else 1
    roles = ", ".join(f"{role}={name}" for role, name in config.roles.items() if name is not None)
    print(f"engine: SGLang {sglang.SGLANG_VERSION} flags -> roles: {roles}")
    print(choice)
    print(format_plan(result, context_notes={"page_size": config.page_size(platform).note}))
    for phase, decision in result.phases.items():
        if decision.capture:
            print(f"why: {phase.value} is captured: {decision.backend} declares {phase.value} graphs and "
                  "their limits hold, the platform has a graph API and the policy allows them")
    for note in config.notes:
        print(f"note: {note}")
    for differs in (*engine_differs(config, platform), *late_failures(config, platform)):
        print(differs)
    print(plan_report(result, engine_differs(config, platform), f"SGLang {sglang.SGLANG_VERSION} on {platform.name}"))
    _print_ignored(config.ignored)
    return 0 if result.valid else 1


_PLANS: Mapping[str, EngineCommand] = {"sglang": _sglang_plan, "vllm": _vllm_plan}
_EXPLAINS: Mapping[str, EngineCommand] = {"sglang": _sglang_explain, "vllm": _vllm_explain}


# --- catalog ------------------------------------------------------------------------------

def register_catalog(sub: Any) -> None:
    p = sub.add_parser("catalog", help="the catalogued attention backends of real engines (sglang:NAME, vllm:NAME)")
    p.add_argument("--engine", help="only this engine's backends (sglang, vllm)")
    p.add_argument("--backend", metavar="ENGINE:NAME",
                   help="one entry (sglang:aiter): each claim of its descriptor with the engine source it cites")
    p.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    p.set_defaults(func=run_catalog)


def run_catalog(args: argparse.Namespace) -> int:
    """``attnhal catalog [--engine E]``: every catalogued engine backend; ``--backend E:N``: one
    entry's claims with the engine source each cites."""
    if args.backend is not None:
        return _citations(args)
    try:
        found = entries(args.engine)
    except CatalogError as exc:
        raise UsageError(f"--engine: {exc}") from None
    if args.json:
        print_json([{"name": e.qualified_name, "engine": e.engine, "version": e.version,
                     "vendors": sorted(v.value for v in e.descriptor.vendors), "summary": e.summary}
                    for e in found])
        return 0
    rows = [(e.qualified_name, ",".join(sorted(v.value for v in e.descriptor.vendors)),
             f"{e.engine} {e.version}", e.summary) for e in found]
    print(table(("name", "vendors", "describes", "summary"), rows))
    return 0


def _citations(args: argparse.Namespace) -> int:
    if args.engine is not None:
        raise UsageError("--engine and --backend are exclusive (--backend names the engine: sglang:aiter)")
    try:
        entry, cited = load(args.backend), citations(args.backend)
    except CatalogError as exc:
        raise UsageError(f"--backend: {exc}") from None
    if args.json:
        print_json({"name": entry.qualified_name, "engine": entry.engine, "version": entry.version,
                    "summary": entry.summary, "citations": [{"key": c.key, "source": c.text} for c in cited]})
        return 0
    print(f"{entry.qualified_name}: {entry.summary} ({entry.engine} {entry.version})")
    print(table(("claim", "source"), [(c.key, c.text) for c in cited]))
    return 0
