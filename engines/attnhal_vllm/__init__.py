"""vLLM adapter: attnhal descriptors <-> vLLM's graded CUDA-graph support, and its graph mode.

vLLM (v1, release 0.33.0) grades each attention backend's metadata builder with one
``AttentionCGSupport`` level (``vllm/v1/attention/backend.py:557-569``), takes the
minimum over every attention group of the model (``v1/worker/gpu_model_runner.py:6771-6785``)
and resolves the requested ``cudagraph_mode`` against it
(``config/compilation.py:1376-1490``). attnhal decides per phase instead. The mapping:

==========================  ==============================================================
vLLM level                  attnhal phases captured
==========================  ==============================================================
``ALWAYS``                  decode, draft_decode, draft_extend, target_verify — and mixed
                            prefill+decode batches, which attnhal has no phase for (lost)
``UNIFORM_BATCH``           decode, draft_decode, draft_extend, target_verify: every batch
                            whose requests all have the same query length (chains only:
                            ``max_topk = 1``, vLLM verifies ``1 + num_speculative_tokens``)
``UNIFORM_SINGLE_TOKEN_DECODE``  decode and draft_decode with one token per request (topk 1)
``NEVER``                   nothing
==========================  ==============================================================

Losses, both ways: vLLM has no level for "verify yes, draft extend no" (attnhal can say
it; vLLM rounds down to ``UNIFORM_SINGLE_TOKEN_DECODE``); attnhal has no phase for
mixed prefill+decode graphs nor for piecewise capture of the non-attention layers
(``PIECEWISE`` graphs exist whatever the attention backend, so they are not a claim
of the backend); vLLM has no topk: a tree (``topk > 1``) is never uniform for it.

- :mod:`~attnhal_vllm.flags`: vLLM's vocabulary (modelled arguments, harmless ones).
- :mod:`~attnhal_vllm.modes`: support levels <-> descriptors, their minimum, the graph mode.
- :mod:`~attnhal_vllm.levels`: the level a builder reports for one configuration (platform, spec, cubins).
- :mod:`~attnhal_vllm.drafter`: the drafter's graph mode per release (0.33: piecewise at
  most, attention eager; 0.34: FULL_DECODE_ONLY), from the target's mode.
- :mod:`~attnhal_vllm.adapter`: the adapter (:data:`ADAPTER`).
- :mod:`~attnhal_vllm.config`: engine arguments -> :class:`VllmConfig` -> attnhal's plan, for the
  release :func:`~attnhal_vllm.config.release_for` picks
  (``--vllm-version``; default the installed one, else the newest supported).
- optional: :mod:`~attnhal_vllm.audit` (vLLM's mode resolution explained) and
  :mod:`~attnhal_vllm.plugin` (what runs inside vLLM).
"""

from attnhal.engines.flags import EngineArgError
from attnhal_vllm.flags import FLAGS, HARMLESS, VLLM_VERSION, parse_cli
from attnhal_vllm.levels import Level, support_on
from attnhal_vllm.adapter import ADAPTER
from attnhal_vllm.config import VllmConfig, from_engine_args
from attnhal_vllm.modes import (
    CGSupport,
    GraphMode,
    ModeResolution,
    catalog_support,
    descriptor_for_level,
    min_support,
    resolve_mode,
    support_level,
)

__all__ = [
    "ADAPTER",
    "FLAGS",
    "HARMLESS",
    "VLLM_VERSION",
    "CGSupport",
    "EngineArgError",
    "GraphMode",
    "Level",
    "ModeResolution",
    "VllmConfig",
    "catalog_support",
    "descriptor_for_level",
    "from_engine_args",
    "min_support",
    "parse_cli",
    "resolve_mode",
    "support_level",
    "support_on",
]
