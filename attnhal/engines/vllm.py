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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

from attnhal import catalog
from attnhal.capabilities import BackendCapabilities, Phase, SpecLimits
from attnhal.engines.flags import EngineArgError, Flag, check, model_kind, one_of, positive, truth
from attnhal.engines.flags import parse_cli as parse_flags
from attnhal.plan import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, Vendor
from attnhal.spec import ModelKind, RequestContext, SpecConfig

__all__ = [
    "CGSupport",
    "GraphMode",
    "ModeResolution",
    "VllmConfig",
    "catalog_support",
    "descriptor_for_level",
    "from_engine_args",
    "min_support",
    "parse_cli",
    "resolve_mode",
    "support_level",
]


class CGSupport(IntEnum):
    """vLLM's ``AttentionCGSupport`` (``vllm/v1/attention/backend.py:557-569``); higher is more."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # only batches of query_len == 1 decodes
    UNIFORM_BATCH = 2  # batches whose queries all have the same length (spec decode)
    ALWAYS = 3  # also mixed prefill + decode batches


class GraphMode(str, Enum):
    """vLLM's ``CUDAGraphMode`` (``config/compilation.py:53-63``): (decode routine, mixed routine)."""

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"  # full graphs for decode, none for mixed batches
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"  # full graphs for decode, piecewise for mixed

    @property
    def decode(self) -> str:
        return {"FULL_DECODE_ONLY": "FULL", "FULL_AND_PIECEWISE": "FULL"}.get(self.value, self.value)

    @property
    def mixed(self) -> str:
        return {"FULL_DECODE_ONLY": "NONE", "FULL_AND_PIECEWISE": "PIECEWISE"}.get(self.value, self.value)


# --- descriptor -> level ------------------------------------------------------------------

def _captured(caps: BackendCapabilities, spec: SpecConfig, platform: Platform) -> frozenset[Phase]:
    result = plan(spec, platform, PhaseBackends.same(caps, spec), GraphPolicy())
    return frozenset(result.captured)


def support_level(caps: BackendCapabilities, platform: Platform, num_speculative_tokens: int = 1) -> CGSupport:
    """The vLLM level a descriptor earns on ``platform``.

    ``UNIFORM_BATCH`` needs decode and a chain's target_verify (``1 + num_speculative_tokens``
    query tokens) captured; ``UNIFORM_SINGLE_TOKEN_DECODE`` needs decode captured. ``ALWAYS``
    is never returned: no attnhal claim says "mixed prefill+decode batches capture".
    """
    decode = Phase.DECODE in _captured(caps, SpecConfig(), platform)
    if not decode:
        return CGSupport.NEVER
    chain = SpecConfig.eagle(num_speculative_tokens)
    verify = Phase.TARGET_VERIFY in _captured(caps, chain, platform)
    return CGSupport.UNIFORM_BATCH if verify else CGSupport.UNIFORM_SINGLE_TOKEN_DECODE


def catalog_support(name: str) -> CGSupport:
    """The level vLLM's own code gives a catalogued backend (``vllm:FLASH_ATTN``), as recorded
    with its source lines in the catalogue; conditions on it are in ``meta.cg_conditions``."""
    entry = catalog.load(name)
    if entry.engine != "vllm":
        raise catalog.CatalogError(f"backend={name} (supported: vllm:NAME)")
    return CGSupport[entry.meta["cg_support"]]


# --- level -> descriptor ------------------------------------------------------------------

_CHAIN = SpecLimits(max_topk=1)
_LEVEL_GRAPHS: Mapping[CGSupport, Mapping[Phase, SpecLimits]] = {
    CGSupport.NEVER: {},
    CGSupport.UNIFORM_SINGLE_TOKEN_DECODE: {Phase.DECODE: SpecLimits(), Phase.DRAFT_DECODE: _CHAIN},
    CGSupport.UNIFORM_BATCH: {Phase.DECODE: SpecLimits(), Phase.DRAFT_DECODE: _CHAIN,
                              Phase.DRAFT_EXTEND: _CHAIN, Phase.TARGET_VERIFY: _CHAIN},
}


def descriptor_for_level(name: str, level: CGSupport, vendors: Iterable[Vendor | str],
                         page_sizes: Iterable[int] = (16,)) -> BackendCapabilities:
    """A descriptor with the graph claims a vLLM level implies (``ALWAYS`` maps like
    ``UNIFORM_BATCH``: its mixed-batch graphs have no attnhal phase). Runs every phase,
    multi-step for chains only: vLLM's drafters propose one token per step."""
    graph = _LEVEL_GRAPHS[min(level, CGSupport.UNIFORM_BATCH)]
    return BackendCapabilities(name=name, vendors=frozenset(Vendor(v) for v in vendors),
                               phases=frozenset(Phase), graph=dict(graph), multi_step=_CHAIN,
                               page_sizes=frozenset(page_sizes))


