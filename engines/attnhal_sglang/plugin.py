"""attnhal inside SGLang 0.5.23: a general plugin (entry-point group ``sglang.srt.plugins``)
that explains, and on request corrects, the speculative workers' graph decisions.

SGLang's ``load_plugins()`` (engine, scheduler and detokenizer processes) calls :func:`register`,
which registers AROUND hooks with SGLang's ``HookRegistry`` on each speculative worker's graph
decision (:data:`HOOKS`) when the worker's module is first imported (:mod:`.on_import`). ``ATTNHAL_SGLANG_GRAPHS`` picks what the hooks do:

- ``audit`` (default): SGLang decides; attnhal plans the same worker (backends by class,
  :mod:`~attnhal_sglang.classes`; the resolved server arguments through the adapter)
  and logs one line per phase on tensor-parallel rank 0: SGLang's decision, attnhal's and,
  where they differ, attnhal's reasons and the catalogued entry (``docs/catalog.md`` D1..).
- ``enforce``: as audit, and where attnhal captures a phase SGLang leaves eager, the phase's
  runner is built with the class SGLang itself uses for that phase on that device; where the
  phase's backend descriptor says it cannot be captured, SGLang's runner is not built.
- ``strict``: as audit, and the server does not start (:class:`~attnhal.engines.report.StrictRefusal`,
  naming the phase, the catalogue entry and the flag that changes it) where attnhal plans a phase
  captured that SGLang would run eagerly, or plans a late failure (:func:`~attnhal_sglang.strict.refuse_late`).
- ``off``: no hook.

Once per server (rank 0) the hook logs the graph report (:mod:`attnhal_sglang.report`).

What attnhal cannot plan (a backend class outside the table, an argument the adapter does not model, a platform
without device graphs, an out-of-tree platform's runners) is left to SGLang with one warning naming it. An error
inside a hook is logged and SGLang's own decision stands. Another SGLang release: one warning, no hook. Loading
this module imports the standard library and attnhal's light core only; SGLang's modules are read inside the hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from attnhal.engines.plugin_gate import installed, mode_from, plugin_mode
from attnhal_sglang.strict import refuse_late
from attnhal_hooks.sglang import MODE_VAR, MODES
from attnhal.errors import AttnhalError

__all__ = ["HOOKS", "LOGGER", "MODES", "MODE_VAR", "DraftPlan", "Unplannable", "installed_sglang", "register"]

#: attnhal's log lines go to this child of SGLang's own ``sglang`` logger.
LOGGER = "sglang.srt.plugins.attnhal"
_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
#: Where the EAGLE draft worker keeps each phase's graph runner.
_RUNNER_ATTRS = {"draft_decode": "cuda_graph_runner", "draft_extend": "cuda_graph_runner_for_draft_extend"}
#: The runner class SGLang 0.5.23 builds per phase and torch device (``Device2DraftCudaGraphRunner``
#: and ``Device2ExtendCudaGraphRunner`` in ``EagleDraftWorker._capture_cuda_graphs``; ROCm's device
#: is "cuda"). musa's draft extend is left out: SGLang maps it to the draft-decode runner class.
RUNNER_CLASSES: Mapping[str, Mapping[str, str]] = {
    "draft_decode": {"cuda": "EAGLEDraftCudaGraphRunner", "xpu": "EAGLEDraftCudaGraphRunner",
                     "musa": "EAGLEDraftCudaGraphRunner", "npu": "EAGLEDraftNpuGraphRunner"},
    "draft_extend": {"cuda": "EAGLEDraftExtendCudaGraphRunner", "xpu": "EAGLEDraftExtendCudaGraphRunner",
                     "npu": "EAGLEDraftExtendNpuGraphRunner"},
}

log = logging.getLogger(LOGGER)


class Unplannable(AttnhalError, ValueError):
    """What attnhal cannot plan for this worker; the phase is left to SGLang."""


def installed_sglang() -> str | None:
    """The installed SGLang release (``None``: not installed)."""
    return installed("sglang")


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: register the hooks the mode asks for."""
    from attnhal_sglang.flags import SGLANG_SERIES_DIGITS, SGLANG_VERSIONS

    mode = plugin_mode("SGLang", installed_sglang(), SGLANG_VERSIONS, mode_from(os.environ, MODE_VAR, MODES, log),
                       MODE_VAR, log, digits=SGLANG_SERIES_DIGITS)
    if mode is None:
        return
    from attnhal_sglang.on_import import register_on_import

    # A server without speculation never imports the workers: their hooks cost it nothing.
    register_on_import({target: make(mode) for target, make in HOOKS.items()})


# --- logging ---------------------------------------------------------------------------------

