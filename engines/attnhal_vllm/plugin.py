"""attnhal inside vLLM: a general plugin (entry-point group ``vllm.general_plugins``), audit only.

vLLM's ``load_general_plugins()`` calls :func:`register` in every process. It wraps the
functions :data:`RELEASES` names for the installed vLLM release — each when its module is first
imported, so a process that never builds a model runner (the API server) imports nothing more:

- vLLM 0.33.0, both of its runners (``VLLM_USE_V2_MODEL_RUNNER`` and vLLM's defaults pick one:
  :mod:`~attnhal_vllm.runner`): ``GPUModelRunner._check_and_update_cudagraph_mode`` (V1), and
  V2's steps as on 0.34, its drafter being ``TargetDependentARSpeculator.init_cudagraph_manager``;
- vLLM 0.34.0 (the V2 runner only, :mod:`~attnhal_vllm.runner_v2`): the weakest builder
  level (``get_attn_cg_support``), the mode resolution
  (``CompilationConfig.resolve_cudagraph_mode_and_sizes``; on 0.33 the V1 runner's call of it is
  left to the V1 wrapper) and the drafter's own mode
  (``AutoRegressiveSpeculator.init_cudagraph_manager``).

After vLLM has resolved ``cudagraph_mode`` it logs, through vLLM's logger, the level each
attention group's builder reported, which backend / KV-cache group set the minimum, the
resolved mode, every downgrade with its cause and where attnhal's reading differs
(:func:`attnhal_vllm.audit.audit_mode`); on 0.34 also the drafter's mode. vLLM's
decision is never changed.

``ATTNHAL_VLLM=strict`` is audit plus a refusal: where attnhal's reading of the same backends
captures decode graphs vLLM's resolution does not, the server does not start
(:class:`~attnhal.engines.report.StrictRefusal`). Once per process on rank 0 the plugin logs the
graph report (:mod:`~attnhal_vllm.startup`). ``ATTNHAL_VLLM=off`` disables it. Another vLLM release: one warning, no wrapper. vLLM's
loader does not catch a plugin's exceptions: nothing here raises into vLLM but an unknown
``ATTNHAL_VLLM`` value, which fails closed (:class:`attnhal_hooks.SwitchRefused`, a ``SystemExit``:
the server does not start); an error inside the wrapper is logged and vLLM's own resolution stands.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from attnhal.engines.plugin_gate import installed, mode_from, plugin_mode
from attnhal_hooks import spec_then
from attnhal.engines.report import StrictRefusal

__all__ = ["ENV_VAR", "LOGGER", "MODES", "RELEASES", "TARGET", "Target", "installed_vllm", "register"]

ENV_VAR = "ATTNHAL_VLLM"
MODES = ("audit", "strict", "off")
#: A child of vLLM's own ``vllm`` logger (vLLM configures its handlers).
LOGGER = "vllm.attnhal"
_MARK = "__attnhal_audit__"

log = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class Target:
    """One function the plugin wraps: ``module.owner.name`` (``owner`` None: a module function)."""

    module: str
    owner: str | None
    name: str
    kind: str  # which wrapper (_maker): runner, groups, resolution, drafter


#: The V2 runner's steps: it collects the weakest builder level (``v1/worker/gpu/attn_utils.py``:
#: 0.33 314-347, 0.34 322-347), resolves the mode with ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
#: (``v1/worker/gpu/model_runner.py``: 0.33 756, 0.34 792) and hands it to the drafter.
_V2_STEPS = (Target("vllm.v1.worker.gpu.attn_utils", None, "get_attn_cg_support", "groups"),
             Target("vllm.config.compilation", "CompilationConfig", "resolve_cudagraph_mode_and_sizes", "resolution"))
#: The vLLM releases the plugin hooks, and where (version as data: another minor is audit-free,
#: said once). 0.33.0 has both runners: V1's mode check, and V2's steps with its EAGLE/MTP drafter
#: (``spec_decode/target_dependent_ar/speculator.py:89-107``). 0.34.0 removed the V1 runner; its
#: drafter's decode mode is set in ``spec_decode/autoregressive/speculator.py:36-52``.
RELEASES: Mapping[str, tuple[Target, ...]] = {
    "0.33.0": (Target("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_check_and_update_cudagraph_mode",
                      "runner"), *_V2_STEPS,
               Target("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator", "TargetDependentARSpeculator",
                      "init_cudagraph_manager", "drafter")),
    "0.34.0": (*_V2_STEPS,
               Target("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator", "AutoRegressiveSpeculator",
                      "init_cudagraph_manager", "drafter")),
}
#: (module, class, method) the plugin wraps in vLLM 0.33.0 (kept for callers of 0.1).
TARGET = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_check_and_update_cudagraph_mode")


def installed_vllm() -> str | None:
    """The installed vLLM release (``None``: not installed)."""
    return installed("vllm")


def register() -> None:
    """The ``vllm.general_plugins`` entry point (may run several times per process: idempotent)."""
    try:
        _register(os.environ)  # an unknown ATTNHAL_VLLM raises SwitchRefused, a SystemExit: it ends the start
    except Exception:  # vLLM's loader would let it crash the process
        log.exception("attnhal: registering the vLLM plugin failed; vLLM runs without it")


def _register(env: Mapping[str, str]) -> None:
    from attnhal.engines.releases import modelled
    from attnhal_vllm.flags import VLLM_SERIES_DIGITS

    version = installed_vllm()
    # Another minor: no known code to hook (0.34 moved the runner), so the plugin stays off; a patch
    # or pre/post release of a supported minor is hooked as that minor's release (said once).
    if plugin_mode("vLLM", version, tuple(RELEASES), mode_from(env, ENV_VAR, MODES, log), ENV_VAR, log,
                   other=None, digits=VLLM_SERIES_DIGITS) is None:
        return
    same = modelled(version, tuple(RELEASES), VLLM_SERIES_DIGITS)
    if same is None:
        return
    from attnhal_vllm import runner_v2

    runner_v2.RELEASE[0] = same.release  # the drafter lines name the release modelled
    targets = RELEASES[same.release]
    waiting = []
    for target in targets:
        module = sys.modules.get(target.module)
        if module is not None:
            _wrap(module, target)
        else:
            waiting.append(target)
    if waiting and not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport(waiting))


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps each target right after its module is executed, the first time it is imported."""

    def __init__(self, targets: Sequence[Target]) -> None:
        self.targets = list(targets)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        mine = [t for t in self.targets if t.module == fullname]
        if not mine:
            return None
        self.targets = [t for t in self.targets if t.module != fullname]
        if not self.targets:
            sys.meta_path.remove(self)
        return spec_then(fullname, path, lambda module: _wrap_each(module, mine), log,
                         f"wrapping {fullname} failed; vLLM runs without the audit")


