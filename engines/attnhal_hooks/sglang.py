"""SGLang's ``sglang.srt.plugins`` entry point for attnhal: nearly free where it is not needed.

SGLang's ``load_plugins()`` runs in every process of a server. :func:`register` imports only
the standard library: it loads attnhal's plugin (:func:`attnhal_sglang.plugin.register`)
once the first speculative worker module that plugin hooks is imported — at once where one
already is — so a server without speculative decoding never imports attnhal. The hooks are then
registered with SGLang's ``HookRegistry`` under attnhal's name and applied.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from attnhal_hooks import spec_then, switch

__all__ = ["MODES", "MODE_VAR", "WORKERS", "register"]

#: The switch of attnhal's SGLang plugin and its values (the first is the default); another value
#: refuses to start the server (:func:`attnhal_hooks.switch`), in every process, before SGLang runs.
MODE_VAR = "ATTNHAL_SGLANG_GRAPHS"
MODES = ("audit", "enforce", "strict", "off")

#: The modules whose classes attnhal's SGLang plugin hooks (its ``HOOKS``; a test keeps the two equal).
WORKERS = ("sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.multi_layer_eagle_worker_v2",
           "sglang.srt.speculative.frozen_kv_mtp_worker_v2")

log = logging.getLogger("sglang.srt.plugins.attnhal")


def register() -> None:
    """The entry point: attnhal's plugin now if a hooked worker is imported, else when one is.
    An unknown :data:`MODE_VAR` ends the start here (:class:`attnhal_hooks.SwitchRefused`), also in
    a server that never loads the plugin: a typo must not pass silently where it would matter."""
    switch(os.environ, MODE_VAR, MODES)
    from sglang.srt.plugins.hook_registry import _current_plugin_source

    source = _current_plugin_source.get()  # "attnhal", as load_plugins() set it
    for finder in [f for f in sys.meta_path if isinstance(f, _LoadOnImport)]:
        sys.meta_path.remove(finder)  # load_plugins() again in this process: one finder
    if any(name in sys.modules for name in WORKERS):
        _load(source, apply=False)  # load_plugins() applies them after this returns
    else:
        sys.meta_path.insert(0, _LoadOnImport(source))


def _load(source: Any, apply: bool) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, _current_plugin_source

    token = _current_plugin_source.set(source)
    try:
        from attnhal_sglang.plugin import register as register_hooks

        register_hooks()
    finally:
        _current_plugin_source.reset(token)
    if apply:
        HookRegistry.apply_hooks()  # only the targets not patched yet


class _LoadOnImport(importlib.abc.MetaPathFinder):
    """Loads attnhal's plugin right after the first hooked worker module is executed."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in WORKERS:
            return None
        sys.meta_path.remove(self)
        return spec_then(fullname, path, lambda module: _load(self.source, apply=True), log,
                         "loading attnhal's SGLang plugin failed; SGLang decides without it")
