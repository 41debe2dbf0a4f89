"""Plugin commands: the same names as :mod:`attnhal.cli.plugins`, where they are defined."""

from attnhal.cli.plugins import GROUP, Command, CommandUnavailable, load_commands

__all__ = ["GROUP", "Command", "CommandUnavailable", "load_commands"]
