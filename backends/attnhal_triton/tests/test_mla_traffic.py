"""K/V bytes the MLA kernel loads per forward, counted under the interpreter.

Over MLA's latent pool a decode or verify block holding every (token, head) of a row loads
each latent row once (576 values: V comes from the same tile), ratio 1.000 to the bytes the
batch covers; with more heads than a block holds (128) each block reads the row, as its
tiled model says, and the blocks that repeat a read are neighbours in dispatch order (unique
bytes still 1.000 of the covered ones); a planted second launch (every row read twice) and a
planted split of the heads into two launches fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from planted_kernels import load_every_draft_key

from attnhal.testing.cases import build_case
from attnhal_triton import TritonBackend, mla_ops
from attnhal_triton.kv_reuse import Reuse, reuse
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


def test_reuse_counts_union_and_dispatch_distance() -> None:
    """kv_reuse on planted traces: 4 head blocks of one row on grid axis 0 are neighbours in
    dispatch order (distance 3 < 4); the same blocks on axis 2 (the row's splits axis) repeat
    each read 2 x 3 = 6 programs later, beyond the window; a re-read inside one program is
    logical only."""
    rows = [np.arange(0, 1152, 2) + 2 * 576 * r for r in range(2)]  # 2 rows x 576 bf16
    near = {(x, r, 0): [rows[r]] for x in range(4) for r in range(2)}
    got = reuse((4, 2, 1), near, [2])
    assert got == Reuse(logical=8 * 1152, unique=2 * 1152, distance=3, windowed=2 * 1152)
    far = {(0, r, x): [rows[r]] for x in range(4) for r in range(2)}
    assert reuse((1, 2, 4), far, [2]).distance == 6 and reuse((1, 2, 4), far, [2]).windowed == 8 * 1152
    again = reuse((1, 1, 1), {(0, 0, 0): [rows[0], rows[0]]}, [2])
    assert again == Reuse(logical=2 * 1152, unique=1152, distance=0, windowed=1152)
    with pytest.raises(ValueError, match="element_sizes"):
        reuse((1, 1, 1), near, [2, 4])
