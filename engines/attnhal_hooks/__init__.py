"""The engines' entry points into attnhal's plugins, outside the ``attnhal`` package so that an
engine loading its plugins imports nothing of attnhal until the plugin is needed
(``import attnhal`` is about 0.1 s). :mod:`attnhal_hooks.sglang`: SGLang's general plugin."""

from __future__ import annotations

import importlib.machinery
import logging
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["SwitchRefused", "spec_then", "switch"]


class SwitchRefused(SystemExit):
    """An unknown value of a plugin's switch (``ATTNHAL_SGLANG_GRAPHS``, ``ATTNHAL_VLLM``): the
    server does not start. A user who typed a value meant something (``strcit`` meant ``strict``);
    starting without the hook would give the opposite of what was asked.

    A :class:`SystemExit`, not an ``Exception``: SGLang's plugin loader runs each plugin under
    ``except Exception`` and would log it and start the server anyway; this ends the process with
    the message, exit status 1.
    """


def switch(env: Mapping[str, str], var: str, modes: Sequence[str]) -> str:
    """``env[var]`` as one of ``modes`` (unset or empty: the first, case and spaces ignored);
    any other value raises :class:`SwitchRefused` naming the variable, the value and ``modes``."""
    raw = env.get(var, "")
    mode = raw.strip().lower() or modes[0]
    if mode not in modes:
        shown = raw[:20] + "..." if len(raw) > 20 else raw
        raise SwitchRefused(f"attnhal: {var}={shown!r} (supported: {', '.join(modes)}): the server does not start "
                            f"with a value attnhal does not know; unset {var} for {modes[0]}, or give one of those")
    return mode


def spec_then(fullname: str, path: Sequence[str] | None, then: Callable[[ModuleType], None], log: logging.Logger,
              failed: str) -> Any:
    """The module spec of ``fullname`` whose loader runs ``then(module)`` right after the module is
    executed (the import hook both plugins use); ``then`` failing is logged on ``log``
    (``failed``), never raised into the engine's import."""
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is None or spec.loader is None:
        return spec
    execute = spec.loader.exec_module

    def exec_module(module: ModuleType) -> None:
        execute(module)
        try:
            then(module)
        except Exception:
            log.exception("attnhal: %s", failed)

    spec.loader.exec_module = exec_module  # type: ignore[method-assign]
    return spec
