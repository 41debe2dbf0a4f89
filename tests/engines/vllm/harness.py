"""vLLM's own code (0.33.0 or 0.34.0, whichever the tier's environment has), executed on a
CPU-only machine: engine config, backend graph support, graph mode.

Functions take plain inputs and import vLLM inside, so they can move into attnhal's engines
package. ``VLLM_TARGET_DEVICE=cpu`` must be set before vLLM is imported (the tier's conftest).

- :func:`engine_config`: ``EngineArgs(...).create_engine_config()`` on a local model config
  (no weights). The CPU platform forces ``cudagraph_mode=NONE`` and its own compilation
  mode; the compilation config is then replaced by a real ``CompilationConfig`` (vLLM's GPU
  default or the requested mode, ``VLLM_COMPILE``) with its splitting ops and capture sizes
  set by vLLM's own methods, as on a GPU.
- :func:`selected_runner`: the model runner vLLM selects (0.33's own ``use_v2_model_runner``, with
  Triton importable as on a GPU machine and ``VLLM_USE_V2_MODEL_RUNNER`` as the case sets it; V2 on 0.34).
- :func:`resolve`: the real builder's ``get_cudagraph_support`` and, on the V1 runner (0.33),
  ``GPUModelRunner._check_and_update_cudagraph_mode`` (which calls
  ``CompilationConfig.resolve_cudagraph_mode_and_sizes``) on an emulated SM90/SM100, with a
  runner made by ``object.__new__`` and the graph dispatcher replaced by a recorder; on the V2
  runner (0.33's default, 0.34's only) what it runs (0.34: ``v1/worker/gpu/model_runner.py:724-829``):
  ``attn_utils.get_attn_cg_support`` over the model's one attention group,
  ``resolve_cudagraph_mode_and_sizes`` with piecewise capture available (a compiled model),
  and the drafter's ``TargetDependentARSpeculator.init_cudagraph_manager`` (draft prefill and
  draft decode managers) with its graph manager replaced by a recorder. vLLM 0.34's CPU platform refuses a config without a Triton driver
  (``platforms/cpu.py:241-243``): its flag is set while the config is built.
  FlashInfer's cubin check (``has_nvidia_artifactory``) answers "no cubins" instead of
  making an HTTP request: the environment of this resolution has no trtllm-gen cubins.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

MODELS = Path(__file__).resolve().parents[1] / "models"
#: The vLLM releases the harness executes -> whether the release has only the V2 model runner
#: (0.33 has both and selects one: :func:`selected_runner`).
V2_RUNNER = {"0.33.0": False, "0.34.0": True}


def release() -> str:
    """The installed vLLM release (one of :data:`V2_RUNNER`)."""
    from importlib.metadata import version

    found = version("vllm")
    if found not in V2_RUNNER:
        raise RuntimeError(f"vllm=={found} is installed (supported: {', '.join(V2_RUNNER)})")
    return found
CAPABILITIES = {"cuda:sm90": (9, 0), "cuda:sm100": (10, 0)}
#: Catalogued CUDA backends whose builder vLLM cannot import on a CPU-only machine, and why:
#: their graph support is not checked here (the catalogue's citation stands alone). A failed
#: import can leave a module half-imported that a second attempt then finds: the tier's tests
#: never ask for these (test_vllm_executed checks that they still fail).
NOT_REACHED = {
    "FLASH_ATTN": "vllm.vllm_flash_attn (compiled FA2/FA3 extension) decides the FA version and the level",
    "FLASH_ATTN_DIFFKV": "imports vllm.vllm_flash_attn's kernels",
    "FLASH_ATTN_MLA": "imports vllm.vllm_flash_attn's kernels",
    "FLASH_ATTN_MLA_SPARSE": "imports vllm.vllm_flash_attn's kernels",
    "TURBOQUANT": "imports vllm.vllm_flash_attn's kernels",
    "CUTLASS_MLA": "queries the CUDA device at import",
}



def _clear_caches() -> None:
    """vLLM caches capability-dependent answers (functools.cache): cleared when the platform changes."""
    import sys

    for name in ("vllm.utils.flashinfer", "vllm.v1.attention.backends.fa_utils",
                 "vllm.v1.attention.backends.flashinfer"):
        module = sys.modules.get(name)
        for value in vars(module).values() if module else ():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


@contextlib.contextmanager
def emulate(platform: str) -> Iterator[None]:
    """vLLM's platform answers as on a CUDA GPU of ``platform`` (``cuda:sm90`` | ``cuda:sm100``)."""
    import sys

    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    if platform not in CAPABILITIES:
        raise ValueError(f"platform={platform!r} (supported: {', '.join(CAPABILITIES)})")
    major, minor = CAPABILITIES[platform]
    cls = type(current_platform)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(cls, "get_device_capability",
                                     classmethod(lambda c, device_id=0: DeviceCapability(major, minor))))
        stack.enter_context(mock.patch.object(cls, "is_cuda", lambda self: True))
        stack.enter_context(mock.patch.object(cls, "is_cuda_alike", lambda self: True))
        stack.enter_context(mock.patch.object(cls, "is_cpu", lambda self: False))
        for name, module in list(sys.modules.items()):
            if name.startswith("vllm") and getattr(module, "has_nvidia_artifactory", None) is not None:
                stack.enter_context(mock.patch.object(module, "has_nvidia_artifactory", lambda: False))
        _clear_caches()
        try:
            yield
        finally:
            _clear_caches()


