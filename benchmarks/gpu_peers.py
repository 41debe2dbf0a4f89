"""attnhal's Triton backend against the engines' own Triton attention kernels, on the same K/V.

    python benchmarks/gpu_peers.py [--shapes KIND:BSxCTX,...] [--contenders attnhal,sglang,vllm,sdpa]
        [--dtype bf16|fp16|fp32] [--peers-dir DIR] [--launch KERNEL:ENCODED ...] [--json FILE]
        [--warm-workers N] [--check-only] [--tiny] [--budget-s S]

Contenders (``peer_contenders``), each at its best: attnhal's ``triton`` backend through the
backend contract; SGLang 0.5.23's ``decode_attention_fwd`` (its split heuristic, its default
max KV splits and the sweep); vLLM 0.33's ``unified_attention`` as TRITON_ATTN calls it (block
16; its defaults and the sweep); SDPA on contiguous K/V (its own choice and each backend
forced). The MLA rows (``peer_mla``): SGLang's ``decode_attention_fwd`` with ``has_mla`` (its
MLA split cap and the sweep) and its extend + custom-mask verify, vLLM's TRITON_MLA
``decode_attention_fwd`` as ``forward_mqa`` calls it (its split rule and the sweep; verify as
its causal multi-token decode). Peers load from the installed engines, else from ``--peers-dir`` (default
``$ATTNHAL_PEER_KERNELS`` or ``~/.cache/attnhal/peer-kernels``) that ``fetch_peer_kernels.py``
fills. Shapes (``peer_cases``): ``KIND:BSxCTX[/gG][/dD][/ragged]``, 8 KV heads, group 4 and
head 128 unless given, page size 1; MLA ``mla|mla4|mla8:BSxCTX[/hH]``: decode and verify
chains of 1+3 and 1+7 tokens over one latent head of 576 (V its first 512), 16 q heads
unless given (``/h128``: TP 1).

Per shape, in one process: every setting of every contender is gated against an fp32
reference first (each query row's error relative to the row's own norm, ``peer_gate``; one
that disagrees is WRONG and left out of the ratios), then timed as a CUDA graph of 20 calls,
median of 5 replays; a contender's fastest setting is its cell, its default's speed is
printed beside. GB/s of the K/V bytes the batch covers (fp8: of the fp8 bytes; MLA: of the
latent rows, read once), TFLOP/s for
prefill, and attnhal / the fastest other contender of the row. Without a GPU (``--tiny``, the
Triton interpreter, fp32 or fp16) it runs the same calls eagerly and gates them: plumbing
only, no speed. ``--shapes core`` / ``rest`` / ``mla``: the device session's three parts of
the default table; ``--budget-s S`` stops starting shapes when S seconds would be passed and lists the
rest as NOT RUN (the table keeps what ran; gpu_session.sh's cap would otherwise kill it).
On a GPU, ``--warm-workers N`` (default 8) processes compile every kernel
first (``--check-only`` over a share of the shapes each), so the timing run finds them in
Triton's cache.
Exit status 1 when any output was WRONG or a contender failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnhal_triton import spill_relief
from peer_cases import (
    DEFAULT_SHAPES,
    DTYPES,
    TINY_SHAPES,
    Case,
    Shape,
    build_case,
    parse_shapes,
    reference,
    time_graph,
)
from peer_contenders import CONTENDERS, ENGINES, NotApplicable, Prepared
from peer_gate import gate_limit, row_relative_error
from peer_kernels import LoadedPeer, default_peers_dir, load_peer
from peer_mla import prepare
from peer_table import Result, Row, fp8_speedup, markdown, ratio


@dataclass(frozen=True)
class Settings:
    device: torch.device
    dtype: torch.dtype
    timed: bool  # a GPU: graphs and speed; else the interpreter's plumbing run
    contenders: tuple[str, ...]
    launch: dict[str, str]


def measure(name: str, case: Case, peers: dict[str, LoadedPeer], settings: Settings,
            references: dict[bool, torch.Tensor]) -> Result:
    """Prepare each of one contender's settings over ``case``, gate its output against fp32
    (:mod:`peer_gate`), time it (on a GPU), and keep the fastest; the default's speed is
    reported beside it."""
    try:
        variants = prepare(name, case, peers, settings.launch if name == "attnhal" else None)
    except NotApplicable as exc:
        return Result("n/a", note=str(exc))
    results = [_measure_one(p, case, settings, references) for p in variants]
    ok = [r for r in results if r.status == "ok"]
    if not ok:  # the first failure speaks for the contender (its default when that failed)
        bad = next((r for r in results if r.status in ("WRONG", "FAILED")), results[0])
        return bad
    best = min(ok, key=lambda r: r.seconds if r.seconds is not None else 0.0)
    default = results[0]
    skipped = [f"{r.setting}: {r.status}" for r in results if r.status != "ok"]
    best.default_seconds = default.seconds if default.status == "ok" else None
    best.settings = len(results)
    best.note = "; ".join(filter(None, [best.note, *skipped[:3]]))
    if any(r.status == "WRONG" for r in results):
        wrong = next(r for r in results if r.status == "WRONG")
        return Result("WRONG", err=wrong.err, setting=wrong.setting, note=wrong.note)
    return best


def _measure_one(prepared: Prepared, case: Case, settings: Settings, references: dict[bool, torch.Tensor]) -> Result:
    setting = prepared.setting
    if prepared.fp8_dot and not settings.timed:
        return Result("n/a", setting=setting, note="the interpreter's fp8 tl.dot is wrong and this kernel "
                                                   "multiplies in fp8; checked on a GPU only")
    try:
        out = prepared.tokens(prepared.run()).float()
        if prepared.causal_only not in references:
            references[prepared.causal_only] = reference(case, causal=prepared.causal_only)
        err = row_relative_error(out, references[prepared.causal_only])
        limit = gate_limit(settings.dtype, case.shape.fp8)
        if not err <= limit:  # NaN is WRONG too
            return Result("WRONG", err=err, setting=setting,
                          note=f"{setting}: row error {err:.2e} > {limit:.0e} of the row's norm; {prepared.note}")
        seconds = time_graph(prepared.run) if settings.timed else None
    except Exception as exc:  # noqa: BLE001 - reported per setting; the table goes on
        if "No available kernel" in str(exc) or "No viable backend" in str(exc):  # a forced SDPA backend
            return Result("n/a", setting=setting, note=f"{setting}: {str(exc).splitlines()[0][:100]}")
        return Result("FAILED", setting=setting,
                      note=f"{setting}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
    return Result("ok", err=err, seconds=seconds, note=prepared.note, setting=setting)


def run_shape(shape: Shape, peers: dict[str, LoadedPeer], settings: Settings) -> Row:
    case = build_case(shape, settings.dtype, settings.device)
    references: dict[bool, torch.Tensor] = {}
    row = Row(shape.key, shape.title, "TFLOP/s" if shape.kind == "prefill" else "GB/s of latent" if shape.mla else
              "GB/s of fp8 K/V" if shape.fp8 else "GB/s of K/V", case.kv_bytes, case.flops)
    for name in settings.contenders:
        result = measure(name, case, peers, settings, references)
        row.results[name] = result
        print(f"    {name:<8} {row.cell(name, settings.timed)}" + (f"  ({result.note})" if result.note else ""),
              flush=True)
    row.ratio, row.versus = ratio(row)
    if row.ratio is not None:
        print(f"    attnhal / the fastest other contender ({row.versus}) = {row.ratio:.2f}x", flush=True)
    del case, references
    if settings.device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _parse_launch(items: list[str]) -> dict[str, str]:
    launch = {}
    for item in items:
        kernel, sep, encoded = item.partition(":")
        if not sep or not encoded:
            raise ValueError(f"--launch {item!r} (supported: KERNEL:ENCODED, e.g. decode:BLOCK_N=64,num_warps=4)")
        launch[kernel] = encoded
    return launch


def settings_from(args: argparse.Namespace) -> Settings:
    """Checked settings; the interpreter is switched on (before any kernel loads) without a GPU."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        if not args.tiny:
            raise ValueError("no CUDA/HIP device (supported without one: --tiny, the interpreter's plumbing run)")
        os.environ["TRITON_INTERPRET"] = "1"
    dtype = DTYPES[args.dtype]
    if not on_gpu and dtype is torch.bfloat16:
        raise ValueError("--dtype bf16 under the Triton interpreter (supported: fp32, fp16: the interpreter's "
                         "bf16 tl.dot is wrong)")
    contenders = tuple(c for c in args.contenders.split(",") if c)
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown or not contenders:
        raise ValueError(f"--contenders {args.contenders!r} (supported: a comma list of {', '.join(CONTENDERS)})")
    return Settings(torch.device("cuda" if on_gpu else "cpu"), dtype, on_gpu and not args.check_only, contenders,
                    _parse_launch(args.launch))


