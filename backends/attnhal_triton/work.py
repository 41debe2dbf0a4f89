"""How much work each Triton launch gets: KV splits per batch, query rows per program.

Pure functions of a batch's host shape (batch size, query tokens per row, heads) and
the kernel's launch row: the backend sizes its launches with them, and the launch model
(:func:`programs`) counts programs per launch for CI without a GPU. Everything here is
known on the host before a graph is captured (a captured batch size is fixed), so a
graph freezes these values consistently; per-row split counts, which follow the rows'
lengths, are computed on the device from them.

This module imports neither torch nor triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnhal.kv_format import kv_format
from attnhal_triton.launch_table import LaunchRow

__all__ = ["Launch", "batch_splits", "head_block", "partial_slots", "programs", "query_block", "row_dtype"]

#: ``tl.dot`` needs at least 16 rows in its first operand.
MIN_DOT_ROWS = 16


def row_dtype(dtype: str, kv_dtype: str) -> str:
    """The dtype a launch row is chosen for: ``float32`` over an fp32 cache (its K/V tiles
    take twice a 16-bit row's registers: a 16-bit query with the 16-bit rows spilled 17-208
    bytes there, docs/triton.md), else the compute ``dtype``."""
    fmt = kv_format(kv_dtype)
    return "float32" if fmt.fp8 is None and fmt.storage_name() == "float32" else dtype


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def head_block(row: LaunchRow, group: int) -> int:
    """Decode's ``BLOCK_H``: the group's query heads padded to a power of two >= 16,
    capped by the row."""
    return min(row.blocks["BLOCK_H"], max(MIN_DOT_ROWS, _pow2_at_least(group)))


def query_block(row: LaunchRow, query_rows: int) -> int:
    """An extend program's ``BLOCK_M`` when each batch row has ``query_rows`` flattened
    (query token, query head of the group) rows: the row's ``BLOCK_M``, shrunk to the
    smallest power of two >= ``query_rows`` (>= 16), so that one program holds every
    query of a (row, KV head) and reads each K/V tile once."""
    return min(row.blocks["BLOCK_M"], max(MIN_DOT_ROWS, _pow2_at_least(query_rows)))


def batch_splits(row: LaunchRow, programs_per_split: int) -> int:
    """The batch's split cap ``S``: as many KV splits as bring a launch of
    ``programs_per_split`` programs per split to ``row.fill_programs``, in ``[1, kv_splits]``.

    A batch whose launch already fills the device gets 1 (no split, no partials), and so
    does an empty batch (0 programs: an idle rank's forward launches nothing).
    """
    if programs_per_split < 0:
        raise ValueError(f"programs_per_split={programs_per_split} (supported: >= 0)")
    if programs_per_split == 0:
        return 1
    wanted = -(-row.fill_programs // programs_per_split)
    return max(1, min(row.kv_splits, wanted))


def partial_slots(max_rows: int, row: LaunchRow, num_kv_heads: int, group: int,
                  max_block_m: int) -> int:
    """Partial (row, split) slots per query head that any batch of at most ``max_rows``
    partial rows can need, for the static buffers of graph capture.

    A batch of ``bs`` rows of ``T`` tokens has ``R = bs * T`` partial rows and at most
    ``S <= 1 + fill / (bs * Hkv * m)`` splits with ``m >= T * group / max_block_m``
    programs per (row, KV head) for an extend (``m >= 1``, ``T = 1`` for decode), so
    ``R * S <= R + fill / Hkv * max(1, max_block_m / group)`` — a bound independent of the
    batch size; never more than ``R * kv_splits``.
    """
    per_head = -(-row.fill_programs // num_kv_heads)
    extra = per_head * max(1, -(-max_block_m // group))
    return min(max_rows * row.kv_splits, max_rows + extra)


@dataclass(frozen=True)
class Launch:
    """One launch's shape: ``grid`` and its program count; ``splits`` the batch's cap;
    ``blocks`` the row's block sizes as this batch launches them."""

    grid: tuple[int, int, int]
    splits: int
    blocks: Mapping[str, int]

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def block_m(self) -> int:
        return self.blocks.get("BLOCK_M", 0)


def programs(kernel: str, row: LaunchRow, batch_size: int, query_tokens: int,
             num_q_heads: int, num_kv_heads: int) -> Launch:
    """The launch of ``kernel`` for a batch of ``batch_size`` rows with ``query_tokens``
    query tokens each (1 for decode), as the backend sizes it."""
    group = num_q_heads // num_kv_heads
    if kernel == "decode":
        block_h = head_block(row, group)
        blocks = -(-group // block_h)
        splits = batch_splits(row, batch_size * num_kv_heads * blocks)
        return Launch((batch_size, num_kv_heads * blocks, splits), splits, {**row.blocks, "BLOCK_H": block_h})
    if kernel == "extend_prefill":
        block_m = row.blocks["BLOCK_M"]
        m_blocks = -(-query_tokens * group // block_m)
        return Launch((m_blocks, batch_size, num_kv_heads), 1, row.blocks)
    block_m = query_block(row, query_tokens * group)
    m_blocks = -(-query_tokens * group // block_m)
    splits = batch_splits(row, m_blocks * batch_size * num_kv_heads)
    return Launch((m_blocks, batch_size, num_kv_heads * splits), splits, {**row.blocks, "BLOCK_M": block_m})
