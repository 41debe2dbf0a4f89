"""attnhal's vLLM adapter against vLLM 0.33.0's and 0.34.0's executed decisions, without vLLM installed.

Each vLLM tier executes the release's own graph-mode code over its grid and keeps the recording
of what it decided current (``tests/engines/recorded/vllm-<release>.jsonl``,
``tests/helpers/vllm_recording.py``); here the adapter's outcome of every recorded cell — the
arch refusal, the builder's level, the resolved mode or refusal and the drafter's mode (0.33:
PIECEWISE or NONE, attention never captured; 0.34: FULL_DECODE_ONLY or NONE) — is compared
with it. No difference is catalogued for vLLM: every cell must agree.
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
    # each release's drafter decisions are in its recording, both ways, and compared
    drafters = {o.drafter for c, o in recorded.items() if c.spec == "eagle" and not o.refused and o.mode}
    assert drafters == {"0.33.0": {"PIECEWISE", "NONE"}, "0.34.0": {"FULL_DECODE_ONLY", "NONE"}}[release]