# --- several attention groups, and the graph mode -------------------------------------------

def min_support(groups: Mapping[str, CGSupport]) -> tuple[CGSupport, str | None]:
    """The lowest level over a model's attention groups and the backend that sets it
    (``v1/worker/gpu_model_runner.py:6771-6785``); ``(ALWAYS, None)`` for no groups."""
    level, name = CGSupport.ALWAYS, None
    for backend, support in groups.items():
        if support < level:
            level, name = support, backend
    return level, name


@dataclass(frozen=True)
class ModeResolution:
    """The graph mode vLLM ends with, each downgrade it made, or the error it raises."""

    requested: GraphMode
    mode: GraphMode | None  # None: vLLM refuses to start
    steps: tuple[str, ...] = ()
    error: str | None = None


def resolve_mode(requested: GraphMode, support: CGSupport, uniform_decode_query_len: int = 1,
                 attention_split: bool = True, piecewise_available: bool = True) -> ModeResolution:
    """vLLM's resolution of ``cudagraph_mode`` against the minimum support level.

    Follows ``config/compilation.py:1376-1490``. ``attention_split`` is
    ``splitting_ops_contain_attention()`` (the default VLLM_COMPILE setup splits the graph
    at attention, so attention runs between piecewise graphs); ``uniform_decode_query_len``
    is ``1 + num_speculative_tokens``.
    """
    mode, steps = requested, []

    def downgrade(to: GraphMode, why: str) -> None:
        nonlocal mode
        steps.append(f"{mode.value} -> {to.value}: {why}")
        mode = to

    if mode is GraphMode.NONE:
        return ModeResolution(requested, mode)
    if mode.mixed == "FULL" and support < CGSupport.ALWAYS:  # compilation.py:1395-1418
        if support is CGSupport.NEVER:
            return ModeResolution(requested, None, error=f"cudagraph_mode={requested.value} needs "
                                  f"support >= UNIFORM_SINGLE_TOKEN_DECODE (got NEVER); use PIECEWISE")
        downgrade(GraphMode.FULL_AND_PIECEWISE if attention_split else GraphMode.FULL_DECODE_ONLY,
                  f"mixed batches need ALWAYS (support: {support.name})")
    if mode.decode == "FULL" and support is CGSupport.NEVER:  # compilation.py:1421-1446
        downgrade(GraphMode.PIECEWISE if attention_split else GraphMode.NONE, "support: NEVER")
    if mode.decode == "FULL" and uniform_decode_query_len > 1 and support < CGSupport.UNIFORM_BATCH:
        downgrade(GraphMode.PIECEWISE if attention_split else GraphMode.NONE,  # compilation.py:1448-1466
                  f"spec decode (query len {uniform_decode_query_len}) needs UNIFORM_BATCH "
                  f"(support: {support.name})")
    if not piecewise_available and "PIECEWISE" in (mode.decode, mode.mixed):  # compilation.py:1468-1480
        downgrade(GraphMode.FULL_DECODE_ONLY if mode is GraphMode.FULL_AND_PIECEWISE else GraphMode.NONE,
                  "the model offers no piecewise capture")
    return ModeResolution(requested, mode, tuple(steps))


# --- vLLM's own arguments -------------------------------------------------------------------

VLLM_VERSION = catalog.ENGINES["vllm"]

#: ``--spec-method`` / ``speculative_config.method`` -> attnhal algorithm. ``draft_model`` is a
#: separate small draft model (attnhal's ``standalone``); ``ngram`` drafts from the context.
_METHODS = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "deepseek_mtp": "mtp", "draft_model": "standalone",
            "ngram": "ngram"}

#: Flags that cannot change the attention graph decision: accepted, listed as ignored.
HARMLESS = frozenset("""
model tokenizer revision host port served_model_name trust_remote_code seed tensor_parallel_size
pipeline_parallel_size data_parallel_size gpu_memory_utilization max_model_len max_num_seqs
max_num_batched_tokens dtype quantization spec_model load_format download_dir api_key
""".split())


def _backend(flag: str, value: Any) -> str:
    name = f"vllm:{str(value).upper()}"
    try:
        catalog.load(name)
    except catalog.CatalogError:
        known = ", ".join(e.name for e in catalog.entries("vllm"))
        raise EngineArgError(flag, f"{flag}={value!r} (supported: {known})") from None
    return name


