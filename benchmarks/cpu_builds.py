"""Builds of the cpu kernel side by side: other git revisions and instruction sets, one process, one run.

    python benchmarks/cpu_builds.py main@AVX512 .@AVX512_BF16 main@AVX2 .@AVX2 [--dtype bfloat16] [--page 16]

Each contender is ``REV@ISA``: the ``csrc/`` of git revision ``REV`` (``.`` for the working
tree) compiled for ``ISA`` (a key of ``attnhal_cpu.build.ISA_FLAGS``: ``AVX512_BF16``,
``AVX512``, ``AVX2``, ``DEFAULT``) — e.g. this tree's AVX2 build on an AVX-512 host, or
today's kernel against the main branch's. Each copy registers its op under a namespace of its
own (``attnhal_cpu_b0``, ...: ``-DATTNHAL_CPU_NS``, or the literal namespace renamed in the sources
of revisions before it) so that all load into one process; builds are cached in
``$ATTNHAL_CPU_BUILD_DIR/compare``. The op is called directly on one decode shape (KV pages in
random order, as in ``decode_cpu.py``), contenders interleaved, the read bandwidth (``sum``
over 512 MB) sampled once per repeat; every contender's output is first checked against
SDPA on the gathered K/V. ``--one-page`` points every page index at one page, so K/V stay
in L2: the arithmetic alone. The load average is printed with the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from attnhal_cpu.backend import split_count
from attnhal_cpu.build import ISA_FLAGS, SOURCE_DIR, kernel_spec
from attnhal_cpu.buildcache import Entry, cache_root, ensure_built, locate

REPO = Path(__file__).resolve().parents[1]
CSRC = SOURCE_DIR.relative_to(REPO)


def sources(rev: str, into: Path, namespace: str) -> Path:
    """``csrc/`` of ``rev`` (``.``: the working tree) copied into ``into``, its op renamed to ``namespace``."""
    into.mkdir(parents=True)
    if rev == ".":
        files = {p.name: p.read_text() for p in SOURCE_DIR.iterdir() if p.suffix in (".cpp", ".h")}
    else:
        names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", f"{rev}:{CSRC}"],
                               capture_output=True, text=True, check=True).stdout.split()
        files = {n: subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{CSRC}/{n}"], capture_output=True,
                                   text=True, check=True).stdout for n in names}
    for name, text in files.items():
        text = text.replace("TORCH_LIBRARY(attnhal_cpu,", f"TORCH_LIBRARY({namespace},")
        (into / name).write_text(text.replace("TORCH_LIBRARY_IMPL(attnhal_cpu,", f"TORCH_LIBRARY_IMPL({namespace},"))
    return into


def build_copy(rev: str, isa: str, namespace: str, workdir: Path) -> tuple[object, Entry]:
    """Build (or find in ``$ATTNHAL_CPU_BUILD_DIR/compare``) and load ``rev``'s kernel for ``isa``
    under op namespace ``namespace``; returns its ops (``torch.ops.<namespace>``) and cache entry."""
    spec = kernel_spec(isa, sources(rev, workdir / namespace, namespace), namespace)
    entry = locate(dataclasses.replace(spec, name=namespace), cache_root() / "compare")
    ensure_built(entry)
    torch.ops.load_library(str(entry.library))
    return getattr(torch.ops, namespace), entry


def load(contender: str, index: int, workdir: Path) -> object:
    """Build (or find in the cache) and load contender ``REV@ISA``; returns its op namespace."""
    rev, _, isa = contender.partition("@")
    if isa not in ISA_FLAGS:
        raise SystemExit(f"contender={contender!r}: ISA={isa!r} (supported: REV@ISA with ISA in {sorted(ISA_FLAGS)})")
    return build_copy(rev, isa, f"attnhal_cpu_b{index}", workdir)[0]


@dataclasses.dataclass
class Decode:
    """One decode launch's arguments: q ``[bs, Hq, D]`` over a paged pool ``[slots, Hkv, D]``."""

    out: torch.Tensor
    mid_o: torch.Tensor
    mid_lse: torch.Tensor
    args: tuple[object, ...]
    expected: torch.Tensor
    kv_bytes: int


def decode(bs: int, ctx: int, dtype: torch.dtype, page: int, one_page: bool, hq: int = 32, hkv: int = 8,
           d: int = 128) -> Decode:
    gen = torch.Generator().manual_seed(0)
    per = -(-ctx // page)
    k, v = (torch.randn((bs * per + 1) * page, hkv, d, generator=gen).to(dtype) for _ in range(2))
    pages = (torch.randperm(bs * per, generator=gen) + 1).view(bs, per)
    if one_page:
        pages = torch.ones_like(pages)
    table = torch.cat([torch.zeros(1, per, dtype=torch.int32), pages.to(torch.int32)])
    q = torch.randn(bs, hq, d, generator=gen).to(dtype)
    splits = split_count(bs, ctx, torch.get_num_threads())
    req, lens = torch.arange(1, bs + 1), torch.full((bs,), ctx, dtype=torch.int32)
    pos = torch.arange(ctx)
    slots = pages[:, pos // page] * page + pos % page
    gathered = [x[slots].float().transpose(1, 2) for x in (k, v)]  # [bs, Hkv, ctx, D]
    expected = torch.nn.functional.scaled_dot_product_attention(q.float().view(bs, hkv, hq // hkv, d), *gathered)
    args = (q, k, v, table, req, lens, None, None, None, 0, 1, page, d ** -0.5, splits)
    return Decode(torch.empty_like(q), torch.empty(bs * hq * splits * d), torch.empty(bs * hq * splits), args,
                  expected.view(bs, hq, d), 2 * bs * ctx * hkv * d * k.element_size())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("contenders", nargs="+", metavar="REV@ISA")
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--one-page", action="store_true", help="every page index -> one page (K/V stay in L2)")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ops = {c: load(c, i, Path(tmp)) for i, c in enumerate(a.contenders)}
    print(f"{a.bs}x{a.ctx} {a.dtype} page {a.page}{' (one page: L2)' if a.one_page else ''}, threads "
          f"{torch.get_num_threads()}; builds: " + "; ".join(f"{c}: {op.isa()}" for c, op in ops.items()))
    with torch.no_grad():
        job = decode(a.bs, a.ctx, getattr(torch, a.dtype), a.page, a.one_page)
        for name, op in ops.items():
            op.attend(job.out, job.mid_o, job.mid_lse, *job.args)
            err = (job.out.float() - job.expected).abs().max().item()
            if err > 0.05:
                raise SystemExit(f"{name}: max |out - sdpa| = {err:.3g}: wrong result, not timing it")
        times: dict[str, list[float]] = {n: [] for n in ops}
        bandwidth, big = [], torch.ones(128 << 20)
        for _ in range(a.repeats):
            for name, op in ops.items():
                start = time.perf_counter()
                op.attend(job.out, job.mid_o, job.mid_lse, *job.args)
                times[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            big.sum()
            bandwidth.append(big.numel() * 4 / (time.perf_counter() - start) / 1e9)
    read = statistics.median(bandwidth)
    first = statistics.median(times[a.contenders[0]])
    print(f"read bandwidth {read:.1f} GB/s; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, ts in times.items():
        s = statistics.median(ts)
        print(f"  {name:24} {s * 1e3:8.2f} ms {job.kv_bytes / s / 1e9:6.1f} GB/s {job.kv_bytes / s / 1e9 / read:5.0%} "
              f"of read bw  {first / s:5.2f}x the first")


if __name__ == "__main__":
    main()
