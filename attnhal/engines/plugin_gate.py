"""What both engine plugins decide before they touch the engine: the mode the user set, and
what the plugin may do on the installed release.

One rule (:func:`plugin_mode`): on a release the adapter supports (its ``versions``, the table
``attnhal info`` prints, :mod:`attnhal.engines.versions`) the plugin runs in the mode asked; on
another release it audits only — or stays off, where it knows no code of that release to hook
(vLLM moves its runner between releases) — and says so once per process: its hooks read that
release's private code, so it changes no engine decision it was not tested against.

Nothing here imports an engine; the answers are logged on the engine's own logger.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

__all__ = ["AUDIT", "installed", "mode_from", "plugin_mode"]

#: The mode every plugin has that changes nothing (it logs).
AUDIT = "audit"
_said: set[tuple[str, str | None]] = set()


def installed(distribution: str) -> str | None:
    """The installed release of ``distribution`` (``None``: not installed)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def mode_from(env: Mapping[str, str], var: str, modes: Sequence[str], log: logging.Logger) -> str:
    """``env[var]`` as one of ``modes`` (unset or empty: the first). Any other value fails closed:
    logged as an error on the engine's logger, then :class:`attnhal_hooks.SwitchRefused` (a
    ``SystemExit``) ends the server's start (:func:`attnhal_hooks.switch`)."""
    from attnhal_hooks import SwitchRefused, switch

    try:
        return switch(env, var, modes)
    except SwitchRefused as refused:
        log.error("%s", refused)
        raise


def plugin_mode(engine: str, version: str | None, supported: Sequence[str], mode: str | None, var: str,
                log: logging.Logger, *, other: str | None = AUDIT, digits: int = 3) -> str | None:
    """The mode the plugin runs in: ``None`` (off) for ``None`` or ``"off"`` and where the engine is
    not installed (``version`` ``None``: nothing to hook, said once); ``mode`` on a ``supported``
    release and on a patch, pre- or post-release of one (its series: the first ``digits`` release
    numbers, :func:`attnhal.engines.releases.modelled`; one line per process says which release
    models it); ``other`` on any other (:data:`AUDIT`, or ``None``: the plugin knows no code of it
    to hook and stays off), with one warning per process and release."""
    from attnhal.engines.releases import modelled

    if mode is None or mode == "off":
        return None
    first = (engine, version) not in _said
    _said.add((engine, version))
    same = modelled(version, supported, digits)
    if same is not None:
        if first and not same.exact:
            log.info("attnhal: %s", same.line(engine))
        return mode
    if version is None:
        if first:
            log.warning("attnhal: %s is not installed here: the plugin stays off", engine)
        return None
    if first:
        does = "it audits only" if other == AUDIT else "it stays off"
        needs = "" if other is None or mode == other else f"{var}={mode} needs a tested release; "
        log.warning("attnhal: %s %s is installed; attnhal's plugin is tested against %s %s: %s "
                    "(%s%s=off silences this)", engine, version, engine, ", ".join(supported), does, needs, var)
    return other
