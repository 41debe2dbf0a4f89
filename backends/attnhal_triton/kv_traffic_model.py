"""What a forward should load from the K/V pool, from the batch alone, and the per-phase
check of :func:`attnhal_triton.kv_traffic.count_kv_loads` against it.

``covered``: each row's attended positions once (the union over its queries, window
applied), ``x Hkv x (D_k + D_v) x itemsize``. ``tiled`` (prefill, and a verify whose
tokens x group the sized block cannot hold): the same union taken per block of ``BLOCK_M``
flattened (query, head of the group) rows — each block re-reads its own queries' range
(causal, or the tree's ancestors: the kernel loads no draft key none of a block's queries
sees). Attended keys come from the conformance kit's oracle
(:func:`attnhal.testing.oracle.attended`), the table every backend is checked against.

:func:`traffic_report` runs a fixed set of small shapes of every phase (GQA group 4; 4 and
8 draft tokens, chain and tree; a tree of 8 at group 16; page sizes 1 and 16; a window) and
returns one :class:`TrafficCheck` per shape: a CI report prints them, a test asserts ``ok``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from attnhal.backend import AttentionConfig, ForwardBatch, KVPool
from attnhal.phases import Phase
from attnhal.platform import Platform, parse
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, CaseRecipe, build_case
from attnhal.testing.oracle import attended
from attnhal.testing.oracle import query_tokens as oracle_tokens
from attnhal_triton import work
from attnhal_triton.backend import TritonBackend
from attnhal_triton.kv_traffic import Traffic, count_kv_loads
from attnhal_triton.metadata import kernel_of, query_tokens

__all__ = ["SLACK", "TrafficCheck", "check_traffic", "covered_bytes", "main", "sized_block", "tiled_bytes",
           "traffic_recipes", "traffic_report", "worst_ratio_per_phase"]

#: Loaded bytes may exceed the model by 5 % (nothing does today: the check is exact, the
#: slack leaves room for a kernel that rounds a range to its alignment).
SLACK = 1.05


def _position_bytes(pool: KVPool) -> int:
    """Bytes of one position's K and V over all KV heads."""
    return pool.num_kv_heads * (pool.head_dim + pool.v_head_dim) * pool.k[0].element_size()


def _attended_slots(batch: ForwardBatch, config: AttentionConfig, layer: int,
                    table: torch.Tensor, r: int, i: int) -> set[int]:
    keys, qpos = attended(batch, table, r, i)
    window = config.window(layer)
    return {slot for slot, kpos in keys if window is None or kpos >= qpos - window}


def _groups_bytes(case: Case, groups: Iterable[Sequence[tuple[int, int]]], layer: int, config: AttentionConfig) -> int:
    """Sum over ``groups`` of (row, query) pairs of the bytes of their attended slots' union."""
    table, total = case.pool.token_table(), 0
    for group in groups:
        slots: set[int] = set()
        for r, i in group:
            slots |= _attended_slots(case.batch, config, layer, table, r, i)
        total += len(slots)
    return total * _position_bytes(case.pool)


def _queries_by_row(batch: ForwardBatch) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for r, i, _ in oracle_tokens(batch):
        rows.setdefault(r, []).append(i)
    return rows


def covered_bytes(case: Case, config: AttentionConfig) -> int:
    """Each row's attended K/V positions once: the least any kernel can load."""
    rows = _queries_by_row(case.batch)
    return _groups_bytes(case, ([(r, i) for i in queries] for r, queries in rows.items()), case.layer, config)


def tiled_bytes(case: Case, config: AttentionConfig, block_m: int) -> int:
    """Each block of ``block_m`` flattened (query, head of the group) rows of a row re-reads
    the union of its queries' ranges (prefill's one-pass extend kernel)."""
    group = config.group_size
    blocks = []
    for r, queries in _queries_by_row(case.batch).items():
        flat = len(queries) * group
        for start in range(0, flat, block_m):  # flattened row m is (query m // group, head m % group)
            tokens = range(start // group, (min(start + block_m, flat) - 1) // group + 1)
            blocks.append([(r, queries[t]) for t in tokens])
    return _groups_bytes(case, blocks, case.layer, config)


@dataclass(frozen=True)
class TrafficCheck:
    """One forward's K/V bytes against the model its phase is held to."""

    name: str
    phase: Phase
    loaded: int
    covered: int
    expected: int  # covered, or for prefill the tiling model
    model: str  # "covered" or "tiled BLOCK_M=..."

    @property
    def ratio(self) -> float:
        """Loaded / expected: <= SLACK passes."""
        return self.loaded / self.expected if self.expected else float(self.loaded > 0) + 1.0

    @property
    def ok(self) -> bool:
        return self.loaded <= SLACK * self.expected

    def line(self) -> str:
        tiling = f"  (tiled/covered {self.expected / self.covered:.2f})" if self.model != "covered" else ""
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.name:<34} loaded {self.loaded:>9} B  {self.model:<18} "
                f"{self.expected:>9} B  ratio {self.ratio:.3f}{tiling}")


def sized_block(case: Case, backend: TritonBackend) -> int:
    """``BLOCK_M`` the launch sizing (:func:`work.programs`) gives ``case``'s extend batch on
    ``backend``'s rows; 0 for the decode forms (one block holds a row's group)."""
    kernel, cfg = kernel_of(case.batch), backend.config
    if kernel == "decode":
        return 0
    return work.programs(kernel, backend.rows[kernel], case.batch.batch_size, query_tokens(case.batch),
                         cfg.num_q_heads, cfg.num_kv_heads).block_m


