"""``attnhal advise --engine vllm`` against vLLM 0.33.0's own code, executed.

For each user configuration (emulated SM90 / SM100, MHA / MLA model, no speculation / EAGLE with 3
tokens, the weakest reachable backend as the user's choice), every backend advise recommends is
run through vLLM's ``create_engine_config``, its builder's ``get_cudagraph_support`` and
``_check_and_update_cudagraph_mode`` (``harness``): vLLM must capture at least the phases advise
claims. The phases a resolved mode captures are vLLM's levels read per phase (the graded
table of ``docs/engine.md``). Backends vLLM cannot import here (``harness.NOT_REACHED``) are
left out of the advice (``among``), so no recommendation goes unchecked.
"""

from __future__ import annotations

import json

import harness
from harness import NOT_REACHED
import pytest

from attnhal.engines import advise
from attnhal.phases import Phase

PLATFORMS = ("cuda:sm90", "cuda:sm100")
#: The user's flags per model: a backend that loses full graphs under speculation (FLASHINFER without
#: trtllm-gen cubins) or whose level downgrades the requested FULL mode (TRITON_MLA: UNIFORM_BATCH).
USERS = {"mha": {"attention_backend": "FLASHINFER"},
         "mla": {"attention_backend": "TRITON_MLA", "compilation_config": '{"cudagraph_mode": "FULL"}'}}
SPEC_TOKENS = 3
#: Where no reachable backend beats the user's: vLLM's MLA backends at ALWAYS need SM 10.x
#: (FLASHINFER_MLA, CUTLASS_MLA; their arch checks, executed in test_vllm_archs.py), and
#: FLASH_ATTN_MLA (ALWAYS on 9.x) cannot be imported here; FLASHMLA grades as TRITON_MLA does.
NOTHING_BETTER = {("mla", "cuda:sm90"): "an ALWAYS MLA backend vLLM takes on SM90 and this machine imports"}
#: vLLM's level -> the attnhal phases a FULL decode graph covers (``docs/engine.md``).
LEVEL_PHASES = {
    "ALWAYS": {Phase.DECODE, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY},
    "UNIFORM_BATCH": {Phase.DECODE, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY},
    "UNIFORM_SINGLE_TOKEN_DECODE": {Phase.DECODE, Phase.DRAFT_DECODE},
    "NEVER": set(),
}


def reachable(model: str) -> list[str]:
    from attnhal import catalog

    return [e.name for e in catalog.entries("vllm") if e.name not in NOT_REACHED
            and "cuda" in {v.value for v in e.descriptor.vendors} and model in {m.value for m in e.descriptor.models}]


def engine_captures(backend: str, model: str, speculative: bool, platform: str, mode: str | None) -> set[Phase]:
    spec = {"method": "eagle", "num_speculative_tokens": SPEC_TOKENS, "model": harness.model_dir(model)}
    config = harness.engine_config(backend, model, spec if speculative else None, mode)
    resolved = harness.resolve(config, backend, platform)
    assert resolved.error is None, resolved.error
    full_decode = resolved.mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    return LEVEL_PHASES[resolved.support] if full_decode else set()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("model", list(USERS))
@pytest.mark.parametrize("speculative", [False, True], ids=["nospec", "eagle"])
def test_every_recommendation_is_captured_by_vllm(platform: str, model: str, speculative: bool) -> None:
    args = dict(USERS[model])
    mode = json.loads(args.get("compilation_config", "{}")).get("cudagraph_mode")
    if speculative:
        args.update(spec_method="eagle", spec_tokens=str(SPEC_TOKENS))
    advice = advise("vllm", args, platform, model, trtllm_cubins=False, top=10, among=reachable(model))
    if speculative and (model, platform) in NOTHING_BETTER:
        assert not advice.recommended, NOTHING_BETTER[model, platform]
    elif speculative:  # the users' backends lose full graphs or downgrade the mode: something beats them
        best = advice.recommended[0]
        assert Phase.TARGET_VERIFY in best.captured and len(best.costs) < len(advice.current.costs) + len(
            advice.current.missed)
    for option in (advice.current, *advice.recommended):
        if option.blocked is not None:
            continue
        backend = option.flags["attention_backend"]
        missing = set(option.captured) - engine_captures(backend, model, speculative, platform, mode)
        assert not missing, f"{backend} on {platform}: advise claims {sorted(p.value for p in missing)} captured"
