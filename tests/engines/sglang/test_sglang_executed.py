"""attnhal's SGLang adapter and plan against SGLang 0.5.23's own code, executed, cell by cell.

Grids (``tests/helpers/sglang_grid.py``): every catalogued CUDA/HIP backend x cuda:sm90 / cuda:sm100 / hip:gfx942
x num_steps {1, 2, 3, 5} x topk {1, 2, 4, 8} x page size {default, 16, 64} x the MHA / MLA
model configs it serves (EAGLE); split prefill/decode backends under both
--speculative-attention-mode values; EAGLE3, NEXTN and STANDALONE; NGRAM. Per cell: SGLang's
acceptance (or its exception), resolved page size and (prefill, decode) roles, the draft
runners it builds and whether the target's graph runner is built, against attnhal's
``from_server_args`` / plan. ``sglang_expected.py`` explains every difference. The executed views
are also the recording the main suite checks the adapter against (``sglang_recording.py``).
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import harness
import platforms
import pytest
import sglang_grid as grid
import sglang_recording
from sglang_expected import RULES, Rule, as_resolved, check, rules_for
from sglang_grid import Case, View
from tier_summary import LINES as SUMMARY


class AdapterDifference(AssertionError):
    """The difference an adapter rule predicts (the strict xfail's expected failure)."""


def _params(cases: list[Case]) -> Iterator[object]:
    for case in cases:
        adapter = [r.cause for r in rules_for(case) if r.adapter]
        marks = [pytest.mark.xfail(strict=True, raises=AdapterDifference, reason=cause) for cause in adapter]
        yield pytest.param(case, id=str(case).replace(" ", ""), marks=marks)


GRIDS = grid.grids()
ALL_CASES = grid.all_cases()


@pytest.fixture(scope="module")
def views() -> dict[Case, tuple[View, View]]:
    """SGLang's and attnhal's view of every case, computed once (grouped by emulated platform)."""
    out = {}
    for platform, cases in itertools.groupby(sorted(ALL_CASES, key=lambda c: c.platform), key=lambda c: c.platform):
        with platforms.emulate(platform):
            for case in cases:
                out[case] = (harness.engine_view(case), grid.attnhal_view(case))
    _summarise(out)
    return out


def _outcome(case: Case, engine: View, observed: frozenset[str]) -> str:
    causes = sorted({r.cause for r in rules_for(as_resolved(case, engine)) for label in observed if r.explains(label)})
    return ", ".join(causes) if causes else ("agree" if not observed else "UNEXPLAINED")


def _summarise(views: dict[Case, tuple[View, View]]) -> None:
    SUMMARY.append(f"grid: {len(views)} cases (" + ", ".join(f"{k} {len(v)}" for k, v in GRIDS.items()) + ")")
    per_backend: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for case, (engine, attnhal) in views.items():
        outcome = _outcome(case, engine, grid.differences(engine, attnhal))
        per_backend[case.label][outcome] += 1
        per_backend[case.label]["SGLang refuses" if not engine.accepted else "SGLang runs"] += 1
    for label, counts in sorted(per_backend.items()):
        total = counts["SGLang refuses"] + counts["SGLang runs"]
        rest = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()) if k not in ("SGLang refuses", "SGLang runs"))
        SUMMARY.append(f"  {label:24} {total:4} cases: SGLang runs {counts['SGLang runs']}, refuses "
                       f"{counts['SGLang refuses']}; {rest}")


def _check(case: Case, engine: View, attnhal: View) -> None:
    adapter = check(case, engine, attnhal)
    if adapter:
        raise AdapterDifference(f"{adapter}: {sorted(grid.differences(engine, attnhal))}\n  case: {case}")


@pytest.mark.parametrize("case", list(_params(ALL_CASES)))
def test_sglang_executed_grid(case: Case, views: dict[Case, tuple[View, View]]) -> None:
    engine, attnhal = views[case]
    _check(case, engine, attnhal)


def test_grid_covers_every_rule_and_every_catalogued_backend(views: dict[Case, tuple[View, View]]) -> None:
    """Each rule applies somewhere (a rule no case reaches explains nothing), and every
    catalogued CUDA/HIP backend is in the grid."""
    from attnhal import catalog

    unused: list[Rule] = [r for r in RULES if not any(r.applies(c) for c in views)]
    assert not unused, [r.cause for r in unused]
    backends = {c.backend for c in views}
    vendors = set(grid.VENDOR_PLATFORMS)
    missing = {e.name for e in catalog.entries("sglang") if {v.value for v in e.descriptor.vendors} & vendors}
    assert missing <= backends, missing - backends
    assert len(views) > 2500, len(views)


def test_recording_is_what_sglang_decides(views: dict[Case, tuple[View, View]]) -> None:
    """The main suite checks the adapter against ``tests/engines/recorded/``: it must be today's
    execution, case for case (``ATTNHAL_RECORD=1`` rewrites it)."""
    executed = [(case, views[case][0]) for case in ALL_CASES]
    elsewhere = os.environ.get("ATTNHAL_RECORD_TO")
    if elsewhere:  # a maintainer's run on another release (tests/engines/newest.py): record, compare nothing
        from importlib.metadata import version

        sglang_recording.write(executed, Path(elsewhere), engine=f"sglang=={version('sglang')}")
        return
    if os.environ.get("ATTNHAL_RECORD") == "1":
        sglang_recording.write(executed)
    engine, recorded = sglang_recording.load()
    assert engine == sglang_recording.ENGINE
    stale = [str(case) for case, view in executed
             if recorded.get(case) != sglang_recording.normal(view)]
    assert not stale and len(recorded) == len(executed), (
        f"{len(stale)} of {len(executed)} cases differ from {sglang_recording.PATH.name} (first: {stale[:3]}; "
        f"{len(recorded)} recorded): rerun the SGLang tier with ATTNHAL_RECORD=1")