def _cpu_config_check() -> Any:
    """vLLM 0.34: its CPU platform's Triton-driver check passes (there is no GPU either way)."""
    if not V2_RUNNER[release()]:
        return contextlib.nullcontext()
    return mock.patch("vllm.triton_utils.HAS_TRITON", True)


def model_dir(model: str) -> str:
    path = MODELS / model
    if not (path / "config.json").is_file():
        raise ValueError(f"model={model!r} (supported: {', '.join(sorted(p.name for p in MODELS.iterdir()))})")
    return str(path)


def default_cudagraph_mode() -> str:
    """vLLM's GPU default ``cudagraph_mode``: the one of its default optimization level."""
    from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG
    from vllm.engine.arg_utils import EngineArgs

    level = EngineArgs.optimization_level
    return OPTIMIZATION_LEVEL_TO_CONFIG[level]["compilation_config"]["cudagraph_mode"].name


def engine_config(backend: str, model: str, speculative: Mapping[str, Any] | None = None,
                  cudagraph_mode: str | None = None) -> Any:
    """``EngineArgs(...).create_engine_config()``, with the GPU compilation config put back."""
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=model_dir(model), skip_tokenizer_init=True, attention_backend=backend,
                      speculative_config=dict(speculative) if speculative else None, max_model_len=4096)
    with _cpu_config_check():
        config = args.create_engine_config()
    mode = CUDAGraphMode[cudagraph_mode or default_cudagraph_mode()]
    compilation = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=mode)
    compilation.set_splitting_ops_for_v1(all2all_backend=config.parallel_config.all2all_backend)
    config.compilation_config = compilation
    config._set_cudagraph_sizes()
    return config


@dataclass(frozen=True)
class Resolution:
    """What vLLM resolved: the backend's support level, the graph mode, the capture sizes, or its error."""

    support: str | None = None  # AttentionCGSupport name
    mode: str | None = None  # CUDAGraphMode name
    capture_sizes: tuple[int, ...] = ()
    error: str | None = None
    dispatcher_modes: tuple[str, ...] = field(default_factory=tuple)
    drafter: str | None = None  # the drafter's draft-decode CUDAGraphMode name (None: no drafter)
    runner: str = "V2"  # the model runner vLLM selected (V1 or V2)
    draft_extend: str | None = None  # whether the drafter's prefill runs its attention in a graph (captured/eager)


