"""Acceptance grid: attnhal's plan from the SGLang catalogue vs SGLang 0.5.23's own decisions.

For every catalogued SGLang backend, on CUDA and HIP where it exists, for num_steps
1, 2, 3, 5, topk 1, 2, 4, 8, each page size it supports and each model kind it
serves, the plan that ``attnhal.engines.sglang`` builds from the engine's own flags
is compared with ``engine_transcripts.sglang_decisions`` — a hand transcription of
the engine's code, rule by rule with its source lines. Split prefill/decode backends under
both ``--speculative-attention-mode`` values are planned too. Every difference must be a
documented discrepancy in docs/catalog.md: the test asserts the set of differences
*exactly*, so a new difference (or a fixed one) fails it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from attnhal import catalog
from attnhal.engines import sglang
from attnhal.phases import Phase
from engine_transcripts.sglang_decisions import Case, decide
from repo import ROOT

DOCS = ROOT / "docs" / "catalog.md"

#: The platform each backend is planned on per vendor (the arch it is built for).
PLATFORMS = {
    "triton": {"cuda": "sm90", "hip": "gfx942"},
    "flashinfer": {"cuda": "sm90"},
    "fa3": {"cuda": "sm90"},
    "fa4": {"cuda": "sm100"},
    "aiter": {"hip": "gfx942"},
    "trtllm_mha": {"cuda": "sm100"},
    "trtllm_mla": {"cuda": "sm100"},
    "cutedsl_mla": {"cuda": "sm100"},
    "flashmla": {"cuda": "sm90"},
    "dsa": {"cuda": "sm90", "hip": "gfx942"},
    "torch_native": {"cuda": "sm90", "hip": "gfx942"},
    "wave": {"hip": "gfx942"},
    "intel_amx": {"cpu": "cpu"},
}
STEPS = (1, 2, 3, 5)
TOPKS = (1, 2, 4, 8)
#: EAGLE's phases (EAGLE3, NEXTN and STANDALONE decide the same way), and n-gram (verify only).
ALGORITHMS = ("EAGLE", "NGRAM")
SPEC_PHASES = (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)

#: Every difference between attnhal and the engine, by (backend, vendor, what differs) ->
#: the entry of docs/catalog.md that explains it. Split backends are labelled prefill/decode/mode.
EAGER_EXTEND = "draft_extend: attnhal captures, engine eager"
INVALID = "attnhal: plan invalid, engine runs"
DOCUMENTED = {
    ("aiter", "hip", EAGER_EXTEND): "D1",
    ("triton", "hip", EAGER_EXTEND): "D2",
    ("flashinfer", "cuda", INVALID): "D3",
    ("dsa", "cuda", INVALID): "D4",
    ("dsa", "hip", INVALID): "D4",
    ("torch_native", "cuda", INVALID): "D6",
    ("torch_native", "hip", INVALID): "D6",
    **{(f"{pair}/{mode}", "hip", EAGER_EXTEND): "D7"
       for pair in ("aiter/triton", "triton/aiter") for mode in ("prefill", "decode")},
}


def cases() -> Iterator[tuple[Case, str]]:
    for name, platforms in PLATFORMS.items():
        caps = catalog.load(f"sglang:{name}").descriptor
        models = sorted(m.value for m in caps.models if m.value != "gqa")
        for vendor, arch in platforms.items():
            for model in models:
                for page in sorted(caps.page_sizes):
                    for algorithm in ALGORITHMS:
                        for steps in STEPS:
                            for topk in TOPKS:
                                case = Case(name, vendor, arch, model, steps, topk, page, algorithm)
                                yield case, f"{vendor}:{arch}"


#: Split prefill/decode backends (--attention-backend X --decode-attention-backend Y) under both
#: --speculative-attention-mode values, per vendor.
SPLIT = {"cuda": ("triton", "fa3", "flashinfer"), "hip": ("triton", "aiter")}


def split_cases() -> Iterator[tuple[Case, str]]:
    for vendor, names in SPLIT.items():
        arch = {"cuda": "sm90", "hip": "gfx942"}[vendor]
        for prefill in names:
            for decode in names:
                if prefill == decode:
                    continue
                for mode in ("prefill", "decode"):
                    for steps in STEPS:
                        for topk in (1, 2):
                            case = Case(prefill, vendor, arch, "mha", steps, topk, 1, decode_backend=decode,
                                        attention_mode=mode)
                            yield case, f"{vendor}:{arch}"


def _args(case: Case) -> dict[str, object]:
    args = {"attention_backend": case.backend, "decode_attention_backend": case.decode,
            "speculative_attention_mode": case.attention_mode, "speculative_algorithm": case.algorithm,
            "speculative_num_draft_tokens": case.topk * case.num_steps + 1, "page_size": case.page_size}
    if case.algorithm == "NGRAM":
        args["speculative_ngram_max_bfs_breadth"] = case.topk
    else:
        args.update(speculative_num_steps=case.num_steps, speculative_eagle_topk=case.topk)
    return args


def page_replaced(case: Case, platform: str) -> bool:
    """SGLang replaces this page size (the transcription does not model that; the executed
    tier, tests/engines/sglang, compares these cases with SGLang's own resolution)."""
    return sglang.from_server_args(_args(case), model=case.model).page_size(platform).set_by is not None


def attnhal_view(case: Case, platform: str) -> tuple[bool, frozenset[str], frozenset[str]]:
    result = sglang.plan_server_args(_args(case), platform, model=case.model)
    runs = frozenset(p.value for p in SPEC_PHASES if result[p].runs)
    captured = frozenset(p.value for p in SPEC_PHASES if result[p].capture)
    return result.valid, runs, captured


def differences(case: Case, platform: str) -> set[str]:
    valid, runs, captured = attnhal_view(case, platform)
    engine = decide(case)
    if valid != (engine.refused is None):
        return {"attnhal: plan invalid, engine runs" if not valid else "attnhal: plan valid, engine refuses"}
    if not valid:
        return set()
    out = set()
    for phase in SPEC_PHASES:
        name = phase.value
        if (name in runs) != (name in engine.runs):
            out.add(f"{name}: runs differ")
        elif (name in captured) != (name in engine.captured):
            who = ("attnhal captures, engine eager" if name in captured else "engine captures, attnhal eager")
            out.add(f"{name}: {who}")
    return out


def test_grid_differences_are_exactly_the_documented_ones() -> None:
    found: dict[tuple[str, str, str], Case] = {}
    count = 0
    for case, platform in [*cases(), *split_cases()]:
        if page_replaced(case, platform):
            continue
        count += 1
        label = case.backend if case.decode == case.backend else f"{case.backend}/{case.decode}/{case.attention_mode}"
        for what in differences(case, platform):
            found.setdefault((label, case.vendor, what), case)
    assert count > 1000, count
    unexplained = {k: found[k] for k in set(found) - set(DOCUMENTED)}
    assert not unexplained, f"differences not documented in docs/catalog.md: {unexplained}"
    gone = set(DOCUMENTED) - set(found)
    assert not gone, f"documented differences no longer seen (fixed? update docs/catalog.md): {gone}"


def test_every_documented_difference_is_an_entry_of_catalog_md() -> None:
    text = DOCS.read_text(encoding="utf-8")
    headings = set(re.findall(r"^### (D\d+)\b", text, flags=re.MULTILINE))
    assert set(DOCUMENTED.values()) <= headings


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


def test_each_difference_is_also_noted_in_the_backends_catalogue_file() -> None:
    """`attnhal plan --engine sglang` prints these notes next to the plan."""
    for (label, _, _), entry_id in DOCUMENTED.items():
        for backend in label.split("/")[:2]:
            notes = catalog.load(f"sglang:{backend}").meta.get("engine_differs", ())
            assert any(f"docs/catalog.md {entry_id}" in n for n in notes), (backend, entry_id)