def check_traffic(name: str, case: Case, backend: TritonBackend) -> TrafficCheck:
    """Count one forward of ``case`` and hold it to its phase's model: prefill to the tiling of
    the block it launched; verify and draft extend to the tiling of the block the sizing gives
    (covered when one block holds a row's tokens x group; a row's tokens over several blocks,
    a large group, re-read the prefix per block); decode to the covered bytes."""
    traffic: Traffic = count_kv_loads(case, backend)
    covered = covered_bytes(case, backend.config)
    if case.batch.phase is Phase.PREFILL:
        block_m = traffic.block_m()
        return TrafficCheck(name, Phase.PREFILL, traffic.kv_bytes, covered,
                            tiled_bytes(case, backend.config, block_m), f"tiled BLOCK_M={block_m}")
    block_m = sized_block(case, backend)
    tiled = tiled_bytes(case, backend.config, block_m) if block_m else covered
    model = "covered" if tiled == covered else f"tiled BLOCK_M={block_m}"
    return TrafficCheck(name, case.batch.phase, traffic.kv_bytes, covered, tiled, model)


def traffic_recipes(dtype: str = "float32", head_size: int = 32) -> dict[str, CaseRecipe]:
    """Small shapes of every phase: 2 KV heads x group 4, pages 1 and 16, in ``dtype`` with
    ``head_size`` (launch rows differ by both)."""
    base = dict(num_q_heads=8, num_kv_heads=2, head_size=head_size, dtype=dtype, seed=3, slot_seed=4)
    lens = (70, 5, 33)
    out: dict[str, CaseRecipe] = {}
    for page in (1, 16):
        def add(name: str, phase: Phase, **kw: object) -> None:
            out[f"{name} page{page}"] = CaseRecipe(phase, page_size=page, **{**base, **kw})  # type: ignore[arg-type]

        add("decode", Phase.DECODE, prefix_lens=lens)
        add("decode window 24", Phase.DECODE, prefix_lens=lens, sliding_window=24)
        add("draft_decode 4 steps", Phase.DRAFT_DECODE, prefix_lens=lens, spec=SpecConfig.eagle(4), draft_step=3)
        for tokens in (4, 8):
            add(f"target_verify chain {tokens}", Phase.TARGET_VERIFY, prefix_lens=lens,
                spec=SpecConfig.eagle(tokens - 1))
            add(f"target_verify tree {tokens}", Phase.TARGET_VERIFY, prefix_lens=lens,
                spec=SpecConfig.eagle(tokens - 1, topk=2, num_draft_tokens=tokens),
                tree_parents=tuple(_tree(tokens, seed) for seed in range(len(lens))))
            add(f"draft_extend {tokens}", Phase.DRAFT_EXTEND, prefix_lens=lens,
                spec=SpecConfig.eagle(tokens - 1), new_lens=(tokens, 1, tokens - 1))
        # Group 16 x 8 tokens: 128 flattened rows, over blocks of fewer tokens than the tree.
        add("target_verify tree 8 group 16", Phase.TARGET_VERIFY, prefix_lens=lens, num_q_heads=32,
            spec=SpecConfig.eagle(7, topk=2, num_draft_tokens=8),
            tree_parents=tuple(_tree(8, seed) for seed in range(len(lens))))
        add("prefill", Phase.PREFILL, prefix_lens=(0, 40, 7), new_lens=(37, 9, 1))
        add("prefill window 12", Phase.PREFILL, prefix_lens=(0, 40, 7), new_lens=(37, 9, 1), sliding_window=12)
    return out


def _tree(tokens: int, seed: int) -> tuple[int, ...]:
    """A branching draft tree: token ``j``'s parent is one of the tokens before it."""
    return (-1, *((j * 7 + seed) % j for j in range(1, tokens)))


def traffic_report(platform: Platform | str = "cpu", names: Sequence[str] | None = None,
                   dtype: str = "float32", head_size: int = 32) -> list[TrafficCheck]:
    """One check per shape of :func:`traffic_recipes` (``names``: a subset), launched with
    ``platform``'s rows under the interpreter."""
    target = parse(platform) if isinstance(platform, str) else platform
    recipes = traffic_recipes(dtype, head_size)
    out = []
    for name in names if names is not None else list(recipes):
        case = build_case(recipes[name])
        out.append(check_traffic(name, case, TritonBackend(case.config, case.pool, platform=target)))
    return out



def worst_ratio_per_phase(checks: Iterable[TrafficCheck]) -> dict[Phase, float]:
    """The largest loaded / expected ratio of each phase (what a CI report tabulates)."""
    out: dict[Phase, float] = {}
    for check in checks:
        out[check.phase] = max(out.get(check.phase, 0.0), check.ratio)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``TRITON_INTERPRET=1 python -m attnhal_triton.kv_traffic_model [PLATFORM ...] [--dtype D]
    [--head-size N]``: one line per shape and the worst ratio per phase, for each platform's
    launch rows (default ``cpu``, the interpreter's); exit status 1 if any shape fails."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attnhal_triton.kv_traffic_model",
                                     description="K/V bytes per forward vs the bytes the batch covers")
    parser.add_argument("platforms", nargs="*", default=["cpu"], help="launch rows of (e.g. cuda:sm90)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--head-size", type=int, default=32)
    args = parser.parse_args(argv)
    failed = False
    for platform in args.platforms:
        checks = traffic_report(platform, dtype=args.dtype, head_size=args.head_size)
        print(f"K/V traffic, launch rows of {platform}, {args.dtype} head {args.head_size} "
              f"(limit: {SLACK} x the model)")
        for check in checks:
            print("  " + check.line())
        worst = worst_ratio_per_phase(checks)
        print("  worst ratio per phase: " + ", ".join(f"{p.value} {r:.3f}" for p, r in worst.items()))
        failed |= not all(check.ok for check in checks)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
