"""SGLang's own objects, built on the CPU for one attnhal config and pool.

Everything here imports SGLang inside a function: ``import attnhal`` (and the catalogue)
never loads it. What is built is SGLang's real code — ``ReqToTokenPool``,
``MHATokenToKVPool``, ``RadixAttention``, the backend classes of the attention registry —
around a model-runner shim that carries only the fields those classes read (the shape of
the wheel's own ``sglang/test/kits/attention_unittest`` ``MockModelRunner``, written here).

SGLang reads its configuration from process-wide state (``get_context()``'s server
arguments, ``get_parallel()``): :func:`published` installs it once per distinct set of
values, since publishing a ``ServerArgs`` costs about 0.7 s.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from attnhal.backend import AttentionConfig, KVPool

__all__ = ["MISSING", "SGLANG_VERSION", "TRITON_KERNELS", "ServerFields", "backend_factory", "engine_reasons", "interpreter_reasons",
           "new_runner", "published", "radix_layer"]

#: The release the catalogue describes and the adapter was written against.
SGLANG_VERSION = "0.5.23"
#: What to install when SGLang is missing (tests/engines/setup.sh builds such an environment).
MISSING = (f"SGLang {SGLANG_VERSION} is not importable here: install it with its pure-Python dependencies "
           f"(pip install --no-deps sglang=={SGLANG_VERSION}, then tests/engines/requirements-sglang.txt; "
           "tests/engines/setup.sh sglang builds such an environment)")


def engine_reasons() -> list[str]:
    """Why SGLang's backends cannot be built in this process (empty: they can)."""
    if importlib.util.find_spec("sglang") is None:
        return [MISSING]
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("sglang")
    except PackageNotFoundError:  # importable from a source tree: trust it
        return []
    if found != SGLANG_VERSION:
        return [f"sglang=={found} is installed (supported: {SGLANG_VERSION}, the release the catalogue describes)"]
    return []


@dataclass(frozen=True)
class ServerFields:
    """The server arguments an attention backend reads at construction."""

    backend: str
    page_size: int = 1
    topk: int = 0
    num_steps: int = 0
    num_draft_tokens: int = 0

    def overrides(self) -> dict[str, Any]:
        from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig

        # Graphs "disabled" in the server arguments: the kit drives capture itself, through
        # the backend's own graph-state and metadata methods.
        off = PhaseConfig(backend=Backend.DISABLED)
        return dict(
            attention_backend=self.backend, page_size=self.page_size, chunked_prefill_size=-1,
            cuda_graph_config=CudaGraphConfig(decode=off, prefill=off), disable_radix_cache=False,
            dllm_algorithm=None, dllm_algorithm_config=None, dp_size=1, enable_deterministic_inference=False,
            enable_mis=False, is_embedding=False, kv_cache_dtype="auto", max_running_requests=None, pp_size=1,
            revision=None, speculative_algorithm="EAGLE" if self.num_steps else None,
            speculative_eagle_topk=self.topk, speculative_num_draft_tokens=self.num_draft_tokens,
            speculative_num_steps=self.num_steps, tp_size=1, triton_attention_num_kv_splits=8,
            triton_attention_split_tile_size=None)


_state: dict[str, Any] = {}


def published(fields: ServerFields) -> Any:
    """Make ``fields`` SGLang's current server arguments (and single-rank parallel state); returns them."""
    from sglang.srt.runtime_context import get_context, get_parallel

    if "parallel" not in _state:
        # Kept referenced: a dropped override would be restored whenever it is collected.
        _state["parallel"] = get_parallel().override(attn_tp_size=1, attn_dcp_rank=0)
        _state["parallel"].__enter__()
    if _state.get("fields") == fields:
        return _state["server_args"]
    if "override" in _state:
        _state.pop("override").restore()
    override = get_context().override_server_args(**fields.overrides())
    _state["server_args"] = override.install()
    _state["override"], _state["fields"] = override, fields
    return _state["server_args"]


class _ModelConfig:
    """The model-config fields SGLang's attention backends read, for one attnhal config."""

    def __init__(self, config: AttentionConfig, context_len: int) -> None:
        from sglang.srt.configs.model_config import AttentionArch

        h, kv, d = config.num_q_heads, config.num_kv_heads, config.head_size
        self.attention_arch = AttentionArch.MHA
        self.context_len = context_len
        self.hidden_size = h * d
        self.num_attention_heads, self.num_key_value_heads = h, kv
        self.head_dim, self.v_head_dim, self.swa_v_head_dim = d, config.out_head_size, config.out_head_size
        self.is_encoder_decoder = self.is_multimodal = self.model_is_mrope = False
        self.is_generation = True
        self.quantization = None
        self.is_hybrid_swa = self.is_local_attention_model = False
        self.attention_chunk_size = self.sliding_window_size = None
        hf = SimpleNamespace(architectures=["AttnhalKitForCausalLM"], hidden_size=h * d, num_attention_heads=h,
                             num_key_value_heads=kv, head_dim=d)
        hf.get_text_config = lambda: hf
        self.hf_config = self.hf_text_config = hf
        self.linear_attn_registry_result = None

    def get_num_attention_heads(self, tp_size: int) -> int:
        return self.num_attention_heads // tp_size

    def get_max_num_attention_heads(self) -> int:
        return self.num_attention_heads

    def get_num_kv_heads(self, tp_size: int, dcp_size: int = 1) -> int:
        return self.num_key_value_heads // (tp_size // dcp_size)


