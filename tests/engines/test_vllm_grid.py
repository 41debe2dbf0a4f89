"""attnhal's vLLM adapter against vLLM 0.33.0's and 0.34.0's executed decisions, without vLLM installed.

Each vLLM tier executes the release's own graph-mode code over its grid and keeps the recording
of what it decided current (``tests/engines/recorded/vllm-<release>.jsonl``,
``tests/helpers/vllm_recording.py``); here the adapter's outcome of every recorded cell — the
arch refusal, the builder's level, the model runner vLLM selects, the resolved mode or refusal,
the drafter's mode (the V1 runner, 0.33 with ``VLLM_USE_V2_MODEL_RUNNER=0``: PIECEWISE or NONE,
attention never captured; the V2 runner, 0.33's default and 0.34's only: FULL_DECODE_ONLY or NONE)
and whether the draft prefill (draft extend) is captured — is compared with it. No difference is
catalogued for vLLM: every cell must agree.
"""

from __future__ import annotations

import pytest

import vllm_recording
from vllm_recording import attnhal_outcome, differences


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_every_recorded_vllm_cell_agrees_with_attnhal(release: str) -> None:
    recorded = vllm_recording.load(release)
    assert len(recorded) >= 280 and sum(o.refused for o in recorded.values()) >= 40
    found = {str(case): sorted(differences(engine, attnhal_outcome(case, release)))
             for case, engine in recorded.items()}
    unexplained = {case: labels for case, labels in found.items() if labels}
    assert not unexplained, f"{len(unexplained)} of {len(recorded)} cells: {list(unexplained.items())[:5]}"
    # each runner's drafter decisions are in the recordings, both ways, and compared
    drafters = {(o.runner, o.drafter, o.draft_extend) for c, o in recorded.items()
                if c.spec == "eagle" and not o.refused and o.mode}
    v2 = {("V2", "FULL_DECODE_ONLY", "captured"), ("V2", "NONE", "eager")}
    assert drafters == {"0.33.0": v2 | {("V1", "PIECEWISE", "eager"), ("V1", "NONE", "eager")}, "0.34.0": v2}[release]
    # vLLM 0.33 selects V2 by default, V1 only where VLLM_USE_V2_MODEL_RUNNER=0
    assert {(c.runner_env, o.runner) for c, o in recorded.items()} == (
        {(None, "V2"), ("0", "V1")} if release == "0.33.0" else {(None, "V2")})
