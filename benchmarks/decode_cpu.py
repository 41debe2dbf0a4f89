"""Paged decode on the CPU: cpu backend vs torch backend vs contiguous SDPA, with the read bandwidth.

    python benchmarks/decode_cpu.py [--repeats 7] [--page-sizes 1 16 64] [--plot decode_cpu.png] [--quick]
                                    [--isa AVX2 AVX512 ...] [--no-sweep]

Same data for every contender: K/V of ``bs`` requests × ``ctx`` tokens, laid out in a
KV pool whose pages are a random permutation (page size ``P``: slot = page * P + pos % P),
and the same K/V contiguous ``[bs, kv_heads, ctx, D]`` for SDPA.

Contenders
    ``cpu ISA pP`` ``CpuBackend.forward`` (decode) on a pool of page size ``P``, once per build of the
                  kernel this host can run, each forced for every cache width: its own (``native_build``)
                  and the narrower builds the backend races it with (an ``AVX512_BF16`` host also runs
                  ``AVX512`` and ``AVX2``; ``--isa`` picks), each with the parameters measured for it on
                  this host (``attnhal_cpu.tuning``; the header prints them, measured or defaulted, and
                  which build the backend runs per cache width). Each build's op has a namespace of its
                  own (``attnhal_cpu_avx2``), so all run in this process;
    ``torch pP``  ``TorchBackend.forward``; a page size a backend does not claim prints ``n/a`` with the reason;
    ``sdpa gqa``  ``scaled_dot_product_attention(q [bs, H, 1, D], K, V, enable_gqa=True)``;
    ``sdpa folded`` the query heads of each KV head folded into the query length:
                  ``sdpa(q.view(bs, KV, G, D), K, V)``. The baseline is the faster SDPA form, per row.
Metadata is built once per batch (as an engine does for all layers) and not timed.

``read GB/s``: ``tensor.sum()`` over 512 MB of fp32 (the streaming read rate), sampled
once per repeat between the contenders. ``KV GB/s`` counts the K and V bytes a decode
must read once: ``2 * bs * ctx * kv_heads * D * itemsize``. Times are medians of
interleaved repeats (contenders alternate, so load drift hits all alike). The load
average is printed before and after and with each shape's read bandwidth: compare runs
only at similar load. The header names the host: the CPU model, the instruction-set flags
the kernel can use (``/proc/cpuinfo``), torch's capability and the build the cpu backend
loaded (its instruction set and tile width), so a table is never read against the wrong host.
The last lines restate each build's figures on the shape the acceptance names (16 × 2048).
``--no-sweep`` leaves out the context sweep (not the parameter sweep: ``ATTNHAL_CPU_TUNE=0``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch, KVPool, dtype_name
from attnhal.capabilities import AttentionRequest, not_supported_reasons
from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal_cpu import CpuBackend
from attnhal_cpu.build import ISA_FLAGS, NARROWER, load_build, native_build, op_namespace, tune_entry
from attnhal_cpu.buildcache import find_compiler
from attnhal_cpu.ops import Kernel, attend_op
from attnhal_cpu.params import WIDTH_NAMES, WIDTHS
from attnhal_torch import TorchBackend

SHAPES = ((1, 8192), (16, 2048), (64, 512))
SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
QUICK_SHAPES = ((2, 512),)
QUICK_SWEEP = (256, 1024)


@dataclass(frozen=True)
class Heads:
    q: int = 32
    kv: int = 8
    dim: int = 128


@dataclass
class Result:
    """Median seconds per contender of one (shape, dtype); ``na`` maps a contender to why it did not run."""

    bs: int
    ctx: int
    dtype: str
    kv_bytes: int
    read_gbs: float
    load: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    na: dict[str, str] = field(default_factory=dict)

    @property
    def baseline(self) -> str:
        return min(("sdpa gqa", "sdpa folded"), key=lambda n: self.seconds[n])

    def gbs(self, name: str) -> float:
        return self.kv_bytes / self.seconds[name] / 1e9


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _paged_pool(k: torch.Tensor, v: torch.Tensor, page: int, gen: torch.Generator) -> tuple[KVPool, torch.Tensor]:
    """A pool of page size ``page`` holding ``k``/``v`` ``[bs, ctx, KV, D]`` in randomly permuted pages;
    returns it and each request's slots ``[bs, ctx]``."""
    bs, ctx, kv, d = k.shape
    per_req = -(-ctx // page)
    pool = KVPool(num_layers=1, num_slots=bs * per_req * page, num_kv_heads=kv, head_dim=d, dtype=k.dtype,
                  max_reqs=bs, max_context_len=ctx, page_size=page)
    pages = (torch.randperm(bs * per_req, generator=gen) + 1).view(bs, per_req)
    pool.req_to_page[1:bs + 1] = pages.to(torch.int32)
    pos = torch.arange(ctx)
    slots = pages[:, pos // page] * page + pos % page
    pool.k[0][slots.view(-1)] = k.reshape(-1, kv, d)
    pool.v[0][slots.view(-1)] = v.reshape(-1, kv, d)
    return pool, slots


@dataclass
class _Data:
    q: torch.Tensor  # [bs, H, D]
    k: torch.Tensor  # [bs, KV, ctx, D] contiguous
    v: torch.Tensor


def _data(bs: int, ctx: int, heads: Heads, dtype: torch.dtype, gen: torch.Generator) -> _Data:
    shape = (bs, heads.kv, ctx, heads.dim)
    return _Data(torch.randn(bs, heads.q, heads.dim, generator=gen).to(dtype),
                 torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))


@dataclass(frozen=True)
class Contender:
    """A paged backend to time: its label prefix, class and constructor keywords."""

    label: str
    cls: type[AttentionBackend]
    kwargs: dict[str, object] = field(default_factory=dict)


def _paged_contender(who: Contender, page: int, data: _Data, heads: Heads, dtype: torch.dtype,
                     gen: torch.Generator) -> tuple[Callable[[], torch.Tensor] | None, str]:
    """(the timed call, "") or (None, why not) for ``who`` at page size ``page``."""
    cls = who.cls
    dt = dtype_name(dtype)
    request = AttentionRequest(phase=Phase.DECODE, dtype=dt, kv_dtype=dt, head_size=heads.dim, page_size=page)
    reasons = not_supported_reasons(cls.capabilities, request, parse("cpu")) or cls.runtime_reasons(parse("cpu"))
    if reasons:
        return None, "; ".join(r.message for r in reasons)
    bs, ctx = data.k.shape[0], data.k.shape[2]
    pool, slots = _paged_pool(data.k.transpose(1, 2), data.v.transpose(1, 2), page, gen)
    lens = torch.full((bs,), ctx, dtype=torch.int32)
    batch = ForwardBatch(Phase.DECODE, req_pool_indices=torch.arange(1, bs + 1), seq_lens=lens,
                         out_cache_loc=slots[:, -1].clone(), seq_lens_cpu=lens.clone())
    backend = cls(AttentionConfig(heads.q, heads.kv, heads.dim, dtype), pool, **who.kwargs)
    backend.init_forward_metadata(batch)
    return (lambda: backend.forward(data.q, None, None, 0, batch)), ""


def kernels(isas: list[str] | None) -> list[Kernel]:
    """Each build this host runs — its own, then every narrower one (those the backend races per
    cache width) — or those of ``isas``, each forced for both widths with its own parameters,
    tuned for this host (each build's record lives in its cache entry)."""
    native = native_build()
    if not native.ok or native.tuning is None:
        return []
    own = native.own_isa
    allowed = (own, *NARROWER[own], "DEFAULT")
    out = []
    for isa in isas or allowed[:-1]:
        if isa not in allowed:
            raise SystemExit(f"--isa={isa} (supported on this host: {' '.join(allowed)})")
        entry, _, ops = load_build(isa, find_compiler())
        tuning = native.tuning if isa == own else tune_entry(entry, isa, ops)
        out.append(Kernel(attend_op(op_namespace(isa)), tuning.params, op_namespace(isa),
                          f"{tuning.source}: {tuning.detail}"))
    return out


def contenders(kernels: list[Kernel]) -> list[Contender]:
    cpu = [Contender("cpu " + k.name.removeprefix("attnhal_cpu_").split()[0], CpuBackend, {"kernel": k})
           for k in kernels] or [Contender("cpu", CpuBackend)]  # unavailable: its rows say why
    return [*cpu, Contender("torch", TorchBackend)]


def _sdpa_contenders(data: _Data, heads: Heads) -> dict[str, Callable[[], torch.Tensor]]:
    bs, g = data.q.shape[0], heads.q // heads.kv
    q4 = data.q.view(bs, heads.q, 1, heads.dim)
    folded = data.q.view(bs, heads.kv, g, heads.dim)
    return {"sdpa gqa": lambda: F.scaled_dot_product_attention(q4, data.k, data.v, enable_gqa=True),
            "sdpa folded": lambda: F.scaled_dot_product_attention(folded, data.k, data.v)}


#: CPU flags the kernel's builds can use (``/proc/cpuinfo`` names).
KERNEL_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16",
                "amx_bf16")