def kv_cache_spec(config: Any) -> Any:
    """The KV-cache spec of the model's attention layers (full attention; MLA for an MLA model)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    model = config.model_config
    heads = model.get_num_kv_heads(config.parallel_config)
    size = model.get_head_size()
    block = config.cache_config.block_size or 16
    if model.use_mla:
        return MLAAttentionSpec(block_size=block, num_kv_heads=1, head_size=size, dtype=torch.bfloat16)
    return FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=size, dtype=torch.bfloat16)


#: vLLM's switch between its model runners (0.33; 0.34 has V2 only).
RUNNER_VAR = "VLLM_USE_V2_MODEL_RUNNER"


def selected_runner(config: Any, runner_env: str | None = None) -> str:
    """The runner vLLM selects for ``config`` on a GPU machine with Triton: 0.33's own
    ``VllmConfig.use_v2_model_runner`` (config/vllm.py:731-767) executed with ``VLLM_USE_V2_MODEL_RUNNER``
    set to ``runner_env`` (None: unset) and Triton importable; 0.34 has no V1 runner."""
    import os

    if V2_RUNNER[release()]:
        return "V2"
    env = {RUNNER_VAR: runner_env} if runner_env is not None else {}
    with mock.patch.dict(os.environ, env), mock.patch("vllm.config.vllm.HAS_TRITON", True):
        if runner_env is None:
            os.environ.pop(RUNNER_VAR, None)
        return "V2" if config.use_v2_model_runner else "V1"


def resolve(config: Any, backend: str, platform: str, runner_env: str | None = None) -> Resolution:
    """The builder's support level and the graph mode the installed vLLM resolves on ``platform``,
    on the runner it selects (:func:`selected_runner`)."""
    if selected_runner(config, runner_env) == "V2":
        return _resolve_v2(config, backend, platform)
    return _resolve_v1(config, backend, platform)


def _resolve_v1(config: Any, backend: str, platform: str) -> Resolution:
    """vLLM 0.33: ``GPUModelRunner._check_and_update_cudagraph_mode``."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm.config import set_current_vllm_config

    with emulate(platform), set_current_vllm_config(config):
        backend_cls = AttentionBackendEnum[backend].get_class()
        spec = kv_cache_spec(config)
        support = backend_cls.get_builder_cls().get_cudagraph_support(config, spec).name
        recorded: list[str] = []
        runner = object.__new__(GPUModelRunner)
        speculative = config.speculative_config
        runner.vllm_config, runner.compilation_config = config, config.compilation_config
        runner.uniform_decode_query_len = 1 + (speculative.num_speculative_tokens if speculative else 0)
        runner.kv_cache_config, runner.max_num_reqs = None, config.scheduler_config.max_num_seqs
        runner.speculative_config = speculative
        runner.cudagraph_dispatcher = types.SimpleNamespace(
            initialize_cudagraph_keys=lambda mode, query_len: recorded.append(mode.name))
        drafted: list[str] = []
        runner.drafter = _drafter_probe_v1(speculative, drafted)
        try:
            runner._check_and_update_cudagraph_mode([{backend_cls}], [KVCacheGroupSpec(["layer"], spec)])
        except ValueError as exc:
            return Resolution(support=support, error=f"ValueError: {exc}")
        mode = config.compilation_config.cudagraph_mode
        drafter = drafted[-1] if drafted else None
        # V1's drafter runs every draft forward (decode and prefill) in the one mode its dispatcher has.
        extend = None if drafter is None else "captured" if drafter.startswith("FULL") else "eager"
        return Resolution(support=support, mode=recorded[-1] if recorded else mode.name,
                          capture_sizes=tuple(config.compilation_config.cudagraph_capture_sizes or ()),
                          dispatcher_modes=tuple(recorded), drafter=drafter, runner="V1", draft_extend=extend)


def _drafter_probe_v1(speculative: Any, drafted: list[str]) -> Any:
    """vLLM 0.33's drafter for the runner's mode check: an ``EagleProposer`` made by ``object.__new__``
    (the class the runner asserts; draft models share its ``initialize_cudagraph_keys``,
    ``v1/spec_decode/llm_base_proposer.py:420-435``) whose dispatcher records the mode it is given.
    ``None`` where the runner sets up no drafter graphs (no speculation, n-gram)."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    if speculative is None or not (speculative.use_eagle() or speculative.uses_draft_model()):
        return None
    drafter = object.__new__(EagleProposer)
    drafter.speculative_config = speculative
    dispatcher = types.SimpleNamespace(cudagraph_mode=None)

    def keys(mode: Any, *args: Any) -> None:
        drafted.append(mode.name)
        dispatcher.cudagraph_mode = mode  # what the real dispatcher keeps (v1/cudagraph_dispatcher.py:169)

    dispatcher.initialize_cudagraph_keys = keys
    drafter.cudagraph_dispatcher = dispatcher
    return drafter


#: Compute capabilities the arch check is executed on (``DeviceCapability(major, minor)``).
ARCH_CHECKED = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))


@contextlib.contextmanager
def _capability(major: int, minor: int) -> Iterator[None]:
    """vLLM's platform reports ``major.minor`` (the rest of :func:`emulate` applies)."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    with mock.patch.object(type(current_platform), "get_device_capability",
                           classmethod(lambda c, device_id=0: DeviceCapability(major, minor))):
        yield


def arch_refusals(backend: str, model: str) -> dict[tuple[int, int], str | None]:
    """Per capability of :data:`ARCH_CHECKED`, why vLLM's backend selection refuses ``backend`` for
    its arch (``None``: it does not): the class's ``supports_compute_capability`` (what
    ``validate_configuration`` asks, v1/attention/backend.py:328-329), then its
    ``supports_combination`` where that answer depends on the device (FlashMLA's dense kernels
    ask for Hopper there). The compiled FlashMLA extension is absent here: it is assumed built,
    as on a GPU; a combination answer that is the same on every capability is not about the arch."""
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm.config import set_current_vllm_config

    config = engine_config(backend, model)
    # Imported as the CPU platform: under emulation its modules would import the CUDA-only
    # vllm_flash_attn and fail, half-imported, for every later import too.
    cls = AttentionBackendEnum[backend].get_class()
    with emulate("cuda:sm90"), set_current_vllm_config(config), \
            mock.patch("vllm.v1.attention.ops.flashmla._is_flashmla_available", lambda: (True, None)):
        capability, combination = {}, {}
        for major, minor in ARCH_CHECKED:
            cap = DeviceCapability(major, minor)
            with _capability(major, minor):
                capability[(major, minor)] = cls.supports_compute_capability(cap)
                try:
                    combination[(major, minor)] = cls.supports_combination(
                        config.model_config.get_head_size(), torch.bfloat16, None, None, model == "mla", False,
                        cls.is_sparse(), False, cap)
                except ImportError as exc:  # a kernel package absent here (b12x: cuda-python): not checked
                    combination[(major, minor)] = f"not checked here: {exc}"
    by_arch = len(set(combination.values())) > 1
    return {cap: "compute capability not supported" if not capability[cap]
            else combination[cap] if by_arch else None for cap in ARCH_CHECKED}


