"""``attnhal advise --engine sglang``: the attention-backend flags that capture the most, before the server starts.

Enumerates SGLang 0.5.23's backend flags (``--attention-backend``, ``--decode-attention-backend``,
``--speculative-draft-attention-backend``, ``--speculative-attention-mode``) over the catalogued
backends that fit the platform, model kind, dtypes and the page size SGLang would set — pruned
before any planning — and, with one draft step, one more step (SGLang builds no draft-decode
backend for one step, and its HIP draft-extend rule reads that backend: docs/catalog.md D1, D7).
Each flag set goes through the adapter (:func:`~attnhal_sglang.from_server_args`) and
the planner; what SGLang's own code then captures is the plan less the catalogued engine
decisions that apply (:func:`~attnhal_sglang.audit.engine_differs`).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from attnhal.capabilities import AttentionRequest, BackendCapabilities, Facts, not_supported_reasons
from attnhal.catalog import entries, load
from attnhal.engines import flags as _flags
from attnhal.engines.advice import (MAX_COMBINATIONS, PRIORITY, Advice, Option, changes, check_size, frontier,
                                    model_of, rank_key, served_kinds)
from attnhal.engines.flags import EngineArgError, cli_name, model_kind
from attnhal.engines.model_config import HFConfig
from attnhal_sglang.audit import Direction, engine_differs, explain
from attnhal_sglang.flags import FLAGS, HARMLESS, SGLANG_VERSION
from attnhal_sglang.pages import resolve_page_size
from attnhal_sglang.config import SglangConfig, from_server_args
from attnhal.phases import Phase, phases_run
from attnhal.platform import Platform, as_platform
from attnhal.spec import ModelKind

__all__ = ["VARIED", "advise", "every_phase_line"]

#: The flags advise may change (``vary``), in the order they are enumerated.
VARIED = ("attention_backend", "decode_attention_backend", "speculative_draft_attention_backend",
          "speculative_attention_mode", "speculative_num_steps")
#: Every flag that names a backend or a role's source: replaced as a whole by a candidate.
_BACKEND_FLAGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                  "speculative_draft_attention_backend", "speculative_attention_mode")
_SHOWN_FLAGS = (*_BACKEND_FLAGS, "speculative_num_steps", "speculative_num_draft_tokens")
_DRAFTING = frozenset({Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE})
_ENGINE = f"SGLang {SGLANG_VERSION}"


def _descriptor(name: str) -> BackendCapabilities:
    return load(f"sglang:{name}").descriptor


def _fitting(given: Mapping[str, Any], config: SglangConfig, platform: Platform,
             among: Collection[str] | None) -> dict[str, BackendCapabilities]:
    """The catalogued backends that serve this platform, model, dtypes and the page size SGLang sets
    with each; a model-specific one (``meta.model_specific``) only when the user's flags name it."""
    named = {v for k, v in given.items() if k in _BACKEND_FLAGS}
    out = {}
    for entry in entries("sglang"):
        if (among is not None and entry.name not in among) or (
                entry.meta.get("model_specific") and entry.name not in named):
            continue
        page = resolve_page_size({**given, "attention_backend": entry.name}, config.context.model, platform).value
        context = replace(config.context, page_size=page)
        caps = entry.descriptor.resolve(Facts.of(platform, context, config.spec))
        request = AttentionRequest.of(context)
        if not not_supported_reasons(caps, request, platform):
            out[entry.name] = caps
    return out


