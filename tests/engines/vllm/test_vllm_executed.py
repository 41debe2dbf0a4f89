"""attnhal's vLLM adapter against vLLM's own graph-mode code (0.33.0 or 0.34.0), executed.

Grid: every catalogued CUDA backend whose metadata builder imports on CPU x the model config
it serves (MHA / MLA) x no speculation, ngram, eagle (3 speculative tokens) x requested
cudagraph_mode {vLLM's default, FULL, FULL_DECODE_ONLY, PIECEWISE} x emulated SM90 / SM100.
Per cell: whether vLLM's backend selection refuses the backend for the arch
(``harness.arch_refusals``) against an ``[arch]`` reason in attnhal's plan; where neither
refuses, the builder's ``AttentionCGSupport`` (``get_cudagraph_support``) against the
catalogue's ``meta.cg_support``, the mode vLLM resolves (or its error) against
``attnhal_vllm.from_engine_args``, and the drafter's draft-decode mode (each release's
own rule) against the adapter's and its plan of draft_decode. ``RULES`` explains every difference (see
``tests/helpers/sglang_expected.py`` for the two kinds).
"""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import harness
from harness import NOT_REACHED
import pytest
from tier_summary import LINES as SUMMARY
import vllm_recording
from vllm_recording import Outcome, differences

PLATFORMS = ("cuda:sm90", "cuda:sm100")
MODES = (None, "FULL", "FULL_DECODE_ONLY", "PIECEWISE")  # None: vLLM's default
SPECS = (None, "ngram", "eagle")
SPEC_TOKENS = vllm_recording.SPEC_TOKENS


class Case(vllm_recording.Case):
    """A grid cell (``vllm_recording.Case``) with vLLM's speculative config for it."""

    def speculative(self) -> dict[str, object] | None:
        if self.spec is None:
            return None
        out: dict[str, object] = {"method": self.spec, "num_speculative_tokens": SPEC_TOKENS}
        if self.spec == "ngram":
            out.update(prompt_lookup_max=3, prompt_lookup_min=1)
        else:
            out["model"] = harness.model_dir(self.model)
        return out


def backends() -> list[tuple[str, str]]:
    from attnhal import catalog

    out = []
    for entry in catalog.entries("vllm"):
        if "cuda" in {v.value for v in entry.descriptor.vendors} and entry.name not in NOT_REACHED:
            models = [m.value for m in entry.descriptor.models if m.value in ("mha", "mla")]
            out.append((entry.name, models[0]))
    return out


def cases() -> Iterator[Case]:
    """The grid on the runner vLLM selects (``VLLM_USE_V2_MODEL_RUNNER`` unset); on 0.33, which has
    both runners, the EAGLE cells again on the V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``)."""
    for backend, model in backends():
        for spec in SPECS:
            for mode in MODES:
                for platform in PLATFORMS:
                    yield Case(backend, model, spec, mode, platform)
                    if spec == "eagle" and not harness.V2_RUNNER[harness.release()]:
                        yield Case(backend, model, spec, mode, platform, "0")


@functools.cache
def _arch_refusals(backend: str, model: str) -> dict[tuple[int, int], str | None]:
    return harness.arch_refusals(backend, model)


def engine_outcome(case: Case) -> Outcome:
    refused = _arch_refusals(case.backend, case.model)[harness.CAPABILITIES[case.platform]] is not None
    config = harness.engine_config(case.backend, case.model, case.speculative(), case.mode)
    r = harness.resolve(config, case.backend, case.platform, case.runner_env)
    return Outcome(r.support, r.mode, r.error, r.capture_sizes, refused, r.drafter, r.runner, r.draft_extend)


def attnhal_outcome(case: Case) -> Outcome:
    return vllm_recording.attnhal_outcome(case, harness.release())


@dataclass(frozen=True)
class Rule:
    cause: str
    applies: Callable[[Case], bool]
    labels: str

    def explains(self, label: str) -> bool:
        return re.fullmatch(self.labels, label) is not None


#: Nothing differs: FLASHINFER's level (trtllm-gen cubins) and HPC_ATTN's (speculation) are
#: decided per configuration by ``attnhal_vllm.levels``. A new difference needs a rule.
RULES: tuple[Rule, ...] = ()