def warm_up(shapes: tuple[Shape, ...], args: argparse.Namespace) -> str:
    """Compile every kernel first in ``args.warm_workers`` processes (``--check-only`` over a share
    of the shapes each), so the timing process finds them in Triton's cache; returns a summary."""
    workers = min(args.warm_workers, len(shapes))
    command = [sys.executable, str(Path(__file__).resolve()), "--check-only", "--warm-workers", "0",
               "--dtype", args.dtype, "--contenders", args.contenders]
    command += ["--peers-dir", str(args.peers_dir)] if args.peers_dir else []
    command += [arg for item in args.launch for arg in ("--launch", item)] + (["--tiny"] if args.tiny else [])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        logs = [Path(tmp) / f"worker{i}.txt" for i in range(workers)]
        procs = [subprocess.Popen([*command, "--shapes", ",".join(s.key for s in shapes[i::workers])],
                                  stdout=log.open("w"), stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
        codes = [proc.wait() for proc in procs]
        failed = [f"worker {i} rc={rc}: {log.read_text().strip().splitlines()[-1:]}"
                  for i, (rc, log) in enumerate(zip(codes, logs)) if rc]
    done = f"warm-up: {workers} processes compiled the kernels in {time.perf_counter() - start:.0f} s"
    return done + (f" ({'; '.join(failed)})" if failed else "")


def within_budget(budget_s: float | None, elapsed_s: float, shapes_s: float, shapes_done: int) -> bool:
    """Whether one more shape fits: ``elapsed_s`` since the start plus the mean time of the
    ``shapes_done`` shapes (``shapes_s`` in all) stays within ``budget_s`` (None: no budget)."""
    if budget_s is None:
        return True
    mean = shapes_s / shapes_done if shapes_done else 0.0
    return elapsed_s + mean <= budget_s


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", help="comma list of KIND:BSxCTX, KIND in decode, chain4, tree8, fp8, prefill, "
                   "mla, mla4, mla8 (default: the issue's table; with --tiny: tiny shapes), or a set: core, rest, "
                   "mla")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--dtype", choices=DTYPES, default=None, help="q and K/V dtype (default bf16; fp32 with --tiny)")
    p.add_argument("--peers-dir", type=Path, default=None, help=f"peer kernel cache (default {default_peers_dir()})")
    p.add_argument("--launch", action="append", default=[], metavar="KERNEL:ENCODED",
                   help="override one attnhal launch row (LaunchRow.encode() form)")
    p.add_argument("--json", type=Path, help="write the rows as JSON")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (the interpreter's plumbing run)")
    p.add_argument("--check-only", action="store_true", help="on a GPU: check the outputs, time nothing")
    p.add_argument("--budget-s", type=float, default=None, metavar="S",
                   help="start no shape past S seconds from the start (warm-up included) less the mean "
                        "shape's time so far; the shapes left are listed NOT RUN")
    p.add_argument("--warm-workers", type=int, default=8, metavar="N",
                   help="on a GPU: compile the kernels in N processes before timing (0: in the timing process)")
    return p


def main(argv: list[str] | None = None) -> int:
    begun = time.perf_counter()
    args = parser().parse_args(argv)
    if args.dtype is None:
        args.dtype = "fp32" if args.tiny and not torch.cuda.is_available() else "bf16"
    try:
        settings = settings_from(args)
        shapes = parse_shapes(args.shapes) if args.shapes else TINY_SHAPES if args.tiny else DEFAULT_SHAPES
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = ("interpreter: plumbing only, no speed" if settings.device.type == "cpu" else
             torch.cuda.get_device_name() + ("" if settings.timed else " (check only, no timing)"))
    print(f"gpu_peers: {where}; {args.dtype}, {len(shapes)} shapes, contenders {', '.join(settings.contenders)}",
          flush=True)
    peers = {name: load_peer(name, args.peers_dir) for name in ENGINES if name in settings.contenders}
    for name, peer in peers.items():
        print(f"  {name}: {peer.source}", flush=True)
    if settings.timed and args.warm_workers > 0:
        print(warm_up(shapes, args), flush=True)
    rows, start = [], time.perf_counter()
    for i, shape in enumerate(shapes, 1):
        if not within_budget(args.budget_s, time.perf_counter() - begun, time.perf_counter() - start, len(rows)):
            break
        print(f"[{i}/{len(shapes)}] {shape.title}", flush=True)
        rows.append(run_shape(shape, peers, settings))
    print(f"\n{len(rows)} shapes in {time.perf_counter() - start:.0f} s\n")
    print(markdown(rows, settings.contenders, settings.timed))
    not_run = [shape.key for shape in shapes[len(rows):]]
    if not_run:
        print(f"\nNOT RUN (the --budget-s {args.budget_s:.0f} s was spent): {', '.join(not_run)}")
    relieved = spill_relief.relieved()
    print(f"\nspill relief: {len(spill_relief.RELIEVED)} attnhal forms launched, {len(relieved)} relieved"
          + "".join(f"\n  {line}" for line in relieved))
    speedup = fp8_speedup(rows)
    if speedup is not None:
        print(f"\nattnhal fp8 / bf16 decode tokens/s at {speedup[0]}: {speedup[1]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({
            "device": where, "dtype": args.dtype, "timed": settings.timed,
            "peers": {n: p.source for n, p in peers.items()},
            "fp8_vs_bf16_tokens_per_s": speedup[1] if speedup else None, "not_run": not_run,
            "spill_relieved": relieved,
            "rows": [{**asdict(r), "speeds": {n: r.speed(n) for n in r.results}} for r in rows]}, indent=1))
    bad = [f"{r.key} {n}" for r in rows for n, res in r.results.items() if res.status in ("WRONG", "FAILED")]
    if bad:
        print(f"\nWRONG or FAILED: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
