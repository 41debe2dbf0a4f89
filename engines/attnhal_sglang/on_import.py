"""Register the SGLang plugin's hooks when the module they hook is first imported.

SGLang's ``load_plugins()`` runs in every process of a server and applies each registered
hook at once, importing the hooked module (``HookRegistry.apply_hooks`` resolves its target):
for the speculative workers that is seconds of imports in servers that never speculate. Here
a hook whose module is not imported yet is registered — and applied, through SGLang's own
registry, exactly once (:func:`attnhal_hooks.sglang.apply_once`) — right after that module is first executed; one already imported is registered at
once, as before, and applied by ``load_plugins()``.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from attnhal_hooks import spec_then

__all__ = ["module_of", "register_on_import"]

log = logging.getLogger("sglang.srt.plugins.attnhal")


def module_of(target: str) -> str:
    """The module of a ``module.Class.method`` hook target."""
    return target.rsplit(".", 2)[0]


def _register(hooks: Mapping[str, Callable[..., Any]], source: Any) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in hooks.items():
        HookRegistry.register(target, hook, HookType.AROUND, source=source)


class _OnImport(importlib.abc.MetaPathFinder):
    """Registers and applies the hooks of a module right after it is executed, the first time."""

    def __init__(self, pending: dict[str, dict[str, Callable[..., Any]]], source: Any) -> None:
        self.pending, self.source = pending, source

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        hooks = self.pending.pop(fullname, None)
        if hooks is None:
            return None
        if not self.pending:
            sys.meta_path.remove(self)
        return spec_then(fullname, path, lambda module: _register_and_apply(hooks, self.source), log,
                         f"hooking {fullname} failed; SGLang decides without attnhal")


def _register_and_apply(hooks: Mapping[str, Callable[..., Any]], source: Any) -> None:
    from attnhal_hooks.sglang import apply_once

    _register(hooks, source)
    apply_once(hooks)  # each once, whatever other plugins do (an import inside SGLang's apply_hooks())


def register_on_import(hooks: Mapping[str, Callable[..., Any]]) -> None:
    """Register ``hooks`` (target -> AROUND hook) now where their module is imported, on import otherwise."""
    from sglang.srt.plugins.hook_registry import _current_plugin_source

    source = _current_plugin_source.get()  # load_plugins() names attnhal as the hooks' source
    now = {t: h for t, h in hooks.items() if module_of(t) in sys.modules}
    _register(now, source)
    pending: dict[str, dict[str, Callable[..., Any]]] = {}
    for target, hook in hooks.items():
        if target not in now:
            pending.setdefault(module_of(target), {})[target] = hook
    for finder in [f for f in sys.meta_path if isinstance(f, _OnImport)]:
        sys.meta_path.remove(finder)  # a second load_plugins() in the process: the newest hooks win
    if pending:
        sys.meta_path.insert(0, _OnImport(pending, source))
