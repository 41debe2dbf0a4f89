"""The engine side of the command line: ``attnhal catalog`` and ``plan``/``explain --engine NAME -- ...``.

The engine adapters (:mod:`attnhal.engines.base`, registered through the ``attnhal.engines``
entry-point group: :mod:`attnhal.engines.registry`) turn an engine's own flags into the
planner's inputs; this module is their command-line front and knows no engine by name: it
splits attnhal's flags from the engine's, asks the adapter to resolve them, plans, and prints
what the adapter's config reports.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from attnhal.capabilities import AttentionRequest, BackendCapabilities, Facts, not_supported_reasons
from attnhal.cli.app import OUTCOME_DIFFERS, UsageError
from attnhal.cli.args import Registered, choice
from attnhal.cli.inputs import resolve_platform
from attnhal.cli.output import format_plan, print_json, table
from attnhal.engines import registry
from attnhal.engines.base import EngineAdapter, EngineConfig, in_engine_words
from attnhal.engines.flags import EngineArgError, check
from attnhal.engines.report import GraphRow, outcome_differs
from attnhal.errors import InvalidValue
from attnhal.planner import GraphPlan
from attnhal.platform import Platform
from attnhal.spec import ModelKind

__all__ = ["COMMON_OWN_FLAGS", "ENGINE_COMMANDS", "add_engine_flags", "add_model_config_flag", "add_own_flags",
           "check_model_config", "check_values", "engine_errors", "engine_json", "engine_message", "engine_status",
           "own_flags", "register_catalog", "requested_engine", "run_catalog", "run_explain", "run_plan",
           "split_own_flags"]

#: The commands that take ``--engine E`` and the engine's own flags on either side of ``--``.
ENGINE_COMMANDS = ("plan", "explain")

#: attnhal's own flags every engine command takes among the engine's flags (after ``--``), as in
#: ``attnhal plan --engine E -- <E's flags> --platform hip:gfx942``; an adapter adds its own
#: (:attr:`~attnhal.engines.base.EngineAdapter.own_flags`).
COMMON_OWN_FLAGS = ("platform", "model", "model-config")

#: attnhal's own flags that engines spell too (an engine's ``--model CHECKPOINT``),
#: with attnhal's values: after ``--`` any other value is the engine's flag.
ENGINE_SPELLS_TOO = {"model": frozenset(m.value for m in ModelKind)}

#: What an engine command does with (args, the adapter's config, the platform).
EngineCommand = Callable[[argparse.Namespace, EngineConfig, Platform], int]


def own_flags(adapter: EngineAdapter | None = None) -> tuple[str, ...]:
    """attnhal's flags taken among the engine's: the common ones and ``adapter``'s (every adapter's: ``None``)."""
    adapters = [adapter] if adapter is not None else registry.adapters()
    return tuple(dict.fromkeys((*COMMON_OWN_FLAGS, *(f.name for a in adapters for f in a.own_flags))))


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """``--engine E`` and the engine's flags after ``--`` (for ``plan`` and ``explain``); reads the
    registered names only (the requested adapter's own flags: :func:`add_own_flags`)."""
    p.add_argument("--engine", type=Registered(registry.names),
                   help="read the engine's own flags after `--` ({names})")
    p.add_argument("engine_args", nargs="*", metavar="-- ENGINE_FLAGS", help="with --engine: the engine's flags")
    add_model_config_flag(p)


def add_model_config_flag(p: argparse.ArgumentParser) -> None:
    """``--model-config PATH``: the model's Hugging Face ``config.json``, read the way the engine reads it."""
    p.add_argument("--model-config", dest="model-config", metavar="PATH", default=None,
                   help="with --engine: the model's config.json (architectures, MLA, heads), read as the engine "
                        "reads it; --model gives the attention kind alone")


def check_model_config(own: Mapping[str, str | None], adapter: EngineAdapter) -> None:
    """Read ``--model-config`` before anything heavy is imported: a bad file exits 2 naming the field
    (the adapter reads it again, its engine's way); an adapter that does not read it (no
    ``reads_model_config``) refuses it rather than dropping it."""
    if own.get("model-config"):
        from attnhal.engines.model_config import read

        if not getattr(adapter, "reads_model_config", False):
            takers = [a.name for a in registry.adapters() if getattr(a, "reads_model_config", False)]
            raise EngineArgError("--model-config", f"--model-config with --engine {adapter.name} (supported: with "
                                                   f"--engine {', '.join(takers)})")
        read(str(own["model-config"]))


def requested_engine(argv: Sequence[str]) -> str | None:
    """The ``--engine NAME`` of a command line (before ``--``), or None."""
    head = list(argv[:argv.index("--")] if "--" in argv else argv)
    for i, word in enumerate(head):
        if word == "--engine" and i + 1 < len(head):
            return head[i + 1]
        if word.startswith("--engine="):
            return word.partition("=")[2]
    return None


def add_own_flags(p: argparse.ArgumentParser, engine: str | None) -> None:
    """With ``--engine E`` on the command line: every adapter's own flags, so that they may stand
    before ``--`` too (another engine's is refused by name when the command runs). Without it no
    adapter is loaded; an unavailable one adds nothing (asking for it says why)."""
    if engine is None:
        return
    declared: set[str] = set()
    for adapter in registry.adapters():
        for flag in adapter.own_flags:
            if flag.name not in declared:
                # An open flag's other values are the adapter's to check (a release string).
                p.add_argument(f"--{flag.name}", dest=flag.name, type=str if flag.open else choice(flag.choices),
                               default=None,
                               metavar="|".join(flag.choices), help=f"with --engine {adapter.name}: {flag.help}")
            declared.add(flag.name)


def split_own_flags(argv: Sequence[str], names: Sequence[str] | None = None) -> tuple[dict[str, str], list[str]]:
    """Pull attnhal's own flags (``names``; default: :func:`own_flags`) out of an engine command line;
    a flag the engine spells too (:data:`ENGINE_SPELLS_TOO`) stays the engine's where its value is
    not one of attnhal's (``--model deepseek-ai/DeepSeek-V3``: the checkpoint, said not read)."""
    names = own_flags() if names is None else names
    own: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        start = i
        name, eq, value = argv[i].removeprefix("--").partition("=")
        if argv[i].startswith("--") and name in names:
            if not eq:
                if i + 1 >= len(argv):
                    raise EngineArgError(f"--{name}", f"--{name} needs a value")
                value, i = argv[i + 1], i + 1
            if value in ENGINE_SPELLS_TOO.get(name, (value,)):
                own[name] = value
            else:
                rest.extend(argv[start:i + 1])
        else:
            rest.append(argv[i])
        i += 1
    return own, rest


def _own_values(args: argparse.Namespace, adapter: EngineAdapter) -> tuple[dict[str, str | None], list[str]]:
    """attnhal's own flags (either side of ``--``) checked against ``adapter``, and the engine's flags."""
    given, engine_argv = split_own_flags(args.engine_args)
    own = {name: given.get(name) or getattr(args, name, None) for name in own_flags()}
    mine = {flag.name: flag for flag in adapter.own_flags}
    for name, value in own.items():
        if value is not None and name not in COMMON_OWN_FLAGS and name not in mine:
            takers = [a.name for a in registry.adapters() if name in {f.name for f in a.own_flags}]
            raise EngineArgError(f"--{name}", f"--{name}={value} (supported: with --engine {', '.join(takers)})")
    for flag in mine.values():
        value = own.get(flag.name)
        if value is not None and value not in flag.choices and not flag.open:
            raise EngineArgError(f"--{flag.name}", f"--{flag.name}={value!r} (supported: {', '.join(flag.choices)})")
    return {**{n: own.get(n) for n in COMMON_OWN_FLAGS}, **{n: own.get(n) for n in mine}}, engine_argv


#: Namespace entries that are not plan/explain flags, or that --engine accepts.
_NOT_MIXED = frozenset({"engine", "engine_args", "func", "parser", "json", "command", "argv", "registry", "debug",
                        *COMMON_OWN_FLAGS})


def _attnhal_flags_given(args: argparse.Namespace) -> list[str]:
    """attnhal's own plan/explain flags given beside --engine (they would be silently dropped)."""
    parser: argparse.ArgumentParser = args.parser
    own = set(own_flags())
    return ["--" + k.replace("_", "-") for k, v in vars(args).items()
            if k not in _NOT_MIXED and k not in own and v != parser.get_default(k)]


def _refuse_command_flags(engine: str, engine_argv: Sequence[str], parser: argparse.ArgumentParser) -> None:
    """A flag of the attnhal command itself (``--json``, ``--debug``) given after ``--``, where
    only the engine's flags go: say where it belongs rather than "not modelled"."""
    ours = {"--json", "--debug"} & set(parser._option_string_actions)
    for arg in engine_argv:
        flag = arg.partition("=")[0]
        if flag in ours:
            raise UsageError(f"{flag} after `--` (supported: put it before `--`, which starts the engine's own "
                             f"flags: attnhal {parser.prog.split()[-1]} --engine {engine} {flag} -- ENGINE_FLAGS)")


def check_values(adapter: EngineAdapter, values: Mapping[str, Any]) -> None:
    """Every flag converted by the adapter's table and every unknown one refused
    (:func:`attnhal.engines.flags.check`, as :meth:`~attnhal.engines.base.EngineAdapter.resolve`
    does) before the platform is detected: a bad value never waits for torch."""
    package = type(adapter).__module__.partition(".")[0]
    check(values, adapter.flags, adapter.harmless, f"{package}.HARMLESS")


def engine_message(engine: str, exc: Exception, argv: Sequence[str]) -> str:
    """An adapter's error in the engine's words: an :class:`~attnhal.errors.InvalidValue` names the
    flag of the adapter's ``field_flags`` the user gave (``argv``); else the message as it is."""
    if isinstance(exc, InvalidValue):
        return str(in_engine_words(exc, registry.get(engine).field_flags, argv))
    return str(exc)


@contextlib.contextmanager
def engine_errors(engine: str, argv: Sequence[str]) -> Iterator[None]:
    """The engine commands' one error boundary: an adapter's bad input exits 2 in the engine's
    words (an :class:`EngineArgError` as it is; an :class:`~attnhal.errors.InvalidValue` by the
    flag of ``argv`` that set its field)."""
    try:
        yield
    except EngineArgError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # an InvalidValue among them: named by the engine's flag
        raise UsageError(engine_message(engine, exc, argv)) from None


def _run(args: argparse.Namespace, command: EngineCommand) -> int:
    """Split the engine's flags from attnhal's, resolve them with the engine's adapter and run
    ``command``; bad input exits 2."""
    if not args.engine:
        raise UsageError(f"{' '.join(args.engine_args)}: engine flags need --engine "
                         f"(supported: {', '.join(registry.names())})")
    adapter = registry.get(args.engine)
    mixed = _attnhal_flags_given(args)
    if mixed:
        raise UsageError(f"{mixed[0]} with --engine {adapter.name} (supported: the engine's own flags after `--`, "
                         f"and {', '.join('--' + f for f in (*own_flags(adapter), 'json'))})")
    with engine_errors(args.engine, args.engine_args):
        own, engine_argv = _own_values(args, adapter)
        _refuse_command_flags(adapter.name, engine_argv, args.parser)
        parsed = adapter.parse(engine_argv)
        check_values(adapter, parsed)
        check_model_config(own, adapter)
        platform = resolve_platform(own["platform"])  # last: detecting the device imports torch
        config = adapter.resolve(parsed, platform, own)
        return command(args, config, platform)


def run_plan(args: argparse.Namespace) -> int:
    """``attnhal plan --engine E -- <engine flags>``: the plan the engine's flags lead to."""
    return _run(args, _plan)


def run_explain(args: argparse.Namespace) -> int:
    """``attnhal explain --engine E -- <engine flags>``: whether each backend the flags
    name fits the request (platform, model, KV cache), with every reason; then the plan."""
    return _run(args, _explain)


def engine_status(config: EngineConfig, result: GraphPlan, rows: Sequence[GraphRow]) -> int:
    """``plan --engine``'s exit status: 1 when the plan is invalid or the engine refuses the flags;
    else :data:`~attnhal.cli.app.OUTCOME_DIFFERS` (4) when the engine's outcome ``rows`` differ from
    attnhal's plan on a phase (:func:`~attnhal.engines.report.outcome_differs`); else 0."""
    if not result.valid or config.refusal() is not None:
        return 1
    return OUTCOME_DIFFERS if outcome_differs(rows, result) else 0


def _plan(args: argparse.Namespace, config: EngineConfig, platform: Platform) -> int:
    """The plan, with what the adapter says before and after it; the status: :func:`engine_status`."""
    result = config.plan(platform)
    rows = config.outcome(platform, result)
    status = engine_status(config, result, rows)
    if args.json:
        print_json(engine_json(config, platform, result, rows))
        return status
    print("\n".join(config.summary(platform)))
    print(format_plan(result, context_notes=config.context_notes(platform)))
    for line in config.remarks(platform, result):
        print(line)
    differs = outcome_differs(rows, result)
    if differs:
        said = ", ".join(f"{row.phase} {row.graph}" + (f" ({row.by})" if row.by else "") for row in differs)
        print(f"outcome: what the engine will do differs from attnhal's plan: {said}; the report's last column says what "
              "changes it")
    return status


def engine_json(config: EngineConfig, platform: Platform, result: GraphPlan,
                rows: Sequence[GraphRow] | None = None) -> dict[str, object]:
    """``--engine --json``: the adapter's report, ``engine_outcome`` (what the engine will do per
    phase: the rows the text report prints, :meth:`~attnhal.engines.base.EngineConfig.outcome`;
    given as ``rows`` or computed), ``outcome_differs`` (the phases where it is not attnhal's
    plan: exit 4) and ``plan`` (attnhal's own plan for the same flags)."""
    rows = config.outcome(platform, result) if rows is None else rows
    return {"engine": config.engine, **config.report(platform), "engine_outcome": [row.to_dict() for row in rows],
            "outcome_differs": [row.phase for row in outcome_differs(rows, result)], "plan": result.to_dict()}


def _fits(described: list[tuple[BackendCapabilities, list[str]]], platform: Platform, result: GraphPlan,
          as_json: bool) -> tuple[bool, list[dict[str, object]]]:
    """Each backend's fit with the plan's request, printed (unless ``as_json``); all fit?"""
    context = result.context
    facts = Facts.of(platform, context, result.spec)
    request = AttentionRequest.of(context)
    out = []
    for caps, roles in described:
        reasons = not_supported_reasons(caps.resolve(facts), request, platform)
        out.append({"backend": caps.name, "roles": roles, "fits": not reasons,
                    "reasons": [r.to_dict() for r in reasons]})
        if not as_json:
            print(f"backend {caps.name!r} ({', '.join(roles)}) on {platform.name}:")
            print("  fits this request" if not reasons else "\n".join(f"  does not fit: {r}" for r in reasons))
    return all(item["fits"] for item in out), out


def _explain(args: argparse.Namespace, config: EngineConfig, platform: Platform) -> int:
    """Each backend's fit with the plan's request, then the plan; exit 1 when one does not fit."""
    result = config.plan(platform)
    fits, report = _fits(config.described(), platform, result, args.json)
    if args.json:
        print_json({"backends": report, **engine_json(config, platform, result)})
    else:
        print()
        _plan(args, config, platform)
    return 0 if fits else 1


# --- catalog ------------------------------------------------------------------------------

def register_catalog(sub: Any) -> None:
    p = sub.add_parser("catalog", help="the catalogued attention backends of real engines (ENGINE:NAME)")
    p.add_argument("--engine", help="only this engine's backends")
    p.add_argument("--backend", metavar="ENGINE:NAME",
                   help="one entry: each claim of its descriptor with the engine source it cites")
    p.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    p.set_defaults(func=run_catalog)


def run_catalog(args: argparse.Namespace) -> int:
    """``attnhal catalog [--engine E]``: every catalogued engine backend; ``--backend E:N``: one
    entry's claims with the engine source each cites."""
    from attnhal.catalog import CatalogError, entries  # here: another command's usage error does not load it

    if args.backend is not None:
        return _citations(args)
    try:
        found = entries(args.engine)
    except CatalogError as exc:
        raise UsageError(f"--engine: {exc}") from None
    if args.json:
        print_json([{"name": e.qualified_name, "engine": e.engine, "version": e.version,
                     "releases": list(_releases(e.engine)),
                     "vendors": sorted(v.value for v in e.descriptor.vendors), "summary": e.summary}
                    for e in found])
        return 0
    rows = [(e.qualified_name, ",".join(sorted(v.value for v in e.descriptor.vendors)),
             f"{e.engine} {', '.join(_releases(e.engine))}", e.summary) for e in found]
    print(table(("name", "vendors", "describes", "summary"), rows))
    cited = sorted({f"{e.engine} {e.version}" for e in found if _releases(e.engine) != (e.version,)})
    if cited:
        print(f"(the entries cite the source of {', '.join(cited)}; a plan models each release listed)")
    return 0


def _releases(engine: str) -> tuple[str, ...]:
    """The releases an engine's plans model with its catalogue (the adapter's tested releases)."""
    from attnhal.engines.versions import supported

    return supported(registry.get(engine))


def _citations(args: argparse.Namespace) -> int:
    from attnhal.catalog import CatalogError, citations, load

    if args.engine is not None:
        raise UsageError("--engine and --backend are exclusive (--backend names the engine: ENGINE:NAME)")
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
