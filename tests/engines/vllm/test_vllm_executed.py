"""attnhal's vLLM adapter against vLLM 0.33.0's own graph-mode code, executed.

Grid: every catalogued CUDA backend whose metadata builder imports on CPU x the model config
it serves (MHA / MLA) x no speculation, ngram, eagle (3 speculative tokens) x requested
cudagraph_mode {vLLM's default, FULL, FULL_DECODE_ONLY, PIECEWISE} x emulated SM90 / SM100.
Per cell: the builder's ``AttentionCGSupport`` (``get_cudagraph_support``) against the
catalogue's ``meta.cg_support``, and the mode vLLM resolves (or its error) against
``attnhal.engines.vllm.from_engine_args``. ``RULES`` explains every difference (see
``tests/helpers/sglang_expected.py`` for the two kinds).
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import harness
from harness import NOT_REACHED
import pytest
from tier_summary import LINES as SUMMARY

PLATFORMS = ("cuda:sm90", "cuda:sm100")
MODES = (None, "FULL", "FULL_DECODE_ONLY", "PIECEWISE")  # None: vLLM's default
SPECS = (None, "ngram", "eagle")
SPEC_TOKENS = 3



@dataclass(frozen=True)
class Case:
    backend: str
    model: str
    spec: str | None
    mode: str | None
    platform: str

    def __str__(self) -> str:
        return f"{self.platform}:{self.backend}:{self.model}:{self.spec or 'nospec'}:{self.mode or 'default'}"

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
    for backend, model in backends():
        for spec in SPECS:
            for mode in MODES:
                for platform in PLATFORMS:
                    yield Case(backend, model, spec, mode, platform)


@dataclass(frozen=True)
class Outcome:
    support: str | None
    mode: str | None
    error: str | None
    sizes: tuple[int, ...] = ()


def engine_outcome(case: Case) -> Outcome:
    config = harness.engine_config(case.backend, case.model, case.speculative(), case.mode)
    r = harness.resolve(config, case.backend, case.platform)
    return Outcome(r.support, r.mode, r.error, r.capture_sizes)


def attnhal_outcome(case: Case) -> Outcome:
    from attnhal.engines import vllm

    args: dict[str, object] = {"attention_backend": case.backend}
    if case.spec is not None:
        args["speculative_config"] = json.dumps({"method": case.spec, "num_speculative_tokens": SPEC_TOKENS})
    if case.mode is not None:
        args["compilation_config"] = json.dumps({"cudagraph_mode": case.mode})
    # The harness answers FlashInfer's cubin check "no cubins": the same assumption, stated.
    config = vllm.from_engine_args(args, case.platform, trtllm_cubins=False)
    r = config.resolution
    assert config.level is not None
    return Outcome(config.level.support.name, r.mode.value if r.mode else None, r.error)


def differences(engine: Outcome, attnhal: Outcome) -> frozenset[str]:
    out = set()
    if engine.support != attnhal.support:
        out.add(f"support: engine {engine.support}, catalogue {attnhal.support}")
    if (engine.error is None) != (attnhal.error is None):
        out.add("engine raises, attnhal resolves" if engine.error else "attnhal raises, engine resolves")
    elif engine.mode != attnhal.mode:
        out.add(f"mode: engine {engine.mode}, attnhal {attnhal.mode}")
    return frozenset(out)


@dataclass(frozen=True)
class Rule:
    cause: str
    applies: Callable[[Case], bool]
    labels: str

    def explains(self, label: str) -> bool:
        return re.fullmatch(self.labels, label) is not None


#: Nothing differs: FLASHINFER's level (trtllm-gen cubins) and HPC_ATTN's (speculation) are
#: decided per configuration by ``attnhal.engines.vllm.levels``. A new difference needs a rule.
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
    SUMMARY.append(f"grid: {len(out)} cases; not reached here: " + ", ".join(sorted(NOT_REACHED)))
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for case, (engine, attnhal) in out.items():
        labels = differences(engine, attnhal)
        causes = sorted({r.cause for r in rules_for(case) for label in labels if r.explains(label)})
        per[case.backend][", ".join(causes) or ("agree" if not labels else "UNEXPLAINED")] += 1
        per[case.backend][f"vLLM {engine.mode or 'raises'}"] += 1
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
