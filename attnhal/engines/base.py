"""The engine contract: what an engine adapter is, and the one record every adapter resolves to.

An engine (SGLang, vLLM, a third one) plugs in like a backend: a package with a fixed layout
(``flags``: parse the flags, ``config``: resolve them to the engine's config, ``adapter``: the
object satisfying :class:`EngineAdapter`; optionally ``advice``, ``audit``, ``plugin``,
``executed``, ``kit/``; ``docs/engine.md``), its adapter registered in the
``attnhal.engines`` entry-point group (:mod:`attnhal.engines.registry`). The command line
(``attnhal plan|explain --engine NAME -- FLAGS``) knows no engine: it asks the adapter to parse
and resolve the engine's flags into an :class:`EngineConfig`, plans with it and prints what the
config reports. ``docs/engine.md`` is the recipe for a new engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from attnhal.capabilities import BackendCapabilities
from attnhal.engines.flags import EngineArgError, Flag, cli_name
from attnhal.errors import InvalidValue
from attnhal.phases import DEFAULT_LAYOUT, Phase, StepLayout
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, as_platform
from attnhal.spec import RequestContext, SpecConfig

if TYPE_CHECKING:
    from attnhal.engines.report import GraphRow

__all__ = ["EngineAdapter", "EngineConfig", "FieldFlags", "OwnFlag", "flag_error", "in_engine_words"]

#: A planner field an adapter's error may name (``InvalidValue.field``) -> the engine flags its
#: value comes from, in the adapter's order of precedence, each with how a message names it
#: (``("--speculative-config", "--speculative-config num_speculative_tokens")``).
FieldFlags = Mapping[str, Sequence[tuple[str, str]]]


@dataclass(frozen=True)
class OwnFlag:
    """A flag of attnhal's that only this engine takes (vLLM's ``--trtllm-cubins``): it may stand
    before ``--`` or among the engine's flags; ``default`` is what an absent flag means
    (``None``: the adapter decides)."""

    name: str  # without dashes: "trtllm-cubins"
    help: str
    choices: tuple[str, ...]
    default: str | None = None
    #: ``choices`` are the named values, not all: the adapter checks any other (a release
    #: string, ``0.34.1``, modelled by rule) and refuses it naming the flag.
    open: bool = False


@runtime_checkable
class EngineAdapter(Protocol):
    """One engine's vocabulary in, an :class:`EngineConfig` out; nothing of the engine imported.

    Attributes
    ----------
    name: the ``--engine`` value and the catalogue's ``ENGINE:`` prefix.
    version: the engine release whose flags (and catalogue) the adapter models.
    flags: the modelled flags, ``argument_name -> Flag`` (converted, a bad value names the flag).
    harmless: flags that cannot change an attention-graph decision: accepted and listed as ignored.
    own_flags: attnhal flags only this engine takes (:class:`OwnFlag`).
    field_flags: planner field -> the engine flags that set it (:data:`FieldFlags`), so an
        :class:`~attnhal.errors.InvalidValue` is said in the engine's words.
    catalog: the package whose folder holds the engine's catalogue files (``NAME.toml``), or
        ``None``: the engine has no catalogue (its configs name registered backends).
    """

    name: str
    version: str
    flags: Mapping[str, Flag]
    harmless: frozenset[str]
    own_flags: Sequence[OwnFlag]
    field_flags: FieldFlags
    catalog: str | None

    def parse(self, argv: Sequence[str]) -> dict[str, Any]:
        """The engine's command line -> ``{argument_name: text}``, unconverted."""
        ...

    def resolve(self, values: Mapping[str, Any], platform: Platform,
                own: Mapping[str, str | None]) -> EngineConfig:
        """The parsed flags on ``platform``; ``own``: attnhal's ``platform`` (as typed, ``None``:
        this machine), ``model`` and the adapter's own flags. Raises :class:`EngineArgError`
        naming the flag, or :class:`~attnhal.errors.InvalidValue` naming a planner field."""
        ...


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """An engine's flags translated: the planner's inputs, the backend of each role, what was not used.

    Every adapter resolves to this type (or a subclass adding the engine's own facts). ``roles``
    maps each phase (``"prefill"``, ``"decode"``, ``"draft_decode"``, ``"draft_extend"``,
    ``"target_verify"``) to the engine's name of the backend running it (``None``: not run);
    ``backends`` holds their descriptors. ``layout`` is how the engine's worker lays out a
    step (:class:`~attnhal.phases.StepLayout`: draft steps as decodes or as extends, phases it
    captures as one graph); the planner reads it as data. Subclasses refine what is printed and
    reported.
    """

    engine: str
    version: str
    spec: SpecConfig
    backends: PhaseBackends
    policy: GraphPolicy
    context: RequestContext
    roles: Mapping[str, str | None] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()  # accepted flags attnhal does not model (argument names): see unread
    #: The engine's flags that name the model's checkpoint: its attention kind can change a
    #: decision, but attnhal opens no checkpoint (``--model`` / ``--model-config`` say it).
    checkpoint_flags: ClassVar[frozenset[str]] = frozenset()
    notes: tuple[str, ...] = ()
    layout: StepLayout = DEFAULT_LAYOUT

    def context_on(self, platform: Platform) -> RequestContext:
        """The request context on ``platform`` (an engine may set the page size per platform)."""
        return self.context

    def plan(self, platform: Platform | str) -> GraphPlan:
        """attnhal's plan for these flags on ``platform``."""
        where = as_platform(platform)
        return plan(self.spec, where, self.backends, self.policy, self.context_on(where), self.layout)

    def described(self) -> list[tuple[BackendCapabilities, list[str]]]:
        """Each descriptor the roles read, with the roles it runs, in role order (for ``explain``)."""
        out: dict[str, tuple[BackendCapabilities, list[str]]] = {}
        for role, name in self.roles.items():
            caps = self.backends.for_phase(Phase(role)) if name is not None else None
            if caps is not None:
                out.setdefault(caps.name, (caps, []))[1].append(role)
        return list(out.values())

    def refusal(self) -> str | None:
        """Why the engine itself would refuse to start with these flags (``None``: it would start)."""
        return None

    def report(self, platform: Platform) -> dict[str, object]:
        """The JSON entries besides ``engine`` and ``plan``."""
        return {"version": self.version, "roles": dict(self.roles), "ignored": list(self.harmless_given),
                "unread": list(self.unread), "notes": list(self.notes)}

    @property
    def unread(self) -> tuple[str, ...]:
        """The checkpoint flags given (:attr:`checkpoint_flags`): they can decide, attnhal did not read them."""
        return tuple(n for n in self.ignored if n in self.checkpoint_flags)

    @property
    def harmless_given(self) -> tuple[str, ...]:
        """The flags given that cannot change an attention-graph decision."""
        return tuple(n for n in self.ignored if n not in self.checkpoint_flags)

    def outcome(self, platform: Platform, result: GraphPlan) -> list[GraphRow]:
        """What the engine will do per phase (the one record the report, ``engine_outcome`` in the
        JSON and the plugins' log lines are rendered from); an adapter that knows its engine's own
        decisions says them here. By default attnhal's plan ``result``, said as attnhal's."""
        from attnhal.engines.report import plan_verdict_rows

        return plan_verdict_rows(result)

    def summary(self, platform: Platform) -> list[str]:
        """The lines printed before the plan."""
        roles = ", ".join(f"{role}={name}" for role, name in self.roles.items() if name is not None)
        return [f"engine: {self.engine} {self.version} flags -> roles: {roles}"]

    def context_notes(self, platform: Platform) -> dict[str, str | None]:
        """Notes on the plan's request context fields (``{"page_size": "set by ..."}``)."""
        return {}

    def remarks(self, platform: Platform, result: GraphPlan) -> list[str]:
        """The lines printed after the plan: the notes, then the ignored flags."""
        return [*(f"note: {note}" for note in self.notes), *self.ignored_lines()]

    def checkpoint_read_by(self) -> str | None:
        """What read the checkpoint for this config where something did (the engine's own resolution)."""
        return None

    def ignored_lines(self) -> list[str]:
        """The lines listing the checkpoint flags given (not read) and the harmless ones (ignored)."""
        lines = []
        if self.unread:
            kind = self.context.model
            said = (f"the plan takes it as {kind.value}" if kind is not None else
                    "say its attention kind as --model mla|gqa|mha, or give its config.json as --model-config PATH")
            by = self.checkpoint_read_by()
            lines.append(f"not read: {', '.join(cli_name(n) for n in self.unread)} (the model's checkpoint: its "
                         f"attention kind can change a decision, and attnhal opens no checkpoint"
                         f"{f'; {by} read it' if by else ''}; {said})")
        if self.harmless_given:
            lines.append("ignored (cannot change an attention-graph decision): "
                         + ", ".join(cli_name(n) for n in self.harmless_given))
        return lines


def in_engine_words(exc: InvalidValue, field_flags: FieldFlags, argv: Sequence[str] = ()) -> InvalidValue:
    """``exc`` naming the engine flag that set its field: the first of ``field_flags[exc.field]``
    the user gave in ``argv`` (every flag when ``argv`` is empty: the first); else ``exc``."""
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    shown = next((name for flag, name in field_flags.get(exc.field, ()) if not argv or flag in given), None)
    return InvalidValue(shown, exc.value, exc.supported) if shown is not None else exc


def flag_error(exc: InvalidValue, field_flags: FieldFlags) -> EngineArgError | InvalidValue:
    """``exc`` as an :class:`EngineArgError` naming the first flag that sets its field (``exc``
    itself where no flag does): ``raise flag_error(exc, FIELD_FLAGS) from None``."""
    flags = field_flags.get(exc.field, ())
    return EngineArgError(flags[0][0], str(in_engine_words(exc, field_flags))) if flags else exc
