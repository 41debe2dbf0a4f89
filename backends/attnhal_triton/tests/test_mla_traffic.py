"""K/V bytes the MLA kernel loads per forward, counted under the interpreter.

Over MLA's latent pool a decode or verify block holding every (token, head) of a row loads
each latent row once (576 values: V comes from the same tile), ratio 1.000 to the bytes the
batch covers; with more heads than a block holds (128) each block reads the row, as its
tiled model says; a planted second launch (every row read twice) fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from attnhal.testing.cases import build_case
from attnhal_triton import TritonBackend, mla_ops
from attnhal_triton.mla_traffic import check_mla, latent_pool, mla_recipes, mla_report

RECIPES = mla_recipes()


@pytest.mark.parametrize("name", ["mla decode 16 heads page16", "mla target_verify tree 4 page16",
                                  "mla draft_decode 4 steps page1"])
def test_each_latent_row_is_read_once(name: str) -> None:
    [check] = mla_report(names=[name])
    print(check.line())
    assert check.ok and check.model == "covered" and check.loaded == check.covered


def test_a_separate_v_is_read_once_too() -> None:
    [check] = mla_report(names=["mla decode 16 heads page16"], latent=False)
    assert check.ok and check.loaded == check.covered
    [latent] = mla_report(names=["mla decode 16 heads page16"])
    assert latent.covered * (576 + 512) == check.covered * 576  # the latent pool moves 576 of 1088 values


def test_128_heads_read_once_per_block() -> None:
    [check] = mla_report(names=["mla decode 128 heads page16"])
    print(check.line())
    assert check.ok and check.loaded == check.expected == 2 * check.covered  # 2 blocks of 64 heads


def test_a_second_read_fails() -> None:
    name = "mla target_verify chain 4 page16"
    case = build_case(RECIPES[name], pool=latent_pool(RECIPES[name]))
    backend = TritonBackend(case.config, case.pool)
    real = mla_ops.mla_attend

    def twice(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        real(*args, **kwargs)

    mla_ops.mla_attend = twice  # type: ignore[assignment]
    try:
        check = check_mla(name, case, backend)
    finally:
        mla_ops.mla_attend = real  # type: ignore[assignment]
    print(check.line())
    assert not check.ok and check.ratio > 1.9
