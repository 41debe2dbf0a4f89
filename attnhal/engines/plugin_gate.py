"""What both engine plugins decide before they touch the engine: the mode the user set, and
whether the installed engine is the release the plugin was written and tested against.

Nothing here imports an engine; the answers are logged on the engine's own logger.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

__all__ = ["installed", "mode_from", "release_matches"]


def installed(distribution: str) -> str | None:
    """The installed release of ``distribution`` (``None``: not installed)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def mode_from(env: Mapping[str, str], var: str, modes: Sequence[str], log: logging.Logger) -> str | None:
    """``env[var]`` as one of ``modes`` (unset or empty: the first); ``None``, with one error
    logged, for any other value: the plugin then stays off."""
    raw = env.get(var, "")
    mode = raw.strip().lower() or modes[0]
    if mode not in modes:
        log.error("attnhal: %s=%r (supported: %s): the plugin stays off", var, raw, ", ".join(modes))
        return None
    return mode


def release_matches(engine: str, version: str | None, expected: str, var: str, log: logging.Logger) -> bool:
    """Whether the installed ``version`` of ``engine`` is ``expected``; otherwise one warning says
    the plugin stays off (the hooks read that release's private code)."""
    if version == expected:
        return True
    log.warning("attnhal: %s %s is installed; attnhal's plugin is written and tested against %s %s only: "
                "it stays off (%s=off silences this)", engine, version, engine, expected, var)
    return False
