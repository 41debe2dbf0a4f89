"""``attnhal`` command line: info | plan | explain | conformance | demo | catalog | advise | docs, plus plugin commands.

Exit status: 0 yes; 1 a valid question with a negative answer (an invalid plan, a
backend that does not fit, a falsified claim, a stale file); 2 bad input, with one
line ``attnhal <command>: error: ...`` naming the flag, the value and what is
allowed; 3 an internal error (a bug: ``--debug`` shows the traceback); 4 ``plan --engine``:
the engine starts, but its outcome is not attnhal's plan (:data:`~attnhal.cli.app.OUTCOME_DIFFERS`); 130
interrupted; 141 the reader of the output went away (``attnhal info | head -2``).

Each built-in command is a module with ``register(sub)`` (its parser and flags) and
``run(args)`` (the exit status), listed once in :data:`BUILTIN`. Commands raise
:class:`UsageError` (or let the API's ``ValueError``/``TypeError``/``LookupError``/
``OSError`` through) for bad input; :func:`attnhal.cli.app.run` is the one error
boundary. Plugin commands come from :mod:`attnhal.cli.plugins`; their flags can use
the parameter types of :mod:`attnhal.cli.args`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnhal.cli import advise, app, conformance, demo, docs, engine, explain, info, plan
from attnhal.cli.app import BAD_USAGE, INTERNAL_ERROR, UsageError
from attnhal.cli.demo import demo_config, parsed_demo_config
from attnhal.cli.output import format_plan
from attnhal.cli.plugins import Command, CommandUnavailable, load_commands
from attnhal.registry import default_registry

__all__ = ["BUILTIN", "BUILTIN_NAMES", "INTERNAL_ERROR", "UsageError", "build_parser", "demo_config", "format_plan",
           "main", "parsed_demo_config"]

#: The built-in commands, in the order ``attnhal --help`` lists them: name -> ``register(sub)``.
BUILTIN: Mapping[str, Callable[[Any], None]] = {
    "info": info.register,
    "plan": plan.register,
    "explain": explain.register,
    "conformance": conformance.register,
    "demo": demo.register,
    "catalog": engine.register_catalog,
    "advise": advise.register,
    "docs": docs.register,
}
#: Names a plugin command may not take.
BUILTIN_NAMES = tuple(BUILTIN)


def _add_plugin(sub: Any, command: Command) -> None:
    p = sub.add_parser(command.name, help=command.help)
    command.add_arguments(p)
    p.set_defaults(func=command.run)


def build_parser(plugins: Sequence[Command] = (), unavailable: Sequence[CommandUnavailable] = (),
                 argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser: built-in commands, then the plugin commands that work here. Of the engine adapters
    only the one ``argv`` asks for (``--engine E``) is loaded, for its own flags."""
    epilog = ("exit status: 0 yes, 1 a negative answer, 2 bad input, 3 internal error, 4 plan --engine: the engine "
              "runs, but not as attnhal's plan recommends (see docs/cli.md)")
    if unavailable:
        epilog += "\nplugin commands not available here:\n" + "\n".join(
            f"  {u.name}: {u.reason}" for u in unavailable)
    parser, sub = app.root_parser(epilog)
    for register in BUILTIN.values():
        register(sub)
    for name in engine.ENGINE_COMMANDS:
        engine.add_own_flags(sub.choices[name], engine.requested_engine(argv))
    for command in plugins:
        _add_plugin(sub, command)
    return parser


def _command_word(argv: Sequence[str]) -> str | None:
    """The command named on the command line: its first word that is not a flag (the root parser's
    flags take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _unavailable_command(argv: Sequence[str], unavailable: Sequence[CommandUnavailable]) -> str | None:
    word = _command_word(argv)
    for u in unavailable:
        if word == u.name:
            return f"attnhal {u.name}: error: command unavailable here: {u.reason}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The ``attnhal`` command; returns the exit status.

    The parsed arguments carry what every command runs with: ``argv`` (the command line)
    and ``registry`` (:func:`~attnhal.registry.default_registry`, the backends installed here).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # A built-in command needs no plugin command: their entry points are not loaded (nor anything they
    # import), so a built-in's usage error answers before them; ``attnhal --help`` still lists them all.
    plugins, unavailable = ((), ()) if _command_word(argv) in BUILTIN_NAMES else load_commands(BUILTIN_NAMES)
    missing = _unavailable_command(argv, unavailable)
    if missing:
        print(missing, file=sys.stderr)
        return BAD_USAGE
    try:
        args = build_parser(plugins, unavailable, argv).parse_args(argv)
    except SystemExit as exc:  # --help, or a one-line argparse error already printed
        return exc.code if isinstance(exc.code, int) else 0
    args.argv = argv
    args.registry = default_registry()
    return app.run(args)
