"""Plugin commands: the same names as :mod:`attnhal.cli.plugins`, where they are defined."""

from attnhal._compat import moved
from attnhal.cli.plugins import GROUP, Command, CommandUnavailable, load_commands

moved("attnhal.commands", "attnhal.cli.plugins")

__all__ = ["GROUP", "Command", "CommandUnavailable", "load_commands"]
