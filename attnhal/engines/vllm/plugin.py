"""attnhal inside vLLM 0.33.0: a general plugin (entry-point group ``vllm.general_plugins``), audit only.

vLLM's ``load_general_plugins()`` calls :func:`register` in every process. It wraps
``GPUModelRunner._check_and_update_cudagraph_mode`` — when ``vllm.v1.worker.gpu_model_runner``
is imported, so a process that never builds a model runner (the API server) imports nothing
more — and after vLLM has resolved ``cudagraph_mode`` logs, through vLLM's logger, the level
each attention group's builder reported, which backend / KV-cache group set the minimum, the
resolved mode, every downgrade with its cause and where attnhal's reading differs
(:func:`attnhal.engines.vllm.audit.audit_mode`). vLLM's decision is never changed.

``ATTNHAL_VLLM=off`` disables it. Another vLLM release: one warning, no wrapper. vLLM's
loader does not catch a plugin's exceptions: nothing here raises into vLLM; an error inside
the wrapper is logged and vLLM's own resolution stands.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from attnhal.engines.plugin_gate import installed, mode_from, plugin_mode

__all__ = ["ENV_VAR", "LOGGER", "MODES", "TARGET", "installed_vllm", "register"]

ENV_VAR = "ATTNHAL_VLLM"
MODES = ("audit", "off")
#: A child of vLLM's own ``vllm`` logger (vLLM configures its handlers).
LOGGER = "vllm.attnhal"
#: (module, class, method) the plugin wraps.
TARGET = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_check_and_update_cudagraph_mode")
_MARK = "__attnhal_audit__"

log = logging.getLogger(LOGGER)


def installed_vllm() -> str | None:
    """The installed vLLM release (``None``: not installed)."""
    return installed("vllm")


def register() -> None:
    """The ``vllm.general_plugins`` entry point (may run several times per process: idempotent)."""
    try:
        _register(os.environ)
    except Exception:  # vLLM's loader would let it crash the process
        log.exception("attnhal: registering the vLLM plugin failed; vLLM runs without it")


def _register(env: Mapping[str, str]) -> None:
    from attnhal.engines.vllm.flags import VLLM_VERSIONS

    if plugin_mode("vLLM", installed_vllm(), VLLM_VERSIONS, mode_from(env, ENV_VAR, MODES, log), ENV_VAR, log) is None:
        return
    module = sys.modules.get(TARGET[0])
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps the target method right after its module is executed, the first time it is imported."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != TARGET[0]:
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not find this finder again
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            try:
                _wrap(module)
            except Exception:
                log.exception("attnhal: wrapping %s failed; vLLM runs without the audit", ".".join(TARGET[1:]))

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _wrap(module: ModuleType) -> None:
    cls = getattr(module, TARGET[1])
    original = getattr(cls, TARGET[2])
    if getattr(original, _MARK, False):
        return
    setattr(cls, TARGET[2], _audited(original))


def _audited(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, attention_backends: Any, kv_cache_groups: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            before = _before(self, attention_backends, kv_cache_groups)
        except Exception:
            log.exception("attnhal: reading vLLM's attention groups failed; no audit")
            before = None
        try:
            result = original(self, attention_backends, kv_cache_groups, *args, **kwargs)
        except ValueError as exc:  # vLLM refuses the mode: explain it, then let vLLM raise
            _report(self, before, str(exc))
            raise
        _report(self, before, None)
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def _before(runner: Any, attention_backends: Any, kv_cache_groups: Any) -> tuple[Any, Any]:
    """Each group's backends with their levels, as vLLM computes them, and the requested mode."""
    from attnhal.engines.vllm.audit import GroupLevel
    from attnhal.engines.vllm.resolution import CGSupport, GraphMode

    groups = []
    for index, (backends, group) in enumerate(zip(attention_backends, kv_cache_groups)):
        for backend in sorted(backends, key=lambda b: b.get_name()):
            level = backend.get_builder_cls().get_cudagraph_support(runner.vllm_config, group.kv_cache_spec)
            groups.append(GroupLevel(index, backend.get_name(), CGSupport[level.name], type(group.kv_cache_spec).__name__))
    requested = runner.compilation_config.cudagraph_mode
    return groups, GraphMode(requested.name if requested is not None else "NONE")


def _platform() -> Any:
    """Where attnhal reads the backends' levels: :func:`attnhal.detect` (``ATTNHAL_PLATFORM`` overrides)."""
    from attnhal.platform import detect

    return detect()


def _report(runner: Any, before: tuple[Any, Any] | None, error: str | None) -> None:
    if before is None:
        return
    try:
        from attnhal.engines.vllm.audit import audit_mode
        from attnhal.engines.vllm.resolution import GraphMode

        groups, requested = before
        config = runner.compilation_config
        resolved = None if error else GraphMode(config.cudagraph_mode.name)
        split = bool(config.splitting_ops_contain_attention())
        result = audit_mode(groups, requested, resolved, runner.uniform_decode_query_len, split, error,
                            _platform())
        for line in result.lines:
            log.info("attnhal: %s", line)
    except Exception:
        log.exception("attnhal: explaining vLLM's cudagraph_mode failed; vLLM's resolution stands")