def new_runner(fields: ServerFields, config: AttentionConfig, pool: KVPool, context_len: int,
               num_tokens_per_req: int, max_requests: int = 0) -> Any:
    """A model-runner shim with SGLang's real pools; its KV buffers *are* ``pool``'s tensors.

    ``req_to_token`` is the runner's own table of ``context_len`` positions per row (SGLang's
    layout: one slot per token), filled from ``pool``'s page table by the adapter. It has at
    least ``max_requests`` rows: SGLang sizes per-request metadata by it (a graph's batch size
    never exceeds the running requests).
    """
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    server_args = published(fields)

    class KitModelRunner(ModelRunner):
        # The model-kind probes a backend's __init__ makes: a dense model has none.
        hybrid_gdn_config = hybrid_lightning_config = kimi_linear_config = None
        linear_attn_model_spec = mamba2_config = mambaish_config = None

        def __init__(self) -> None:  # noqa: D401 - the shim sets only what the backends read
            rows = max(pool.req_to_page.shape[0], max_requests)
            self.device, self.dtype = "cpu" if pool.device.type == "cpu" else str(pool.device), config.dtype
            self.kv_cache_dtype, self.kv_cache_dtype_str = pool.dtype, "auto"
            self.prefill_attention_backend_str = self.decode_attention_backend_str = fields.backend
            self.draft_attention_backend = None
            self.gpu_id, self.canary_manager, self.page_size = 0, None, pool.page_size
            self.model_config = _ModelConfig(config, context_len)
            self.is_draft_worker = False
            self.max_running_requests = rows
            self.model = torch.nn.Module()
            self.spec_algorithm = SpeculativeAlgorithm.EAGLE if fields.num_steps else SpeculativeAlgorithm.NONE
            self._kernel_warmed_up = True
            self.server_args = server_args
            self.req_to_token_pool = ReqToTokenPool(size=rows, max_context_len=context_len, device=self.device,
                                                    enable_memory_saver=False)
            self.token_to_kv_pool = _shared_kv_pool(MHATokenToKVPool, pool, self.device)
            self.token_to_kv_pool_allocator = SimpleNamespace(page_size=pool.page_size,
                                                              get_kvcache=lambda: self.token_to_kv_pool)
            self.init_kv_index_translator()
            self.attention_chunk_size = self.hisparse_coordinator = None
            self.init_new_workspace = self.is_hybrid_swa = self.use_mla_backend = False
            self.sliding_window_size = None

        def decode_num_tokens_per_req(self, *, num_draft_tokens: int | None = None) -> int:
            return num_tokens_per_req

    return KitModelRunner()


def _shared_kv_pool(cls: type, pool: KVPool, device: str) -> Any:
    """SGLang's ``MHATokenToKVPool`` over ``pool``'s own K/V tensors: what one writes, the other reads.

    The pool takes them where it would allocate its zeroed buffers (``_create_buffers_normal``),
    so that it builds the pointer tables its copy kernels read from the shared tensors, and
    never zeroes a buffer of its own first (the kit's far pool, past 2^31 elements, is 8 GiB:
    zeroing SGLang's copy of it took 10-17 s of each run).
    """

    class SharedKVPool(cls):
        def _create_buffers_normal(self) -> None:
            self.k_buffer, self.v_buffer = list(pool.k), list(pool.v)

    kv = SharedKVPool(size=pool.num_slots, page_size=pool.page_size, dtype=pool.dtype, head_num=pool.num_kv_heads,
                      head_dim=pool.head_dim, v_head_dim=pool.v_head_dim, layer_num=pool.num_layers, device=device,
                      enable_memory_saver=False, enable_alt_stream=False)
    if kv.k_buffer[0] is not pool.k[0]:  # an SGLang that allocates elsewhere would leave the kit's pool unread
        raise RuntimeError(f"{cls.__name__} did not take the kit's K/V tensors through _create_buffers_normal "
                           "(attnhal_sglang.kit.runtime supports the SGLang release of its tier)")
    return kv


def radix_layer(config: AttentionConfig, layer: int) -> Any:
    """SGLang's ``RadixAttention`` of layer ``layer`` of ``config``."""
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention(num_heads=config.num_q_heads, head_dim=config.head_size, scaling=config.sm_scale,
                          num_kv_heads=config.num_kv_heads, layer_id=layer, v_head_dim=config.out_head_size)


#: SGLang backends whose kernels are Triton kernels (on the CPU: the interpreter runs them).
TRITON_KERNELS = frozenset({"triton"})


def interpreter_reasons(backend: str, device: torch.device | str) -> list[str]:
    """Why SGLang's Triton kernels cannot run on ``device`` in this process."""
    if backend not in TRITON_KERNELS or torch.device(device).type != "cpu":
        return []
    if os.environ.get("TRITON_INTERPRET") != "1":
        return ["sglang:triton on the CPU runs under the Triton interpreter: set TRITON_INTERPRET=1 at process "
                "start (before SGLang's kernels are defined, at import)"]
    if importlib.util.find_spec("triton") is None:
        return ["module triton is not installed"]
    return []


def backend_factory(name: str) -> Mapping[str, Any]:
    """SGLang's classes for catalogue backend ``name``: the single-step class and the multi-step one."""
    from sglang.srt.layers.attention import torch_native_backend, triton_backend

    table = {"torch_native": {"single": torch_native_backend.TorchNativeAttnBackend, "multi_step": None},
             "triton": {"single": triton_backend.TritonAttnBackend,
                        "multi_step": triton_backend.TritonMultiStepDraftBackend}}
    return table[name]