# --- the seed bug and its relatives, in SGLang's own code ---------------------------------------------

def _runners(backend: str, platform: str, steps: int, decode: str | None = None, mode: str | None = None,
             env: dict[str, str] | None = None) -> dict[str, str]:
    args = {"attention_backend": backend, "speculative_algorithm": "EAGLE", "speculative_num_steps": steps,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}
    if decode:
        args.update(decode_attention_backend=decode, speculative_attention_mode=mode)
    resolution = harness.resolve(args, platform, "mha")
    assert resolution.accepted, resolution.error
    graphs = harness.draft_graphs(resolution, platform, env=env)
    assert graphs.error is None, graphs.error
    return dict(graphs.runners)


def test_seed_bug_d1_hip_aiter_one_step_builds_no_draft_extend_runner() -> None:
    """D1 in SGLang's executed code: on HIP, aiter with --speculative-num-steps 1 builds no
    draft-extend graph runner; with 2 steps (an aiter multi-step draft backend exists) it does;
    on CUDA the rule reads the draft-extend backend (triton: built at one step)."""
    assert _runners("aiter", "hip:gfx942", 1) == {}
    assert _runners("aiter", "hip:gfx942", 2) == {"draft_decode": "EAGLEDraftCudaGraphRunner",
                                                   "draft_extend": "EAGLEDraftExtendCudaGraphRunner"}
    assert _runners("triton", "cuda:sm90", 1) == {"draft_extend": "EAGLEDraftExtendCudaGraphRunner"}
    import attnhal_sglang as sglang

    plan = sglang.plan_server_args({"attention_backend": "aiter", "speculative_algorithm": "EAGLE",
                                    "speculative_num_steps": 1, "speculative_eagle_topk": 1,
                                    "speculative_num_draft_tokens": 2}, "hip:gfx942", model="mha")
    assert plan["draft_extend"].capture  # attnhal: aiter can capture draft extend at one step


def test_d2_triton_draft_extend_runner_built_on_cuda_never_on_hip() -> None:
    for steps in (1, 3):
        assert "draft_extend" in _runners("triton", "cuda:sm90", steps)
        assert "draft_extend" not in _runners("triton", "hip:gfx942", steps)


def test_d7_hip_split_draft_extend_follows_the_draft_decode_backend() -> None:
    """aiter prefill + triton decode: draft extend runs on aiter (mode prefill) and is never
    captured; triton prefill + aiter decode: captured only when an aiter multi-step backend exists."""
    for steps in (1, 3):
        assert "draft_extend" not in _runners("aiter", "hip:gfx942", steps, "triton", "prefill")
    assert "draft_extend" not in _runners("triton", "hip:gfx942", 1, "aiter", "prefill")
    assert "draft_extend" in _runners("triton", "hip:gfx942", 3, "aiter", "prefill")


def test_draft_extend_graph_env_switch_is_read_by_the_executed_worker_and_the_adapter() -> None:
    import attnhal_sglang as sglang

    env = {sglang.DRAFT_EXTEND_GRAPH_OFF: "1"}
    assert _runners("triton", "cuda:sm90", 3, env=env) == {"draft_decode": "EAGLEDraftCudaGraphRunner"}
    plan = sglang.plan_server_args({"attention_backend": "triton", "speculative_algorithm": "EAGLE",
                                    "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                    "speculative_num_draft_tokens": 4}, "cuda:sm90", env=env, model="mha")
    assert not plan["draft_extend"].capture and plan["draft_decode"].capture


def test_every_catalogued_cause_is_an_entry_of_catalog_md_marked_as_shown() -> None:
    """Each non-adapter rule names a D-entry of docs/catalog.md (or its "Late failures" note),
    and each D-entry a rule reproduces says it is shown in the engine's executed code."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "catalog.md").read_text(encoding="utf-8")
    entries = dict(re.findall(r"^### (D\d+)\b.*?\n\n(.*?)(?=^### |\Z)", text, flags=re.MULTILINE | re.DOTALL))
    for rule in RULES:
        if rule.adapter:
            continue
        if rule.cause == "late failures":
            assert "**Late failures.**" in text and "rule `late failures`" in text
            continue
        assert rule.cause in entries, rule.cause
        assert "**Shown in the engine's executed code**" in entries[rule.cause], rule.cause


@pytest.mark.parametrize("backend", ["fa3", None])
def test_fa3_with_fp8_e5m2_kv_runs_on_triton_in_sglang_and_in_the_adapter(backend: str | None) -> None:
    """fa3 reads fp8 KV as e4m3 only: SGLang swaps it for triton, given or picked by default."""
    import attnhal_sglang as sglang

    args = {"kv_cache_dtype": "fp8_e5m2", **({"attention_backend": backend} if backend else {})}
    resolution = harness.resolve(args, "cuda:sm90", "mha")
    assert resolution.accepted and resolution.roles == ("triton", "triton"), resolution.error
    config = sglang.from_server_args(args, model="mha", platform="cuda:sm90")
    assert (config.roles["prefill"], config.roles["decode"]) == resolution.roles
