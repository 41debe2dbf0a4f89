"""Configurations SGLang 0.5.23 starts with and that fail later: the catalogue's "Late failures".

attnhal's plan already refuses them (the backend's ``run_limits``); this module says which
catalogue entry it is and *when* SGLang fails, which depends on SGLang's own graph decision
for the phase: inside the draft-extend graph capture at server start-up when SGLang captures
draft extend, at the first draft extend otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnhal.phases import DraftSteps, Phase
from attnhal.platform import Platform, Vendor, as_platform

if TYPE_CHECKING:
    from attnhal.engines.base import EngineConfig

__all__ = ["ENTRY", "LateFailure", "late_failures"]

#: The catalogue's entry (a bullet of docs/catalog.md, "SGLang: engine behaviour worth knowing").
ENTRY = "docs/catalog.md, Late failures"
AT_CAPTURE = "during the draft-extend graph capture at server start-up"
AT_FIRST_STEP = "at the first draft extend (the first speculative step the server runs)"


@dataclass(frozen=True)
class LateFailure:
    """One late failure that applies to a configuration: its backend, phase, and when it happens."""

    backend: str  # "sglang:aiter"
    phase: Phase
    when: str  # AT_CAPTURE | AT_FIRST_STEP
    why: str  # the engine source that raises

    def __str__(self) -> str:
        return (f"late failure ({ENTRY}; {self.backend}): SGLang's argument checks accept this configuration; it fails "
                f"{self.when}: {self.why}")

    def to_dict(self) -> dict[str, Any]:
        return {"entry": ENTRY, "backend": self.backend, "phase": self.phase.value, "when": self.when,
                "why": self.why}


#: Per vendor, the role whose backend must be aiter's for SGLang 0.5.23 to build an aiter
#: draft-extend runner: on HIP the multi-step draft backend (``AiterMultiStepDraftBackend``,
#: num_steps > 1; eagle_worker_v2.py:546-565). aiter runs on no other vendor.
_AITER_EXTEND_CAPTURED_BY: Mapping[Vendor, str] = {Vendor.HIP: "draft_decode"}


def _sglang_captures_aiter_extend(config: EngineConfig, platform: Platform) -> bool:
    """Whether SGLang builds aiter's draft-extend runner: the role above is aiter, graphs are on
    and the env switch is off (eagle_worker_v2.py:625-628); multi-layer EAGLE builds it whenever
    graphs are on (multi_layer_eagle_worker_v2.py:417-457)."""
    graphs_on = config.policy.enabled and Phase.DRAFT_EXTEND not in config.policy.disabled_phases
    if config.layout.draft_steps is DraftSteps.EXTEND:  # multi-layer EAGLE: no role rule, graphs on is enough
        return graphs_on and platform.vendor in _AITER_EXTEND_CAPTURED_BY
    role = _AITER_EXTEND_CAPTURED_BY.get(platform.vendor)
    return role is not None and config.roles.get(role) == "aiter" and graphs_on


def late_failures(config: EngineConfig, platform: Platform | str) -> tuple[LateFailure, ...]:
    """The late failures of ``config`` on ``platform`` (empty: none catalogued applies).

    aiter's draft extend raises ``NotImplementedError`` for ``topk > 1``
    (``_ensure_spec_v2_topk_supported``, layers/attention/aiter_backend.py:1396-1401), called
    by the eager metadata (2210) and the graph-capture metadata (3344).
    """
    where = as_platform(platform)
    if config.roles.get("draft_extend") != "aiter" or config.spec.topk <= 1:
        return ()
    when = AT_CAPTURE if _sglang_captures_aiter_extend(config, where) else AT_FIRST_STEP
    why = (f"aiter's draft extend raises NotImplementedError for topk={config.spec.topk} (supports topk <= 1; "
           "layers/attention/aiter_backend.py:1396-1401, called at 2210 eager and 3344 in capture)")
    return (LateFailure("sglang:aiter", Phase.DRAFT_EXTEND, when, why),)

