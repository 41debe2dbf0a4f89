"""SGLang 0.5.23's own code, executed on a CPU-only machine: argument resolution and graph decisions.

Functions take plain inputs (a dict of ``ServerArgs`` fields, a platform spec, a model
directory) and import SGLang inside, so they can move into attnhal's engines package.

- :func:`resolve` runs ``ServerArgs(...).resolve_once()`` (SGLang's resolution pipeline:
  backend defaults and overrides, page-size changes, speculative defaults and the assertions
  that reject a configuration) on an emulated GPU and returns what it resolved, or the error.
- :func:`draft_graphs` runs the draft worker's ``init_attention_backend()`` (the real
  ``DraftBackendFactory``) and its graph decision ``_capture_cuda_graphs()`` with a worker
  made by ``object.__new__``: single-step attention backends are built with ``__init__``
  skipped (so ``isinstance`` is real and no GPU buffer is allocated), multi-step draft
  backends run their real ``__init__`` on CPU tensors (their refusals, e.g. ``topk > 1``,
  are the engine's), and the graph-runner classes are replaced by recorders.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from platforms import PLATFORMS, emulate
from sglang_grid import Case, View

MODELS = Path(__file__).resolve().parents[1] / "models"

#: Resolved fields read back after SGLang's resolution (``arg_groups.overrides.resolution_result``).
RESOLVED_FIELDS = ("page_size", "attention_backend", "prefill_attention_backend", "decode_attention_backend",
                   "speculative_algorithm", "speculative_attention_mode", "speculative_num_steps",
                   "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_draft_attention_backend")


@dataclass(frozen=True)
class Resolution:
    """What SGLang's resolution made of the arguments, or why it refused them."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    roles: tuple[str | None, str | None] = (None, None)  # SGLang's (prefill, decode) backend pair
    error: str | None = None  # "ExceptionType: message" when SGLang refused
    server_args: Any = None
    context: Any = None  # SGLang's runtime context built from the resolved arguments (when accepted)

    @property
    def accepted(self) -> bool:
        return self.error is None


def model_dir(model: str) -> str:
    """The local model directory of a model kind (``mha`` | ``mla``): a config.json, no weights."""
    path = MODELS / model
    if not (path / "config.json").is_file():
        raise ValueError(f"model={model!r} (supported: {', '.join(sorted(p.name for p in MODELS.iterdir()))})")
    return str(path)


