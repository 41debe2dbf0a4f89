"""attnhal: vendor-neutral attention capability descriptors and graph planning.

``import attnhal`` is light: it imports no triton, no backend, and touches no GPU.
"""

from attnhal.capabilities import AttentionRequest, BackendCapabilities, SpecLimits, not_supported_reasons
from attnhal.capabilities.files import load_descriptor
from attnhal.phases import Feature, Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, Vendor, detect, parse
from attnhal.reasons import Reason, ReasonCode
from attnhal.registry import default_registry
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__version__ = "0.1.0"

__all__ = [
    "AttentionRequest",
    "BackendCapabilities",
    "Feature",
    "GraphPlan",
    "GraphPolicy",
    "ModelKind",
    "Phase",
    "PhaseBackends",
    "Platform",
    "Reason",
    "ReasonCode",
    "RequestContext",
    "SpecAlgorithm",
    "SpecConfig",
    "SpecLimits",
    "Vendor",
    "default_registry",
    "detect",
    "load_descriptor",
    "not_supported_reasons",
    "parse",
    "plan",
]