def _json_table(keys: Mapping[str, Flag]) -> Callable[[str, Any], dict[str, Any]]:
    """A JSON object flag (``--speculative-config '{...}'``) whose keys are checked like flags."""
    def convert(flag: str, value: Any) -> dict[str, Any]:
        try:
            table = json.loads(value) if isinstance(value, str) else dict(value)
        except (TypeError, ValueError):
            raise EngineArgError(flag, f"{flag}={value!r} (supported: a JSON object)") from None
        if not isinstance(table, dict):
            raise EngineArgError(flag, f"{flag}={value!r} (supported: a JSON object)")
        out = {}
        for key, item in table.items():
            if key not in keys:
                raise EngineArgError(f"{flag}.{key}", f"{flag}.{key} is not modelled by attnhal "
                                     f"(modelled: {', '.join(keys)})")
            out[key] = keys[key].convert(f"{flag}.{key}", item)
        return out
    return convert


_METHOD = Flag(one_of(tuple(_METHODS)))
_MODE = Flag(one_of(tuple(m.value for m in GraphMode)))

#: The modelled arguments (vLLM 0.33.0 names: vllm/engine/arg_utils.py:1114, 1866-1873, 1891).
FLAGS: Mapping[str, Flag] = {
    "attention_backend": Flag(_backend),
    "spec_method": _METHOD,
    "spec_tokens": Flag(positive),
    "speculative_config": Flag(_json_table({"method": _METHOD, "num_speculative_tokens": Flag(positive)})),
    "compilation_config": Flag(_json_table({"cudagraph_mode": _MODE})),
    "enforce_eager": Flag(truth, boolean=True),
}


@dataclass(frozen=True)
class VllmConfig:
    """vLLM arguments translated: the backend, the spec, the graph mode vLLM resolves, the plan inputs."""

    backend: str  # vllm:NAME
    spec: SpecConfig
    requested: GraphMode
    resolution: ModeResolution
    ignored: tuple[str, ...] = ()

    def plan(self, platform: Platform | str, model: ModelKind | str | None = None) -> GraphPlan:
        """attnhal's plan with the backend's descriptor in every role; graphs off when vLLM's mode has
        no full graphs (piecewise graphs leave attention eager)."""
        caps = catalog.load(self.backend).descriptor
        full = self.resolution.mode is not None and "FULL" in (self.resolution.mode.decode, self.resolution.mode.mixed)
        return plan(self.spec, platform, PhaseBackends.same(caps, self.spec), GraphPolicy(enabled=full),
                    RequestContext(model=model_kind(model)))


def parse_cli(argv: Sequence[str]) -> dict[str, Any]:
    """vLLM command-line flags -> ``{argument_name: text}``."""
    return parse_flags(argv, FLAGS)


def from_engine_args(args: Mapping[str, Any]) -> VllmConfig:
    """Translate vLLM engine arguments (``--attention-backend``, ``--spec-method``, ``--spec-tokens``,
    ``--speculative-config``, ``--compilation-config`` ``cudagraph_mode``, ``--enforce-eager``).

    The requested mode defaults to vLLM's ``FULL_AND_PIECEWISE`` (``config/vllm.py:311, 332``);
    ``--enforce-eager`` makes it ``NONE``. Raises :class:`EngineArgError` naming the flag.
    """
    values, ignored = check(args, FLAGS, HARMLESS, "attnhal.engines.vllm.HARMLESS")
    if "attention_backend" not in values:
        raise EngineArgError("--attention-backend", "--attention-backend is required (vLLM picks one per "
                             "platform and model when omitted; attnhal does not model that choice)")
    speculative = values.get("speculative_config", {})
    method = values.get("spec_method", speculative.get("method"))
    tokens = values.get("spec_tokens", speculative.get("num_speculative_tokens"))
    if (method is None) != (tokens is None):
        raise EngineArgError("--spec-tokens", "speculative decoding needs both a method and --spec-tokens")
    if method is None:
        spec = SpecConfig()
    elif _METHODS[method] == "ngram":
        spec = SpecConfig.ngram(tokens + 1)
    else:
        spec = SpecConfig.eagle(tokens, algorithm=_METHODS[method])
    requested = GraphMode(values.get("compilation_config", {}).get("cudagraph_mode", "FULL_AND_PIECEWISE"))
    if values.get("enforce_eager"):
        requested = GraphMode.NONE
    query_len = 1 + tokens if tokens else 1
    resolution = resolve_mode(requested, catalog_support(values["attention_backend"]), query_len)
    return VllmConfig(values["attention_backend"], spec, requested, resolution, ignored)