def _choices(given: Mapping[str, Any], config: SglangConfig, fitting: Mapping[str, BackendCapabilities],
             vary: Collection[str]) -> dict[str, list[Any]]:
    """Per varied flag, the values to try (``None``: not given); a flag not varied keeps the user's."""
    spec, roles = config.spec, config.roles
    def able(phase: Phase) -> list[str]:
        return [n for n, caps in fitting.items() if phase in caps.phases]
    split = roles.get("prefill") != roles.get("decode")
    drafting = bool(_DRAFTING & phases_run(spec))
    steps = given.get("speculative_num_steps")
    one_more = drafting and steps == 1 and "speculative_num_steps" in vary
    return {
        "attention_backend": able(Phase.PREFILL) if "attention_backend" in vary else [roles.get("prefill")],
        # Not varied: the decode backend follows the prefill one unless the user split them.
        "decode_attention_backend": able(Phase.DECODE) if "decode_attention_backend" in vary
        else [roles.get("decode") if split else None],
        "speculative_draft_attention_backend": [None, *able(Phase.DRAFT_EXTEND)]
        if drafting and "speculative_draft_attention_backend" in vary
        else [given.get("speculative_draft_attention_backend")],
        "speculative_attention_mode": [None, "decode"] if spec.speculative and "speculative_attention_mode" in vary
        else [given.get("speculative_attention_mode")],
        "speculative_num_steps": [steps, 2] if one_more else [steps],
    }


def _role_sets(given: Mapping[str, Any], choices: Mapping[str, list[Any]],
               decode_runs: bool) -> list[tuple[Any, Any, Any, Any]]:
    """(attention backend, decode backend, attention mode, draft backend) to try. A split pair only
    matters while the draft model has no backend of its own or plain decode runs: with
    ``--speculative-draft-attention-backend`` under speculation the decode backend runs nothing
    the unsplit set does not (its flags would only add changes)."""
    out: list[tuple[Any, Any, Any, Any]] = []
    for draft in choices["speculative_draft_attention_backend"]:
        for prefill in choices["attention_backend"]:
            for decode in choices["decode_attention_backend"]:
                split = decode not in (None, prefill)
                if split and draft not in (None, given.get("speculative_draft_attention_backend")) and not decode_runs:
                    continue
                modes = choices["speculative_attention_mode"] if split else [given.get("speculative_attention_mode")]
                out.extend((prefill, decode if split else None, mode, draft) for mode in modes)
    return out


def _candidates(given: Mapping[str, Any], choices: Mapping[str, list[Any]],
                role_sets: list[tuple[Any, Any, Any, Any]]) -> Iterator[dict[str, Any]]:
    kept = {k: v for k, v in given.items() if k not in _BACKEND_FLAGS}
    for steps in choices["speculative_num_steps"]:
        for prefill, decode, mode, draft in role_sets:
            flags = {**kept, "attention_backend": prefill, "decode_attention_backend": decode,
                     "speculative_draft_attention_backend": draft, "speculative_attention_mode": mode}
            chosen = _with_steps({k: v for k, v in flags.items() if v is not None}, given, steps)
            # The user's flags first, in the user's order: the pasted line reads like theirs.
            yield {**{k: chosen[k] for k in given if k in chosen}, **chosen}


def _with_steps(flags: dict[str, Any], given: Mapping[str, Any], steps: Any) -> dict[str, Any]:
    """One more draft step: with topk 1 SGLang verifies num_steps + 1 tokens, so the flag follows."""
    if steps == given.get("speculative_num_steps"):
        return flags
    flags["speculative_num_steps"] = steps
    if given.get("speculative_eagle_topk", 1) == 1 and "speculative_num_draft_tokens" in given:
        flags["speculative_num_draft_tokens"] = steps + 1
    return flags


def _label(config: SglangConfig) -> str:
    by_name: dict[str, list[str]] = {}
    for role, name in config.roles.items():
        if name is not None:
            by_name.setdefault(name, []).append(role)
    if len(by_name) == 1:
        return next(iter(by_name))
    return "; ".join(f"{name} ({', '.join(roles)})" for name, roles in by_name.items())


def _costs(flags: Mapping[str, Any], config: SglangConfig, platform: Platform) -> tuple[str, ...]:
    out = []
    page = config.page_size(platform)
    if page.set_by is not None:
        out.append(f"page size {page.value} forced by SGLang for {page.set_by}"
                   + (f" (given: {page.given})" if page.given is not None else ""))
    asked, used = flags.get("attention_backend"), config.values.get("attention_backend")
    if asked is not None and asked != used:
        out.append(f"SGLang replaces --attention-backend {asked} by {used}")
    return tuple(out)


