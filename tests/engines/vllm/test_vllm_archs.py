"""The vLLM catalogue's arch sets against vLLM's own arch checks, executed.

For every catalogued CUDA backend whose class imports here, on each compute capability of
``harness.ARCH_CHECKED``: vLLM refuses the backend for its arch (``supports_compute_capability``,
and ``supports_combination`` where it depends on the device) exactly where the catalogue's
``archs`` leave the arch out, and attnhal's plan says ``[arch]`` there. Backends whose module
cannot be imported on a CPU-only machine (``harness.NOT_REACHED``) carry the arch set read
from the source, cited in their TOML.
"""

from __future__ import annotations

import harness
from harness import ARCH_CHECKED, NOT_REACHED
import pytest


def _cuda_backends() -> list[tuple[str, str]]:
    from attnhal import catalog

    out = []
    for entry in catalog.entries("vllm"):
        if "cuda" in {v.value for v in entry.descriptor.vendors} and entry.name not in NOT_REACHED:
            out.append((entry.name, [m.value for m in entry.descriptor.models if m.value in ("mha", "mla")][0]))
    return out


def _catalogue_takes(backend: str, major: int, minor: int) -> bool:
    from attnhal import catalog
    from attnhal.platform import parse

    platform = parse(f"cuda:sm{major}{minor}")
    archs = catalog.load(f"vllm:{backend}").descriptor.archs.get(platform.vendor)
    return archs is None or platform.arch in archs


def _plan_refuses_arch(backend: str, model: str, major: int, minor: int) -> bool:
    import attnhal_vllm as vllm

    platform = f"cuda:sm{major}{minor}"
    plan = vllm.from_engine_args({"attention_backend": backend}, platform, model=model).plan(platform)
    return any(r.code == "arch" for d in plan.phases.values() for r in d.reasons)


@pytest.mark.parametrize(("backend", "model"), _cuda_backends())
def test_catalogue_archs_are_vllms(backend: str, model: str) -> None:
    refusals = harness.arch_refusals(backend, model)
    for (major, minor), refused in refusals.items():
        takes = _catalogue_takes(backend, major, minor)
        assert takes is (refused is None), f"vllm:{backend} on {major}.{minor}: vLLM {refused or 'takes it'}"
        assert _plan_refuses_arch(backend, model, major, minor) is not takes


def test_the_issue_refusals_are_predicted() -> None:
    """Issue 30 item 2: FLASHINFER_MLA and CUTLASS_MLA need 10.x; FLASHMLA and FLASH_ATTN_MLA refuse sm100."""
    for backend, platform in (("FLASHINFER_MLA", "cuda:sm90"), ("CUTLASS_MLA", "cuda:sm90"),
                              ("FLASHMLA", "cuda:sm100"), ("FLASH_ATTN_MLA", "cuda:sm100")):
        major, minor = int(platform[7:-1]), int(platform[-1])
        assert _plan_refuses_arch(backend, "mla", major, minor), (backend, platform)
    assert len(ARCH_CHECKED) >= 8 and len(_cuda_backends()) >= 10
