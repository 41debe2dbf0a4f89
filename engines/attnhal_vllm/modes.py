"""vLLM's graph decisions, as its own code makes them: support levels, their minimum, the graph mode.

The levels map to attnhal descriptors both ways (:func:`support_level`,
:func:`descriptor_for_level`); :func:`resolve_mode` follows vLLM's resolution of
``cudagraph_mode`` against the minimum level over a model's attention groups. The
comments cite the vLLM 0.33.0 source lines each rule follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.catalog import CatalogError, load
from attnhal.phases import Phase
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, Vendor
from attnhal.spec import SpecConfig

__all__ = ["CGSupport", "GraphMode", "ModeResolution", "catalog_support", "descriptor_for_level", "min_support",
           "resolve_mode", "support_level"]


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
    entry = load(name)
    if entry.engine != "vllm":
        raise CatalogError(f"backend={name} (supported: vllm:NAME)")
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


def _named(enum: type[GraphMode] | type[CGSupport], field: str, value: object) -> Any:
    """``value`` as a member of ``enum``: a member, or its name; else a ValueError listing the names."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str) and value in enum.__members__:
        return enum.__members__[value]
    raise ValueError(f"{field}={value!r} (supported: {enum.__name__} or one of its names "
                     f"{', '.join(enum.__members__)})")


def resolve_mode(requested: GraphMode | str, support: CGSupport | str, uniform_decode_query_len: int = 1,
                 attention_split: bool = True, piecewise_available: bool = True) -> ModeResolution:
    """vLLM's resolution of ``cudagraph_mode`` against the minimum support level.

    Follows ``config/compilation.py:1376-1490``. ``attention_split`` is
    ``splitting_ops_contain_attention()`` (the default VLLM_COMPILE setup splits the graph
    at attention, so attention runs between piecewise graphs); ``uniform_decode_query_len``
    is ``1 + num_speculative_tokens``. ``requested`` and ``support`` may be given by name
    (``"FULL"``, ``"UNIFORM_BATCH"``), as vLLM's configs spell them.
    """
    return _resolve(_named(GraphMode, "requested", requested), _named(CGSupport, "support", support),
                    uniform_decode_query_len, attention_split, piecewise_available)


def _resolve(requested: GraphMode, support: CGSupport, uniform_decode_query_len: int, attention_split: bool,
             piecewise_available: bool) -> ModeResolution:
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
