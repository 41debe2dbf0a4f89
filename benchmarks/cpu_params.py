"""Parameter sets of the cpu kernel side by side, with other builds and SDPA, in one process, one run.

    python benchmarks/cpu_params.py - fp32.prefetch_burst=1 prefetch=32 [--against main@AVX2 main@AVX2:PARAMS]
                                    [--dtype bfloat16] [--page 16] [--cpu-time]

Each positional argument is a parameter set of the host's build (``-``: the defaults; else
``ATTNHAL_CPU_PARAMS`` syntax, see ``attnhal_cpu.params.parse_host_params``; the set for the
``--dtype``'s cache width is used). ``--against REV@ISA`` adds a build of another revision
(``benchmarks/cpu_builds.py``), launched with its own defaults; ``REV@ISA:PARAMS`` with these
parameters (its op must take ``prefetch, max_vectors, prefetch_burst``; ``tile_vectors`` is passed
only when not 1, so revisions before it run too). All contenders, both SDPA
forms on contiguous K/V and the read bandwidth (``sum`` over 512 MB) are timed interleaved
on one decode shape (default 16 × 2048, pages in random order), medians of ``--repeats``.

``--cpu-time``: one thread, and each launch timed by the thread's CPU time
(``time.thread_time``) rather than the wall clock: on a host shared with other work the wall
time of a launch is mostly the time it waited for a core (at load 18 on 2 CPUs a 15 ms launch
took 150 ms), its CPU time is not. The figures are then one core's: compare contenders within
a run, not with a 2-thread table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from attnhal_cpu.ops import attend_op
from attnhal_cpu.params import parse_host_params, split_count

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_builds import build_copy, decode  # noqa: E402 - a sibling script


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sets", nargs="+", metavar="PARAMS", help="'-' or ATTNHAL_CPU_PARAMS syntax")
    ap.add_argument("--against", nargs="*", default=[], metavar="REV@ISA[:PARAMS]")
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cpu-time", action="store_true", help="one thread, timed by its CPU time")
    a = ap.parse_args(argv)
    if a.cpu_time:
        torch.set_num_threads(1)
    clock = time.thread_time if a.cpu_time else time.perf_counter
    dtype = getattr(torch, a.dtype)
    try:
        sets = [parse_host_params("" if s == "-" else s).for_itemsize(dtype.itemsize) for s in a.sets]
    except ValueError as exc:
        raise SystemExit(f"PARAMS: {exc}") from None
    job = decode(a.bs, a.ctx, dtype, a.page, False)
    fns: dict[str, Callable[[], object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, contender in enumerate(a.against):
            build, _, text = contender.partition(":")
            rev, _, isa = build.partition("@")
            ops = build_copy(rev, isa, f"attnhal_cpu_p{i}", Path(tmp))[0]
            args: tuple[object, ...] = job.args
            if text:
                try:
                    p = parse_host_params(text).for_itemsize(dtype.itemsize)
                except ValueError as exc:
                    raise SystemExit(f"--against {contender}: {exc}") from None
                args = (*job.args[:-1], split_count(a.bs, a.ctx, torch.get_num_threads(), p.tasks_per_thread),
                        *p.op_args()[:3], *p.op_args()[3:] * (p.tile_vectors != 1))
            fns[contender] = lambda ops=ops, args=args: ops.attend(  # type: ignore[misc]
                job.out, job.mid_o, job.mid_lse, *args)
    op, threads = attend_op(), torch.get_num_threads()
    for p in sets:
        args = (*job.args[:-1], split_count(a.bs, a.ctx, threads, p.tasks_per_thread))
        fns[str(p)] = lambda args=args, p=p: op(job.out, job.mid_o, job.mid_lse, *args, *p.op_args())
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(a.bs, 8, a.ctx, 128, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(a.bs, 8, 4, 128, generator=gen).to(dtype)
    fns["sdpa folded"] = lambda: F.scaled_dot_product_attention(q, k, v)
    fns["sdpa gqa"] = lambda: F.scaled_dot_product_attention(q.reshape(a.bs, 32, 1, 128), k, v, enable_gqa=True)
    big = torch.ones(128 << 20)
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {n: [] for n in fns}
    bandwidth, load = [], os.getloadavg()[0]
    for _ in range(a.repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
        start = clock()
        big.sum()
        bandwidth.append(big.numel() * 4 / (clock() - start) / 1e9)
    read, med = statistics.median(bandwidth), {n: statistics.median(t) for n, t in times.items()}
    best = min(med["sdpa folded"], med["sdpa gqa"])
    print(f"{a.bs}x{a.ctx} {a.dtype} page {a.page}, threads {torch.get_num_threads()}, "
          f"{'thread CPU time' if a.cpu_time else 'wall time'}; read bandwidth {read:.1f} GB/s; "
          f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for name, s in med.items():
        gbs = job.kv_bytes / s / 1e9
        print(f"  {name:92} {s * 1e3:8.2f} ms {gbs / read:5.0%} of read bw {best / s:5.2f}x best sdpa")


if __name__ == "__main__":
    main()
