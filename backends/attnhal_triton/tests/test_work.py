"""Work sizing of the Triton launches (``attnhal_triton.work``) and the launch model CI
checks it with: programs per launch against the SMs/CUs of sm90 and gfx942 at every shape
of the GPU benchmarks, the splits that get there, and the partial buffers they need.
The direct (unsplit) extend path runs under the interpreter against the oracle."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

import dataclasses  # noqa: E402

import pytest  # noqa: E402
from triton_cases import assert_close, build, expected, record_launches, run, shape  # noqa: E402

from attnhal.phases import Phase  # noqa: E402
from attnhal.platform import parse  # noqa: E402
from attnhal_triton import ops, work  # noqa: E402
from attnhal_triton.device_fill import UNITS  # noqa: E402
from attnhal_triton.launch_table import lookup  # noqa: E402

HEADS, KV_HEADS = 32, 8
#: The GPU benchmarks' shapes (benchmarks/triton_sweep.py, gpu_peers.py): (kernel, bs, tokens).
BENCH = [("decode", bs, 1) for bs in (1, 8, 64, 256)] + \
        [(k, bs, t) for k, t in (("extend_verify", 4), ("extend_verify_tree", 8)) for bs in (8, 64, 256)]
FAMILIES = {"cuda:sm90": "sm90", "hip:gfx942": "gfx94"}


def _launch(kernel: str, spec: str, bs: int, tokens: int) -> work.Launch:
    row = lookup(kernel, parse(spec), 128, "bfloat16")
    return work.programs(kernel, row, bs, tokens, HEADS, KV_HEADS)


@pytest.mark.parametrize("spec", sorted(FAMILIES))
@pytest.mark.parametrize("kernel,bs,tokens", BENCH)
def test_every_benchmark_launch_fills_the_device_without_needless_splits(
        spec: str, kernel: str, bs: int, tokens: int) -> None:
    """At least one program per SM/CU at every benchmark shape, and splits only where the
    unsplit grid leaves units idle: a batch that fills the device is not split."""
    units = UNITS[FAMILIES[spec]]
    launch = _launch(kernel, spec, bs, tokens)
    unsplit = launch.programs // launch.splits
    print(f"{spec} {kernel} bs {bs} x {tokens}: {launch.programs} programs, "
          f"{launch.splits} splits, {launch.programs / units:.1f} per unit")
    assert launch.programs >= units
    if unsplit >= lookup(kernel, parse(spec), 128, "bfloat16").fill_programs:
        assert launch.splits == 1


@pytest.mark.parametrize("spec", sorted(FAMILIES))
@pytest.mark.parametrize("kernel,tokens", [("extend_verify", 4), ("extend_verify_tree", 8),
                                           ("extend_draft", 4)])
def test_one_program_holds_every_query_of_a_row_and_kv_head(spec: str, kernel: str, tokens: int) -> None:
    """Draft tokens x query heads of a group packed into one program: each K/V tile is read
    once per (row, KV head), and the block is no larger than the 16-row dot minimum needs."""
    launch = _launch(kernel, spec, 64, tokens)
    assert launch.grid[0] == 1
    assert launch.block_m == max(16, tokens * HEADS // KV_HEADS)


def test_a_planted_fixed_split_count_fails_the_launch_model() -> None:
    """The model catches a regression to one split at any batch size (bs 1 leaves 124 of
    132 SMs idle) and to a fixed split count at a batch that already fills the device."""
    row = lookup("decode", parse("cuda:sm90"), 128, "bfloat16")
    never = dataclasses.replace(row, fill_programs=0)
    assert work.programs("decode", never, 1, 1, HEADS, KV_HEADS).programs < UNITS["sm90"]
    always = dataclasses.replace(row, fill_programs=row.kv_splits * 256 * KV_HEADS)
    assert work.programs("decode", always, 256, 1, HEADS, KV_HEADS).splits > 1


def test_partial_slots_bound_every_batch_size() -> None:
    """The static partial buffers sized by ``partial_slots`` hold rows x splits of every
    batch up to the captured maximum, and stay far below rows x kv_splits."""
    for spec in FAMILIES:
        for kernel, tokens in (("decode", 1), ("extend_verify", 4), ("extend_verify_tree", 8)):
            row = lookup(kernel, parse(spec), 128, "bfloat16")
            max_bs = 256
            slots = work.partial_slots(max_bs * tokens, row, KV_HEADS, HEADS // KV_HEADS,
                                       row.blocks.get("BLOCK_M", 1))
            for bs in range(1, max_bs + 1):
                launch = work.programs(kernel, row, bs, tokens, HEADS, KV_HEADS)
                assert bs * tokens * launch.splits <= slots, (spec, kernel, bs)
            assert slots < max_bs * tokens * row.kv_splits / 8


def test_batch_splits_of_an_empty_launch_is_one_and_a_negative_count_is_refused() -> None:
    row = lookup("decode", parse("cuda:sm90"), 128, "bfloat16")
    assert work.batch_splits(row, 0) == 1  # an empty batch (an idle rank) launches nothing
    with pytest.raises(ValueError, match="programs_per_split=-1"):
        work.batch_splits(row, -1)


@pytest.mark.parametrize("phase,tree", [(Phase.TARGET_VERIFY, False), (Phase.TARGET_VERIFY, True),
                                        (Phase.DRAFT_EXTEND, False)])
def test_a_batch_that_fills_the_device_runs_one_unsplit_extend(phase: Phase, tree: bool) -> None:
    """With a fill the batch reaches, verify and draft extend write the output in one launch
    (no partials, no reduce, sinks in the kernel) and agree with the oracle."""
    case, backend = build(shape(phase, tree=tree, sinks=True, lens=(130, 70)))
    row = backend.rows[backend._sizing(case.batch).kernel]
    backend.use_launch_rows({row.kernel: dataclasses.replace(row, fill_programs=1)})
    launches = record_launches(case, backend)
    assert [op for op, _, _ in launches] == [ops.extend]
    assert backend._meta is not None and backend._meta.mid_o is None
    assert_close(backend, run(case, backend), expected(case, backend))