def _resolve_v2(config: Any, backend: str, platform: str) -> Resolution:
    """The V2 runner's steps (0.34: ``v1/worker/gpu/model_runner.py:724-829``; 0.33: 745-792) on one
    attention group."""
    import types as _types

    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.gpu import attn_utils

    with emulate(platform), set_current_vllm_config(config):
        backend_cls = AttentionBackendEnum[backend].get_class()
        spec = kv_cache_spec(config)
        builder = backend_cls.get_builder_cls()
        group = _types.SimpleNamespace(backend=backend_cls, kv_cache_spec=spec, layer_names=["layer"],
                                       get_metadata_builder=lambda index=0: builder)
        info = attn_utils.get_attn_cg_support([[group]], config)
        support = builder.get_cudagraph_support(config, spec).name
        speculative = config.speculative_config
        query_len = 1 + (speculative.num_speculative_tokens if speculative else 0)
        compilation = config.compilation_config
        try:
            # 0.33's V2 runner says which runner calls (model_runner.py:756-765); 0.34 has one runner.
            which = {} if V2_RUNNER[release()] else {"use_v2_model_runner": True}
            mode = compilation.resolve_cudagraph_mode_and_sizes(
                info.min_cg_support, info.min_cg_attn_backend, query_len, kv_cache_config=None,
                max_num_reqs=config.scheduler_config.max_num_seqs, piecewise_capture_available=True, **which)
        except ValueError as exc:
            return Resolution(support=support, error=f"ValueError: {exc}")
        autoregressive = speculative is not None and speculative.method not in NOT_AUTOREGRESSIVE
        drafter, extend = _drafter_modes(config, mode) if autoregressive else (None, None)
        return Resolution(support=support, mode=mode.name,
                          capture_sizes=tuple(compilation.cudagraph_capture_sizes or ()), drafter=drafter,
                          runner="V2", draft_extend=extend)


#: Speculative methods without an autoregressive draft model (no draft decodes to capture).
NOT_AUTOREGRESSIVE = ("ngram", "ngram_gpu", "suffix")


def _drafter_modes(config: Any, mode: Any) -> tuple[str, str]:
    """The V2 EAGLE/MTP drafter's graph managers for the target's ``mode``: its own
    ``TargetDependentARSpeculator.init_cudagraph_manager`` (0.33: spec_decode/target_dependent_ar/
    speculator.py:89-107; 0.34: 42-53, then autoregressive/speculator.py:36-52) on a speculator made
    by ``object.__new__``, the graph manager replaced by a recorder. Returns the draft-decode mode's
    name and whether the draft prefill (attnhal's draft extend) runs its uniform batches in a FULL
    graph ("captured": the prefill manager's decode mode is FULL) or not ("eager")."""
    import importlib

    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar import speculator

    probe = type("Probe", (speculator.TargetDependentARSpeculator,), {})
    probe.__abstractmethods__ = frozenset()  # type: ignore[attr-defined]
    drafter = object.__new__(probe)
    drafter.vllm_config, drafter.device, drafter.max_num_reqs = config, "cpu", config.scheduler_config.max_num_seqs
    drafter.num_speculative_steps = config.speculative_config.num_speculative_tokens
    drafter.enable_adaptive_verification = False
    recorded: list[Any] = []

    def manager(vllm_config: Any, device: Any, cg_mode: Any, *args: Any, **kwargs: Any) -> Any:
        recorded.append(cg_mode)
        return types.SimpleNamespace(cudagraph_mode=cg_mode)  # what the plugin reads of a manager

    modules = [speculator]
    if V2_RUNNER[release()]:
        modules.append(importlib.import_module("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator"))
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(mock.patch.object(module, "SpeculatorCudaGraphManager", manager))
        drafter.init_cudagraph_manager(mode)
    prefill, decode = recorded[0], recorded[-1]
    return decode.name, "captured" if prefill.decode_mode() == CUDAGraphMode.FULL else "eager"
