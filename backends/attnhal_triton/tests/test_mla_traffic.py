"""K/V bytes the MLA kernel loads per forward, counted under the interpreter.

Over MLA's latent pool a decode or verify block holding every (token, head) of a row loads
each latent row once (576 values: V comes from the same tile), ratio 1.000 to the bytes the
batch covers; with more heads than a block holds (128) each block reads the row, as its
tiled model says, and the blocks that repeat a read are neighbours in dispatch order (unique
bytes still 1.000 of the covered ones); on gfx942's rows the kernel renumbers its programs so
that a row's blocks share one of the 8 XCDs' L2s (per L2 1.000 at a full launch; the grid's
own order, planted, 8.000); a planted second launch (every row read twice) and a planted
split of the heads into two launches fail.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from planted_kernels import load_every_draft_key

from attnhal.platform import parse
from attnhal.testing.cases import build_case
from attnhal_triton import TritonBackend, l2_order, mla_kernels, mla_ops
from attnhal_triton.device_fill import L2_DEAL
from attnhal_triton.kv_reuse import Reuse, domain_spread, logical_rank, reuse
from attnhal_triton.mla_traffic import check_mla, latent_pool, mla_recipes, mla_report

RECIPES = mla_recipes()


@pytest.mark.parametrize("name", ["mla decode 16 heads page16", "mla target_verify tree 4 page16",
                                  "mla draft_decode 4 steps page1"])
def test_each_latent_row_is_read_once(name: str) -> None:
    [check] = mla_report(names=[name])
    print(check.line())
    assert check.ok and check.model == "covered" and check.loaded == check.covered
    assert check.unique == check.windowed == check.covered and check.distance == 0


def test_a_separate_v_is_read_once_too() -> None:
    [check] = mla_report(names=["mla decode 16 heads page16"], latent=False)
    assert check.ok and check.loaded == check.covered
    [latent] = mla_report(names=["mla decode 16 heads page16"])
    assert latent.covered * (576 + 512) == check.covered * 576  # the latent pool moves 576 of 1088 values


def test_128_heads_read_once_per_block() -> None:
    [check] = mla_report(names=["mla decode 128 heads page16"])
    print(check.line())
    assert check.ok and check.loaded == check.expected == 2 * check.covered  # 2 blocks of 64 heads
    # ... side by side in dispatch order: memory serves each latent row once if they share a cache
    assert check.window == 2 and check.distance == 1 and check.unique == check.windowed == check.covered


@pytest.mark.parametrize("platform", ["hip:gfx942", "cuda:sm90"])
def test_tree_blocks_load_only_the_keys_they_see(platform: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of fewer tokens than the tree (gfx942: one token x 16 heads; sm90: two) loads
    its tokens' ancestors, as the tiled model counts; the old load of every draft key of the
    row (planted) loads more (1.053x on gfx942, 1.026x on sm90 before the fix)."""
    name = "mla target_verify tree 4 page16"
    [check] = mla_report(platform, names=[name])
    print(check.line())
    assert check.ok and check.loaded == check.expected > check.covered
    load_every_draft_key(monkeypatch)
    [planted] = mla_report(platform, names=[name])
    print(planted.line())
    assert planted.loaded > check.loaded and planted.ratio > 1.02
    if platform == "hip:gfx942":
        assert not planted.ok