def server_args_fields(args: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``ServerArgs`` keyword arguments: the caller's, plus a local model (and draft) and no tokenizer."""
    fields = {"model_path": model_dir(model), "skip_tokenizer_init": True, "device": "cuda", **args}
    # NGRAM drafts from the prompt, UNO with the target model: neither takes a draft model.
    if fields.get("speculative_algorithm") not in (None, "NGRAM", "UNO") and "speculative_draft_model_path" not in fields:
        fields["speculative_draft_model_path"] = fields["model_path"]
    return fields


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def resolve(args: Mapping[str, Any], platform: str, model: str) -> Resolution:
    """Run SGLang's ``ServerArgs`` resolution for ``args`` on emulated ``platform``."""
    from sglang.srt import runtime_context
    from sglang.srt.arg_groups.overrides import attention_backends_of, resolution_result, resolving_view
    from sglang.srt.server_args import ServerArgs

    with emulate(platform):
        server_args = ServerArgs(**server_args_fields(args, model))
        try:
            server_args.resolve_once()
        except Exception as exc:  # SGLang's own refusal (assertion, ValueError, ...)
            # What the pipeline had resolved when it refused (the page size is set early).
            partial = {name: resolution_result(server_args, name) for name in RESOLVED_FIELDS}
            return Resolution(fields=partial, error=_error(exc))
        resolved = {name: resolution_result(server_args, name) for name in RESOLVED_FIELDS}
        roles = tuple(attention_backends_of(resolving_view(server_args)))
        context = runtime_context.create_context(server_args, role="test")
    return Resolution(fields=resolved, roles=(roles[0], roles[1]), server_args=server_args, context=context)


# --- the draft worker's graph decision -----------------------------------------------------------

@dataclass(frozen=True)
class DraftGraphs:
    """The draft worker's decision: which backends the factory built, which graph runners it built."""

    draft_decode_backend: str | None = None  # class name; None: no multi-step draft backend
    draft_extend_backend: str | None = None
    runners: Mapping[str, str] = field(default_factory=dict)  # "draft_decode"|"draft_extend" -> runner class
    error: str | None = None  # the engine refused while building its backends

    @property
    def captured(self) -> frozenset[str]:
        return frozenset(self.runners)


class _Recorder:
    """Stands in for a graph-runner class: records that the worker built it, captures nothing."""

    def __init__(self, name: str, built: dict[str, str], phase: str) -> None:
        self.name, self.built, self.phase = name, built, phase

    def __call__(self, worker: Any, **kwargs: Any) -> "_Recorder":
        self.built[self.phase] = self.name
        return self


def _attention_backend_classes() -> list[type]:
    """Every single-step attention backend class SGLang has loaded (``AttentionBackend`` subclasses
    that are not multi-step draft containers)."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    found, todo = [], list(AttentionBackend.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "MultiStep" not in cls.__name__:
            found.append(cls)
    return found


#: Modules whose backend classes the draft factory may build (imported before patching).
_BACKEND_MODULES = ("triton_backend", "flashinfer_backend", "flashinfer_mla_backend", "aiter_backend",
                    "flashattention_backend", "flashmla_backend", "trtllm_mha_backend", "trtllm_mla_backend",
                    "cutedsl_mla_backend", "dsa_backend", "intel_amx_backend", "torch_native_backend",
                    "wave_backend", "deepseek_v4_backend", "deepseek_v4_backend_hip_radix",
                    "qwen_sparse_attn_backend")


def import_engine() -> None:
    """Import the modules the decisions read (the speculative workers take 10-20 s): call once
    per process before :func:`emulate`, so the module flags they set at import are emulated too."""
    import importlib

    for name in _BACKEND_MODULES:
        importlib.import_module(f"sglang.srt.layers.attention.{name}")
    for name in ("eagle_worker_v2", "draft_utils", "multi_layer_eagle_worker_v2", "frozen_kv_mtp_worker_v2",
                 "dflash_worker_v2", "ngram_worker", "standalone_worker_v2", "dspark_components.dspark_worker_v2"):
        importlib.import_module(f"sglang.srt.speculative.{name}")



@contextlib.contextmanager
def skipped_backend_init(context_len: int) -> Iterator[None]:
    """Single-step attention backends built without their ``__init__`` (it allocates GPU buffers)."""

    def init(self: Any, model_runner: Any, *args: Any, **kwargs: Any) -> None:
        self.max_context_len = context_len
        self.kv_index_translator = model_runner.kv_index_translator  # read by metadata-staging queries
        self.attnhal_built_with = kwargs  # skip_prefill, kv_indptr_buf, ... as the factory passed them
        # What the seam queries read (flashattention_backend.py:531-560): the draft's topk, no SWA pool.
        for name, value in (("topk", _spec_topk()), ("use_sliding_window_kv_pool", False)):
            if not isinstance(getattr(type(self), name, None), property):
                setattr(self, name, value)

    with contextlib.ExitStack() as stack:
        for cls in _attention_backend_classes():
            if "__init__" in vars(cls):
                stack.enter_context(mock.patch.object(cls, "__init__", init))
        yield


def _spec_topk() -> int:
    from sglang.srt.runtime_context import get_spec

    try:
        return int(get_spec().speculative_eagle_topk or 1)
    except Exception:  # no runtime context (a target backend built outside a draft worker)
        return 1


def draft_runner(server_args: Any, num_requests: int = 4, draft: bool = True) -> Any:
    """The model runner fields the backend builders and the multi-step backends read, on CPU
    (``draft=False``: the target model's runner)."""
    import torch
    from sglang.srt.arg_groups.overrides import model_config_of, use_mla_backend
    from sglang.srt.model_executor.model_runner import resolve_draft_attention_backend

    config = model_config_of(server_args)
    pool = types.SimpleNamespace(size=num_requests, req_to_token=torch.zeros((num_requests, 64), dtype=torch.int32))
    return types.SimpleNamespace(
        model_config=config, use_mla_backend=use_mla_backend(server_args), device="cpu", gpu_id=0,
        draft_attention_backend=resolve_draft_attention_backend(draft_attention_backend=None, is_draft_worker=draft),
        req_to_token_pool=pool, token_to_kv_pool=None, sliding_window_size=None, server_args=server_args,
        kv_index_translator=types.SimpleNamespace(is_translating=False), page_size=1, is_draft_worker=draft,
        init_new_workspace=False, kv_cache_dtype=torch.bfloat16,
        plan_stream_for_flashinfer=object(),  # flashinfer's EAGLE setup makes a CUDA stream otherwise
    )


def target_backend(resolution: Resolution, platform: str) -> str:
    """Build the target model's attention backend as its model runner does
    (``model_runner_components/attention_backend_setup.get_attention_backend``: the registry's
    creator per backend, a hybrid backend for split prefill/decode); returns the class name.
    The creators' own checks (MLA-only backends, arch checks) raise here as they would at startup."""
    from sglang.srt import runtime_context
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import get_attention_backend

    context = resolution.context
    with emulate(platform), runtime_context.use_context(context):
        runner = draft_runner(resolution.server_args, draft=False)
        with skipped_backend_init(runner.model_config.context_len):
            return type(get_attention_backend(model_runner=runner)).__name__


#: The draft-worker class each EAGLE-family algorithm builds (module, class): STANDALONE's
#: subclasses EAGLE's and keeps its graph decision; EAGLE3 and NEXTN use EAGLE's.
WORKERS = {"EAGLE": ("eagle_worker_v2", "EagleDraftWorker"), "EAGLE3": ("eagle_worker_v2", "EagleDraftWorker"),
           "NEXTN": ("eagle_worker_v2", "EagleDraftWorker"),
           "STANDALONE": ("standalone_worker_v2", "StandaloneDraftWorker")}


def _draft_worker(server_args: Any, runner: Any, worker: tuple[str, str]) -> Any:
    import importlib

    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    spec = get_spec()
    cls = getattr(importlib.import_module(f"sglang.srt.speculative.{worker[0]}"), worker[1])
    worker = object.__new__(cls)
    worker.server_args, worker.draft_runner, worker.gpu_id, worker.device = server_args, runner, 0, "cuda"
    worker.topk, worker.speculative_num_steps = spec.speculative_eagle_topk, spec.speculative_num_steps
    worker.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
    worker.speculative_algorithm = SpeculativeAlgorithm.from_string(spec.speculative_algorithm)
    worker.seed_dsa_topk_from_draft_extend = False
    worker.target_worker = types.SimpleNamespace(device="cuda")
    worker._specialized_graph_memory_usage, worker._specialized_graph_time_usage = {}, {}
    return worker


def _class_name(obj: Any) -> str | None:
    return type(obj).__name__ if obj is not None else None


def draft_graphs(resolution: Resolution, platform: str, env: Mapping[str, str] | None = None,
                 worker: tuple[str, str] = WORKERS["EAGLE"], out_of_tree: Any = None) -> DraftGraphs:
    """Execute an EAGLE-family draft worker's backend construction and graph decision
    (``speculative/eagle_worker_v2.py``: ``init_attention_backend``, ``_capture_cuda_graphs``).
    ``out_of_tree``: ``(graph_capture, {phase: runner name or None})``, an out-of-tree SGLang
    platform answering ``get_speculative_graph_runner_cls`` (``None``: the emulated in-tree one)."""
    from sglang.srt import runtime_context
    from sglang.srt.speculative import eagle_worker_v2 as module

    if not resolution.accepted:
        raise ValueError(f"resolution refused: {resolution.error}")
    server_args, context = resolution.server_args, resolution.context
    built: dict[str, str] = {}
    with emulate(platform), runtime_context.use_context(context), contextlib.ExitStack() as stack:
        runner = draft_runner(server_args)
        stack.enter_context(skipped_backend_init(runner.model_config.context_len))
        for name, value in (env or {}).items():
            stack.enter_context(_env(name, value))
        stack.enter_context(mock.patch.object(module, "get_available_gpu_memory", lambda *a, **k: 0.0))
        for phase, names in (("draft_decode", ("EAGLEDraftCudaGraphRunner", "EAGLEDraftNpuGraphRunner")),
                             ("draft_extend", ("EAGLEDraftExtendCudaGraphRunner", "EAGLEDraftExtendNpuGraphRunner"))):
            for name in names:
                stack.enter_context(mock.patch.object(module, name, _Recorder(name, built, phase)))
        if out_of_tree is not None:
            stack.enter_context(mock.patch.object(module, "current_platform", _out_of_tree(*out_of_tree, built)))
        draft = _draft_worker(server_args, runner, worker)
        draft.target_worker = types.SimpleNamespace(device=PLATFORMS[platform].device)
        try:
            draft.init_attention_backend()
        except Exception as exc:  # the factory's or a multi-step backend's refusal
            return DraftGraphs(error=_error(exc))
        draft._capture_cuda_graphs()
        # Each phase's runner as the worker keeps it (not as the recorder was named): SGLang may
        # build one phase's runner class for the other (MUSA's draft extend, docs/catalog.md D9).
        slots = {"draft_decode": draft.cuda_graph_runner, "draft_extend": draft.cuda_graph_runner_for_draft_extend}
        return DraftGraphs(_class_name(draft.draft_attn_backend), _class_name(draft.draft_extend_attn_backend),
                           {phase: r.name for phase, r in slots.items() if isinstance(r, _Recorder)})


def target_verify_graph(resolution: Resolution, platform: str) -> bool:
    """Whether the target's decode graph runner (which captures target verify) is built: the
    speculative workers build it unless decode graphs are disabled (``eagle_worker_v2.py``,
    ``check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)``), as resolved by SGLang."""
    from sglang.srt import runtime_context
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    context = resolution.context
    with emulate(platform), runtime_context.use_context(context):
        return not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    import os

    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def loaded() -> bool:
    return "sglang.srt.speculative.eagle_worker_v2" in sys.modules


# --- the other speculative workers' graph decisions ---------------------------------------------

def _worker_shell(module_name: str, class_name: str, resolution: Resolution) -> Any:
    import importlib

    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    worker = object.__new__(getattr(importlib.import_module(f"sglang.srt.speculative.{module_name}"), class_name))
    worker.server_args, worker.gpu_id, worker.device = resolution.server_args, 0, "cuda"
    worker.topk, worker.speculative_num_steps = spec.speculative_eagle_topk, spec.speculative_num_steps
    worker.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
    worker.target_worker = types.SimpleNamespace(device="cuda")
    worker._specialized_graph_memory_usage, worker._specialized_graph_time_usage = {}, {}
    return worker


def multi_layer_eagle_graphs(resolution: Resolution, platform: str,
                             env: Mapping[str, str] | None = None) -> DraftGraphs:
    """``MultiLayerEagleDraftWorker``: one draft-extend backend per step from the factory
    (``init_attention_backend``), then ``_capture_cuda_graphs`` (multi_layer_eagle_worker_v2.py)."""
    from sglang.srt.speculative import multi_layer_eagle_worker_v2 as module

    built: dict[str, str] = {}
    with emulate(platform), _context(resolution), contextlib.ExitStack() as stack:
        worker = _worker_shell("multi_layer_eagle_worker_v2", "MultiLayerEagleDraftWorker", resolution)
        worker.draft_runner_list = [draft_runner(resolution.server_args) for _ in range(worker.speculative_num_steps)]
        stack.enter_context(skipped_backend_init(worker.draft_runner_list[0].model_config.context_len))
        _enter_env(stack, env)
        stack.enter_context(mock.patch.object(module, "get_available_gpu_memory", lambda *a, **k: 0.0))
        for name in ("MultiLayerEagleMultiStepDraftExtendCudaGraphRunner",
                     "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner",
                     "MultiLayerEagleMultiStepDraftExtendNpuGraphRunner"):
            stack.enter_context(mock.patch.object(module, name, _Recorder(name, built, "draft_extend")))
        try:
            worker.init_attention_backend()
        except Exception as exc:
            return DraftGraphs(error=_error(exc))
        worker._capture_cuda_graphs()
        # Each phase's runner as the worker keeps it: the multi-layer worker has no draft-decode slot filled.
        slots = {"draft_decode": worker.cuda_graph_runner, "draft_extend": worker.cuda_graph_runner_for_draft_extend}
        return DraftGraphs(None, _class_name(worker.draft_extend_attn_backend_list[0]),
                           {phase: r.name for phase, r in slots.items() if isinstance(r, _Recorder)})


def frozen_kv_mtp_graphs(resolution: Resolution, platform: str) -> DraftGraphs:
    """``FrozenKVMTPDraftWorker._capture_cuda_graphs`` (frozen_kv_mtp_worker_v2.py): its one
    draft-loop graph runner."""
    from sglang.srt.speculative import frozen_kv_mtp_cuda_graph_runner as runners

    built: dict[str, str] = {}
    with emulate(platform), _context(resolution), contextlib.ExitStack() as stack:
        worker = _worker_shell("frozen_kv_mtp_worker_v2", "FrozenKVMTPDraftWorker", resolution)
        stack.enter_context(mock.patch.object(sys.modules["sglang.srt.speculative.frozen_kv_mtp_worker_v2"],
                                     "get_available_gpu_memory", lambda *a, **k: 0.0))
        stack.enter_context(mock.patch.object(runners, "FrozenKVMTPCudaGraphRunner",
                                     _Recorder("FrozenKVMTPCudaGraphRunner", built, "draft_decode")))
        worker._capture_cuda_graphs()
        return DraftGraphs(runners=dict(built))


class _DraftGraphSwitch:
    """Stands in for the draft ``TpModelWorker`` of DFLASH / DSPARK: records the decision its
    ``init_cuda_graphs(capture_decode_cuda_graph=...)`` receives (the worker's whole graph choice)."""

    def __init__(self, built: dict[str, str]) -> None:
        self.built = built

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool) -> None:
        if capture_decode_cuda_graph:
            self.built["draft"] = "draft model runner decode graph"


def _block_draft_shell(module: Any, class_name: str, available_gb: float, built: dict[str, str]) -> Any:
    """A DFLASH / DSPARK worker made by ``object.__new__`` with what ``init_cuda_graphs`` reads:
    the free GPU memory its tensor-parallel sync reports is ``available_gb`` (answered, not measured)."""
    worker = object.__new__(getattr(module, class_name))
    worker.device, worker.gpu_id, worker._target_tp_rank = "cuda", 0, 0
    worker.draft_parallel_layout = types.SimpleNamespace(tp_group=None, disable_cp=False)
    worker._tp_sync = types.SimpleNamespace(available_memory_gb=lambda *a, **k: available_gb)
    worker._maybe_build_draft_sampler = lambda: None  # a sampler head folded into the graph: not a graph decision
    worker._draft_sampler, worker.selector = None, None
    worker._draft_worker = _DraftGraphSwitch(built)
    return worker


def _out_of_tree(capture: bool, runners: Mapping[str, str | None], built: dict[str, str]) -> Any:
    """An out-of-tree SGLang platform: ``capabilities.graph_capture`` and, per phase, the runner
    class its ``get_speculative_graph_runner_cls(algorithm, phase)`` returns (a recorder)."""
    def runner_cls(algorithm: str, phase: str) -> Any:
        name = runners.get(phase)
        return _Recorder(name, built, phase) if name is not None else None

    return types.SimpleNamespace(is_out_of_tree=lambda: True, get_speculative_graph_runner_cls=runner_cls,
                                 capabilities=types.SimpleNamespace(graph_capture=capture))


def _graph_capture_platform(capture: bool) -> Any:
    """An out-of-tree SGLang platform that does (not) support device graph capture."""
    return types.SimpleNamespace(is_out_of_tree=lambda: True, capabilities=types.SimpleNamespace(graph_capture=capture))


def dflash_graphs(resolution: Resolution, platform: str, available_gb: float = 40.0,
                  out_of_tree_capture: bool | None = None) -> DraftGraphs:
    """``DFlashWorkerV2.init_cuda_graphs`` (dflash_worker_v2.py): whether the draft's block
    forward is captured. ``out_of_tree_capture``: run on an out-of-tree platform that does (not)
    capture graphs (``None``: the emulated in-tree one)."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative import dflash_worker_v2 as module

    built: dict[str, str] = {}
    with emulate(platform), _context(resolution), contextlib.ExitStack() as stack:
        worker = _block_draft_shell(module, "DFlashWorkerV2", available_gb, built)
        stack.enter_context(mock.patch.object(module, "draft_pp_context", contextlib.nullcontext))
        # The memory query is reduced over the TP group: one rank here (SGLang's own override API).
        stack.enter_context(get_parallel().override(tp_group=types.SimpleNamespace(world_size=get_parallel().tp_size, cpu_group=None)))
        if out_of_tree_capture is not None:
            stack.enter_context(mock.patch.object(module, "current_platform",
                                                  _graph_capture_platform(out_of_tree_capture)))
        worker.init_cuda_graphs()
    return DraftGraphs(runners=dict(built))


def dspark_graphs(resolution: Resolution, platform: str, available_gb: float = 40.0) -> DraftGraphs:
    """``DSparkWorkerV2.init_cuda_graphs`` (dspark_components/dspark_worker_v2.py): the draft's
    graph, on the last pipeline rank. ``_decode_graph_allowed`` is set by the worker's
    ``__init__`` from the resolved decode graph backend (and not a PD prefill server): the shell
    takes that from the resolution."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec
    from sglang.srt.speculative.dspark_components import dspark_worker_v2 as module

    built: dict[str, str] = {}
    with emulate(platform), _context(resolution), contextlib.ExitStack() as stack:
        worker = _block_draft_shell(module, "DSparkWorkerV2", available_gb, built)
        worker._hosts_draft, worker._draft_graph_group = True, None
        worker._decode_graph_allowed = get_exec().graph.cuda_graph_config.decode.backend != Backend.DISABLED
        worker._proposer = types.SimpleNamespace(attach_draft_sampler=lambda sampler: None)
        worker._verify_epilogue = None
        stack.enter_context(mock.patch.object(module, "draft_pp_context", contextlib.nullcontext))
        worker.init_cuda_graphs()
    return DraftGraphs(runners=dict(built))


def _uno_module() -> Any:
    """``speculative/uno_worker_v2.py``, imported with a stand-in ``flashinfer`` (its tree kernel
    module imports ``flashinfer.top_k`` unguarded). The stand-in is in ``sys.modules`` only
    during the import: SGLang's flashinfer probes elsewhere keep seeing no flashinfer."""
    import importlib

    name = "sglang.srt.speculative.uno_worker_v2"
    if name in sys.modules:
        return sys.modules[name]
    stand_in = types.ModuleType("flashinfer")
    stand_in.top_k = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("flashinfer stand-in"))  # type: ignore[attr-defined]
    with mock.patch.dict(sys.modules, {"flashinfer": stand_in}):
        module = importlib.import_module(name)
    return module