def _blocked(config: SglangConfig, result: Any, platform: Platform) -> tuple[str, bool]:
    """Why an invalid plan is never recommended, and whether SGLang starts with it anyway
    (a late failure or a catalogued engine bug: shown) or refuses it (not shown)."""
    applicable = engine_differs(config, platform)
    for phase, decision in result.phases.items():
        if decision.blocking:
            found = explain(phase, Direction.ATTNHAL_INVALID, applicable, config.roles.get(phase.value),
                            config.spec.topk)
            if found is not None:
                return f"{_ENGINE} starts with it, then: {found}", True
    reasons = sorted({str(r) for d in result.phases.values() if d.blocking for r in d.reasons})
    return "refused: " + "; ".join(reasons), False


def _evaluate(flags: Mapping[str, Any], given: Mapping[str, Any], env: Mapping[str, str], model: ModelKind,
              platform: Platform, model_config: HFConfig | None = None) -> tuple[Option, bool, tuple[Any, ...]]:
    """The option, whether it is shown when blocked, and the engine decision's identity.
    Raises ``ValueError`` where the adapter refuses the flags (SGLang refuses them too)."""
    config = from_server_args(flags, env, model, platform, model_config)
    result = config.plan(platform)
    runs = frozenset(p for p in PRIORITY if result[p].runs)
    base = Option(flags=flags, label=_label(config), changes=changes(given, flags, _SHOWN_FLAGS), runs=runs,
                  costs=_costs(flags, config, platform),
                  changes_speculation=flags.get("speculative_num_steps") != given.get("speculative_num_steps"))
    identity = (tuple(config.roles.items()), config.page_size(platform).value, config.spec)
    if not result.valid:
        why, shown = _blocked(config, result, platform)
        return replace(base, blocked=why), shown, identity
    applicable = engine_differs(config, platform)
    captured, eager = set(), {}
    for phase in (p for p in PRIORITY if p in runs):
        decision = result[phase]
        found = explain(phase, Direction.ATTNHAL_CAPTURES, applicable) if decision.capture else None
        if decision.capture and found is None:
            captured.add(phase)
        else:
            eager[phase] = (f"{_ENGINE} runs it eagerly: {found}" if found is not None
                            else "; ".join(str(r) for r in decision.reasons) or "not captured")
    return replace(base, captured=frozenset(captured), eager=eager), False, identity


def _current(given: Mapping[str, Any], env: Mapping[str, str], model: ModelKind, platform: Platform,
             model_config: HFConfig | None = None) -> tuple[Option, tuple[Any, ...] | None]:
    """The user's own flags evaluated, and their engine decision's identity (``None``: refused)."""
    try:
        option, _, identity = _evaluate(given, given, env, model, platform, model_config)
    except ValueError as exc:
        return Option(flags=given, label="(refused)", blocked=f"refused: {exc}"), None
    return option, identity


def _vary(vary: Collection[str] | None) -> tuple[str, ...]:
    if vary is None:
        return VARIED
    names = tuple(v.removeprefix("--").replace("-", "_") for v in vary)
    for name in names:
        if name not in VARIED:
            raise EngineArgError("--vary", f"--vary={cli_name(name).removeprefix('--')} (supported: "
                                           f"{', '.join(cli_name(v).removeprefix('--') for v in VARIED)})")
    return names


