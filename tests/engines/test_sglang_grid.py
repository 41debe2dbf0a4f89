"""attnhal's SGLang adapter against SGLang 0.5.23's executed decisions, without SGLang installed.

The SGLang tier executes the engine's own code over the grid (``tests/helpers/sglang_grid.py``)
and keeps the recording of what it decided current (``tests/engines/recorded/``); here the
adapter's plan of every recorded case is compared with it, and every difference must be
explained by a rule of ``sglang_expected.py``: a catalogued engine discrepancy (docs/catalog.md)
or an adapter defect still to fix. A new difference, or a rule that explains nothing any more,
fails.
"""

from __future__ import annotations

import collections

import pytest

import sglang_grid
import sglang_recording
from attnhal import catalog
import attnhal_sglang as sglang
from attnhal.phases import Phase
from sglang_expected import RULES, check


def test_the_recording_covers_the_grid_of_the_engine_tier() -> None:
    engine, recorded = sglang_recording.load()
    assert engine == f"sglang=={sglang.SGLANG_VERSION}"  # the release the adapter models
    assert list(recorded) == sglang_grid.all_cases()


def test_every_difference_from_the_recorded_engine_is_explained() -> None:
    _, recorded = sglang_recording.load()
    failures, causes = [], collections.Counter[str]()
    for case, engine in recorded.items():
        try:
            causes.update(check(case, engine, sglang_grid.attnhal_view(case)) or ("agree or catalogued",))
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, f"{len(failures)} of {len(recorded)} cases:\n" + "\n".join(failures[:5])
    assert sum(causes.values()) == len(recorded) > 2500


def test_every_rule_names_a_catalogue_entry_that_the_backends_notes_cite() -> None:
    """`attnhal plan --engine sglang` prints these notes next to the plan."""
    for rule in RULES:
        if rule.adapter or rule.cause == "late failures":
            continue
        cited = [e.name for e in catalog.entries("sglang")
                 if any(f"docs/catalog.md {rule.cause}" in note for note in e.meta.get("engine_differs", ()))]
        assert cited, rule.cause


@pytest.mark.parametrize("backend,platform", [("aiter", "hip:gfx942"), ("triton", "hip:gfx942"),
                                              ("triton", "cuda:sm90"), ("fa3", "cuda:sm90")])
def test_seed_scenario_num_steps_1_captures_draft_extend(backend: str, platform: str) -> None:
    """The seed bug, in engine vocabulary: one draft step still captures draft extend."""
    args = {"attention_backend": backend, "speculative_algorithm": "EAGLE", "speculative_num_steps": 1,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}
    result = sglang.plan_server_args(args, platform, model="mha")
    assert result.valid
    assert result[Phase.DRAFT_EXTEND].capture and result[Phase.DRAFT_EXTEND].backend == f"sglang:{backend}"
    assert not result[Phase.DRAFT_DECODE].runs


def test_cpu_intel_amx_captures_no_speculative_graph() -> None:
    """Outside the executed grid (SGLang's CPU path needs AMX kernels to build its backend):
    SGLang on CPU captures no speculative graph (eagle_worker_v2.py's first check), and attnhal's
    plan on a CPU platform captures none either."""
    args = {"attention_backend": "intel_amx", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    result = sglang.plan_server_args(args, "cpu", model="mha")
    assert not any(result[p].capture for p in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY))