def uno_graphs(resolution: Resolution, platform: str) -> DraftGraphs:
    """``UnoWorkerV2.init_cuda_graphs`` (uno_worker_v2.py): its private tree-draft graph, built in
    tree mode when the target model runner has a decode graph runner. Tree mode is the resolved
    ``topk > 1`` (as ``UnoWorkerV2.__init__`` sets it); the target's runner exists when decode
    graphs are on (:func:`target_verify_graph`)."""
    from sglang.srt.runtime_context import get_spec

    module = _uno_module()
    built: dict[str, str] = {}
    target_graph = target_verify_graph(resolution, platform)
    with emulate(platform), _context(resolution), contextlib.ExitStack() as stack:
        worker = object.__new__(module.UnoWorkerV2)
        worker.tree_mode = int(get_spec().speculative_eagle_topk or 1) > 1
        worker.device, worker.gpu_id, worker.forward_width = "cuda", 0, int(get_spec().speculative_num_steps or 1) + 1
        worker.model_runner = types.SimpleNamespace(decode_cuda_graph_runner=object() if target_graph else None)
        worker._uno_draft_attn_backend = object()  # built by init_attention_backends in tree mode
        worker._bind_uno_draft_runtime = contextlib.nullcontext
        worker._additional_graph_memory_usage, worker._additional_graph_time_usage = {}, {}
        stack.enter_context(mock.patch.object(module, "get_available_gpu_memory", lambda *a, **k: 0.0))
        stack.enter_context(mock.patch.object(module, "UnoDecodeCudaGraphRunner",
                                              _Recorder("UnoDecodeCudaGraphRunner", built, "draft_decode")))
        worker.init_cuda_graphs()
    return DraftGraphs(runners=dict(built))