def advise(args: Mapping[str, Any] | argparse.Namespace, platform: Platform | str, model: ModelKind | str | None = None,
           env: Mapping[str, str] | None = None, *, top: int = 3, vary: Collection[str] | None = None,
           among: Collection[str] | None = None, limit: int = MAX_COMBINATIONS,
           model_config: HFConfig | None = None) -> Advice:
    """The SGLang flag sets that capture the most on ``platform`` for this model, ranked
    (:func:`attnhal.engines.advice.rank_key`), against the user's server arguments ``args``.

    ``vary``: the flags advise may change (:data:`VARIED`, default all); ``among``: the backend
    names it may propose (default: every catalogued one that fits); ``limit``: more flag
    combinations than this is an :class:`EngineArgError` naming ``--vary``, raised before planning;
    ``model_config``: the model's ``config.json`` (``--model-config``), read as the plan reads it.
    Bad arguments raise :class:`EngineArgError` naming the flag, as the adapter does.
    """
    where, environment = as_platform(platform), dict(env or {})
    raw = {k: v for k, v in (vars(args) if isinstance(args, argparse.Namespace) else dict(args)).items()
           if v is not None}
    converted, _ = _flags.check(raw, FLAGS, HARMLESS, "attnhal_sglang.HARMLESS")
    given = {**raw, **converted}
    user = from_server_args(raw, environment, model_kind(model), where, model_config)
    kind = model_of(user.context.model, [_descriptor(n) for n in user.roles.values() if n is not None])
    user = from_server_args(raw, environment, kind, where, model_config)
    fitting = _fitting(given, user, where, among)
    if not fitting:
        raise EngineArgError("--model", f"--model={kind.value} on platform={where.name}: no catalogued SGLang "
                                        f"backend serves it (supported: {served_kinds('sglang', where)})")
    varied = _vary(vary)
    choices = _choices(given, user, fitting, varied)
    role_sets = _role_sets(given, choices, Phase.DECODE in phases_run(user.spec))
    check_size(len(role_sets) * len(choices["speculative_num_steps"]), varied, limit)
    current, current_id = _current(given, environment, kind, where, model_config)
    best: dict[tuple[Any, ...], tuple[Option, bool]] = {}
    considered = 0
    for flags in _candidates(given, choices, role_sets):
        considered += 1
        try:
            option, shown, identity = _evaluate(flags, given, environment, kind, where, model_config)
        except ValueError:  # the adapter refuses it, as SGLang does
            continue
        if identity == current_id:
            continue
        if identity not in best or rank_key(option) < rank_key(best[identity][0]):
            best[identity] = (option, shown)
    ranked = sorted(best.values(), key=lambda pair: rank_key(pair[0]))
    recommended = frontier(o for o, _ in ranked if o.blocked is None and rank_key(o) < rank_key(current))[:top]
    blocked = _distinct_blocked((o for o, shown in ranked if shown), current)[:top]
    return Advice(_ENGINE, where.name, kind.value, current, recommended, blocked, considered, _notes(current))


def _distinct_blocked(options: Iterable[Option], current: Option) -> tuple[Option, ...]:
    """One option per reason (the one with fewest changes), none with the user's own reason."""
    seen = {current.blocked}
    out = []
    for option in sorted(options, key=lambda o: len(o.changes)):
        if option.blocked not in seen:
            seen.add(option.blocked)
            out.append(option)
    return tuple(out)


def _notes(current: Option) -> tuple[str, ...]:
    """What else keeps the user's flags capturing: attnhal's SGLang plugin, where SGLang's rule is the cause."""
    if any("runs it eagerly" in why for why in current.eager.values()):
        return ("or keep these flags and install attnhal's SGLang plugin with ATTNHAL_SGLANG_GRAPHS=enforce: it builds "
                "the graph runner SGLang's rule leaves out (docs/engines/sglang.md)",)
    return ()


def every_phase_line(args: Mapping[str, Any], platform: Platform | str, model: ModelKind | str | None,
                     env: Mapping[str, str] | None = None) -> str | None:
    """The plugins' start-up line: the flag changes that capture every phase here, or that none
    does (``None``: the flags already do). ``args`` may be a server's whole resolved argument set:
    the line names only what changes."""
    advice = advise(args, platform, model, env, top=1)
    best = advice.every_phase
    if best is advice.current:
        return None
    if best is None:
        return "no combination of attention-backend flags captures every phase here (attnhal advise --engine sglang)"
    # The flags to set as words SGLang's parser reads; a flag to drop cannot be one of them: said apart.
    new = " ".join(f"{c.flag} {shlex.quote(str(c.new))}" for c in best.changes if c.new is not None)
    dropped = " ".join(c.flag for c in best.changes if c.new is None)
    without = (", " if new else "") + f"without {dropped}" if dropped else ""
    old = " ".join(f"{c.flag} {c.old}" for c in best.changes if c.old is not None)
    return (f"a combination that captures every phase here: {new}{without} (instead of {old}; "
            "attnhal advise --engine sglang)")
