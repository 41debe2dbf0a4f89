"""What ``attnhal advise`` answers, for any engine: options (flag sets) and how they rank.

An engine's advice module (:mod:`attnhal_sglang.advice`, :mod:`attnhal_vllm.advice`)
enumerates the attention-backend flag sets the engine accepts and predicts, per set, what the
engine's own code captures; this module ranks them and says why one beats the user's flags.

The rank, best first: the phases captured (a phase that runs eagerly costs most on target
verify, then draft decode, draft extend, decode — :data:`PRIORITY`), then the catalogue's facts
that cost speed (a page size the engine forces, a backend it substitutes, a graph-mode
downgrade), then whether the speculation itself changes, then how few flags change. An option
the engine starts with but that fails later or hits a catalogued engine bug is *blocked*: shown,
never recommended.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attnhal.engines.flags import EngineArgError, cli_name
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Phase
from attnhal.platform import Platform
from attnhal.spec import ModelKind

if TYPE_CHECKING:
    from attnhal.engines.base import EngineAdapter

__all__ = ["MAX_COMBINATIONS", "PRIORITY", "Advice", "Adviser", "Change", "Option", "adviser", "changes", "check_size",
           "frontier", "model_of", "rank_key", "served_kinds", "summarize"]

#: The phases whose capture the rank reads, most valuable first (prefill is never captured).
PRIORITY = (Phase.TARGET_VERIFY, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.DECODE)
#: More flag combinations than this are refused before planning (see :func:`check_size`).
MAX_COMBINATIONS = 5000


@dataclass(frozen=True)
class Change:
    """One flag the option sets differently from the user's (``None``: not given)."""

    flag: str  # "--attention-backend"
    old: Any
    new: Any

    def __str__(self) -> str:
        old = "(not given)" if self.old is None else self.old
        new = "(removed)" if self.new is None else self.new
        return f"{self.flag} {old} -> {new}"


@dataclass(frozen=True)
class Option:
    """One flag set, and what the engine's own code does with it (as the catalogue predicts).

    ``captured``: the phases the engine captures; ``eager``: each running phase it does not
    capture, with why (an attnhal reason or the catalogue entry); ``costs``: the catalogue's facts
    that cost speed; ``blocked``: why it is never recommended (a late failure, a catalogued engine
    bug, a refusal); ``label``: the backends of its roles, in words.
    """

    flags: Mapping[str, Any]  # the full argument set, engine names (``attention_backend``)
    label: str
    changes: tuple[Change, ...] = ()
    runs: frozenset[Phase] = frozenset()
    captured: frozenset[Phase] = frozenset()
    eager: Mapping[Phase, str] = field(default_factory=dict)
    costs: tuple[str, ...] = ()
    blocked: str | None = None
    changes_speculation: bool = False

    @property
    def captures_every_phase(self) -> bool:
        return self.blocked is None and bool(self.runs) and not self.missed

    @property
    def missed(self) -> tuple[Phase, ...]:
        """The ranked phases that run eagerly, most valuable first."""
        return tuple(p for p in PRIORITY if p in self.runs and p not in self.captured)

    def argv(self) -> list[str]:
        """The flags as the engine's parser takes them, one word each: ``--name`` then its value's
        words (a boolean flag alone; several values as several words; a nested option as JSON)."""
        words: list[str] = []
        for name, value in self.flags.items():
            if value is None or value is False:
                continue
            words.append(cli_name(name))
            if isinstance(value, Mapping):
                words.append(json.dumps(dict(value), separators=(",", ":")))
            elif isinstance(value, (tuple, list)):
                words += [str(v) for v in value]
            elif isinstance(value, str) and value.lstrip().startswith(("{", "[")):
                words.append(value)  # JSON as typed (one word, its spaces kept: the engine parses it whole)
            elif value is not True:
                words += str(value).split() or [str(value)]  # parse_cli joined a flag's several values
        return words

    def command(self) -> str:
        """The flags to paste into a shell: :meth:`argv`, quoted where a word needs it."""
        return shlex.join(self.argv())

    def to_dict(self) -> dict[str, Any]:
        return {"flags": self.command(), "argv": self.argv(), "label": self.label, "changes": [str(c) for c in self.changes],
                "runs": [p.value for p in PRIORITY if p in self.runs],
                "captured": [p.value for p in PRIORITY if p in self.captured],
                "eager": {p.value: why for p, why in self.eager.items()}, "costs": list(self.costs),
                "blocked": self.blocked, "changes_speculation": self.changes_speculation}


def rank_key(option: Option) -> tuple[Any, ...]:
    """Smaller is better: not blocked, the phases missed (by priority), costs, speculation kept, fewer changes."""
    return (option.blocked is not None, tuple(p in option.missed for p in PRIORITY), len(option.costs),
            option.changes_speculation, len(option.changes))


def frontier(ranked: Iterable[Option]) -> tuple[Option, ...]:
    """Of options ranked best first, those worth showing: the best, then each next one only if it
    changes fewer flags than every one kept before it (a worse outcome bought with fewer changes)."""
    out: list[Option] = []
    for option in ranked:
        if not out or len(option.changes) < len(out[-1].changes):
            out.append(option)
    return tuple(out)


