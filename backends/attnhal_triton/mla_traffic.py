"""K/V bytes the MLA kernel loads per forward (counted by the interpreter, as
:mod:`attnhal_triton.kv_traffic` counts the GQA kernels'), against what the batch covers.

MLA's point is that every q head reads one latent stream: a (row, split) program holding
``BLOCK_M`` flattened (query token, q head) rows reads each latent row of its range once, and
V comes from the same tile when the pool keeps V inside K's row (``KVPool(v_in_k=True)``,
one 576-wide row per position). Models and figures of one forward:

* ``covered``: each row's attended positions once, ``x (576 [+ 512 for a separate V]) x
  itemsize`` — what a forward loads when one block holds every (token, head) of a row;
* ``tiled BLOCK_M=m``: each block of ``m`` flattened rows re-reads the union of its queries'
  ranges (:func:`~attnhal_triton.kv_traffic_model.tiled_bytes`), what the kernel does when a
  row has more (token, head) pairs than one block holds (128 heads: ``ceil(128 / m)`` blocks);
* ``unique`` and ``distance`` (:mod:`attnhal_triton.kv_reuse`): the union of the addresses of
  each launch, and the largest gap in dispatch order between two programs reading one
  address behind one L2. The head blocks of one (row, KV head, split) are grid axis 0,
  dispatched side by side, so ``distance`` must stay below the launch's blocks per row
  (``grid[0]``) and ``unique`` must equal ``covered``: every repeat is a neighbour's read of
  the same tile;
* ``per L2``: the L2s' unions where the launch row deals programs over ``L2_DOMAINS`` L2s
  (gfx942/gfx950's XCDs; :mod:`attnhal_triton.kv_reuse`), against ``covered`` times the
  L2s a window spans under the kernel's renumbering (``spread``: 1.0 once every window is
  dealt whole; in the grid's order each head block of a window is behind another L2).
Each kernel run is its own launch: a second run over the same rows is a second pass.

A shape passes when ``loaded <= SLACK x tiled``, ``unique <= SLACK x covered``,
``per L2 <= SLACK x spread x covered`` and the distance holds.
``TRITON_INTERPRET=1 python -m attnhal_triton.mla_traffic [PLATFORM ...]`` prints them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnhal.backend import KVPool
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, CaseRecipe, build_case, make_pool, pool_size
from attnhal_triton import mla_ops
from attnhal_triton.backend import TritonBackend
from attnhal_triton.kv_reuse import domain_spread, reuse
from attnhal_triton.kv_traffic import Launch, Traffic, kv_loads
from attnhal_triton.kv_traffic_model import SLACK, TrafficCheck, covered_bytes, tiled_bytes
from attnhal_triton.launch_table import decode_launch

__all__ = ["MlaTrafficCheck", "check_mla", "latent_pool", "main", "mla_recipes", "mla_report"]


@dataclass(frozen=True)
class MlaTrafficCheck(TrafficCheck):
    """:class:`TrafficCheck` (``loaded`` against the tiled model) plus what memory serves:
    ``unique`` bytes (each launch's union), the largest dispatch ``distance`` of a repeated
    read and the ``window`` it must stay below (head blocks per row, ``grid[0]``)."""

    unique: int = 0
    distance: int = 0
    window: int = 1
    windowed: int = 0  # the sum of each (row, KV head, split) window's union
    per_domain: int = 0  # the sum of each L2's union
    spread: float = 1.0  # L2s per window the launch's renumbering allows (kv_reuse.domain_spread)

    @property
    def unique_ratio(self) -> float:
        """Unique / covered: 1.000 when memory serves each covered latent row once."""
        return self.unique / self.covered if self.covered else float(self.unique > 0) + 1.0

    @property
    def ok(self) -> bool:
        return (super().ok and max(self.unique, self.windowed) <= SLACK * self.covered
                and self.per_domain <= SLACK * self.spread * self.covered and self.distance < self.window)

    def line(self) -> str:
        return (f"{super().line()}\n      logical/covered {self.loaded / self.covered:.3f}  unique/covered "
                f"{self.unique_ratio:.3f}  per (row, split) window {self.windowed / self.covered:.3f}  "
                f"per L2 {self.per_domain / self.covered:.3f} (spread {self.spread:.3f})  "
                f"repeat distance {self.distance} < {self.window} programs")


def latent_pool(recipe: CaseRecipe) -> KVPool:
    """A pool for ``recipe`` (as the kit's :func:`~attnhal.testing.cases.make_pool`) holding V
    inside K's rows: MLA's one latent tensor per layer."""
    like = make_pool(recipe, pool_size(recipe))
    pool = KVPool(num_layers=like.num_layers, num_slots=like.num_slots, num_kv_heads=like.num_kv_heads,
                  head_dim=like.head_dim, v_head_dim=like.v_head_dim, dtype=like.dtype,
                  max_reqs=like.req_to_page.shape[0] - 1, max_context_len=like.max_context_len,
                  page_size=like.page_size, v_in_k=True)
    pool.k_scale.copy_(like.k_scale)
    pool.v_scale.copy_(like.v_scale)
    return pool


def mla_recipes(dtype: str = "bfloat16") -> dict[str, CaseRecipe]:
    """MLA shapes of every phase: 16 heads (TP 8) with chains and trees of 4 draft tokens
    (64 flattened rows), 64 and 128 heads (TP 2, TP 1) for decode; pages 1 and 16."""
    base: dict[str, Any] = dict(num_kv_heads=1, head_size=576, v_head_size=512, dtype=dtype, seed=3, slot_seed=4)
    lens = (70, 5, 33)
    out: dict[str, CaseRecipe] = {}
    for page in (1, 16):
        def add(name: str, phase: Phase, heads: int = 16, **kw: Any) -> None:
            out[f"mla {name} page{page}"] = CaseRecipe(phase, num_q_heads=heads, page_size=page, **base, **kw)

        add("decode 16 heads", Phase.DECODE, prefix_lens=lens)
        add("draft_decode 4 steps", Phase.DRAFT_DECODE, prefix_lens=lens, spec=SpecConfig.eagle(4), draft_step=3)
        add("target_verify chain 4", Phase.TARGET_VERIFY, prefix_lens=lens, spec=SpecConfig.eagle(3))
        add("target_verify tree 4", Phase.TARGET_VERIFY, prefix_lens=lens,
            spec=SpecConfig.eagle(3, topk=2, num_draft_tokens=4), tree_parents=((-1, 0, 0, 1),) * len(lens))
        add("draft_extend 4", Phase.DRAFT_EXTEND, prefix_lens=lens, spec=SpecConfig.eagle(3), new_lens=(4, 1, 3))
        add("prefill", Phase.PREFILL, prefix_lens=(0, 40), new_lens=(9, 3))
    out["mla decode 64 heads page16"] = CaseRecipe(Phase.DECODE, num_q_heads=64, page_size=16, prefix_lens=lens, **base)
    out["mla decode 128 heads page16"] = CaseRecipe(Phase.DECODE, num_q_heads=128, page_size=16, prefix_lens=lens,
                                                    **base)
    return out


@contextlib.contextmanager
def _mla_launches(traffic: Traffic) -> Iterator[None]:
    """Each MLA launch starts a :class:`Launch` of ``traffic`` (its loads are added to it)."""
    real: Callable[..., None] = mla_ops.mla_attend

    def launch(*args: Any, **kwargs: Any) -> None:
        traffic.launches.append(Launch("mla_attend", decode_launch(kwargs["launch"])[0]))
        real(*args, **kwargs)

    mla_ops.mla_attend = launch  # type: ignore[assignment]
    try:
        yield
    finally:
        mla_ops.mla_attend = real  # type: ignore[assignment]


def count_mla_loads(case: Case, backend: TritonBackend) -> Traffic:
    """The K/V bytes of one forward of ``case`` (new tokens already in the pool); a latent
    pool's V is K's own bytes, counted once (as K)."""
    pool, layer = backend.pool, case.layer
    v = pool.k[layer][:0] if pool.v_in_k else pool.v[layer]
    with kv_loads(pool.k[layer], v, per_program=True) as traffic, _mla_launches(traffic):
        backend.init_forward_metadata(case.batch)
        backend.forward(case.q, None, None, layer, case.batch)
    if not any(launch.op == "mla_attend" for launch in traffic.launches):
        raise RuntimeError(f"no MLA launch was seen in a forward of {case.recipe!r}")
    return traffic


def check_mla(name: str, case: Case, backend: TritonBackend) -> MlaTrafficCheck:
    """One forward of ``case`` held to the tiled model of the block size it launched with and
    to the covered bytes once per launch (:class:`MlaTrafficCheck`)."""
    traffic = count_mla_loads(case, backend)
    launches = [launch for launch in traffic.launches if launch.op == "mla_attend"]
    runs = [(grid, reads, launch.element_sizes, launch.constexprs.get("L2_DOMAINS", 1))
            for launch in launches for grid, reads in launch.runs]
    reuses = [reuse(*run) for run in runs]
    blocks = {launch.constexprs["BLOCK_M"] for launch in launches}
    if len(blocks) != 1:
        raise ValueError(f"MLA launches with BLOCK_M={sorted(blocks)} (supported: exactly one)")
    block_m = blocks.pop()
    pool, config = case.pool, backend.config
    # The models count K + V bytes per position; a latent pool stores only K's.
    share = pool.head_dim / (pool.head_dim + pool.v_head_dim) if pool.v_in_k else 1.0
    covered = round(covered_bytes(case, config) * share)
    tiled = round(tiled_bytes(case, config, block_m) * share)
    model = "covered" if tiled == covered else f"tiled BLOCK_M={block_m}"
    return MlaTrafficCheck(name, case.batch.phase, traffic.kv_bytes, covered, tiled, model,
                           unique=sum(r.unique for r in reuses), distance=max(r.distance for r in reuses),
                           windowed=sum(r.windowed for r in reuses),
                           per_domain=sum(r.per_domain for r in reuses),
                           spread=max(domain_spread(grid, domains) for grid, _, _, domains in runs),
                           window=min(grid[0] for grid, *_ in runs))


def mla_report(platform: str = "cpu", names: Sequence[str] | None = None, latent: bool = True,
               dtype: str = "bfloat16") -> list[MlaTrafficCheck]:
    """One check per shape of :func:`mla_recipes` on ``platform``'s launch rows; ``latent``:
    V inside K's rows (else a separate V tensor, as the conformance kit's pools)."""
    recipes, target = mla_recipes(dtype), parse(platform)
    out = []
    for name in names if names is not None else list(recipes):
        recipe = recipes[name]
        case = build_case(recipe, pool=latent_pool(recipe) if latent else None)
        out.append(check_mla(name, case, TritonBackend(case.config, case.pool, platform=target)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print every MLA shape's loaded bytes against its model, per platform's launch rows (default
    ``cpu``); exit status 1 if one loads more than ``SLACK x`` its model."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attnhal_triton.mla_traffic",
                                     description="MLA K/V bytes per forward vs the bytes the batch covers")
    parser.add_argument("platforms", nargs="*", default=["cpu"], help="launch rows of (e.g. cuda:sm90)")
    parser.add_argument("--separate-v", action="store_true", help="V in its own tensor (the kit's pools)")
    args = parser.parse_args(argv)
    failed = False
    for platform in args.platforms:
        checks = mla_report(platform, latent=not args.separate_v)
        print(f"MLA K/V traffic, launch rows of {platform}, "
              f"{'separate V' if args.separate_v else 'latent pool (V in K)'} (limit: {SLACK} x the model)")
        for check in checks:
            print(f"  {check.line()}")
        failed |= not all(check.ok for check in checks)
    return 1 if failed else 0


if __name__ == "__main__":
    with torch.no_grad():
        raise SystemExit(main())