def _checked_with(name: str, planted: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The traffic check of ``name`` with ``planted(real, ...)`` in place of the MLA op."""
    case = build_case(RECIPES[name], pool=latent_pool(RECIPES[name]))
    backend = TritonBackend(case.config, case.pool)
    real = mla_ops.mla_attend
    monkeypatch.setattr(mla_ops, "mla_attend", lambda *a, **kw: planted(real, *a, **kw))
    check = check_mla(name, case, backend)
    print(check.line())
    return check


def test_a_second_read_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def twice(real: Any, *args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        real(*args, **kwargs)

    check = _checked_with("mla target_verify chain 4 page16", twice, monkeypatch)
    assert not check.ok and check.ratio > 1.9 and check.unique_ratio > 1.9


def test_heads_in_separate_launches_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """128 heads as two launches of 64: the same logical bytes as one launch of two blocks,
    but the second pass over the rows is a whole launch later (no cache holds it)."""

    def halves(real: Any, out: Any, mid_o: Any, mid_lse: Any, q: Any, **kwargs: Any) -> None:
        for h in (slice(0, 64), slice(64, 128)):
            part = None if mid_o is None else mid_o[:, h].contiguous()
            real(out[:, h].contiguous(), part, None if mid_lse is None else mid_lse[:, h].contiguous(),
                 q[:, h], **kwargs)

    check = _checked_with("mla decode 128 heads page16", halves, monkeypatch)
    assert check.loaded == 2 * check.covered and check.unique == 2 * check.covered and not check.ok


@triton.jit
def _grid_order(DOMAINS: tl.constexpr, DEAL: tl.constexpr):
    """The MLA kernel's program ids before the L2 renumbering: the grid's own."""
    return tl.program_id(0), tl.program_id(1), tl.program_id(2)


def _gfx942_unsplit(case: Any) -> TritonBackend:
    """A backend on gfx942's rows whose MLA decode is not split (one window per row: 8 rows,
    8 windows, 64 programs instead of the row's fill of 608 under the interpreter)."""
    backend = TritonBackend(case.config, case.pool, platform=parse("hip:gfx942"))
    backend.use_launch_rows({"mla_decode": replace(backend.rows["mla_decode"], kv_splits=1)})
    return backend


def test_gfx942_head_blocks_share_an_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    """128 heads over 8 rows on gfx942's rows (8 head blocks of 16, 8 XCDs dealt round-robin):
    the kernel's renumbering puts each row's 8 blocks behind one L2, so the L2s together fetch
    each latent row once (per L2 = covered, spread 1.0); in the grid's own order every block of
    a row is behind another L2 (8x) and the check fails."""
    recipe = replace(RECIPES["mla decode 128 heads page16"], prefix_lens=(17,) * 8)
    case = build_case(recipe, pool=latent_pool(recipe))
    check = check_mla("128 heads x 8 rows", case, _gfx942_unsplit(case))
    print(check.line())
    assert check.ok and check.spread == 1.0 and check.window == 8 and check.distance == 7
    assert check.loaded == 8 * check.covered and check.per_domain == check.unique == check.covered
    monkeypatch.setattr(mla_kernels, "l2_program", _grid_order)
    planted = check_mla("grid order", case, _gfx942_unsplit(case))
    print(planted.line())
    assert planted.per_domain == 8 * check.covered and not planted.ok


@triton.jit
def _logical_ids(Out, DOMAINS: tl.constexpr, DEAL: tl.constexpr):
    x, y, z = l2_order.l2_program(DOMAINS, DEAL)
    w = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    tl.store(Out + w, x + tl.num_programs(0) * (y + tl.num_programs(1) * z))


@pytest.mark.parametrize("grid", [(8, 3, 5), (4, 3, 1), (3, 5, 7), (1, 1, 1), (40, 3, 1)], ids=str)
@pytest.mark.parametrize("domains,deal", [(1, L2_DEAL), (8, L2_DEAL), (6, L2_DEAL), (8, 3)])
def test_the_kernels_renumbering_is_kv_reuses_map(grid: tuple[int, int, int], domains: int, deal: int) -> None:
    """The kernels' own ``l2_program``, program by program (interpreter): the logical id it
    runs is ``kv_reuse.logical_rank`` of its dispatch rank, every one once, on grids whose
    hands do not divide evenly over the L2s, and windows wider than a hand, too."""
    programs = int(np.prod(grid))
    out = torch.full((programs,), -1, dtype=torch.int64)
    _logical_ids[grid](out, DOMAINS=domains, DEAL=deal)
    assert out.tolist() == logical_rank(np.arange(programs), grid, domains, deal).tolist()
    assert sorted(out.tolist()) == list(range(programs))


@pytest.mark.parametrize("grid", [(8, 64, 1), (8, 3, 5), (4, 3, 1), (3, 5, 7), (16, 9, 2), (1, 12, 1), (40, 3, 2),
                                  (1024, 9, 1)], ids=str)
def test_l2_renumbering_deals_hands_evenly(grid: tuple[int, int, int]) -> None:
    """kv_reuse.logical_rank (the kernel's map) over 8 L2s: every program once; the logical
    order is cut in hands of min(X, L2_DEAL) programs (a window of up to 16 head blocks is one
    hand), each L2 runs its hands whole and is dealt as many as every other; only the last
    ``hands % 8`` keep the grid's order. A long prefill row (1024 blocks) is spread over all 8."""
    domains, programs = 8, int(np.prod(grid))
    hand = min(grid[0], L2_DEAL)
    ranks = np.arange(programs)
    logical = logical_rank(ranks, grid, domains)
    assert sorted(logical) == list(ranks)
    dealt = programs // hand // domains * domains
    for d in range(domains):
        mine = logical[d::domains]
        hands = mine[mine < dealt * hand] // hand
        assert (hands.reshape(-1, hand) == hands[::hand, None]).all()  # whole hands in turn
        assert sorted(set(hands)) == list(range(d, dealt, domains))
    if grid[0] <= L2_DEAL:  # windows are hands
        tail = programs // grid[0] - dealt
        assert domain_spread(grid, domains) == (dealt + tail * min(grid[0], domains)) / (programs // grid[0])
    else:  # a wide window's hands go to as many L2s
        spans = len(set(ranks[logical < grid[0]] % domains))
        assert domain_spread(grid, domains) > 1 and spans == min(domains, -(-grid[0] // hand))
    assert domain_spread(grid, 1) == 1.0


def test_reuse_counts_l2_unions() -> None:
    """kv_reuse with 8 L2s on planted traces: 8 rows x 8 head blocks reading their row, as the
    kernel renumbers them (each row behind one L2) and in the grid's order (behind 8)."""
    row = [np.arange(4) + 100 * r for r in range(8)]
    renumbered = {(w % 8, w // 8, 0): [row[int(logical_rank(w, (8, 8, 1), 8)) // 8]] for w in range(64)}
    grid_order = {(x, r, 0): [row[r]] for x in range(8) for r in range(8)}
    assert reuse((8, 8, 1), renumbered, [2], domains=8) == Reuse(512, 64, 7, 64, 64)
    assert reuse((8, 8, 1), grid_order, [2], domains=8).per_domain == 512
    assert reuse((8, 8, 1), grid_order, [2]) == Reuse(512, 64, 7, 64, 64)  # one L2: the grid's order is right


def test_reuse_counts_union_and_dispatch_distance() -> None:
    """kv_reuse on planted traces: 4 head blocks of one row on grid axis 0 are neighbours in
    dispatch order (distance 3 < 4); the same blocks on axis 2 (the row's splits axis) repeat
    each read 2 x 3 = 6 programs later, beyond the window; a re-read inside one program is
    logical only."""
    rows = [np.arange(0, 1152, 2) + 2 * 576 * r for r in range(2)]  # 2 rows x 576 bf16
    near = {(x, r, 0): [rows[r]] for x in range(4) for r in range(2)}
    got = reuse((4, 2, 1), near, [2])
    assert got == Reuse(logical=8 * 1152, unique=2 * 1152, distance=3, windowed=2 * 1152, per_domain=2 * 1152)
    far = {(0, r, x): [rows[r]] for x in range(4) for r in range(2)}
    assert reuse((1, 2, 4), far, [2]).distance == 6 and reuse((1, 2, 4), far, [2]).windowed == 8 * 1152
    again = reuse((1, 1, 1), {(0, 0, 0): [rows[0], rows[0]]}, [2])
    assert again == Reuse(logical=2 * 1152, unique=1152, distance=0, windowed=1152, per_domain=1152)
    with pytest.raises(ValueError, match="element_sizes"):
        reuse((1, 1, 1), near, [2, 4])