def _rank0() -> bool:
    """Tensor-parallel rank 0 (or no process group): the one process of a server that logs."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return True
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank) == 0
    except Exception:  # a rank we cannot read: log rather than stay silent
        return True


class _Log:
    """Info lines on rank 0; each warning once per process and hook."""

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def info(self, message: str) -> None:
        if _rank0():
            log.info("attnhal: %s", message)

    def warn_once(self, message: str) -> None:
        if message not in self.warned and _rank0():
            self.warned.add(message)
            log.warning("attnhal: %s", message)


# --- planning one EAGLE draft worker -----------------------------------------------------------

@dataclass(frozen=True)
class DraftPlan:
    """attnhal's plan for one draft worker, with what its log lines and the D-entries read."""

    plan: Any  # attnhal.planner.GraphPlan
    names: Mapping[Any, str | None]  # Phase -> SGLang backend name of the phase
    applicable: tuple[Any, ...]  # the catalogued engine decisions that apply (audit.EngineDiffers)
    platform: str
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the server arguments planned
    model: str | None = None


def _resolved_args(server_args: Any) -> dict[str, Any]:
    """The modelled server arguments as SGLang resolved them (``resolution_result``: the value
    its resolution pipeline chose; the plain attribute keeps what was given)."""
    from attnhal_sglang.flags import FLAGS

    try:
        from sglang.srt.arg_groups.overrides import resolution_result
    except ImportError:  # an SGLang without a resolution pipeline: the attributes are final
        def resolution_result(args: Any, name: str) -> Any:
            return getattr(args, name)
    return {name: resolution_result(server_args, name) for name in FLAGS if hasattr(server_args, name)}


def _model_kind(runner: Any) -> str:
    if getattr(runner, "use_mla_backend", False):
        return "mla"
    config = runner.model_config
    heads, kv_heads = config.num_attention_heads, config.get_total_num_kv_heads()
    return "gqa" if kv_heads < heads else "mha"


def _phase_name(phase: str, backend: object) -> str | None:
    """The catalogue name of the backend SGLang built for ``phase`` (``None``: none built)."""
    from attnhal_sglang.classes import catalog_name

    if backend is None:
        return None
    name = catalog_name(backend)
    if name is None:
        cls = type(backend)
        raise Unplannable(f"{phase} backend class={cls.__module__}.{cls.__qualname__} (supported: the classes of "
                          "attnhal_sglang.classes.BACKEND_CLASSES and their subclasses)")
    return name


def plan_draft_worker(worker: Any, graphs_enabled: bool, env: Mapping[str, str] | None = None) -> DraftPlan:
    """attnhal's plan for an ``EagleDraftWorker`` whose backends SGLang has built.

    The roles come from the worker's backend objects (by class), the spec from the worker
    (adaptive speculation changes it per captured state) with the resolved server arguments
    for the rest (policy, context, the roles the catalogued entries read), the platform from :func:`attnhal.detect` (``ATTNHAL_PLATFORM``
    overrides it). ``graphs_enabled`` is SGLang's own graph switch. Raises :class:`Unplannable`.
    """
    from attnhal.catalog import load
    from attnhal.engines.flags import EngineArgError
    from attnhal_sglang.audit import engine_differs
    from attnhal_sglang.config import from_server_args
    from attnhal.phases import Phase
    from attnhal.planner import plan
    from attnhal.platform import GraphKind, detect

    platform = detect()
    if platform.graph_kind is not GraphKind.DEVICE and not platform.simulated:
        raise Unplannable(f"platform={platform.name} has no device graphs here (attnhal's graphs on it are its "
                          "CPU emulator, which SGLang does not use)")
    names = {Phase.DRAFT_DECODE: _phase_name("draft_decode", worker.draft_attn_backend),
             Phase.DRAFT_EXTEND: _phase_name("draft_extend", worker.draft_extend_attn_backend)}
    # The worker's own spec: adaptive speculation captures one state per step count.
    args = {**_resolved_args(worker.server_args), "speculative_num_steps": worker.speculative_num_steps,
            "speculative_eagle_topk": worker.topk, "speculative_num_draft_tokens": worker.speculative_num_draft_tokens}
    try:
        config = from_server_args(args, env=os.environ if env is None else env, model=_model_kind(worker.draft_runner))
    except EngineArgError as exc:
        text = str(exc).replace(f"{exc.flag}: {exc.flag}", exc.flag)  # a message that names its flag already
        raise Unplannable(f"server argument {text}") from None
    descriptors = {phase: load(f"sglang:{name}").descriptor if name else None for phase, name in names.items()}
    backends = dataclasses.replace(config.backends, draft_decode=descriptors[Phase.DRAFT_DECODE],
                                   draft_extend=descriptors[Phase.DRAFT_EXTEND])
    policy = config.policy if graphs_enabled else dataclasses.replace(config.policy, enabled=False)
    context = dataclasses.replace(config.context, page_size=config.page_size(platform).value)
    result = plan(config.spec, platform, backends, policy, context)
    return DraftPlan(result, names, engine_differs(config, platform), platform.name, args, config.context.model)


