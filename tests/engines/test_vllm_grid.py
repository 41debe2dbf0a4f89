"""attnhal's vLLM adapter against vLLM 0.33.0's and 0.34.0's executed decisions, without vLLM installed.

Each vLLM tier executes the release's own graph-mode code over its grid and keeps the recording
of what it decided current (``tests/engines/recorded/vllm-<release>.jsonl``,
``tests/helpers/vllm_recording.py``); here the adapter's outcome of every recorded cell — the
arch refusal, the builder's level, the resolved mode or refusal and, on 0.34, the drafter's
mode — is compared with it. No difference is catalogued for vLLM: every cell must agree.
"""

from __future__ import annotations

import pytest

import vllm_recording
from vllm_recording import attnhal_outcome, differences


@pytest.mark.parametrize(("release", "drafter"), [("0.33.0", False), ("0.34.0", True)])
def test_every_recorded_vllm_cell_agrees_with_attnhal(release: str, drafter: bool) -> None:
    recorded = vllm_recording.load(release)
    assert len(recorded) >= 280 and sum(o.refused for o in recorded.values()) >= 40
    found = {str(case): sorted(differences(engine, attnhal_outcome(case, drafter)))
             for case, engine in recorded.items()}
    unexplained = {case: labels for case, labels in found.items() if labels}
    assert not unexplained, f"{len(unexplained)} of {len(recorded)} cells: {list(unexplained.items())[:5]}"
    if drafter:  # 0.34's drafter decisions are in the recording and compared
        assert {o.drafter for c, o in recorded.items() if c.spec == "eagle" and not o.refused} >= {
            "FULL_DECODE_ONLY", "NONE"}