def rules_for(case: Case) -> tuple[Rule, ...]:
    return tuple(r for r in RULES if r.applies(case))


class AdapterDifference(AssertionError):
    """The difference an adapter rule predicts (the strict xfail's expected failure)."""


ALL = list(cases())


def _params() -> Iterator[object]:
    for case in ALL:
        marks = [pytest.mark.xfail(strict=True, raises=AdapterDifference, reason=r.cause)
                 for r in rules_for(case) if r.cause.startswith("adapter:")]
        yield pytest.param(case, id=str(case), marks=marks)


@pytest.fixture(scope="module")
def outcomes() -> dict[Case, tuple[Outcome, Outcome]]:
    out = {case: (engine_outcome(case), attnhal_outcome(case)) for case in ALL}
    SUMMARY.append(f"grid (vLLM {harness.release()}): {len(out)} cases, "
                   f"{sum(engine.refused for engine, _ in out.values())} refused for the arch by vLLM; "
                   "not reached here: " + ", ".join(sorted(NOT_REACHED)))
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for case, (engine, attnhal) in out.items():
        labels = differences(engine, attnhal)
        causes = sorted({r.cause for r in rules_for(case) for label in labels if r.explains(label)})
        per[case.backend][", ".join(causes) or ("agree" if not labels else "UNEXPLAINED")] += 1
        per[case.backend]["refused (arch)" if engine.refused else f"vLLM {engine.mode or 'raises'}"] += 1
    for backend, counts in sorted(per.items()):
        SUMMARY.append(f"  {backend:22} " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    return out


@pytest.mark.parametrize("case", list(_params()))
def test_vllm_executed_grid(case: Case, outcomes: dict[Case, tuple[Outcome, Outcome]]) -> None:
    engine, attnhal = outcomes[case]
    observed = differences(engine, attnhal)
    rules = rules_for(case)
    context = f"\n  case: {case}\n  vLLM: {engine}\n  attnhal: {attnhal}\n  rules: {[r.cause for r in rules]}"
    unexplained = [label for label in observed if not any(r.explains(label) for r in rules)]
    assert not unexplained, f"differences no rule explains: {unexplained}{context}"
    gone = [r.cause for r in rules if not any(r.explains(label) for label in observed)]
    assert not gone, f"rules that apply explain no difference (fixed? remove the rule): {gone}{context}"
    adapter = [r.cause for r in rules if r.cause.startswith("adapter:")]
    if adapter:
        raise AdapterDifference(f"{adapter}: {sorted(observed)}{context}")


def test_every_catalogued_cuda_backend_is_reached_or_says_why() -> None:
    """The builders NOT_REACHED names really fail to import here; every other one is in the grid."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for name in NOT_REACHED:
        with pytest.raises((ImportError, AssertionError, RuntimeError)):
            with harness.emulate("cuda:sm90"):
                AttentionBackendEnum[name].get_class().get_builder_cls()
    assert len(backends()) >= 10, backends()


def test_flashinfer_with_speculation_on_sm90_resolves_piecewise_in_vllms_code() -> None:
    """The issue's example: FLASHINFER, spec decode, SM90, no trtllm-gen cubins -> PIECEWISE."""
    config = harness.engine_config("FLASHINFER", "mha", {"method": "ngram", "num_speculative_tokens": 3,
                                                         "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    r = harness.resolve(config, "FLASHINFER", "cuda:sm90")
    assert (r.support, r.mode) == ("UNIFORM_SINGLE_TOKEN_DECODE", "PIECEWISE"), r


def test_the_recording_is_what_vllm_decides(outcomes: dict[Case, tuple[Outcome, Outcome]]) -> None:
    """``tests/engines/recorded/vllm-<release>.jsonl`` holds this release's decisions, checked in the main
    suite (``tests/engines/test_vllm_grid.py``); ``ATTNHAL_RECORD=1`` writes it."""
    import os

    release = harness.release()
    engine = [(vllm_recording.Case(*(getattr(c, f) for f in vllm_recording.CASE_FIELDS)), e)
              for c, (e, _) in outcomes.items()]
    if os.environ.get("ATTNHAL_RECORD") == "1":
        vllm_recording.write(release, engine)
    assert vllm_recording.load(release) == {c: vllm_recording.kept(e) for c, e in engine}
