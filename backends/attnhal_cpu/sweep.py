"""The short measurement that picks the kernel's parameters on this host (at most about 3 s).

Per cache width (fp32, then bf16 for the 2-byte caches), one page size (16) and two decode
shapes over the same 64 MB of K/V (32/8 heads, head size 128, pages in random order, twice
the L3 of the hosts measured so far): many rows (fp32 8 × 1024, bf16 8 × 2048: every thread
has rows of its own) and one long row (1 × 8192, 1 × 16384: the thread split decides). The parameters are searched one at a time, starting from the
defaults (coordinate descent): for each, every candidate value is timed in interleaved
rounds (drift hits all alike), a candidate's time per shape is its fastest round (the least
disturbed by other processes), and it replaces the current choice only when its times, each
relative to the current choice's in the same rounds, sum to at least :data:`GAIN` less.

The sweep never waits past its budget: when the clock passes it, :class:`SweepTimeout` is
raised and the caller keeps the defaults. Nor does it measure a busy host: with a load
average above :data:`BUSY_LOAD_PER_CPU` per CPU the times are other processes' (on a
2-CPU host at load 6 the same launch took 17 to 48 ms), so it raises :class:`HostBusy` at
once instead of caching noise.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnhal.errors import AttnhalError
from attnhal_cpu.params import DEFAULTS, MIN_SPLIT_LEN, TILE_VECTORS, KernelParams, split_count

__all__ = ["CANDIDATES", "GAIN", "RACE_SHAPES", "SHAPES", "HostBusy", "SweepResult", "SweepTimeout", "Timer",
           "kernel_timer", "race", "sweep"]

#: The sweep's page size and shapes (rows, positions per row) per cache width; both read the same 64 MB.
PAGE = 16
SHAPES: dict[str, tuple[tuple[int, int], ...]] = {"fp32": ((8, 1024), (1, 8192)), "half": ((8, 2048), (1, 16384))}
#: The race between builds reads 128 MB, four times the L3 of the hosts measured: over the sweep's
#: 64 MB a Zen 4 (32 MB L3) kept part of the K/V in L3 and its AVX2 build led the AVX512 build by
#: 2-6 %, where over 128 MB it led by 10-14 % and real decodes past the L3 took 4-20 % less time
#: (docs/cpu.md). It launches each build a few times only, so the larger shapes cost little.
RACE_SHAPES: dict[str, tuple[tuple[int, int], ...]] = {"fp32": ((8, 2048), (1, 16384)),
                                                       "half": ((16, 2048), (1, 32768))}
HEADS = (32, 8, 128)  # query heads, KV heads, head size
#: Values tried per parameter, in search order (prefetch distances are rounded up to whole tiles).
CANDIDATES: dict[str, tuple[int, ...]] = {
    "tile_vectors": TILE_VECTORS,
    "prefetch_burst": (0, 1),
    "prefetch": (0, 8, 16, 32, 64),
    "max_vectors": (8, 16, 64),
    "tasks_per_thread": (1, 2, 4, 8),
}
ROUNDS = 4
#: The least improvement (sum of relative times over the shapes) that replaces the current choice.
GAIN = 0.03
BUDGET_S = 3.0
#: Above this 1-minute load average per CPU the host is too busy to measure.
BUSY_LOAD_PER_CPU = 1.5

#: ``timer(params, shape_index)`` -> seconds of one launch.
Timer = Callable[[KernelParams, int], float]


class SweepTimeout(AttnhalError, TimeoutError):
    """The sweep ran past its budget (the host is busy); the defaults stay."""


class HostBusy(AttnhalError, RuntimeError):
    """The load average says other processes would set the times; the defaults stay."""


@dataclass(frozen=True)
class SweepResult:
    """The chosen parameters; ``trials``: every candidate's fastest time per shape (seconds), in
    the order timed; ``seconds``: the sweep's wall time."""

    params: KernelParams
    trials: tuple[tuple[KernelParams, tuple[float, ...]], ...]
    seconds: float


