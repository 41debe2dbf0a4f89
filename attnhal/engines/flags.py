"""Reading an engine's arguments: one table of modelled flags, one set of harmless ones.

Shared by the engine adapters. A modelled flag is converted (a bad value is an
error naming the flag); a harmless flag is accepted and reported as ignored; any
other flag is an error naming it — nothing is dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnhal.errors import AttnhalError
from attnhal.spec import ModelKind

__all__ = ["MAX_JSON_DEPTH", "EngineArgError", "Flag", "Parsed", "check", "cli_name", "json_object", "model_kind",
           "one_of", "parse_cli", "positive", "truth"]


class EngineArgError(AttnhalError, ValueError):
    """An engine argument attnhal cannot take: unknown, unmodelled, or a bad value; ``flag`` names it
    (once: a message that starts with the flag is not prefixed with it again)."""

    def __init__(self, flag: str, message: str) -> None:
        self.flag = flag
        super().__init__(message if message.startswith(flag) else f"{flag}: {message}")


class Parsed(dict[str, Any]):
    """:func:`parse_cli`'s answer: ``{argument_name: text}``, and ``spelled``: each argument as the
    user wrote it (``--max_batch_size``, ``--max-batch-size``, or ``MODEL`` for a positional one),
    so that an error names the flag the user typed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spelled: dict[str, str] = {}


@dataclass(frozen=True)
class Flag:
    """A modelled flag: ``convert(flag, value)`` checks and converts; ``boolean`` flags take no value."""

    convert: Callable[[str, Any], Any]
    boolean: bool = False


def cli_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def positive(flag: str, value: Any) -> int:
    """An integer >= 1 from text or JSON. A JSON number with a fraction (``3.5``), an infinite one
    (``1e400`` reads as ``inf``) or ``nan`` is refused, as the engines' typed configs refuse it;
    an integral one (``3.0``) is the integer, as they take it."""
    if isinstance(value, float) and not value.is_integer():
        raise EngineArgError(flag, f"{flag}={_shown(value)} (supported: an integer >= 1; a number with a "
                                   "fraction, inf or nan is refused by the engine too)")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise EngineArgError(flag, f"{flag}={_shown(value)} (supported: an integer)") from None
    if number < 1 or isinstance(value, bool):
        raise EngineArgError(flag, f"{flag}={_shown(value)} (supported: an integer >= 1)")
    return number


def positive_list(flag: str, value: Any) -> tuple[int, ...]:
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    return tuple(positive(flag, v) for v in items)


#: How deep an engine flag's JSON may nest, and how long it may be: the configs engines take
#: nest two or three levels; a deeper one is refused before the parser recurses.
MAX_JSON_DEPTH = 8
MAX_JSON_CHARS = 1 << 16


def json_object(flag: str, value: Any) -> dict[str, Any]:
    """``value`` (JSON text or a mapping) as a dict; text nested deeper than
    :data:`MAX_JSON_DEPTH` or longer than :data:`MAX_JSON_CHARS` is refused naming ``flag``."""
    supported = f"a JSON object, at most {MAX_JSON_DEPTH} levels deep and {MAX_JSON_CHARS} characters"
    if isinstance(value, str):
        if len(value) > MAX_JSON_CHARS or _json_depth(value) > MAX_JSON_DEPTH:
            raise EngineArgError(flag, f"{flag}={_shown(value)} (supported: {supported})")
        try:
            value = json.loads(value)
        except ValueError:
            raise EngineArgError(flag, f"{flag}={_shown(value)} (supported: {supported})") from None
    if not isinstance(value, Mapping):
        raise EngineArgError(flag, f"{flag}={_shown(value)} (supported: {supported})")
    return dict(value)


def _json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``text`` (brackets inside strings not counted)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _shown(value: Any) -> str:
    text = repr(value)
    return text[:40] + "..." if len(text) > 40 else text


def truth(flag: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text not in ("true", "false", "1", "0"):
        raise EngineArgError(flag, f"{flag}={value!r} (supported: true or false)")
    return text in ("true", "1")


def one_of(allowed: Sequence[str]) -> Callable[[str, Any], str]:
    def convert(flag: str, value: Any) -> str:
        if value not in allowed:
            raise EngineArgError(flag, f"{flag}={value!r} (supported: {', '.join(allowed)})")
        return str(value)
    return convert


def model_kind(value: ModelKind | str | None) -> ModelKind | None:
    """attnhal's ``--model``: the attention kind, which engines read from the checkpoint and attnhal
    cannot (after ``--``, ``--model CHECKPOINT`` is the engine's flag: said not read)."""
    try:
        return ModelKind(value) if value is not None else None
    except ValueError:
        raise EngineArgError("--model", f"--model={value!r} (supported: {', '.join(m.value for m in ModelKind)}; "
                                        "attnhal's flag: the attention kind, which the engine reads from the "
                                        "checkpoint; or the checkpoint's config.json as --model-config PATH)") from None


def check(args: Mapping[str, Any], flags: Mapping[str, Flag], harmless: Collection[str],
          where: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Converted modelled values (``None`` values dropped) and the sorted ignored names.

    ``where`` names the harmless set in the error (``attnhal_sglang.HARMLESS``).
    """
    values, ignored = {}, []
    spelled: Mapping[str, str] = getattr(args, "spelled", {})
    for name, value in args.items():
        if value is None:
            continue
        flag = spelled.get(name) or cli_name(name)  # as the user typed it
        if name in flags:
            values[name] = flags[name].convert(flag, value)
        elif name in harmless:
            ignored.append(name)
        else:
            raise EngineArgError(flag, f"{flag} is not modelled by attnhal "
                                 f"(modelled: {', '.join(cli_name(f) for f in flags)}; "
                                 f"ignored as harmless: see {where})")
    return values, tuple(sorted(ignored))


def parse_cli(argv: Sequence[str], flags: Mapping[str, Flag], positional: str | None = None) -> Parsed:
    """Command-line flags -> ``{argument_name: text}``, unconverted (a :class:`Parsed`, which keeps
    each flag's spelling).

    ``--flag value`` and ``--flag=value`` both work, with dashes or underscores; a flag followed
    by several values keeps them space-separated; ``flags`` says which are boolean (no value).
    ``positional``: the argument a leading word fills where the engine takes one (vLLM's
    ``vllm serve MODEL``: ``"model"``); elsewhere a word that is not a flag is refused. Unknown
    flags are kept: :func:`check` reports them by name.
    """
    out = Parsed()
    i = 0
    if positional is not None and argv and not argv[0].startswith("--"):
        out[positional], out.spelled[positional], i = argv[0], positional.upper(), 1
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            supported = f"flags written --name value{f', after one {positional.upper()}' if positional else ''}"
            raise EngineArgError(token, f"{token!r} (supported: {supported})")
        name, eq, value = token[2:].partition("=")
        out.spelled[name.replace("-", "_")] = "--" + name
        name = name.replace("-", "_")
        flag = flags.get(name)
        if eq:
            out[name] = value
        elif flag is not None and flag.boolean:
            out[name] = True
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                values.append(argv[i + 1])
                i += 1
            out[name] = " ".join(values)
        elif flag is not None:
            raise EngineArgError(out.spelled[name], f"{out.spelled[name]} needs a value")
        else:
            out[name] = True
        i += 1
    return out
