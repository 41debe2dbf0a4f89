"""vLLM's executed graph-mode decisions over the tier's grid, recorded per release, so that the
main suite checks attnhal's vLLM adapter against each release's own code without vLLM installed.

The vLLM tier (``tests/engines/vllm/test_vllm_executed.py``) asserts that the recording of the
installed release is what vLLM decides today; with ``ATTNHAL_RECORD=1`` it writes it instead.
The file: a header line (the engine, the columns), then one JSON row per case in grid order.
This module also holds what both sides compare (the case, the outcome, attnhal's outcome, the
differences), so the tier and the main suite judge a cell alike.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from repo import ROOT

RECORDED = ROOT / "tests" / "engines" / "recorded"
SPEC_TOKENS = 3
RUNNER_VAR = "VLLM_USE_V2_MODEL_RUNNER"


@dataclass(frozen=True)
class Case:
    backend: str
    model: str
    spec: str | None
    mode: str | None
    platform: str
    runner_env: str | None = None  # VLLM_USE_V2_MODEL_RUNNER (None: unset, vLLM's own selection)

    def __str__(self) -> str:
        runner = f":{RUNNER_VAR}={self.runner_env}" if self.runner_env is not None else ""
        return f"{self.platform}:{self.backend}:{self.model}:{self.spec or 'nospec'}:{self.mode or 'default'}{runner}"


@dataclass(frozen=True)
class Outcome:
    support: str | None
    mode: str | None
    error: str | None
    sizes: tuple[int, ...] = ()
    refused: bool = False  # the backend refused for the arch (vLLM's selection / attnhal's [arch])
    drafter: str | None = None  # the drafter's draft-decode mode (None: no drafter)
    runner: str | None = None  # the model runner vLLM selects (V1, V2)
    draft_extend: str | None = None  # the drafter's prefill: captured (attention in a FULL graph) or eager


CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))
KEPT = ("support", "mode", "error", "refused", "drafter", "runner", "draft_extend")  # the sizes are not compared


def path(release: str) -> Path:
    return RECORDED / f"vllm-{release}.jsonl"


def kept(outcome: Outcome) -> Outcome:
    """What the recording keeps: the compared fields, an error's first line."""
    error = outcome.error.splitlines()[0][:160] if outcome.error else None
    return Outcome(outcome.support, outcome.mode, error, (), outcome.refused, outcome.drafter, outcome.runner,
                   outcome.draft_extend)


def write(release: str, outcomes: Iterable[tuple[Case, Outcome]]) -> None:
    rows = [json.dumps([getattr(c, f) for f in CASE_FIELDS] + [getattr(kept(o), f) for f in KEPT],
                       separators=(",", ":")) for c, o in outcomes]
    header = json.dumps({"engine": f"vllm=={release}", "columns": [*CASE_FIELDS, *(f"vllm_{k}" for k in KEPT)]})
    path(release).write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")


def load(release: str) -> dict[Case, Outcome]:
    lines = path(release).read_text(encoding="utf-8").splitlines()
    out = {}
    for line in lines[1:]:
        row = json.loads(line)
        case = Case(*row[:len(CASE_FIELDS)])
        out[case] = Outcome(**dict(zip(KEPT, row[len(CASE_FIELDS):])))
    return out


def attnhal_outcome(case: Case, release: str) -> Outcome:
    """attnhal's adapter for the case on ``release`` (trtllm-gen cubins absent, as in the tier's
    environment). The drafter's mode is the adapter's; where the plan disagrees with it about
    capturing draft decodes, that disagreement is the outcome (a difference)."""
    import attnhal_vllm as vllm
    from attnhal.phases import Phase

    args: dict[str, object] = {"attention_backend": case.backend}
    if case.spec is not None:
        args["speculative_config"] = json.dumps({"method": case.spec, "num_speculative_tokens": SPEC_TOKENS})
    if case.mode is not None:
        args["compilation_config"] = json.dumps({"cudagraph_mode": case.mode})
    env = {RUNNER_VAR: case.runner_env} if case.runner_env is not None else {}
    config = vllm.from_engine_args(args, case.platform, trtllm_cubins=False, model=case.model, version=release,
                                   env=env)
    r = config.resolution
    assert config.level is not None
    plan = config.plan(case.platform)
    refused = any(reason.code == "arch" for decision in plan.phases.values() for reason in decision.reasons)
    drafter = extend = None
    if config.drafter is not None and r.mode is not None:
        drafter = config.drafter.mode
        if plan[Phase.DRAFT_DECODE].capture != config.drafter.captures_attention:
            drafter += f" (but the plan has draft_decode captured={plan[Phase.DRAFT_DECODE].capture})"
        extend = "captured" if plan[Phase.DRAFT_EXTEND].capture else "eager"
    assert config.runner is not None
    return Outcome(config.level.support.name, r.mode.value if r.mode else None, r.error, refused=refused,
                   drafter=drafter, runner=config.runner.name, draft_extend=extend)


def differences(engine: Outcome, attnhal: Outcome) -> frozenset[str]:
    if engine.refused or attnhal.refused:  # a refused backend builds nothing: only the refusal compares
        return frozenset() if engine.refused == attnhal.refused else frozenset(
            {"vLLM refuses the arch, attnhal plans it" if engine.refused
             else "attnhal refuses the arch, vLLM takes it"})
    out = set()
    if engine.support != attnhal.support:
        out.add(f"support: engine {engine.support}, catalogue {attnhal.support}")
    if (engine.error is None) != (attnhal.error is None):
        out.add("engine raises, attnhal resolves" if engine.error else "attnhal raises, engine resolves")
    elif engine.mode != attnhal.mode:
        out.add(f"mode: engine {engine.mode}, attnhal {attnhal.mode}")
    if engine.drafter != attnhal.drafter:
        out.add(f"drafter: engine {engine.drafter}, attnhal {attnhal.drafter}")
    if engine.runner != attnhal.runner:
        out.add(f"runner: engine {engine.runner}, attnhal {attnhal.runner}")
    if engine.draft_extend != attnhal.draft_extend:
        out.add(f"draft_extend: engine {engine.draft_extend}, attnhal {attnhal.draft_extend}")
    return frozenset(out)
