"""The engines' entry points into attnhal's plugins, outside the ``attnhal`` package so that an
engine loading its plugins imports nothing of attnhal until the plugin is needed
(``import attnhal`` is about 0.1 s). :mod:`attnhal_hooks.sglang`: SGLang's general plugin."""

from __future__ import annotations

import importlib.machinery
import logging
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["spec_then"]


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
