"""Stand-ins for the few engine utilities the peers' kernel files import (written here, not copied).

SGLang's ``decode_attention.py`` and vLLM's ``triton_unified_attention.py`` are plain
Triton files, but they import a handful of helpers from their engines (environment
flags, a logger, "is this HIP", the core count, the platform's fp8 dtype). When the
engines are not installed, :func:`install` puts these modules into ``sys.modules``
under the engines' names, each answering from attnhal's platform facts, so the kernel
files load unchanged from the cache. A helper the kernels call that is missing here
fails loudly with an ``AttributeError`` (the loader reports the peer "not available").

Only the benchmark process sees them: importing a real engine afterwards in the same
process would find these modules instead.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch
from peer_cases import fp8_storage

from attnhal.platform import detect

__all__ = ["DEEPSEEK_CONTEXT", "install", "sglang_max_kv_splits", "sglang_mla_max_kv_splits"]


def _vendor() -> str:
    return detect().vendor.value


def _arch() -> str:
    return detect().arch


def _core_count(device_id: int = 0) -> int:
    """Streaming multiprocessors / compute units, 0 without a device (SGLang's convention)."""
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.get_device_properties(device_id).multi_processor_count)


def sglang_max_kv_splits() -> int:
    """SGLang's default ``--triton-attention-num-kv-splits``: 8, and 16 on AMD (its platform hook)."""
    return 16 if _vendor() == "hip" else 8


#: DeepSeek V3/R1's ``max_position_embeddings``: the model context SGLang sizes MLA splits by.
DEEPSEEK_CONTEXT = 163_840


def sglang_mla_max_kv_splits(context_len: int = DEEPSEEK_CONTEXT) -> int:
    """SGLang 0.5.23's ``max_kv_splits`` for an MLA model on its Triton backend
    (``triton_backend._mla_decode_kv_splits_cap``): the flag's value raised to the device's
    core count and the model's context in 32-position blocks, each rounded up to a power of
    two, whichever is smaller; 256 at most on gfx942. The flag's value without a device."""
    base, cores = sglang_max_kv_splits(), _core_count()
    if cores <= 0:
        return base
    cap = max(base, min(1 << (cores - 1).bit_length(), 1 << (-(-context_len // 32) - 1).bit_length()))
    return min(cap, 256) if _arch() == "gfx942" else cap


class _Flag:
    """An SGLang ``EnvBool``/``EnvFloat``: ``.get()`` reads the variable, else the engine's default."""

    def __init__(self, name: str, default: bool | float) -> None:
        self.name, self.default = name, default

    def get(self) -> bool | float:
        text = os.environ.get(self.name)
        if text is None:
            return self.default
        if isinstance(self.default, bool):
            return text.lower() in ("1", "true", "yes", "on")
        return float(text)


class _OnceLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """vLLM's logger: ``debug_once``/``info_once``/``warning_once`` log a message once."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.getLogger(name), {})
        self._seen: set[tuple[str, str]] = set()

    def _once(self, level: str, msg: str, *args: object) -> None:
        if (level, msg) not in self._seen:
            self._seen.add((level, msg))
            getattr(self, level)(msg, *args)

    def debug_once(self, msg: str, *args: object, **_: object) -> None:
        self._once("debug", msg, *args)

    def info_once(self, msg: str, *args: object, **_: object) -> None:
        self._once("info", msg, *args)

    def warning_once(self, msg: str, *args: object, **_: object) -> None:
        self._once("warning", msg, *args)


class _VllmPlatform:
    """The questions ``triton_unified_attention.py`` and ``triton_decode_attention.py`` (TRITON_MLA's
    kernel) ask ``current_platform``."""

    @staticmethod
    def is_rocm() -> bool:
        return _vendor() == "hip"

    @staticmethod
    def fp8_dtype() -> torch.dtype:
        return fp8_storage()

    @staticmethod
    def is_device_capability_family(major: int) -> bool:
        return detect().arch_family == f"sm{major}"


class KVQuantMode(enum.IntEnum):
    """vLLM 0.33's ``vllm.v1.kv_cache_interface.KVQuantMode`` values the kernel dispatches on."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


def _runtime_context_unpublished() -> None:
    # SGLang's kernel asks for the exec config only on its MLA path and treats
    # ValueError as "not published yet": no config, no forced splits.
    raise ValueError("no SGLang runtime context in the benchmark process")


def _module(name: str, path: Path | None = None, **attrs: object) -> types.ModuleType:
    """A module (a package searching ``path`` when given) registered in ``sys.modules``."""
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = [str(path)]
    module.__dict__.update(attrs)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


def _packages(root: Path, names: tuple[str, ...]) -> None:
    """Package modules whose ``__path__`` is the cache folder (their ``__init__`` is not run)."""
    for name in names:
        _module(name, root.joinpath(*name.split(".")))


def _sglang(root: Path) -> None:
    _packages(root, ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention"))
    _module("sglang.srt", root / "sglang" / "srt")
    # SGLang 0.5.23's defaults of the flags its decode and extend kernels read.
    flags = {"SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": False, "SGLANG_MLA_DECODE_TUNE": False,
             "SGLANG_FORCE_LEAN_GRID_CU_MULT": 1.0, "SGLANG_DISABLE_LEAN_ATTENTION": False,
             "SGLANG_TRITON_FP8_PREFILL_ATTN": True, "SGLANG_TRITON_COMPACT_EXTEND_ATTENTION": True}
    _module("sglang.srt.environ", envs=types.SimpleNamespace(**{k: _Flag(k, v) for k, v in flags.items()}))
    _module("sglang.srt.utils", get_device_core_count=_core_count, is_hip=lambda: _vendor() == "hip",
            is_cuda=lambda: _vendor() == "cuda",
            is_gfx95_supported=lambda: _arch().startswith("gfx95"),
            is_gfx1250_supported=lambda: _arch() == "gfx1250")
    _module("sglang.srt.runtime_context", get_exec=_runtime_context_unpublished)


def _vllm(root: Path) -> None:
    import triton
    import triton.language as tl

    _packages(root, ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops"))
    _module("vllm.envs", VLLM_BATCH_INVARIANT=os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0"))
    _module("vllm.logger", init_logger=_OnceLogger)
    _module("vllm.platforms", current_platform=_VllmPlatform())
    _module("vllm.triton_utils", triton=triton, tl=tl)
    _module("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode)


INSTALLERS: dict[str, Callable[[Path], None]] = {"sglang": _sglang, "vllm": _vllm}


def install(engine: str, root: Path) -> None:
    """Register ``engine``'s stand-ins, with its packages searching the cache folder ``root``."""
    INSTALLERS[engine](root)