# --- the hooks ---------------------------------------------------------------------------------

def _sglang_gate(module: Any) -> bool:
    """SGLang's own graph switch for the draft worker (``check_cuda_graph_backend``), read as it reads it."""
    return not module.check_cuda_graph_backend(module.Phase.DECODE, module.Backend.DISABLED)


def _left_to_sglang(module: Any) -> str | None:
    """Cases SGLang decides by other means than its backend rule: attnhal stays out."""
    if module.current_platform.is_out_of_tree():
        return "an out-of-tree platform supplies its own speculative graph runners"
    if getattr(module.get_model(), "model_impl", None) == "mindspore":
        return "model_impl=mindspore captures no draft graphs in SGLang"
    return None


@contextlib.contextmanager
def _refusing(module: Any, phases: frozenset[str], refused: dict[str, str]) -> Iterator[None]:
    """While SGLang decides, its runner classes of ``phases`` build nothing (and record that SGLang asked)."""
    saved: list[tuple[str, Any]] = []
    names = {(phase, name) for phase in phases for name in RUNNER_CLASSES[phase].values()}
    for phase, name in sorted(names):
        original = getattr(module, name, None)
        if original is None:  # a runner class this SGLang build does not import
            continue

        def refuse(worker: Any, _phase: str = phase, _name: str = name) -> None:
            refused[_phase] = _name
            return None

        saved.append((name, original))
        setattr(module, name, refuse)
    try:
        yield
    finally:
        for name, original in reversed(saved):
            setattr(module, name, original)


