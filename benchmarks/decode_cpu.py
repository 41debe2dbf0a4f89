"""Paged decode of the torch backend vs contiguous SDPA and memory read bandwidth, one run.

    python benchmarks/decode_cpu.py [--bs 16] [--ctx 2048] [--repeats 9] [--chunk N]

Same data for every contender: a KV pool with page size 1 whose slots are a
random permutation, and the same K/V laid out contiguously for SDPA.

* ``paged``: ``TorchBackend.forward`` (decode; metadata built once per batch, as an
  engine does for all layers, and timed separately).
* ``sdpa gqa``: ``scaled_dot_product_attention(q, K, V, enable_gqa=True)`` on contiguous
  ``[bs, kv_heads, ctx, D]`` K/V; ``sdpa expanded``: K/V repeated to the query heads
  beforehand (not timed). The baseline is the faster of the two, per dtype.
* ``read bw``: ``tensor.sum()`` over 512 MB of fp32, the machine's streaming read rate.
* ``copy bw``: ``dst.copy_(src)`` of 256 MB (bytes read per second): the ceiling of any
  gather-then-compute kernel, which must read the K/V rows *and* write them to a buffer
  (the paged kernel's ``index_select`` of random 512-byte rows reaches ~90% of it).

Timings are medians of interleaved repeats (the contenders alternate, so drift in
machine load hits all of them alike). KV GB/s counts the K and V bytes a decode
must read once: ``2 * bs * ctx * kv_heads * D * itemsize``. ``cpu ms`` is the
process's CPU time per call (all threads): on a machine shared with other jobs
wall times stretch, and CPU time shows the work itself. The load average is
printed before and after: compare runs only at similar load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnhal.backend import AttentionConfig, ForwardBatch, KVPool
from attnhal.capabilities import Phase
from attnhal_torch import TorchBackend


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _times(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


@dataclass
class _Setup:
    backend: TorchBackend
    batch: ForwardBatch
    q: torch.Tensor  # [bs, q_heads, D]
    k: torch.Tensor  # [bs, kv_heads, ctx, D], contiguous copies of the pool's K
    v: torch.Tensor
    k_rep: torch.Tensor  # [bs, q_heads, ctx, D], K repeated per query head
    v_rep: torch.Tensor


def _setup(bs: int, ctx: int, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int,
           chunk: int | None = None) -> _Setup:
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(num_layers=1, num_slots=bs * ctx, num_kv_heads=hkv, head_dim=d, dtype=dtype,
                  max_reqs=bs, max_context_len=ctx)
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=gen).to(dtype))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=gen).to(dtype))
    slots = (torch.randperm(bs * ctx, generator=gen) + 1).view(bs, ctx)
    pool.req_to_token[1:bs + 1] = slots.to(torch.int32)
    lens = torch.full((bs,), ctx, dtype=torch.int32)
    batch = ForwardBatch(Phase.DECODE, req_pool_indices=torch.arange(1, bs + 1), seq_lens=lens,
                         out_cache_loc=slots[:, -1].clone(), seq_lens_cpu=lens.clone())
    q = torch.randn(bs, hq, d, generator=gen).to(dtype)
    # chunk=None: the backend's own default (what users get).
    extra = {} if chunk is None else {"chunk": chunk}
    backend = TorchBackend(AttentionConfig(hq, hkv, d, dtype), pool, **extra)
    # Contiguous copies of the same K/V for SDPA: [bs, kv_heads, ctx, D].
    k = pool.k[0][slots].transpose(1, 2).contiguous()
    v = pool.v[0][slots].transpose(1, 2).contiguous()
    rep = hq // hkv
    return _Setup(backend, batch, q, k, v, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))


def _contenders(s: _Setup) -> dict[str, Callable[[], torch.Tensor]]:
    bs, hq, d = s.q.shape
    q4 = s.q.view(bs, hq, 1, d)
    return {
        "paged (TorchBackend)": lambda: s.backend.forward(s.q, None, None, 0, s.batch),
        "sdpa gqa": lambda: F.scaled_dot_product_attention(q4, s.k, s.v, enable_gqa=True),
        "sdpa expanded": lambda: F.scaled_dot_product_attention(q4, s.k_rep, s.v_rep),
    }


def _read_bandwidth(repeats: int) -> float:
    big = torch.ones(128 << 20, dtype=torch.float32)  # 512 MB
    big.sum()
    best = statistics.median(_time(big.sum) for _ in range(repeats))
    return big.numel() * 4 / best / 1e9


def _copy_bandwidth(repeats: int) -> float:
    src = torch.ones(64 << 20, dtype=torch.float32)  # 256 MB
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = statistics.median(_time(lambda: dst.copy_(src)) for _ in range(repeats))
    return src.numel() * 4 / best / 1e9


def run(bs: int, ctx: int, hq: int, hkv: int, d: int, repeats: int, chunk: int | None = None) -> None:
    print(f"decode: bs={bs} ctx={ctx} q_heads={hq} kv_heads={hkv} head_dim={d}, page size 1, random slots; "
          f"threads={torch.get_num_threads()}, torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        s = _setup(bs, ctx, hq, hkv, d, dtype, seed=0, chunk=chunk)
        meta_s = statistics.median(_time(lambda: s.backend.init_forward_metadata(s.batch)) for _ in range(3))
        fns = _contenders(s)
        ref = fns["sdpa gqa"]().float().view(bs, hq, d)
        err = (fns["paged (TorchBackend)"]().float() - ref).abs().max().item()
        times: dict[str, list[float]] = {name: [] for name in fns}
        cpu: dict[str, list[float]] = {name: [] for name in fns}
        bw_samples = []
        for _ in range(repeats):  # interleaved
            for name, fn in fns.items():
                wall_s, cpu_s = _times(fn)
                times[name].append(wall_s)
                cpu[name].append(cpu_s)
            bw_samples.append(_read_bandwidth(1))
        bw = statistics.median(bw_samples)
        kv_bytes = 2 * bs * ctx * hkv * d * torch.empty((), dtype=dtype).element_size()
        med = {name: statistics.median(t) for name, t in times.items()}
        base_name = min(("sdpa gqa", "sdpa expanded"), key=lambda n: med[n])
        for name, t in med.items():
            rows.append((str(dtype).removeprefix("torch."), name, t * 1e3, statistics.median(cpu[name]) * 1e3,
                         med[base_name] / t, kv_bytes / t / 1e9, kv_bytes / t / 1e9 / bw, base_name == name))
        print(f"  {dtype}: read bw {bw:.1f} GB/s (sum over 512 MB), copy bw {_copy_bandwidth(3):.1f} GB/s; "
              f"paged chunk {s.backend.chunk}, metadata {meta_s * 1e3:.2f} ms per batch (all layers); "
              f"max |paged - sdpa| = {err:.1e}")
    print(f"  load average after: {os.getloadavg()[0]:.2f}")
    print()
    print(f"{'dtype':9} {'contender':22} {'ms':>8} {'cpu ms':>8} {'vs best sdpa':>13} {'KV GB/s':>8} {'% read bw':>10}")
    for dt, name, ms, cpu_ms, ratio, gbs, frac, base in rows:
        mark = " (baseline)" if base else ""
        print(f"{dt:9} {name:22} {ms:8.2f} {cpu_ms:8.2f} {ratio:12.2f}x {gbs:8.1f} {frac * 100:9.0f}%{mark}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--chunk", type=int, default=None,
                    help="KV columns per chunk of the paged backend (default: the backend's default)")
    a = ap.parse_args()
    with torch.no_grad():
        run(a.bs, a.ctx, a.q_heads, a.kv_heads, a.head_dim, a.repeats, a.chunk)


if __name__ == "__main__":
    main()
