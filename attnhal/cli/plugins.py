"""Plugin commands: a backend package adds an ``attnhal`` subcommand through entry points.

A package declares the command in its ``pyproject.toml``::

    [project.entry-points."attnhal.commands"]
    compile-check = "attnhal_triton.cli:COMMAND"

and the entry point resolves to a :class:`Command`. The core never imports a plugin by name: the CLI
loads the group when it builds its parser, so the module an entry point names
must be light (no torch, no triton at import; import them inside ``run``). A
command whose entry point fails to load, is not a :class:`Command`, clashes with
another command's name, or ``requires`` a module that is not importable, is left
out of ``attnhal --help`` — the help's last lines say why — and every other
command keeps working.

``run`` returns the exit status (0 yes, 1 a negative answer). It may raise
``ValueError``/``TypeError``/``LookupError``/``OSError`` for bad input: the CLI's
error boundary prints them as ``attnhal <command>: error: ...`` and exits 2.
The parameter types of :mod:`attnhal.cli.args` (``type=bounded(1, 64)``, ``choice``,
...) give a plugin's flags the built-in commands' bounds and messages.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["GROUP", "Command", "CommandUnavailable", "load_commands"]

GROUP = "attnhal.commands"


@dataclass(frozen=True)
class Command:
    """One plugin subcommand.

    Parameters
    ----------
    name: the subcommand (``attnhal <name>``); the entry point's name must equal it.
    help: one line for ``attnhal --help``.
    add_arguments: adds the command's flags to its (already created) parser; every
        flag should have a help text, and every number that sizes work a bound.
    run: runs the command with the parsed arguments; returns the exit status.
    requires: modules that must be importable for the command to work (checked
        with ``importlib.util.find_spec``, without importing them).
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    requires: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommandUnavailable:
    """A plugin command that is not offered here, and why (``name=value (supported: ...)``)."""

    name: str
    source: str
    reason: str


def _missing_module(command: Command) -> str | None:
    for module in command.requires:
        if importlib.util.find_spec(module) is None:
            return f"module={module} (supported: importable; pip install {module})"
    return None


def _load(ep: EntryPoint, taken: Collection[str]) -> Command | CommandUnavailable:
    source = f"{ep.value} (entry point {ep.name!r})"
    try:
        command = ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, never a crash
        return CommandUnavailable(ep.name, source, f"load={ep.value} failed: {type(exc).__name__}: {exc}")
    if not isinstance(command, Command):
        return CommandUnavailable(ep.name, source,
                                  f"object={type(command).__name__} (supported: an attnhal.cli.plugins.Command)")
    if command.name != ep.name or command.name in taken:
        return CommandUnavailable(ep.name, source, f"name={command.name} (supported: the entry point's name, "
                                                   f"not one of {', '.join(sorted(taken))})")
    missing = _missing_module(command)
    return CommandUnavailable(ep.name, source, missing) if missing else command


def load_commands(taken: Collection[str],
                  discover: Callable[[], Iterable[EntryPoint]] | None = None,
                  ) -> tuple[list[Command], list[CommandUnavailable]]:
    """The plugin commands that work here, and those that do not with their reasons.

    ``taken`` holds the built-in command names a plugin may not reuse; ``discover``
    replaces the installed entry points (tests).
    """
    if discover is None:
        from importlib.metadata import entry_points  # only when a plugin command may be asked for

        found: Iterable[EntryPoint] = entry_points(group=GROUP)
    else:
        found = discover()
    commands: list[Command] = []
    unavailable: list[CommandUnavailable] = []
    names = set(taken)
    for ep in sorted(found, key=lambda e: e.name):
        loaded = _load(ep, names)
        if isinstance(loaded, Command):
            names.add(loaded.name)
            commands.append(loaded)
        else:
            unavailable.append(loaded)
    return commands, unavailable
