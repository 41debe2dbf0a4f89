"""K/V bytes the Triton kernels load per forward, counted by the interpreter, against the
bytes the batch covers.

What a CPU can check of GPU speed: attention over a paged cache is bound by the K/V bytes
it reads, and a kernel that reads a K/V tile more than once per (row, KV head) — a GQA
group split across programs, a verify block smaller than draft tokens x group, a second
load of K — is slower on every GPU by that factor. Under ``TRITON_INTERPRET=1`` every
``tl.load`` goes through the interpreter's builder (``create_masked_load`` of
:mod:`triton.runtime.interpreter`, the one seam every load takes, ``create_load``
included); :func:`count_kv_loads` wraps it for one forward and adds up, per launch, the
bytes of the **unmasked** lanes whose addresses fall inside the layer's K or V tensor
(masked lanes move no memory on a GPU either).

Two models of what a forward should load (:mod:`attnhal_triton.kv_traffic_model`):

* ``covered``: each row's attended K/V positions once, ``x Hkv x (D_k + D_v) x itemsize``
  (window-limited; the union over the row's queries) — the floor. decode, draft_decode,
  target_verify and draft_extend must load at most ``1.05 x covered`` plus the split
  overhead. The split overhead is what cutting a row's KV range into splits may add: at
  most a partial ``BLOCK_N`` block per split boundary loaded twice. The kernels cut splits
  at whole blocks and mask the rest, so masked lanes are the only padding and the
  overhead they are allowed is 0 bytes.
* ``tiled`` (prefill): each block of ``BLOCK_M`` flattened (query, head of the group) rows
  re-reads the union of its queries' causal (window-limited) ranges — what the one-pass
  extend kernel is designed to do; prefill must load at most ``1.05 x tiled``, and
  ``tiled / covered`` is printed as the tiling's cost.

The expectations are computed from the batch (its lengths, tree, window) and the launch the
backend actually made (its ``BLOCK_M``), never from today's table values.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnhal.testing.cases import Case
from attnhal_triton import ops
from attnhal_triton.backend import TritonBackend
from attnhal_triton.launch_table import decode_launch

__all__ = ["Launch", "Traffic", "count_kv_loads", "kv_loads"]

#: The custom ops whose kernels read the pool (decode_reduce reads only the partials).
_OPS = ("decode_partial", "decode_reduce", "extend")


@dataclass
class Launch:
    """One custom-op launch of a forward and the K/V bytes its kernel loaded."""

    op: str
    constexprs: dict[str, Any]
    k_bytes: int = 0
    v_bytes: int = 0
    #: With ``kv_loads(..., per_program=True)``: per kernel run of the op (each grid the
    #: interpreter ran), the grid and per program ``(x, y, z)`` the byte addresses of the K/V
    #: elements it loaded (each load's live lanes), for :mod:`attnhal_triton.kv_reuse`.
    runs: list[tuple[tuple[int, int, int], dict[tuple[int, int, int], list[np.ndarray]]]] = field(
        default_factory=list)
    element_sizes: set[int] = field(default_factory=set)

    @property
    def kv_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


@dataclass
class Traffic:
    """The launches of one forward, in order."""

    launches: list[Launch] = field(default_factory=list)

    @property
    def kv_bytes(self) -> int:
        return sum(launch.kv_bytes for launch in self.launches)

    def block_m(self) -> int:
        """``BLOCK_M`` of the forward's extend launch (prefill's tiling model reads it)."""
        blocks = {launch.constexprs["BLOCK_M"] for launch in self.launches if launch.op == "extend"}
        if len(blocks) != 1:
            raise ValueError(f"extend launches with BLOCK_M={sorted(blocks)} (supported: exactly one)")
        return blocks.pop()


class _Span:
    """The address range ``[start, end)`` of a tensor's elements on the interpreter's host."""

    def __init__(self, t: torch.Tensor) -> None:
        # The interpreter hands kernels the host storage of each argument: for a CPU tensor,
        # the tensor's own storage (Storage.cpu() returns it), so its addresses are these.
        self.start = t.data_ptr()
        self.end = self.start + t.numel() * t.element_size()

    def inside(self, ptrs: np.ndarray) -> np.ndarray:
        return (ptrs >= self.start) & (ptrs < self.end)


def _interpreter() -> Any:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r} (supported: '1', set "
                           "before the kernels are imported: K/V loads are counted in the interpreter)")
    from triton.runtime import interpreter

    return interpreter.interpreter_builder


@contextlib.contextmanager
def kv_loads(k: torch.Tensor, v: torch.Tensor, per_program: bool = False) -> Iterator[Traffic]:
    """Inside: every interpreted load's bytes of unmasked lanes within ``k``'s or ``v``'s
    elements, added to the current launch of the yielded :class:`Traffic` (each launch of
    an attnhal_triton custom op starts one; loads before any go to a launch named ``"-"``);
    ``per_program``: also each program's addresses, per kernel run (:attr:`Launch.runs`)."""
    traffic, builder, spans = Traffic(), _interpreter(), (_Span(k), _Span(v))
    real_load, real_grid = builder.create_masked_load, builder.set_grid_dim
    new_run = [False]

    def grid_dim(nx: int, ny: int, nz: int) -> None:
        new_run[0] = True  # a kernel starts: its programs' reads are a run of their own
        real_grid(nx, ny, nz)

    def counted_load(ptrs: Any, mask: Any, other: Any, cache_policy: Any, is_volatile: Any) -> Any:
        addresses = np.asarray(ptrs.data)
        live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        if not traffic.launches:
            traffic.launches.append(Launch("-", {}))
        launch = traffic.launches[-1]
        in_k, in_v = live & spans[0].inside(addresses), live & spans[1].inside(addresses)
        launch.k_bytes += int(np.count_nonzero(in_k)) * size
        launch.v_bytes += int(np.count_nonzero(in_v)) * size
        if per_program and (in_k.any() or in_v.any()):
            if new_run[0] or not launch.runs:
                launch.runs.append((tuple(builder.grid_dim), {}))
                new_run[0] = False
            reads = launch.runs[-1][1].setdefault(tuple(builder.grid_idx), [])
            reads.append(addresses[in_k | in_v].astype(np.int64))
            launch.element_sizes.add(size)
        return real_load(ptrs, mask, other, cache_policy, is_volatile)

    saved_ops = {name: getattr(ops, name) for name in _OPS}

    def announced(name: str, op: Callable[..., None]) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            # ``launch`` is every op's last parameter, given by keyword or last by position.
            constexprs, _ = decode_launch(kwargs.get("launch", args[-1] if args else ""))
            traffic.launches.append(Launch(name, dict(constexprs)))
            op(*args, **kwargs)
        return launch

    builder.create_masked_load = counted_load  # the instance attribute shadows the method
    builder.set_grid_dim = grid_dim
    try:
        for name, op in saved_ops.items():
            setattr(ops, name, announced(name, op))
        yield traffic
    finally:
        del builder.create_masked_load
        del builder.set_grid_dim
        for name, op in saved_ops.items():
            setattr(ops, name, op)


def count_kv_loads(case: Case, backend: TritonBackend) -> Traffic:
    """The K/V bytes ``backend``'s kernels load in one forward of ``case`` (its new tokens'
    K/V already in the pool: ``k = v = None``), per launch."""
    pool, layer = backend.pool, case.layer
    with kv_loads(pool.k[layer], pool.v[layer]) as traffic:
        backend.init_forward_metadata(case.batch)
        backend.forward(case.q, None, None, layer, case.batch)
    if not traffic.launches:
        raise RuntimeError(f"no kernel launch was seen in a forward of {case.recipe!r}")
    return traffic
