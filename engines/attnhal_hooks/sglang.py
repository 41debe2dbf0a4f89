"""SGLang's ``sglang.srt.plugins`` entry point for attnhal: nearly free where it is not needed.

SGLang's ``load_plugins()`` runs in every process of a server. :func:`register` imports only
the standard library: it loads attnhal's plugin (:func:`attnhal_sglang.plugin.register`)
once the first speculative worker module that plugin hooks is imported — at once where one
already is — so a server without speculative decoding never imports attnhal. The hooks are then
registered with SGLang's ``HookRegistry`` under attnhal's name and applied by :func:`apply_once`.

Exactly once, whatever other plugins do: the first import of a worker module may happen inside
SGLang's own ``HookRegistry.apply_hooks()`` (another plugin hooks a method of that module, and
SGLang resolves its target). SGLang is then wrapping that target, with the hook list attnhal
appends to: applying it again from inside would wrap it twice (each plugin's hook running twice
per call). :func:`apply_once` applies only attnhal's targets that SGLang is neither applying now
nor has applied, each through SGLang's own ``_apply_target`` (every plugin's hooks on it, in
SGLang's order), and marks them applied as ``apply_hooks()`` does.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from attnhal_hooks import spec_then, switch

__all__ = ["MODES", "MODE_VAR", "WORKERS", "apply_once", "register"]

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


def _being_applied(registry: Any) -> set[str]:
    """The targets SGLang's ``_apply_target`` is applying on this thread's stack now."""
    code = registry._apply_target.__func__.__code__
    busy, frame = set(), sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            busy.add(frame.f_locals.get("target"))
        frame = frame.f_back
    return busy


def apply_once(targets: Iterable[str]) -> None:
    """Apply the hooks registered on each of ``targets`` (``module.Class.method``, the module
    imported) unless SGLang has applied them or is applying them now, further up this stack."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    busy = _being_applied(HookRegistry)
    for target in sorted(targets):  # apply_hooks()'s order
        if target in HookRegistry._patched or target in busy:
            continue  # done, or SGLang's frame above applies it with attnhal's hook in its list
        try:
            HookRegistry._apply_target(target, HookRegistry._hooks[target])
            HookRegistry._patched.add(target)
        except Exception:
            log.exception("attnhal: applying the hooks on %s failed; SGLang decides without them", target)


def _load(source: Any, apply: bool) -> None:
    from sglang.srt.plugins.hook_registry import _current_plugin_source

    token = _current_plugin_source.set(source)
    try:
        from attnhal_sglang.on_import import module_of
        from attnhal_sglang.plugin import HOOKS, register as register_hooks

        register_hooks()
    finally:
        _current_plugin_source.reset(token)
    if apply:
        apply_once(t for t in HOOKS if module_of(t) in sys.modules)


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