class EagleDraftHook:
    """AROUND ``EagleDraftWorker._capture_cuda_graphs`` (also STANDALONE's worker, which inherits it)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.log = _Log()
        self.reported = False

    def __call__(self, original: Callable[..., Any], worker: Any, *args: Any, **kwargs: Any) -> Any:
        module = sys.modules[_EAGLE]
        try:
            planned = self._plan(module, worker)
            held_back = self._not_captured(planned)
        except Unplannable as exc:
            self.log.warn_once(f"{type(worker).__name__}: {exc}; its graph decision is left to SGLang")
            return original(worker, *args, **kwargs)
        except Exception:
            log.exception("attnhal: planning %s failed; SGLang's own graph decision stands", type(worker).__name__)
            return original(worker, *args, **kwargs)
        if self.mode == "strict":  # before SGLang captures: a late failure would stop it there, unexplained
            refuse_late(f"{type(worker).__name__} on {planned.platform}", planned)
        refused: dict[str, str] = {}
        with _refusing(module, held_back, refused):
            result = original(worker, *args, **kwargs)
        rows: tuple[Any, ...] = ()
        try:
            rows = self._report(module, worker, planned, refused)
        except Exception:
            log.exception("attnhal: the %s hook failed after SGLang's decision; SGLang's own decision stands",
                          type(worker).__name__)
            self._restore(module, worker, refused)
        if self.mode == "strict":  # outside the try: this error is meant to stop the server
            from attnhal_sglang.report import refuse_eager

            refuse_eager(f"{type(worker).__name__} on {planned.platform}", rows)
        return result

    def _plan(self, module: Any, worker: Any) -> DraftPlan:
        why = _left_to_sglang(module)
        if why is not None:
            raise Unplannable(why)
        return plan_draft_worker(worker, _sglang_gate(module))

    def _not_captured(self, planned: DraftPlan) -> frozenset[str]:
        """enforce: the phases whose backend descriptor says they cannot be captured."""
        from attnhal_sglang.audit import descriptor_limit

        if self.mode != "enforce":
            return frozenset()
        return frozenset(p.value for p in planned.names if descriptor_limit(planned.plan[p]))

    def _report(self, module: Any, worker: Any, planned: DraftPlan, refused: Mapping[str, str]) -> tuple[Any, ...]:
        """Log one line per phase (and the graph report, once); return the audit rows."""
        from attnhal_sglang.audit import Verdict, audit
        from attnhal_sglang.report import server_report
        from attnhal.phases import Phase

        backends = {Phase.DRAFT_DECODE: worker.draft_attn_backend, Phase.DRAFT_EXTEND: worker.draft_extend_attn_backend}
        sglang = {}
        for phase, backend in backends.items():
            built = getattr(worker, _RUNNER_ATTRS[phase.value], None) is not None or phase.value in refused
            sglang[phase] = Verdict.NOT_RUN if backend is None else Verdict.CAPTURED if built else Verdict.EAGER
        head = f"{self.mode}: {type(worker).__name__} on {planned.platform}"
        rows = audit(planned.plan, sglang, names=planned.names, applicable=planned.applicable)
        for row in rows:
            action = self._act(module, worker, row, refused)
            self.log.info(f"{head}: {row.line()}" + (f"; enforce: {action}" if action else ""))
        if Verdict.EAGER in sglang.values():
            self._advise(head, planned)
        if not self.reported:  # one table per server: the first worker planned (adaptive states follow)
            self.reported = True
            self.log.info(server_report(head, planned.plan, rows))
        return rows

    def _advise(self, head: str, planned: DraftPlan) -> None:
        """One line: the flags that capture every phase here (``attnhal advise``), where SGLang left one eager."""
        from attnhal_sglang.advice import every_phase_line

        try:
            line = every_phase_line(planned.args, planned.platform, planned.model, env=os.environ)
        except Exception:  # the advice is extra: SGLang's decision and the lines above stand
            log.exception("attnhal: advising on %s failed", head)
            return
        if line is not None:
            self.log.info(f"{head}: {line}")

    def _act(self, module: Any, worker: Any, row: Any, refused: Mapping[str, str]) -> str:
        """enforce: what attnhal changed for this phase (empty: nothing)."""
        from attnhal_sglang.audit import Direction

        if self.mode != "enforce":
            return ""
        phase = row.phase.value
        if phase in refused:
            return f"{refused[phase]} not built (the descriptor's limit above)"
        if row.direction is Direction.ATTNHAL_CAPTURES:
            return self._build(module, worker, phase)
        return ""

    def _build(self, module: Any, worker: Any, phase: str) -> str:
        """Build ``phase``'s runner with the class SGLang uses for it on the worker's device."""
        device = worker.target_worker.device
        name = RUNNER_CLASSES[phase].get(device)
        if name is None:
            self.log.warn_once(f"device={device!r} (supported: {', '.join(RUNNER_CLASSES[phase])}): no SGLang "
                               f"{phase} runner class known for it; the phase is left to SGLang")
            return f"left to SGLang (device={device!r})"
        attr = _RUNNER_ATTRS[phase]
        try:
            setattr(worker, attr, getattr(module, name)(worker))
        except Exception:
            setattr(worker, attr, None)
            log.exception("attnhal: building %s for %s failed; it stays eager, as SGLang decided", name, phase)
            return f"building {name} failed (logged); eager, as SGLang decided"
        return f"built {name} (SGLang's {phase} runner on device {device!r})"

    def _restore(self, module: Any, worker: Any, refused: Mapping[str, str]) -> None:
        """Build what SGLang had decided to build and attnhal refused (the hook failed afterwards)."""
        for phase, name in refused.items():
            attr = _RUNNER_ATTRS[phase]
            if getattr(worker, attr, None) is None:
                setattr(worker, attr, getattr(module, name)(worker))


def _unmodelled(what: str, runners: Mapping[str, str],
                said: str = "is not modelled by attnhal") -> Callable[[str], Callable[..., Any]]:
    """A hook for a worker the plugin does not audit: SGLang decides, one warning says so."""

    def make(mode: str) -> Callable[..., Any]:
        logger = _Log()

        def hook(original: Callable[..., Any], worker: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(worker, *args, **kwargs)
            try:
                built = ", ".join(f"{phase} {'captured' if getattr(worker, attr, None) is not None else 'eager'}"
                                  for phase, attr in runners.items())
                logger.warn_once(f"{type(worker).__name__}: {what} {said}; SGLang's graph decision ({built}) is left as it is")
            except Exception:
                log.exception("attnhal: the %s hook failed; SGLang's own decision stands", type(worker).__name__)
            return result

        return hook

    return make


#: Hook target (dotted path, as ``HookRegistry`` takes it) -> the hook for a mode.
HOOKS: Mapping[str, Callable[[str], Callable[..., Any]]] = {
    f"{_EAGLE}.EagleDraftWorker._capture_cuda_graphs": EagleDraftHook,
    "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker._capture_cuda_graphs":
        _unmodelled("multi-layer EAGLE", {"draft_extend": "cuda_graph_runner_for_draft_extend"},
                    "is planned by attnhal (attnhal plan --engine sglang), not audited by its plugin"),
    "sglang.srt.speculative.frozen_kv_mtp_worker_v2.FrozenKVMTPDraftWorker._capture_cuda_graphs":
        _unmodelled("frozen-KV MTP", {"draft_decode": "cuda_graph_runner"}),
}