def model_of(given: ModelKind | None, backends: Iterable[BackendCapabilities]) -> ModelKind:
    """The model kind: given, or the one kind every backend of the user's flags serves."""
    if given is not None:
        return given
    served = [frozenset(caps.models or ModelKind) for caps in backends]  # None: every kind
    kinds = frozenset.intersection(*served) if served else frozenset()
    if len(kinds) == 1:
        return next(iter(kinds))
    raise EngineArgError("--model", "advise needs the model's attention kind: which backends can serve it depends "
                                    "on it (supported: --model mha, gqa or mla)")


def served_kinds(engine: str, platform: Platform) -> str:
    """The model kinds some catalogued backend of ``engine`` serves on ``platform``, for an error message."""
    from attnhal.catalog import entries

    kinds = {m.value for e in entries(engine) if not e.descriptor.platform_reasons(platform)
             for m in e.descriptor.models or ()}
    return ", ".join(f"--model {k}" for k in sorted(kinds)) or f"no model kind on {platform.name}"


def changes(user: Mapping[str, Any], flags: Mapping[str, Any], names: Collection[str]) -> tuple[Change, ...]:
    """The flags of ``names`` whose value differs between the user's arguments and ``flags``."""
    return tuple(Change(cli_name(n), user.get(n), flags.get(n)) for n in names if user.get(n) != flags.get(n))


def check_size(count: int, varied: Collection[str], limit: int) -> None:
    """Refuse an enumeration larger than ``limit`` before planning any of it."""
    if count > limit:
        flags = ", ".join(cli_name(v) for v in varied)
        raise EngineArgError("--vary", f"{count} flag combinations over {flags} (supported: at most {limit}; "
                                       "narrow them with --vary, e.g. --vary attention-backend)")


@dataclass(frozen=True)
class Advice:
    """The user's flags evaluated, the options that beat them (best first), and the blocked ones worth naming."""

    engine: str  # "SGLang 0.5.23"
    platform: str
    model: str | None
    current: Option
    recommended: tuple[Option, ...]
    blocked: tuple[Option, ...]
    considered: int  # flag sets planned
    notes: tuple[str, ...] = ()

    @property
    def every_phase(self) -> Option | None:
        """The best option that captures every phase that runs (the user's own when it does)."""
        if self.current.captures_every_phase:
            return self.current
        return next((o for o in self.recommended if o.captures_every_phase), None)

    def why_better(self, option: Option) -> list[str]:
        """Why ``option`` beats the user's flags, one fact a line."""
        return summarize(self.current, option)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "platform": self.platform, "model": self.model,
                "current": self.current.to_dict(), "considered": self.considered,
                "recommended": [{**o.to_dict(), "why": self.why_better(o)} for o in self.recommended],
                "blocked": [o.to_dict() for o in self.blocked], "notes": list(self.notes),
                "every_phase": self.every_phase.command() if self.every_phase else None}


def summarize(current: Option, option: Option) -> list[str]:
    """The facts by which ``option`` ranks above ``current``: the phases it captures that the user's
    flags leave eager (grouped by why they are eager) or do not run, then the costs it avoids."""
    if current.blocked is not None:
        return [f"yours: {current.blocked}"]
    gained: dict[str, list[str]] = {}
    for phase in PRIORITY:
        if phase in option.captured and phase not in current.captured:
            why = f"eager, {current.eager.get(phase, 'not captured')}" if phase in current.runs else "does not run it"
            gained.setdefault(why, []).append(phase.value)
    out = [f"captures {', '.join(phases)} (yours: {why})" for why, phases in gained.items()]
    out.extend(f"avoids: {c}" for c in current.costs if c not in option.costs)
    if not out and len(option.costs) < len(current.costs):
        out.append("fewer speed costs")
    return out or ["ranks level with yours"]


@runtime_checkable
class Adviser(Protocol):
    """What an adapter adds to answer ``attnhal advise --engine NAME`` (optional: an adapter
    without it is refused by name)."""

    def advise(self, values: Mapping[str, Any], platform: Platform, own: Mapping[str, str | None], *,
               top: int = 3, vary: Sequence[str] | None = None, **options: Any) -> Advice:
        """The engine's flag sets that capture the most, ranked against the parsed flags ``values``
        (:meth:`~attnhal.engines.base.EngineAdapter.parse`); ``own`` as for :meth:`~attnhal.engines.base.EngineAdapter.resolve`; ``top``: how many
        to recommend; ``vary``: the engine flags that may change (``None``: the adapter's default;
        an adapter that varies one flag only refuses it with an :class:`EngineArgError` naming ``--vary``);
        ``options``: the engine's own keywords of the Python API (:func:`attnhal.engines.advise`)."""
        ...


def adviser(adapter: EngineAdapter) -> Adviser | None:
    """``adapter`` if it gives advice (has :meth:`Adviser.advise`), else ``None``."""
    return adapter if callable(getattr(adapter, "advise", None)) else None  # type: ignore[return-value]
