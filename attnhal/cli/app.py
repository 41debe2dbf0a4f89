"""The CLI's frame: exit statuses, the parser classes, and the one error boundary.

Exit status: 0 yes; 1 a valid question with a negative answer; :data:`BAD_USAGE` (2) bad
input, one line ``attnhal <command>: error: ...`` naming the flag, the value and what is
allowed; :data:`INTERNAL_ERROR` (3) a bug (``--debug`` shows the traceback);
:data:`OUTCOME_DIFFERS` (4) ``plan --engine``: the engine starts and runs, but what it will do
differs from attnhal's recommendation (a phase attnhal's plan captures runs eagerly, or the reverse);
:data:`INTERRUPTED` (130); :data:`BROKEN_PIPE` (141) when the reader of the output went away.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from typing import Any

from attnhal.cli.args import BadArgument, ParamType, Registered
from attnhal.cli.output import one_line
from attnhal.errors import AttnhalError

__all__ = ["BAD_INPUT", "BAD_USAGE", "BROKEN_PIPE", "INTERNAL_ERROR", "INTERRUPTED", "OUTCOME_DIFFERS", "UsageError",
           "installed_version", "root_parser", "run"]

#: Bad input: an expected failure, told in one line.
BAD_USAGE = 2
#: Internal errors exit with this status; expected failures never do.
INTERNAL_ERROR = 3
#: ``plan --engine``: the plan is valid and the engine starts, but the engine's outcome (what it
#: will do per phase) is not attnhal's plan; distinct from 1 so that a CI check can tell "runs,
#: differently from what attnhal recommends" from "cannot run".
OUTCOME_DIFFERS = 4
#: 128 + SIGPIPE, the status a Unix tool gets when its reader goes away.
BROKEN_PIPE = 141
INTERRUPTED = 130


class UsageError(AttnhalError, ValueError):
    """Bad command-line input: printed as one line, exit status 2."""


#: Exceptions that mean bad input (the API's validation errors); anything else is a bug.
BAD_INPUT: tuple[type[BaseException], ...] = (UsageError, ValueError, TypeError, LookupError, OSError)


# --- the parsers ----------------------------------------------------------------------------

class _Help(argparse.HelpFormatter):
    """Shows each option's default, unless it is unset or a flag's ``False``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if isinstance(action.type, Registered):  # the names, read now that help is shown
            text = text.replace("{names}", ", ".join(action.type.names()))
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
        self.exit(BAD_USAGE, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")

    def _get_value(self, action: argparse.Action, text: str) -> Any:
        # attnhal's parameter types refuse with the value and what is allowed as data; the
        # flag is the argument being converted ("--topk=99 (supported: ...)"), read from here.
        if isinstance(action.type, ParamType):
            try:
                return action.type(text)
            except BadArgument as bad:
                flag = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
                raise argparse.ArgumentError(None, bad.naming(str(flag))) from None
        return super()._get_value(action, text)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        # argparse reports a subcommand's unknown flag from the root parser ("attnhal: error",
        # "see 'attnhal --help'"); the subcommand's own parser names the command the user typed.
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._command_parser(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the subcommand ``parsed`` ran (this parser when it has none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, argparse.ArgumentParser):
                    return chosen
        return self


class _CommandParser(_Parser):
    """A subcommand's parser: also takes ``--debug`` after the command name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parents", [_debug_parent()])
        super().__init__(*args, **kwargs)


def _debug_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    return parent


def root_parser(epilog: str) -> tuple[argparse.ArgumentParser, Any]:
    """The ``attnhal`` parser and its subcommand action (``sub.add_parser(name, help=...)``)."""
    parser = _Parser(prog="attnhal", description="Plan, explain and check attention backends for speculative decoding on "
                     "CUDA, HIP and CPU.", epilog=epilog,
                     formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog))
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--version", action=_Version, help="show the installed attnhal version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    return parser, sub


class _Version(argparse.Action):
    """``--version``: the installed version, read from the metadata only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"attnhal {installed_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def installed_version() -> str:
    """The version of the installed ``attnhal`` distribution (its metadata, the one truth)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnhal")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed: pip install -e .)"


# --- the error boundary -------------------------------------------------------------------

def _say(command: str, message: str) -> None:
    print(f"attnhal {command}: {message}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    """Run the command; every expected failure becomes one line and exit 2."""
    command = args.command
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning(command, warnings.showwarning)
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
        return BAD_USAGE
    except Exception as exc:  # noqa: BLE001 - the boundary: a bug, reported without a traceback
        if args.debug:
            traceback.print_exc()
        _say(command, f"internal error: {type(exc).__name__}: {one_line(str(exc))[:300]} "
                      "(a bug: rerun with --debug for the traceback)")
        return INTERNAL_ERROR


def _show_warning(command: str, original: Any) -> Any:
    """``warnings.showwarning`` for a command: attnhal's warnings in the command's voice (one line
    ``attnhal COMMAND: warning: ...``); another package's (an engine's, imported by a command) as
    Python shows it, with its file and line: its origin is kept, never relabelled attnhal's."""
    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if _from_attnhal(category, filename):
            _say(command, f"warning: {one_line(str(message))}")
        else:
            original(message, category, filename, lineno, file, line)
    return show


def _from_attnhal(category: type[Warning], filename: str) -> bool:
    """A warning of attnhal's: its category is attnhal's, or it was raised in a file of one of
    attnhal's imported packages (``attnhal``, ``attnhal_triton``, ``attnhal_sglang``, ...)."""
    if category.__module__.partition(".")[0].startswith("attnhal"):
        return True
    files = [getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if "." not in name and name.startswith("attnhal")]
    roots = [os.path.dirname(file) + os.sep for file in files if file]
    path = os.path.abspath(filename)
    return any(path.startswith(root) for root in roots)


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


def run(args: argparse.Namespace) -> int:
    """Run a parsed command (``args.func``) behind the error boundary; returns the exit status.

    Bad input (:data:`BAD_INPUT`) is one line and exit 2, a bug one line and exit 3,
    Ctrl-C exit 130, a reader gone away silence and exit 141; warnings are one line
    ``attnhal COMMAND: warning: ...``.
    """
    try:
        return _run(args)
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