def host_line(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU model and which of :data:`KERNEL_FLAGS` it has, or why that is unknown."""
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError as exc:
        return f"host: cpu flags unknown ({cpuinfo}: {exc.strerror}); torch capability " \
               f"{torch.backends.cpu.get_cpu_capability()}"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    have = " ".join(f for f in KERNEL_FLAGS if f in flags) or "none"
    lacks = " ".join(f for f in KERNEL_FLAGS if f not in flags) or "none"
    model = f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"
    return f"host: {model}, {os.cpu_count()} cpus; flags: {have}; lacks: {lacks}; torch capability " \
           f"{torch.backends.cpu.get_cpu_capability()}"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def read_bandwidth(numel: int) -> float:
    """GB/s of one ``sum`` over ``numel`` fp32 (a streaming read)."""
    big = torch.ones(numel, dtype=torch.float32)
    big.sum()
    return numel * 4 / _time(big.sum) / 1e9


def measure(bs: int, ctx: int, dtype: torch.dtype, heads: Heads, pages: tuple[int, ...], repeats: int,
            bw_numel: int, paged: list[Contender], seed: int = 0) -> Result:
    gen = torch.Generator().manual_seed(seed)
    data = _data(bs, ctx, heads, dtype, gen)
    fns = _sdpa_contenders(data, heads)
    res = Result(bs, ctx, dtype_name(dtype), 2 * data.k.numel() * data.k.element_size(), 0.0)
    ref = fns["sdpa gqa"]().float().view(bs, heads.q, heads.dim)
    for who in paged:
        for page in pages:
            fn, why = _paged_contender(who, page, data, heads, dtype, gen)
            label = f"{who.label} p{page}"
            if fn is None:
                res.na[label] = why
                continue
            err = (fn().float() - ref).abs().max().item()
            if err > 0.05:  # bf16 rounding of the output stays far below this
                raise AssertionError(f"{label}: max |out - sdpa| = {err:.3g}: wrong result, not timing it")
            fns[label] = fn
    times: dict[str, list[float]] = {n: [] for n in fns}
    bw = []
    big = torch.ones(bw_numel, dtype=torch.float32)
    for _ in range(repeats):  # interleaved
        for name, fn in fns.items():
            times[name].append(_time(fn))
        bw.append(bw_numel * 4 / _time(big.sum) / 1e9)
    res.read_gbs = statistics.median(bw)
    res.load = load_average()
    res.seconds = {n: statistics.median(t) for n, t in times.items()}
    return res


def format_results(results: list[Result]) -> str:
    head = f"{'shape':>11} {'dtype':9} {'contender':18} {'ms':>8} {'KV GB/s':>8} {'% read bw':>9} {'vs best sdpa':>13}"
    lines = [head, "-" * len(head)]
    for r in results:
        shape = f"{r.bs}x{r.ctx}"
        for name, s in r.seconds.items():
            mark = "  (baseline)" if name == r.baseline else ""
            lines.append(f"{shape:>11} {r.dtype:9} {name:18} {s * 1e3:8.2f} {r.gbs(name):8.1f} "
                         f"{r.gbs(name) / r.read_gbs * 100:8.0f}% {r.seconds[r.baseline] / s:12.2f}x{mark}")
        for name, why in r.na.items():
            lines.append(f"{shape:>11} {r.dtype:9} {name:18} {'n/a':>8}  {why}")
        lines.append(f"{shape:>11} {r.dtype:9} {'read bw':18} {'':8} {r.read_gbs:8.1f} {100:8.0f}%  load {r.load}")
    return "\n".join(lines)


#: The shape and contenders the acceptance names: (dtype, page size).
FOCUS_SHAPE = (16, 2048)
FOCUS = (("float32", 16), ("float32", 64), ("bfloat16", 16), ("bfloat16", 64))


def summary(results: list[Result], paged: list[Contender]) -> str:
    """Each cpu build's figures on :data:`FOCUS_SHAPE`: % of read bandwidth and × the best SDPA."""
    lines = []
    for who in (c for c in paged if c.cls is CpuBackend):
        cells = []
        for dtype, page in FOCUS:
            name = f"{who.label} p{page}"
            for r in results:
                if (r.bs, r.ctx) == FOCUS_SHAPE and r.dtype == dtype and name in r.seconds:
                    cells.append(f"{dtype} p{page} {r.gbs(name) / r.read_gbs:.0%} "
                                 f"{r.seconds[r.baseline] / r.seconds[name]:.2f}x")
        if cells:
            lines.append(f"  {who.label}: " + "; ".join(cells))
    if not lines:
        return ""
    return (f"{FOCUS_SHAPE[0]}x{FOCUS_SHAPE[1]} per build (% of read bw, x the best sdpa; floor: fp32 >= 60% and "
            ">= 1.4x at pages 16 and 64, bf16 >= 45%):\n" + "\n".join(lines))


def plot(sweep: list[Result], path: str) -> None:
    """GB/s and % of read bandwidth against context length, per contender and dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r.dtype for r in sweep}, reverse=True)
    fig, axes = plt.subplots(2, len(dtypes), figsize=(6 * len(dtypes), 8), squeeze=False)
    for col, dt in enumerate(dtypes):
        rows = [r for r in sweep if r.dtype == dt]
        names = list(dict.fromkeys(n for r in rows for n in r.seconds))
        for name in names:
            ctx = [r.ctx for r in rows if name in r.seconds]
            axes[0][col].plot(ctx, [r.gbs(name) for r in rows if name in r.seconds], marker="o", label=name)
            axes[1][col].plot(ctx, [r.gbs(name) / r.read_gbs * 100 for r in rows if name in r.seconds],
                              marker="o", label=name)
        axes[0][col].plot([r.ctx for r in rows], [r.read_gbs for r in rows], "k--", label="read bw (sum)")
        for row, ylabel in ((0, "KV GB/s"), (1, "% of read bandwidth")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel(f"context (bs {rows[0].bs})")
            ax.set_ylabel(ylabel)
            ax.set_title(f"decode, {dt}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"paged decode on {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}, "
                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--sweep-bs", type=int, default=1, help="batch size of the context sweep")
    ap.add_argument("--no-sweep", action="store_true", help="only the fixed shapes")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the sweep (needs matplotlib: pip install 'attnhal[bench]')")
    ap.add_argument("--quick", action="store_true", help="a smoke run in seconds (tiny shapes, 2 repeats, "
                    "the host's own build only unless --isa)")
    ap.add_argument("--shapes", nargs="+", metavar="BSxCTX", help="the fixed shapes (default: 1x8192 16x2048 64x512)")
    ap.add_argument("--isa", nargs="+", choices=sorted(ISA_FLAGS), help="the kernel builds to run (default: this "
                    "host's and every lower instruction set it can run; DEFAULT: the generic build, vectors of 4 floats)")
    a = ap.parse_args(argv)
    bad = [p for p in a.page_sizes if p < 1]
    if bad or a.repeats < 1:
        ap.error(f"--page-sizes={a.page_sizes} --repeats={a.repeats} (supported: integers >= 1)")
    heads = Heads(a.q_heads, a.kv_heads, a.head_dim)
    shapes, sweep, repeats, bw_numel = SHAPES, SWEEP, a.repeats, 128 << 20
    if a.quick:
        shapes, sweep, repeats, bw_numel = QUICK_SHAPES, QUICK_SWEEP, 2, 16 << 20
    if a.shapes:
        try:
            shapes = tuple((int(b), int(c)) for b, _, c in (x.partition("x") for x in a.shapes))
        except ValueError:
            ap.error(f"--shapes={a.shapes} (supported: BSxCTX, e.g. 16x2048)")
    pages = tuple(a.page_sizes)
    own = native_build().own_isa
    paged = contenders(kernels(a.isa or ([own] if a.quick else None)))  # quick: no forced builds to compile
    print(f"paged decode: q_heads={heads.q} kv_heads={heads.kv} head_dim={heads.dim}, page sizes {list(pages)}, "
          f"random page order; threads={torch.get_num_threads()}, torch {torch.__version__}, "
          f"{CpuBackend.build_info()}")
    for who in paged:
        if isinstance(who.kwargs.get("kernel"), Kernel):
            kernel = who.kwargs["kernel"]
            print(f"{who.label}: {kernel.name}, parameters {kernel.params} ({kernel.origin})")
    if native_build().ok:
        runs = (f"{WIDTH_NAMES[w]} caches on {native_build().runs(w)[0]}" for w in WIDTHS)
        print("the backend runs: " + "; ".join(runs))
    print(host_line())
    print(f"load average before: {load_average()} on {os.cpu_count()} cpus; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    dtypes = (torch.float32, torch.bfloat16)
    with torch.no_grad():
        fixed = [measure(bs, ctx, dt, heads, pages, repeats, bw_numel, paged) for dt in dtypes for bs, ctx in shapes]
        print("\n" + format_results(fixed))
        if summary(fixed, paged):
            print("\n" + summary(fixed, paged))
        if not a.no_sweep:
            swept = [measure(a.sweep_bs, ctx, dt, heads, pages, repeats, bw_numel, paged)
                     for dt in dtypes for ctx in sweep]
            print(f"\ncontext sweep, bs {a.sweep_bs}:\n" + format_results(swept))
            if a.plot:
                plot(swept, a.plot)
                print(f"\nplot: {a.plot}")
    print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
