"""vLLM's own backend choice without ``--attention-backend``, executed, against
:func:`attnhal_vllm.selection.select`.

vLLM's CUDA platform module (``platforms/cuda.py``) imports its compiled kernels at the top; here
that one import is stood in for, and the module's own ``_get_backend_priorities`` and each
backend's ``validate_configuration`` run with the selector config vLLM builds (head size, dtype,
``auto`` KV cache, no block size, MLA or not), under the tier's emulated capability and the tier
model's config (FlashInfer MLA reads ``qk_nope_head_dim`` from it). Per capability x model shape:
the priority list is attnhal's, every verdict of a backend that imports here is attnhal's, and
attnhal's pick is the first valid one (a backend that cannot be imported here,
``harness.NOT_REACHED``, counts with attnhal's verdict, and the run says how many did).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from unittest import mock

import pytest

import harness
from tier_summary import LINES as SUMMARY
from attnhal.platform import as_platform
from attnhal_vllm.selection import ModelShape, priorities, reasons, select

CAPABILITIES = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0))
#: Backends whose module imports ``vllm.vllm_flash_attn`` (absent here) besides those of NOT_REACHED.
UNREACHED = {*harness.NOT_REACHED, "FLASH_ATTN_MLA_SPARSE_FA4"}
#: (tier model, head size, query heads): the tier's own configs, and MHA head sizes around vLLM's limits.
SHAPES = (("mha", 32, 8), ("mha", 64, 32), ("mha", 128, 32), ("mha", 96, 32), ("mha", 24, 8), ("mha", 512, 8),
          ("mla", 576, 16))
NOT_EXECUTED: set[str] = set()


@contextlib.contextmanager
def _cuda_module() -> Iterator[types.ModuleType]:
    """``vllm.platforms.cuda`` imported with its compiled-kernel import (``vllm._C_stable_libtorch``,
    platforms/cuda.py:23) stood in for: nothing of it is called by the selection."""
    with mock.patch.dict(sys.modules, {"vllm._C_stable_libtorch": types.ModuleType("vllm._C_stable_libtorch")}):
        import vllm.platforms.cuda as cuda

        yield cuda


def _shape(model: str, head: int, heads: int) -> ModelShape:
    qk_nope = 128 if model == "mla" else None  # tests/engines/models/mla/config.json
    return ModelShape(model == "mla", head, heads, qk_nope_head_dim=qk_nope)


def _executed(model: str, head: int, heads: int, major: int, minor: int) -> list[tuple[str, tuple[str, ...] | None]]:
    """vLLM's list and each backend's reasons (None: it cannot be imported here)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    config = harness.engine_config("TRITON_MLA" if model == "mla" else "TRITON_ATTN", model)
    capability = DeviceCapability(major, minor)
    selector = AttentionSelectorConfig(head_size=head, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None,
                                       use_mla=model == "mla")
    out: list[tuple[str, tuple[str, ...] | None]] = []
    with _cuda_module() as cuda:
        listed = cuda._get_backend_priorities(model == "mla", capability, heads, "auto", False, head, False)
    # Imported as the CPU platform (as harness.arch_refusals does): under emulation their modules would
    # import the CUDA-only vllm_flash_attn.
    classes = {b.name: b.get_class() for b in listed if b.name not in UNREACHED}
    with harness.emulate("cuda:sm90"), harness._capability(major, minor), set_current_vllm_config(config), \
            mock.patch("vllm.v1.attention.ops.flashmla._is_flashmla_available", lambda: (True, None)):
        for backend in listed:
            if backend.name not in classes:
                out.append((backend.name, None))
                continue
            found = classes[backend.name].validate_configuration(device_capability=capability, **selector._asdict())
            out.append((backend.name, tuple(found)))
    return out


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-head{s[1]}")
def test_vllms_default_backend_is_attnhals(capability: tuple[int, int], shape: tuple[str, int, int]) -> None:
    model, head, heads = shape
    major, minor = capability
    platform = as_platform(f"cuda:sm{major}{minor}")
    ours = _shape(model, head, heads)
    executed = _executed(model, head, heads, major, minor)
    assert [name for name, _ in executed] == list(priorities(major, ours)), executed
    first = None
    for name, found in executed:
        mine = reasons(name, platform, ours)
        if found is None:
            NOT_EXECUTED.add(name)
            found = mine
        else:
            assert bool(found) == bool(mine), (name, platform.name, found, mine)
        if first is None and not found:
            first = name
    if first is None:
        with pytest.raises(Exception, match="no valid attention backend"):
            select(platform, ours)
        return
    assert select(platform, ours).backend == f"vllm:{first}"


def test_zz_summary() -> None:
    """The backends whose verdict is attnhal's alone here (they cannot be imported on this machine)."""
    SUMMARY.append(f"default backend: {len(CAPABILITIES) * len(SHAPES)} cells; verdicts not executed here: "
                   f"{', '.join(sorted(NOT_EXECUTED)) or 'none'}")


@pytest.mark.parametrize("model", ["mha", "mla", "mla-v2"])
def test_the_model_config_is_read_as_vllm_reads_it(model: str) -> None:
    """``--model-config`` (``attnhal_vllm.model``) against vLLM's own ``ModelConfig`` of the same file:
    MLA or not, the head size its selection validates, the query heads."""
    from attnhal.engines.model_config import read
    from attnhal_vllm.model import shape_of

    mla = model.startswith("mla")
    config = harness.engine_config("TRITON_MLA" if mla else "TRITON_ATTN", model).model_config
    shape = shape_of(read(f"{harness.model_dir(model)}/config.json"), harness.release())
    assert (shape.mla, shape.head_size, shape.num_heads) == (
        config.use_mla, config.get_head_size(), config.hf_text_config.num_attention_heads)
    if mla:
        assert shape.qk_nope_head_dim == getattr(config.hf_text_config, "qk_nope_head_dim", 1)
