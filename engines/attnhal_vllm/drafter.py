"""vLLM's drafter graph rule, per model runner: the mode its draft forwards run in, from the target's mode.

The drafter (EAGLE, EAGLE3, MTP, a draft model) does not resolve a mode of its own: it derives
one from the target's resolved ``cudagraph_mode``, and the rule is the runner's
(:mod:`~attnhal_vllm.runner`: which runner vLLM selects is a rule of its own, per release).

- the V1 runner (vLLM 0.33.0 with ``VLLM_USE_V2_MODEL_RUNNER=0``;
  ``v1/spec_decode/llm_base_proposer.py:420-435``): ``PIECEWISE`` when the target's mixed mode is
  PIECEWISE or FULL, else ``NONE``. Piecewise graphs leave attention outside the graph, so the
  drafter's attention (draft decode and draft extend) always runs eagerly.
- the V2 runner (vLLM 0.33.0's default: ``v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:89-107``;
  0.34.0: ``v1/worker/gpu/spec_decode/autoregressive/speculator.py:36-52``): ``FULL_DECODE_ONLY``
  when the target's decode mode is FULL, else ``NONE`` ("PIECEWISE cudagraphs are not supported
  for draft decodes"): draft decodes are captured with attention, and the draft prefill (attnhal's
  draft extend) gets a graph manager with the target's mode, FULL for its uniform batches exactly
  when the target's decode mode is FULL.

Both are executed in the vLLM tiers (the drafter's own method on a probe object) and recorded
(``tests/engines/recorded/vllm-<release>.jsonl``, columns ``vllm_runner``, ``vllm_drafter``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attnhal_vllm.modes import GraphMode

__all__ = ["DRAFTER_RULES", "DrafterMode", "drafter_line", "drafter_mode", "observed"]

#: The graph modes in which a drafter's attention is inside the captured graph.
_FULL = frozenset({"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})


@dataclass(frozen=True)
class DrafterMode:
    """The drafter's draft-decode graph mode (a ``CUDAGraphMode`` name) on one release, and why."""

    release: str
    mode: str
    why: str
    change: str = ""  # what else would capture the drafter's attention ("": the target's mode)
    runner: str = "V2"  # the model runner whose rule it is (attnhal_vllm.runner)

    @property
    def captures_attention(self) -> bool:
        """Whether the drafter's attention runs inside a captured graph."""
        return self.mode in _FULL

    def to_dict(self) -> dict[str, object]:
        return {"release": self.release, "runner": self.runner, "draft_decode": self.mode,
                "captures_attention": self.captures_attention, "why": self.why}


def _v1(target: GraphMode) -> tuple[str, str]:
    if target.mixed in ("PIECEWISE", "FULL"):
        return "PIECEWISE", (f"the target's mixed mode is {target.mixed}; the V1 runner's drafter captures piecewise "
                             "graphs only, which leave attention outside the graph "
                             "(v1/spec_decode/llm_base_proposer.py:420-435)")
    return "NONE", f"the target's mixed mode is {target.mixed} (v1/spec_decode/llm_base_proposer.py:420-435)"


def _v2(target: GraphMode) -> tuple[str, str]:
    if target.decode == "FULL":
        return "FULL_DECODE_ONLY", "the target's decode graphs are FULL"
    return "NONE", (f"the target's mode {target.value} has no FULL decode graphs, and PIECEWISE graphs are not "
                    "supported for draft decodes (spec_decode/autoregressive/speculator.py:36-43)")


#: Runner -> its rule (the target's resolved mode -> the drafter's mode, why) and what else would
#: capture the drafter's attention where the rule never does ("": the target's mode decides).
DRAFTER_RULES: Mapping[str, tuple[Callable[[GraphMode], tuple[str, str]], str]] = {
    "V1": (_v1, "the V2 model runner (FULL_DECODE_ONLY draft decodes: VLLM_USE_V2_MODEL_RUNNER unset or 1)"),
    "V2": (_v2, "")}


#: (release, runner, attnhal algorithm) -> why that drafter captures no graph whatever the target's mode.
NO_GRAPHS: Mapping[tuple[str, str, str], str] = {
    ("0.33.0", "V2", "standalone"): "vLLM 0.33's V2 draft-model speculator captures no CUDA graphs "
                                    "(v1/worker/gpu/spec_decode/standalone_ar/speculator.py:67-71)"}


def drafter_mode(release: str, target: GraphMode | None, runner: str = "V2", algorithm: str = "") -> DrafterMode:
    """The drafter's mode on ``release``'s ``runner`` for the target's resolved mode (``None``: vLLM
    refused the mode and starts no drafter: ``NONE``); ``algorithm`` (attnhal's name) where a
    drafter has a rule of its own (:data:`NO_GRAPHS`). Raises ``KeyError`` for a runner without a rule."""
    rule, change = DRAFTER_RULES[runner]
    if target is None:
        return DrafterMode(release, "NONE", "vLLM refuses the target's mode", change, runner)
    if (release, runner, algorithm) in NO_GRAPHS:
        return DrafterMode(release, "NONE", NO_GRAPHS[release, runner, algorithm], change, runner)
    mode, why = rule(target)
    return DrafterMode(release, mode, why, change, runner)


def observed(release: str, target: GraphMode, seen: str | None, runner: str = "V2") -> DrafterMode:
    """The mode vLLM gave its drafter (``seen``; ``None``: no graphs) with the rule's reason, or,
    where the rule predicts another mode, that difference as the reason (the plugin's audit)."""
    rule = drafter_mode(release, target, runner)
    mode = seen or "NONE"
    return rule if mode == rule.mode else DrafterMode(
        release, mode, f"differs: attnhal's reading of vLLM {release}'s {runner} runner rule gives {rule.mode}",
        rule.change, runner)


def drafter_line(speculator: str, drafter: DrafterMode, prefill: str | None = None) -> str:
    """The plugin's log line for a drafter vLLM set up (its draft-prefill mode where it has one)."""
    line = f"drafter {speculator}: draft decode {drafter.mode} ({drafter.why})"
    return line + (f"; draft prefill {prefill}" if prefill is not None else "")
