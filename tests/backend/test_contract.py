"""The base AttentionBackend's own rules: prefill is never captured (for every backend),
``attend`` serves each phase without a ``forward_<phase>``, and the one dtype-name table."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from cases import random_spec

from attnhal.backend import (
    COMPUTE_DTYPES,
    PADDING_SLOT,
    AttentionBackend,
    AttentionConfig,
    BatchValidationError,
    ForwardBatch,
    KVPool,
    UnsupportedPhase,
    compute_dtype,
    dtype_name,
    set_debug,
)
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.platform import parse
from attnhal.spec import DTYPES
from attnhal.testing.cases import Case, build_case
from attnhal_cpu import CpuBackend
from attnhal_torch import TorchBackend

CAPS = TorchBackend.capabilities


def _case(phase: Phase, seed: int = 3) -> Case:
    return build_case(random_spec(phase, seed=seed, requests=2, head_size=64))  # every backend serves 64


class AttendOnly(AttentionBackend):
    """A single-kernel backend: one ``attend`` for every phase; records what ran."""

    capabilities: ClassVar[BackendCapabilities] = dataclasses.replace(CAPS, name="attend-only")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: list[tuple[str, Phase]] = []

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        self.calls.append(("attend", batch.phase))
        return torch.zeros((*q.shape[:2], self.config.out_head_size), dtype=q.dtype)

    def build_capture_metadata(self, batch: ForwardBatch) -> None:
        self.calls.append(("capture", batch.phase))


class DecodeOfItsOwn(AttendOnly):
    """Decode has its own method; every other phase runs ``attend``."""

    capabilities: ClassVar[BackendCapabilities] = dataclasses.replace(CAPS, name="decode-of-its-own")

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        self.calls.append(("forward_decode", batch.phase))
        return torch.ones((*q.shape[:2], self.config.out_head_size), dtype=q.dtype)


class Neither(AttentionBackend):
    """Lists every phase, implements none."""

    capabilities: ClassVar[BackendCapabilities] = dataclasses.replace(CAPS, name="neither")


class OverridesTheTemplate(TorchBackend):
    """Overrides ``init_capture_metadata`` the old way, calling ``super()``: still refused."""

    capabilities: ClassVar[BackendCapabilities] = dataclasses.replace(CAPS, name="overrides-the-template")

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        super().init_capture_metadata(batch)


def _torch(case: Case) -> AttentionBackend:
    return TorchBackend(case.config, case.pool)


def _cpu(case: Case) -> AttentionBackend:
    reasons = CpuBackend.runtime_reasons(parse("cpu"))
    if reasons:
        pytest.skip(f"cpu kernel unavailable: {reasons}")
    return CpuBackend(case.config, case.pool)


def _triton(case: Case) -> AttentionBackend:
    from attnhal_triton import TritonBackend  # constructing it imports no triton

    return TritonBackend(case.config, case.pool, platform=parse("cpu"))


MAKERS = {"torch": _torch, "cpu": _cpu, "triton": _triton,
          "attend-only": lambda case: AttendOnly(case.config, case.pool),
          "overrides-the-template": lambda case: OverridesTheTemplate(case.config, case.pool)}


# --- prefill is never captured ----------------------------------------------------------

@pytest.mark.parametrize("make", MAKERS.values(), ids=list(MAKERS))
def test_every_backend_refuses_to_capture_prefill(make: Any) -> None:
    prefill = _case(Phase.PREFILL)
    backend = make(prefill)
    backend.init_graph_state(4, 64)
    with pytest.raises(UnsupportedPhase, match=r"phase=prefill for graphs \(supported: decode, draft_decode"):
        backend.init_capture_metadata(prefill.batch)


@pytest.mark.parametrize("make", MAKERS.values(), ids=list(MAKERS))
def test_every_backend_still_captures_decode(make: Any) -> None:
    decode = _case(Phase.DECODE)
    backend = make(decode)
    backend.init_graph_state(4, 64)
    backend.init_capture_metadata(decode.batch)  # the hook ran: no refusal for a capturable phase


def test_the_refusal_comes_before_the_backends_hook() -> None:
    prefill, decode = _case(Phase.PREFILL), _case(Phase.DECODE)
    backend = AttendOnly(prefill.config, prefill.pool)
    with pytest.raises(UnsupportedPhase):
        backend.init_capture_metadata(prefill.batch)
    assert backend.calls == []
    backend = AttendOnly(decode.config, decode.pool)
    backend.init_capture_metadata(decode.batch)
    assert backend.calls == [("capture", Phase.DECODE)]
    assert set(GRAPH_PHASES) == set(Phase) - {Phase.PREFILL}  # what the refusal names as supported


def test_the_base_validates_a_captured_batch_in_debug_mode() -> None:
    decode = _case(Phase.DECODE)
    backend = AttendOnly(decode.config, decode.pool)  # validates nothing itself
    bad = dataclasses.replace(decode.batch, seq_lens=torch.full_like(decode.batch.seq_lens, -1))
    set_debug(True)
    try:
        with pytest.raises(BatchValidationError, match=r"seq_lens\[0\]=-1"):
            backend.init_capture_metadata(bad)
    finally:
        set_debug(None)
    assert backend.calls == []
    set_debug(False)
    try:
        backend.init_capture_metadata(bad)  # debug off: no host reads, the hook runs
    finally:
        set_debug(None)
    assert backend.calls == [("capture", Phase.DECODE)]


# --- attend ---------------------------------------------------------------------------------

@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
def test_attend_serves_every_phase_after_the_kv_write(phase: Phase) -> None:
    case = _case(phase)
    backend = AttendOnly(case.config, case.pool)
    written: list[bool] = []

    def attend(q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        real = batch.out_cache_loc != PADDING_SLOT  # padding tokens all write one slot
        stored = case.pool.k[layer][batch.out_cache_loc[real]].to(case.k.dtype)
        written.append(bool(real.any()) and bool(torch.equal(stored, case.k[real])))
        return AttendOnly.attend(backend, q, layer, batch)

    backend.attend = attend  # type: ignore[method-assign]
    out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    assert backend.calls == [("attend", phase)]
    assert written == [True]  # the base forward wrote the new K/V before attending
    assert out.shape == (case.batch.num_tokens, case.config.num_q_heads, case.config.out_head_size)


def test_a_phase_method_of_its_own_wins_over_attend() -> None:
    for phase, ran in ((Phase.DECODE, "forward_decode"), (Phase.PREFILL, "attend"),
                       (Phase.TARGET_VERIFY, "attend")):
        case = _case(phase)
        backend = DecodeOfItsOwn(case.config, case.pool)
        backend.forward(case.q, case.k, case.v, case.layer, case.batch)
        assert backend.calls == [(ran, phase)]


def test_a_backend_with_neither_names_both() -> None:
    case = _case(Phase.DECODE)
    with pytest.raises(UnsupportedPhase, match="lists phase=decode but implements neither forward_decode nor attend"):
        Neither(case.config, case.pool).forward(case.q, case.k, case.v, case.layer, case.batch)


def test_an_unlisted_phase_is_refused_before_attend() -> None:
    class DecodeOnly(AttendOnly):
        capabilities: ClassVar[BackendCapabilities] = dataclasses.replace(
            CAPS, name="decode-only", phases=frozenset({Phase.DECODE}), graph={})

    case = _case(Phase.PREFILL)
    backend = DecodeOnly(case.config, case.pool)
    with pytest.raises(UnsupportedPhase, match=r"phase=prefill \(supported: decode\)"):
        backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    assert backend.calls == []


def test_single_kernel_reference_backends_define_attend_not_aliases() -> None:
    from attnhal_triton import TritonBackend

    phase_methods = {f"forward_{p.value}" for p in Phase}
    for cls in (TorchBackend, CpuBackend):
        assert "attend" in vars(cls) and not phase_methods & set(vars(cls)), cls.__name__
    # Triton: decode and draft decode have their own kernels; the three extend phases share attend.
    assert phase_methods & set(vars(TritonBackend)) == {"forward_decode", "forward_draft_decode"}
    assert "attend" in vars(TritonBackend)


# --- one dtype-name table -------------------------------------------------------------------

def test_one_dtype_table_read_both_ways() -> None:
    assert tuple(COMPUTE_DTYPES) == DTYPES  # the descriptor's names, nothing more
    for name, dtype in COMPUTE_DTYPES.items():
        assert compute_dtype(name) is dtype and dtype_name(dtype) == name
    assert {dtype_name(d) for d in (torch.float32, torch.float16, torch.bfloat16)} == set(DTYPES)


def test_the_test_kit_reads_the_same_table() -> None:
    from attnhal.testing.cases import TORCH_DTYPES

    assert TORCH_DTYPES is COMPUTE_DTYPES


def test_unknown_dtypes_name_the_field_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"dtype=torch.int8 \(supported: torch.float32, torch.float16, "
                                         r"torch.bfloat16\)"):
        dtype_name(torch.int8)
    with pytest.raises(ValueError, match=r"dtype='fp16' \(supported: float32, float16, bfloat16\)"):
        compute_dtype("fp16")
    with pytest.raises(ValueError, match="dtype=torch.float64"):
        AttentionConfig(2, 1, 16, dtype=torch.float64)


# --- config tensors live beside the pool ------------------------------------------------

def test_on_device_moves_every_tensor_once() -> None:
    """A moved copy when a tensor is elsewhere (the caller's config untouched); the very same
    config when all are there already, so a backend built on it copies nothing."""
    config = AttentionConfig(8, 2, 64, sinks=torch.randn(2, 8))
    moved = config.on_device(torch.device("meta"))
    assert moved.sinks is not None and moved.sinks.device == torch.device("meta")
    assert config.sinks is not None and config.sinks.device == torch.device("cpu")
    assert moved == config  # the shapes and features are the same model
    assert moved.on_device(torch.device("meta")) is moved
    assert config.on_device(torch.device("cpu")) is config


@pytest.mark.parametrize("name", [n for n in MAKERS if n != "cpu"])  # the cpu kernel refuses sinks
def test_every_backend_keeps_config_tensors_on_the_pools_device(name: str) -> None:
    """Sinks given on the host, a pool on another device (``meta``): the backend's config
    holds them on the pool's device (on a GPU, a host tensor handed to a kernel fails)."""
    case = _case(Phase.DECODE)
    config = dataclasses.replace(case.config, sinks=torch.randn(1, case.config.num_q_heads))
    pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=config.num_kv_heads, head_dim=config.head_size,
                  dtype=config.dtype, max_reqs=2, max_context_len=8, device="meta")
    backend = MAKERS[name](dataclasses.replace(case, config=config, pool=pool))
    assert backend.config.sinks is not None and backend.config.sinks.device == pool.device
