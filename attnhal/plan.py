"""The planner's former module name: the names of :mod:`attnhal.planner`, importable from here.

``attnhal.plan`` is also the function :func:`attnhal.planner.plan`, exported by
:mod:`attnhal`. Importing this module makes the import system set the attribute
``attnhal.plan`` to the module, so the module is callable: ``attnhal.plan(spec,
platform, backends)`` plans whichever of the two the attribute holds.
"""

import sys
from types import ModuleType
from typing import Any

from attnhal._compat import moved
from attnhal.phases import ALGORITHM_PHASES
from attnhal.planner import (
    MAX_BATCH_SIZE,
    MAX_CAPTURE_SIZES,
    MAX_STEP_COUNTS,
    AttentionMode,
    GraphPlan,
    GraphPolicy,
    PhaseBackends,
    PhasePlan,
    plan,
    plan_phase,
)
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm, SpecConfig

moved("attnhal.plan (the module)", "attnhal.planner")

__all__ = [
    "ALGORITHM_PHASES",
    "MAX_BATCH_SIZE",
    "AttentionMode",
    "GraphPlan",
    "GraphPolicy",
    "ModelKind",
    "PhaseBackends",
    "PhasePlan",
    "RequestContext",
    "SpecAlgorithm",
    "SpecConfig",
    "plan",
]


class _CallableModule(ModuleType):
    """This module, callable as :func:`attnhal.planner.plan`."""

    def __call__(self, *args: Any, **kwargs: Any) -> GraphPlan:
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
