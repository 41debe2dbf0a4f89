"""The planner: spec config + platform + context + each phase's backend descriptor -> GraphPlan.

:func:`plan` decides, for every phase, whether it runs, whether it is captured as a
graph, on which backend, and why not. Its inputs besides the spec config
(:mod:`attnhal.spec`) and the platform are :class:`PhaseBackends` (the backend of
each role, :mod:`~attnhal.planner.roles`) and :class:`GraphPolicy`
(:mod:`~attnhal.planner.policy`); its output is a :class:`GraphPlan`
(:mod:`~attnhal.planner.result`). The algorithm is one code path, in
:mod:`~attnhal.planner.decide`.
"""

from attnhal.phases import ALGORITHM_PHASES
from attnhal.planner.decide import plan, plan_phase
from attnhal.planner.policy import BATCH_SIZE, MAX_CAPTURE_SIZES, MAX_STEP_COUNTS, GraphPolicy
from attnhal.planner.result import GraphPlan, PhasePlan
from attnhal.planner.roles import AttentionMode, PhaseBackends, needs_draft_backend, phase_roles

__all__ = [
    "ALGORITHM_PHASES",
    "BATCH_SIZE",
    "MAX_CAPTURE_SIZES",
    "MAX_STEP_COUNTS",
    "AttentionMode",
    "GraphPlan",
    "GraphPolicy",
    "PhaseBackends",
    "PhasePlan",
    "needs_draft_backend",
    "phase_roles",
    "plan",
    "plan_phase",
]