def _wrap_each(module: ModuleType, targets: Sequence[Target]) -> None:
    for found in targets:
        try:
            _wrap(module, found)
        except Exception:
            log.exception("attnhal: wrapping %s.%s failed; vLLM runs without the audit",
                          found.owner or found.module, found.name)


def _wrap(module: ModuleType, target: Target) -> None:
    owner: Any = getattr(module, target.owner) if target.owner else module
    original = getattr(owner, target.name)
    if getattr(original, _MARK, False):
        return
    wrapper = _maker(target.kind)(original)
    setattr(wrapper, _MARK, True)
    setattr(owner, target.name, wrapper)


def _audited(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM 0.33.0: around ``GPUModelRunner._check_and_update_cudagraph_mode``."""
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
        _report(self, before, None)  # raises StrictRefusal in strict mode
        return result

    return wrapper


def _before(runner: Any, attention_backends: Any, kv_cache_groups: Any) -> tuple[Any, Any]:
    """Each group's backends with their levels, as vLLM computes them, and the requested mode."""
    from attnhal_vllm.audit import GroupLevel
    from attnhal_vllm.modes import CGSupport, GraphMode

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
        from attnhal_vllm.audit import audit_mode
        from attnhal_vllm.modes import GraphMode
        from attnhal_vllm.startup import at_start

        groups, requested = before
        config = runner.compilation_config
        resolved = None if error else GraphMode(config.cudagraph_mode.name)
        split = bool(config.splitting_ops_contain_attention())
        result = audit_mode(groups, requested, resolved, runner.uniform_decode_query_len, split, error,
                            _platform())
        for line in result.lines:
            log.info("attnhal: %s", line)
        sizes = tuple(config.cudagraph_capture_sizes or ())
        at_start(groups, requested, resolved, runner.uniform_decode_query_len, split, sizes, error, _platform())
        _report_drafter(runner, resolved)
    except StrictRefusal:
        raise
    except Exception:
        log.exception("attnhal: explaining vLLM's cudagraph_mode failed; vLLM's resolution stands")


def _report_drafter(runner: Any, resolved: Any) -> None:
    """vLLM 0.33's V1 runner: the drafter's mode, read from its dispatcher once the runner initialised it,
    and its graph-report table."""
    from attnhal_vllm.drafter import drafter_line, observed
    from attnhal_vllm.startup import at_drafter

    drafter = getattr(runner, "drafter", None)
    dispatcher = getattr(drafter, "cudagraph_dispatcher", None)
    if resolved is None or dispatcher is None or not getattr(runner, "speculative_config", None):
        return  # no mode, or a drafter without graphs of its own (n-gram)
    seen = getattr(getattr(dispatcher, "cudagraph_mode", None), "name", None)
    mode = observed("0.33.0", resolved, seen, "V1")
    log.info("attnhal: %s", drafter_line(type(drafter).__name__, mode))
    tokens = getattr(runner.speculative_config, "num_speculative_tokens", None) or 2
    at_drafter(mode, resolved, tokens > 1)


def _maker(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The wrapper of each target kind; vLLM 0.34's are in :mod:`~attnhal_vllm.runner_v2`."""
    if kind == "runner":
        return _audited
    from attnhal_vllm import runner_v2

    return {"groups": runner_v2.groups_recorded, "resolution": runner_v2.resolution_audited,
            "drafter": runner_v2.drafter_audited}[kind]
