"""attnhal: vendor-neutral attention capability descriptors and graph planning.

``import attnhal`` is light: it imports no triton, no backend, and touches no GPU.
"""

from attnhal.capabilities import (
    AttentionRequest,
    BackendCapabilities,
    Facts,
    SpecLimits,
    Variant,
    When,
    not_supported_reasons,
)
from attnhal.capabilities.files import dump_descriptor, load_descriptor, parse_descriptor
from attnhal.errors import AttnhalError, InvalidValue
from attnhal.phases import Feature, Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, Vendor, detect, parse
from attnhal.reasons import Reason, ReasonCode
from attnhal.registry import Registry, default_registry
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__version__ = "0.1.0"

__all__ = [
    "AttentionRequest",
    "AttnhalError",
    "BackendCapabilities",
    "Facts",
    "Feature",
    "GraphPlan",
    "GraphPolicy",
    "InvalidValue",
    "ModelKind",
    "Phase",
    "PhaseBackends",
    "Platform",
    "Reason",
    "ReasonCode",
    "Registry",
    "RequestContext",
    "SpecAlgorithm",
    "SpecConfig",
    "SpecLimits",
    "Variant",
    "Vendor",
    "When",
    "default_registry",
    "detect",
    "dump_descriptor",
    "load_descriptor",
    "not_supported_reasons",
    "parse",
    "parse_descriptor",
    "plan",
]