def _whole_tiles(params: KernelParams, vector: int) -> KernelParams:
    """``params`` with its prefetch distance rounded up to whole tiles (what the kernel runs)."""
    tile = vector * params.tile_vectors
    return dataclasses.replace(params, prefetch=-(-params.prefetch // tile) * tile)


def _candidates(best: KernelParams, name: str, vector: int) -> list[KernelParams]:
    out = [best]
    for value in CANDIDATES[name]:
        cand = _whole_tiles(dataclasses.replace(best, **{name: value}), vector)
        if cand not in out:
            out.append(cand)
    return out


def _load_per_cpu() -> float:
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def sweep(timer: Timer, tile: int, budget_s: float = BUDGET_S, shapes: int = 2,
          clock: Callable[[], float] = time.monotonic, load: Callable[[], float] = _load_per_cpu) -> SweepResult:
    """Coordinate descent over :data:`CANDIDATES` from :data:`DEFAULTS` (see the module doc).

    ``tile``: the build's positions per vector (a tile is ``tile_vectors`` of them); ``load``: the
    load average per CPU. Raises :class:`HostBusy` above :data:`BUSY_LOAD_PER_CPU`,
    :class:`SweepTimeout` past ``budget_s``.
    """
    if load() > BUSY_LOAD_PER_CPU:
        raise HostBusy(f"load average {load():.2f} per cpu (measured only at <= {BUSY_LOAD_PER_CPU:g}); "
                       "kept the defaults, a later run measures")
    start = clock()
    best = _whole_tiles(DEFAULTS, tile)
    trials: list[tuple[KernelParams, tuple[float, ...]]] = []
    for shape in range(shapes):  # first launches size each thread's buffers: not timed
        timer(best, shape)
    for name in CANDIDATES:
        cands = _candidates(best, name, tile)
        fastest = _fastest({c: functools.partial(timer, c) for c in cands}, shapes, start, budget_s, clock)
        trials.extend((c, fastest[c]) for c in cands)
        best = _winner(fastest, best, shapes)
    return SweepResult(best, tuple(trials), clock() - start)


def race(timers: Mapping[str, Callable[[int], float]], current: str, budget_s: float = BUDGET_S, shapes: int = 2,
         clock: Callable[[], float] = time.monotonic,
         load: Callable[[], float] = _load_per_cpu) -> tuple[str, dict[str, tuple[float, ...]]]:
    """The fastest of several builds, each launched with its own parameters (``timers[name](shape)``:
    seconds of one launch), and every build's fastest time per shape. Timed as one parameter of
    :func:`sweep` is (interleaved rounds, the fastest round); ``current`` (the host's own build) stays
    unless another is :data:`GAIN` faster. Raises :class:`HostBusy` and :class:`SweepTimeout` as it does."""
    if load() > BUSY_LOAD_PER_CPU:
        raise HostBusy(f"load average {load():.2f} per cpu (measured only at <= {BUSY_LOAD_PER_CPU:g}); "
                       "kept the host's build, a later run measures")
    start = clock()
    for run in timers.values():  # first launches size each thread's buffers: not timed
        for shape in range(shapes):
            run(shape)
    fastest = _fastest(timers, shapes, start, budget_s, clock)
    return _winner(fastest, current, shapes), fastest


def _fastest(runs: Mapping[Any, Callable[[int], float]], shapes: int, start: float, budget_s: float,
             clock: Callable[[], float]) -> dict[Any, tuple[float, ...]]:
    """Each run's fastest of :data:`ROUNDS` interleaved rounds, per shape."""
    fastest = {key: [float("inf")] * shapes for key in runs}
    for _ in range(ROUNDS):
        for key, run in runs.items():
            for shape in range(shapes):
                if clock() - start > budget_s:
                    raise SweepTimeout(f"the sweep ran past {budget_s:g} s (load average "
                                       f"{os.getloadavg()[0]:.2f}); kept the defaults")
                fastest[key][shape] = min(fastest[key][shape], run(shape))
    return {key: tuple(times) for key, times in fastest.items()}


def _winner(fastest: Mapping[Any, Sequence[float]], current: Any, shapes: int) -> Any:
    """The run whose times, each relative to ``current``'s, sum to the least, if :data:`GAIN` less."""
    def score(key: Any) -> float:
        return sum(t / b for t, b in zip(fastest[key], fastest[current]))

    winner = min(fastest, key=score)
    return winner if score(winner) <= shapes * (1 - GAIN) else current


def kernel_timer(op: Any, threads: int, width: str = "fp32", seed: int = 0,
                 jobs: list[tuple[Sequence[Any], int, int]] | None = None,
                 shapes: Mapping[str, Sequence[tuple[int, int]]] = SHAPES) -> Timer:
    """A :data:`Timer` of ``op`` (``torch.ops.<namespace>``, with ``attend``) on the ``shapes``
    (:data:`SHAPES`, or :data:`RACE_SHAPES`) of ``width`` (``fp32``, or ``half``: a bf16 cache).

    Allocates the shared KV (64 MB) and each shape's page table at its first call (a sweep that
    gives up at once, on a busy host, allocates nothing) into ``jobs`` (pass one list to the
    timers of several builds of the same width: they then read the same K/V); the returned
    timer launches the op with the given parameters and split count and returns its wall time.
    """
    jobs = [] if jobs is None else jobs

    def timer(params: KernelParams, shape: int) -> float:
        if not jobs:
            jobs.extend(_jobs(shapes[width], width, seed))
        args, rows, ctx = jobs[shape]
        splits = split_count(rows, ctx, threads, params.tasks_per_thread)
        begin = time.perf_counter()
        op.attend(*args, splits, *params.op_args())
        return time.perf_counter() - begin

    return timer


def _jobs(shapes: Sequence[tuple[int, int]], width: str, seed: int) -> list[tuple[Sequence[Any], int, int]]:
    """The op's arguments (but the split count and the parameters) per shape of a ``width`` cache."""
    import torch

    hq, hkv, d = HEADS
    dtype = torch.float32 if width == "fp32" else torch.bfloat16
    slots = max(rows * ctx for rows, ctx in shapes)
    gen = torch.Generator().manual_seed(seed)
    k = torch.empty(slots + PAGE, hkv, d, dtype=dtype).uniform_(-1, 1, generator=gen)
    v = torch.empty(slots + PAGE, hkv, d, dtype=dtype).uniform_(-1, 1, generator=gen)
    pages = torch.randperm(slots // PAGE, generator=gen).to(torch.int32) + 1  # page 0 unused
    jobs: list[tuple[Sequence[Any], int, int]] = []
    for rows, ctx in shapes:
        table = pages[: rows * ctx // PAGE].view(rows, ctx // PAGE).contiguous()
        q = torch.empty(rows, hq, d, dtype=dtype).uniform_(-1, 1, generator=gen)
        most = -(-ctx // MIN_SPLIT_LEN)  # split_count never exceeds this
        out, mid_o, mid_lse = torch.empty_like(q), torch.empty(rows * hq * most * d), torch.empty(rows * hq * most)
        lens = torch.full((rows,), ctx, dtype=torch.int32)
        args = (out, mid_o, mid_lse, q, k, v, table, torch.arange(rows), lens, None, None, None, 0, 1, PAGE, d ** -0.5)
        jobs.append((args, rows, ctx))
    return jobs
