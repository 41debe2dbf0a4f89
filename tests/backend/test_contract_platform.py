"""Backends are built with the platform they run on, and their claims are checked once per build.

A subclass takes ``platform`` as a keyword, or passes its ``**kwargs`` on to the base
``__init__``: either way it is built for the platform attnhal builds it for, and passes the kit.
One that takes neither is refused when given a platform (no hidden way around its signature).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from cases import random_spec

from attnhal.backend import (
    AttentionBackend,
    AttentionConfig,
    KVPool,
    MultiStepDraft,
    UnsupportedFeature,
    contract,
    default_platform,
    new_backend,
)
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.spec import SpecConfig
from attnhal.testing.cases import build_case
from attnhal.testing.checks.target import Target
from attnhal.testing.report import run_conformance
from attnhal_torch import TorchBackend

HIP = parse("hip:gfx942")


class Forwarding(TorchBackend):
    """A subclass that passes what it does not take on to the base ``__init__``."""

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        super().__init__(config, pool, **kwargs)
        self.built_for = self.platform  # set by the base, before this line runs


class WithOptions(TorchBackend):
    """A subclass with options of its own; the platform forwarded through ``**kwargs``."""

    def __init__(self, config: AttentionConfig, pool: KVPool, **options: Any) -> None:
        super().__init__(config, pool, chunk=options.pop("chunk_size", 64), **options)


class NoPlatform(TorchBackend):
    """A subclass whose ``__init__`` takes no platform and forwards nothing."""

    def __init__(self, config: AttentionConfig, pool: KVPool) -> None:
        super().__init__(config, pool)


def _case(phase: Phase = Phase.DECODE) -> Any:
    return build_case(random_spec(phase, seed=5, requests=2, head_size=64))


def _pool(dtype: torch.dtype, head: int = 64, device: str = "cpu") -> KVPool:
    return KVPool(num_layers=1, num_slots=64, num_kv_heads=2, head_dim=head, dtype=dtype, max_reqs=4,
                  max_context_len=32, device=device)


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNHAL_PLATFORM", raising=False)


def test_a_forwarding_subclass_is_built_for_the_platform_attnhal_builds_it_for() -> None:
    case = _case()
    backend = new_backend(Forwarding, case.config, case.pool, HIP)
    assert backend.platform is HIP and backend.built_for is HIP
    options = new_backend(WithOptions, case.config, case.pool, HIP, chunk_size=8)
    assert options.platform is HIP and options.chunk == 8
    by_hand = Forwarding(case.config, case.pool)  # no platform anywhere
    assert by_hand.platform == default_platform(case.pool) and by_hand.platform.name == "cpu"


def test_a_subclass_that_takes_no_platform_is_refused_one_and_built_without() -> None:
    case = _case()
    with pytest.raises(TypeError, match="platform"):
        new_backend(NoPlatform, case.config, case.pool, HIP)
    assert new_backend(NoPlatform, case.config, case.pool).platform.name == "cpu"


def test_the_platform_reaches_the_base_check_of_a_subclass() -> None:
    """A pool whose e4m3 flavour is not the platform's is refused for the platform passed."""
    cfg = AttentionConfig(num_q_heads=4, num_kv_heads=2, head_size=64)
    fnuz = _pool(torch.float8_e4m3fnuz)
    with pytest.raises(UnsupportedFeature, match=r"kv_dtype=fp8_e4m3 stored as e4m3fnuz .*cuda:sm90"):
        new_backend(Forwarding, cfg, fnuz, parse("cuda:sm90"))
    assert new_backend(Forwarding, cfg, fnuz, HIP).platform is HIP


def test_a_new_style_backend_gets_the_platform_as_its_keyword() -> None:
    case = _case()
    assert new_backend(TorchBackend, case.config, case.pool, HIP, chunk=8).platform is HIP
    with pytest.raises(TypeError, match="platform='hip:gfx942'"):
        TorchBackend(case.config, case.pool, platform="hip:gfx942")  # type: ignore[arg-type]


def test_the_default_platform_is_resolved_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _case().pool
    assert default_platform(pool).name == "cpu"
    monkeypatch.setenv("ATTNHAL_PLATFORM", "hip:gfx942")  # a simulated platform: tensors on the CPU
    assert default_platform(pool) == HIP
    gpu = dataclasses.replace(parse("cuda:sm90"), torch_device="cuda:0", simulated=False)
    monkeypatch.setattr(contract, "detect", lambda: gpu)  # a real GPU process
    monkeypatch.delenv("ATTNHAL_PLATFORM")
    assert default_platform(pool) == parse("cpu")  # a pool on the host: not the GPU's platform
    assert default_platform(_pool(torch.float32, device="meta")) is gpu  # a pool on a device: the process's


def test_the_multi_step_draft_the_kit_and_the_worker_pass_the_platform() -> None:
    case = _case(Phase.DRAFT_DECODE)
    spec = SpecConfig.eagle(3)
    draft = MultiStepDraft(Forwarding, case.config, case.pool, spec, platform=HIP)
    assert [draft.backend(s).platform for s in range(draft.num_forwards)] == [HIP, HIP]
    target = Target(Forwarding, HIP, backend_kwargs={})
    assert target.new_backend(case.config, case.pool).platform is HIP
    from attnhal.example_engine.model import ModelConfig, TinyLlama, draft_of
    from attnhal.example_engine.worker import SpecWorker
    from attnhal.planner import GraphPolicy

    model = TinyLlama(ModelConfig(num_layers=1, hidden_size=64, ffn_size=64, vocab_size=32, head_dim=16))
    worker = SpecWorker(model, draft_of(model), spec, platform="hip:gfx942", backend="torch",
                        policy=GraphPolicy(enabled=False, batch_sizes=(1,)), max_context_len=32)
    built = [worker.target_backend, worker.extend_backend, worker.multi_step.backend(0)]
    assert [b.platform for b in built] == [HIP] * 3


def test_a_forwarding_subclass_passes_the_kit_on_a_simulated_platform() -> None:
    report = run_conformance(Forwarding, platform="hip:gfx942", max_examples=0,
                             only=["phase[decode, float32]", "graph[decode]"])
    checked = {r.claim.name: r.status.value for r in report.results}
    assert report.ok and checked == {"phase[decode, float32]": "verified", "graph[decode]": "verified"}, checked


def test_one_claim_check_per_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract applies the capabilities' rule once; Triton's build adds no second check."""
    from attnhal_triton import TritonBackend
    from attnhal_triton import backend as triton_backend

    calls: list[object] = []
    real = contract.request_reasons
    monkeypatch.setattr(contract, "request_reasons", lambda caps, request: calls.append(request) or real(caps, request))
    case = _case()
    TritonBackend(case.config, case.pool, platform=HIP)
    assert len(calls) == 1
    assert not hasattr(triton_backend, "detect") and not hasattr(triton_backend, "not_supported_reasons")
    cfg = AttentionConfig(num_q_heads=4, num_kv_heads=2, head_size=80)
    with pytest.raises(UnsupportedFeature, match=r"head_size=80 \(supported: \{16, 32, 64, 128, 256, 576\}\)") as info:
        TritonBackend(cfg, _pool(torch.float32, head=80), platform=HIP)
    assert isinstance(info.value, ValueError)  # what backends raised before the contract checked it
    assert len(calls) == 2