@contextlib.contextmanager
def _context(resolution: Resolution) -> Iterator[None]:
    from sglang.srt import runtime_context

    if not resolution.accepted:
        raise ValueError(f"resolution refused: {resolution.error}")
    with runtime_context.use_context(resolution.context):
        yield


def _enter_env(stack: contextlib.ExitStack, env: Mapping[str, str] | None) -> None:
    for name, value in (env or {}).items():
        stack.enter_context(_env(name, value))


# --- a grid case, executed --------------------------------------------------------------------

def engine_view(case: Case) -> View:
    """SGLang's own decision, executed."""
    resolution = resolve(case.args(), case.platform, case.model)
    if not resolution.accepted:
        return View(False, resolution.error or "", page_size=resolution.fields.get("page_size"))
    page = resolution.fields["page_size"]
    try:
        target_backend(resolution, case.platform)
    except Exception as exc:  # a backend creator's own check
        return View(False, f"target backend: {type(exc).__name__}: {exc}", page_size=page, roles=resolution.roles)
    if case.algorithm is None:  # no speculation: no speculative phase runs
        return View(True, page_size=page, roles=resolution.roles)
    if case.algorithm == "NGRAM":
        verify = target_verify_graph(resolution, case.platform)
        return View(True, page_size=page, roles=resolution.roles, runs=frozenset({"target_verify"}),
                    captured=frozenset({"target_verify"} if verify else ()))
    graphs = draft_graphs(resolution, case.platform, worker=WORKERS[case.algorithm])
    if graphs.error is not None:
        return View(False, graphs.error, page_size=page, roles=resolution.roles)
    runs = {"draft_extend", "target_verify"} | ({"draft_decode"} if graphs.draft_decode_backend else set())
    verify = target_verify_graph(resolution, case.platform)
    captured = graphs.captured | ({"target_verify"} if verify else set())
    return View(True, page_size=page, roles=resolution.roles, runs=frozenset(runs), captured=frozenset(captured),
                extra={"draft_decode_backend": graphs.draft_decode_backend,
                       "draft_extend_backend": graphs.draft_extend_backend, "runners": dict(graphs.runners)})
