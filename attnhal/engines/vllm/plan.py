"""vLLM engine arguments -> the backend, the spec, the graph mode vLLM resolves, and attnhal's plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnhal.catalog import load
from attnhal.engines.flags import EngineArgError, check, model_kind
from attnhal.engines.vllm.flags import FLAGS, HARMLESS, METHODS
from attnhal.engines.vllm.levels import Level, support_on
from attnhal.engines.vllm.resolution import GraphMode, ModeResolution, resolve_mode
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, as_platform
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__all__ = ["VllmConfig", "from_engine_args"]


@dataclass(frozen=True)
class VllmConfig:
    """vLLM arguments translated: the backend, the spec, the graph mode vLLM resolves, the plan inputs."""

    backend: str  # vllm:NAME
    spec: SpecConfig
    requested: GraphMode
    resolution: ModeResolution
    ignored: tuple[str, ...] = ()
    level: Level | None = None  # the builder's level the resolution used (None: not resolved yet)

    def plan(self, platform: Platform | str, model: ModelKind | str | None = None) -> GraphPlan:
        """attnhal's plan with the backend's descriptor in every role; graphs off when vLLM's mode has
        no full graphs (piecewise graphs leave attention eager)."""
        caps = load(self.backend).descriptor
        full = self.resolution.mode is not None and "FULL" in (self.resolution.mode.decode, self.resolution.mode.mixed)
        return plan(self.spec, platform, PhaseBackends.same(caps, self.spec), GraphPolicy(enabled=full),
                    RequestContext(model=model_kind(model)))


#: The ``--spec-*`` flags and the ``--speculative-config`` keys they stand for.
SPEC_FLAG_KEYS = {"spec_method": "method", "spec_tokens": "num_speculative_tokens"}


def _refuse_contradictions(values: Mapping[str, Any], speculative: Mapping[str, Any]) -> None:
    """A ``--spec-*`` flag that contradicts the same key of ``--speculative-config`` is an error:
    vLLM's own merge of the two is not modelled, so neither is picked silently."""
    for name, key in SPEC_FLAG_KEYS.items():
        flag = "--" + name.replace("_", "-")
        if name in values and key in speculative and values[name] != speculative[key]:
            raise EngineArgError(flag, f"{flag}={values[name]} contradicts --speculative-config {key}="
                                       f"{speculative[key]} (supported: one of them, or both with the same value)")


def from_engine_args(args: Mapping[str, Any], platform: Platform | str | None = None,
                     trtllm_cubins: bool = True) -> VllmConfig:
    """Translate vLLM engine arguments (``--attention-backend``, ``--spec-method``, ``--spec-tokens``,
    ``--speculative-config``, ``--compilation-config`` ``cudagraph_mode``, ``--enforce-eager``).

    The requested mode defaults to vLLM's ``FULL_AND_PIECEWISE`` (``config/vllm.py:311, 332``);
    ``--enforce-eager`` makes it ``NONE``. The builder's level is the one it reports on
    ``platform`` (:func:`~attnhal.engines.vllm.levels.support_on`; without a platform, the
    catalogue's); ``trtllm_cubins`` is the assumption FlashInfer's level rests on.
    Raises :class:`EngineArgError` naming the flag.
    """
    values, ignored = check(args, FLAGS, HARMLESS, "attnhal.engines.vllm.HARMLESS")
    if "attention_backend" not in values:
        raise EngineArgError("--attention-backend", "--attention-backend is required (vLLM picks one per "
                             "platform and model when omitted; attnhal does not model that choice)")
    speculative = values.get("speculative_config", {})
    _refuse_contradictions(values, speculative)
    method = values.get("spec_method", speculative.get("method"))
    tokens = values.get("spec_tokens", speculative.get("num_speculative_tokens"))
    if (method is None) != (tokens is None):
        raise EngineArgError("--spec-tokens", "speculative decoding needs both a method and --spec-tokens")
    if method is None:
        spec = SpecConfig()
    elif METHODS[method] == "ngram":
        spec = SpecConfig.ngram(tokens + 1)
    else:
        spec = SpecConfig(SpecAlgorithm(METHODS[method]), tokens)
    requested = GraphMode(values.get("compilation_config", {}).get("cudagraph_mode", "FULL_AND_PIECEWISE"))
    if values.get("enforce_eager"):
        requested = GraphMode.NONE
    query_len = 1 + tokens if tokens else 1
    where = as_platform(platform) if platform is not None else None
    level = support_on(values["attention_backend"], where, tokens or 0, trtllm_cubins)
    resolution = resolve_mode(requested, level.support, query_len)
    return VllmConfig(values["attention_backend"], spec, requested, resolution, ignored, level)
