"""K/V bytes each kernel loads per forward, counted under the interpreter (issue 34, 4a).

Every phase at small shapes (GQA group 4; 4 and 8 draft tokens, chain and tree; pages 1
and 16; a window): decode, draft_decode, target_verify and draft_extend load each row's
attended K/V once (<= 1.05 x covered; the split overhead allowed is 0: splits are cut at
whole blocks and masked lanes do not count); prefill loads what its tiling model says
(each BLOCK_M block of flattened query rows re-reads its causal range), printed with the
tiling's cost. A tree of 8 at group 16 spans several blocks of 4 tokens: held to the tiling model of the
sized block (each block loads its own queries' ancestors). Each check fails on a planted
regression: a verify/draft-extend block smaller than the sizing gives, a forward that loads
the cache twice, and a tree verify loading every draft key of the row.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from planted_kernels import load_every_draft_key
from triton_cases import build, shape

from attnhal.phases import Phase
from attnhal.testing.cases import build_case
from attnhal_triton import TritonBackend, ops
from attnhal_triton.kv_traffic import count_kv_loads, kv_loads
from attnhal_triton.kv_traffic_model import (
    SLACK,
    TrafficCheck,
    check_traffic,
    covered_bytes,
    traffic_recipes,
    traffic_report,
    worst_ratio_per_phase,
)

RECIPES = traffic_recipes()


def _check(name: str, plant: _Plant | None = None) -> TrafficCheck:
    case = build_case(RECIPES[name])
    backend = TritonBackend(case.config, case.pool)
    if plant is None:
        return check_traffic(name, case, backend)
    with plant:
        return check_traffic(name, case, backend)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_phase_loads_what_its_model_says(name: str) -> None:
    check = _check(name)
    print(check.line())
    assert check.ok, check.line()
    if check.phase is not Phase.PREFILL and "group 16" not in name:
        assert check.expected == check.covered
    else:  # the tiling model never undercuts the floor, and these shapes have several blocks
        assert check.expected > check.covered


def test_the_report_covers_every_phase_and_both_page_sizes() -> None:
    phases = {r.phase for r in RECIPES.values()}
    assert phases == set(Phase)
    assert {r.page_size for r in RECIPES.values()} == {1, 16}
    assert {r.spec.num_draft_tokens for r in RECIPES.values() if r.phase is Phase.TARGET_VERIFY} == {4, 8}
    assert {r.num_q_heads // r.num_kv_heads for r in RECIPES.values()} == {4, 16}


# --- planted regressions ------------------------------------------------------------------

class _Plant:
    """Replace one custom op of :mod:`attnhal_triton.ops` for the duration of a ``with``."""

    def __init__(self, name: str, make: Any) -> None:
        self.name, self.make = name, make

    def __enter__(self) -> None:
        self.real = getattr(ops, self.name)
        setattr(ops, self.name, self.make(self.real))

    def __exit__(self, *exc: object) -> None:
        setattr(ops, self.name, self.real)


def _block_m(value: int) -> _Plant:
    """Every extend launch with ``BLOCK_M=value`` (a launch row sized below tokens x group)."""
    def make(real: Any) -> Any:
        def extend(*args: Any, launch: str, **kwargs: Any) -> None:
            real(*args, launch=re.sub(r"BLOCK_M=\d+", f"BLOCK_M={value}", launch), **kwargs)
        return extend
    return _Plant("extend", make)


def _twice(name: str) -> _Plant:
    """The op's kernel run twice per call: a forward that loads K and V twice."""
    def make(real: Any) -> Any:
        def twice(*args: Any, **kwargs: Any) -> None:
            real(*args, **kwargs)
            real(*args, **kwargs)
        return twice
    return _Plant(name, make)


@pytest.mark.parametrize("name", ["target_verify tree 8 page16", "target_verify chain 8 page1", "draft_extend 8 page16"])
def test_a_block_smaller_than_tokens_times_group_fails(name: str) -> None:
    """8 draft tokens x group 4 = 32 flattened rows in blocks of 16: each prefix tile read twice
    (a tree's block of 4 tokens loads only their ancestors among the draft keys: 1.86x)."""
    check = _check(name, _block_m(16))
    print(check.line())
    assert not check.ok and check.ratio > 1.8


def test_loading_draft_keys_no_query_of_the_block_sees_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Group 16 x a tree of 8 in blocks of 4 tokens: each block loads its queries' ancestors
    only (the tiled model exactly); the old load of every draft key of the row fails."""
    check = _check("target_verify tree 8 group 16 page1")
    assert check.loaded == check.expected > check.covered and check.model == "tiled BLOCK_M=64"
    load_every_draft_key(monkeypatch)
    planted = _check("target_verify tree 8 group 16 page1")
    print(planted.line())
    assert planted.loaded > check.loaded and not planted.ok


@pytest.mark.parametrize("name, op", [("decode page16", "decode_partial"), ("draft_decode 4 steps page1", "decode_partial"),
                                      ("prefill page16", "extend")])
def test_loading_the_cache_twice_fails(name: str, op: str) -> None:
    check = _check(name, _twice(op))
    print(check.line())
    assert not check.ok and check.ratio > 1.9


# --- the counter itself ---------------------------------------------------------------------

def test_masked_lanes_and_other_tensors_do_not_count() -> None:
    """A kernel loading 16 elements of K with 5 lanes masked off, all of V, and another
    tensor: 11 x 4 bytes of K, 16 x 2 of V (fp16), nothing else."""
    import triton
    import triton.language as tl

    @triton.jit
    def loads(K, V, Other, Out, limit):
        offs = tl.arange(0, 16)
        k = tl.load(K + offs, mask=offs < limit, other=0.0)
        v = tl.load(V + offs)
        o = tl.load(Other + offs)
        tl.store(Out + offs, k + v.to(tl.float32) + o)

    k, v = torch.ones(16), torch.ones(16, dtype=torch.float16)
    other, out = torch.ones(16), torch.empty(16)
    with kv_loads(k, v) as traffic:
        loads[(1,)](k, v, other, out, 11)
    assert [(launch.k_bytes, launch.v_bytes) for launch in traffic.launches] == [(11 * 4, 16 * 2)]
    assert torch.equal(out[:11], torch.full((11,), 3.0))


def test_a_forward_is_counted_per_launch() -> None:
    """Decode: the partials kernel reads the cache, the reduce reads only the partials."""
    case, backend = build(shape(Phase.DECODE, lens=(70, 5)))
    traffic = count_kv_loads(case, backend)
    assert [launch.op for launch in traffic.launches] == ["decode_partial", "decode_reduce"]
    assert traffic.launches[1].kv_bytes == 0
    assert traffic.kv_bytes == covered_bytes(case, backend.config) > 0


def test_worst_ratio_per_phase() -> None:
    checks = traffic_report("cpu", ["decode window 24 page1", "prefill window 12 page1"])
    worst = worst_ratio_per_phase(checks)
    assert set(worst) == {Phase.DECODE, Phase.PREFILL} and all(r <= SLACK for r in worst.values())
