"""Launch-row sweep of the Triton backend on a GPU: the tiles, warps, stages and split fill
that the launch table's rows are chosen from.

    python benchmarks/triton_sweep.py [--json FILE] [--warm-workers 8] [--only decode,verify]

For each kernel variant (decode, causal verify, tree verify, prefill) and each of its
benchmark shapes (bf16, 32 query / 8 KV heads, head 128, page size 1; decode also with an
fp8 e4m3 cache), every candidate row is run through the backend's public forward, its
output checked against a dense fp32 reference (a candidate that disagrees is WRONG and
never chosen), then timed as a CUDA/HIP graph of 20 calls (``peer_cases.time_graph``: median of the
replays). A
candidate is the table's row with other ``BLOCK_N`` (prefill: ``BLOCK_M`` too),
``num_warps``, ``num_stages`` and split fill (``fill_programs``, in programs per SM/CU).
Per kernel the row chosen is the one with the best geometric mean, over the kernel's
shapes, of (the shape's fastest candidate time / its time); the JSON holds every timing
and the chosen rows as ``{kernel: {"blocks", "num_warps", "num_stages", "fill_programs"}}``.

Triton compiles every candidate once; ``--warm-workers N`` compiles them in N
processes first (the timing process then finds them in Triton's cache). ``--tiny`` runs
tiny fp32 shapes and two candidates per kernel without timing (the interpreter's plumbing
check; on CPU set ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backend_calls import PagedCase, draft_tree, paged_case  # noqa: E402
from peer_cases import time_graph  # noqa: E402  (one graph-timing rule for every GPU benchmark)

from attnhal.phases import Phase  # noqa: E402
from attnhal.platform import detect  # noqa: E402
from attnhal_triton.device_fill import UNITS  # noqa: E402
from attnhal_triton.launch_table import LaunchRow  # noqa: E402

HEADS, KV_HEADS, HEAD = 32, 8, 128
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}


@dataclass(frozen=True)
class Shape:
    name: str
    kernel: str
    phase: Phase
    bs: int
    ctx: int
    tokens: int = 1
    tree: bool = False
    fp8: bool = False

    def case(self, dtype: torch.dtype, device: str) -> PagedCase:
        kv = torch.float8_e4m3fn if self.fp8 else None
        return paged_case("triton", self.phase, self.bs, self.ctx, q_heads=HEADS, kv_heads=KV_HEADS,
                          head=HEAD, dtype=dtype, draft_tokens=self.tokens, device=device,
                          kv_dtype=kv, tree=self.tree)


SHAPES = (
    *(Shape(f"decode {bs}x{n}", "decode", Phase.DECODE, bs, n)
      for bs, n in ((1, 32768), (8, 8192), (64, 2048), (256, 1024))),
    Shape("decode fp8 256x1024", "decode", Phase.DECODE, 256, 1024, fp8=True),
    *(Shape(f"verify chain4 {bs}x{n}", "extend_verify", Phase.TARGET_VERIFY, bs, n, 4)
      for bs, n in ((8, 8192), (64, 2048), (256, 1024))),
    *(Shape(f"verify tree8 {bs}x{n}", "extend_verify_tree", Phase.TARGET_VERIFY, bs, n, 8, tree=True)
      for bs, n in ((8, 8192), (64, 2048), (256, 1024))),
    Shape("prefill 1x8192", "extend_prefill", Phase.PREFILL, 1, 8192),
)
TINY = (Shape("decode 3x200", "decode", Phase.DECODE, 3, 200),
        Shape("verify chain4 2x150", "extend_verify", Phase.TARGET_VERIFY, 2, 150, 4),
        Shape("verify tree8 2x150", "extend_verify_tree", Phase.TARGET_VERIFY, 2, 150, 8, tree=True),
        Shape("prefill 1x130", "extend_prefill", Phase.PREFILL, 1, 130))


#: Candidate rows per kernel at head size 128: (blocks, warps, stages, programs per SM/CU
#: of the split fill; 0 keeps the row's). Each compiles with 0 spills for sm90 in bf16 and
#: with an fp8 cache (``python -m attnhal_triton.compile_check``); verify's BLOCK_M is the
#: table row's upper bound (launches shrink it to draft tokens x group).
CANDIDATES: dict[str, list[tuple[dict[str, int], int, int, int]]] = {
    "decode": [({"BLOCK_N": n}, w, s, u) for n, w, s in ((64, 4, 2), (64, 4, 3), (128, 4, 2),
                                                         (128, 8, 3), (256, 8, 3))
               for u in (2, 4)],
    "extend_verify": [({"BLOCK_N": n}, w, s, u) for n, w, s in ((64, 4, 2), (64, 8, 2), (64, 4, 3))
                      for u in (1, 2)],
    "extend_verify_tree": [({"BLOCK_N": n}, w, s, u) for n, w, s in ((128, 8, 3), (64, 4, 2), (64, 8, 2))
                           for u in (1, 2)],
    "extend_prefill": [({"BLOCK_M": m, "BLOCK_N": n}, w, s, 0)
                       for m, n, w, s in ((128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3),
                                          (64, 64, 8, 3), (64, 64, 4, 2))],
}


def candidates(kernel: str, tiny: bool) -> list[dict[str, Any]]:
    """Overrides of the table's row: blocks, warps, stages and fill (programs per unit)."""
    grid = [dict(blocks=b, num_warps=w, num_stages=s, per_unit=u) for b, w, s, u in CANDIDATES[kernel]]
    return grid[:2] if tiny else grid


def apply(row: LaunchRow, cand: dict[str, Any], units: int) -> LaunchRow:
    fill = cand["per_unit"] * units if cand["per_unit"] else row.fill_programs
    return replace(row, blocks={**row.blocks, **cand["blocks"]}, num_warps=cand["num_warps"],
                   num_stages=cand["num_stages"], fill_programs=fill)


def label(cand: dict[str, Any]) -> str:
    blocks = "x".join(str(v) for v in cand["blocks"].values())
    fill = f" fill {cand['per_unit']}/unit" if cand["per_unit"] else ""
    return f"{blocks} w{cand['num_warps']} s{cand['num_stages']}{fill}"


def reference(case: PagedCase, shape: Shape) -> torch.Tensor:
    """Dense fp32 attention of the case ([tokens, Hq, D]); slots are contiguous per row."""
    pool, bs, ctx, t = case.backend.pool, shape.bs, shape.ctx, case.q.shape[0] // shape.bs
    k, v = ((c[1:1 + bs * ctx].float() * s[0]).view(bs, ctx, KV_HEADS, HEAD)
            for c, s in ((pool.k[0], pool.k_scale), (pool.v[0], pool.v_scale)))
    group = HEADS // KV_HEADS
    k, v = (x.repeat_interleave(group, dim=2).permute(0, 2, 1, 3) for x in (k, v))  # [bs, H, ctx, D]
    q = case.q.float().view(bs, t, HEADS, HEAD).transpose(1, 2)  # [bs, H, t, D]
    pos = torch.arange(ctx, device=q.device)
    qpos = ctx - t + torch.arange(t, device=q.device)
    allowed = pos[None, :] <= qpos[:, None]
    if shape.tree:
        draft = draft_tree(t).to(q.device)
        allowed = torch.cat([allowed[:, :ctx - t], draft], dim=1)
    scores = (q @ k.transpose(-1, -2)) * HEAD ** -0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(bs * t, HEADS, HEAD)


def sweep_shape(shape: Shape, dtype: torch.dtype, device: str, units: int, tiny: bool,
                time_it: bool) -> dict[str, Any]:
    case = shape.case(dtype, device)
    backend: Any = case.backend
    base = backend.rows[shape.kernel]
    want = reference(case, shape)
    results: dict[str, Any] = {}
    for cand in candidates(shape.kernel, tiny):
        backend.use_launch_rows({shape.kernel: apply(base, cand, units)})
        try:
            err = (case.run().float() - want).abs().max().item()
        except Exception as exc:  # noqa: BLE001 - a candidate that fails to compile or run is reported
            results[label(cand)] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}", "cand": cand}
            continue
        entry: dict[str, Any] = {"err": err, "cand": cand, "ok": err <= TOLERANCE[dtype]}
        if time_it and entry["ok"]:
            entry["seconds"] = time_graph(case.run, 3 if shape.phase is Phase.PREFILL else 20)
            entry["gbps"] = case.kv_bytes / entry["seconds"] / 1e9
            if shape.phase is Phase.PREFILL:
                entry["tflops"] = 2 * shape.ctx * shape.ctx * HEADS * HEAD / entry["seconds"] / 1e12
        results[label(cand)] = entry
    del case, want
    if device != "cpu":
        torch.cuda.empty_cache()
    return results


def choose(shapes: list[Shape], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per kernel: the candidate with the best geometric mean of (fastest / its time) over
    the kernel's bf16 shapes (fp8 decode is reported, not voted)."""
    chosen: dict[str, Any] = {}
    for kernel in dict.fromkeys(s.kernel for s in shapes):
        voters = [s for s in shapes if s.kernel == kernel and not s.fp8]
        best = {s.name: min((e["seconds"] for e in results[s.name].values() if "seconds" in e),
                            default=math.nan) for s in voters}
        scores: dict[str, float] = {}
        for name in results[voters[0].name]:
            rel = [best[s.name] / results[s.name].get(name, {}).get("seconds", math.inf) for s in voters]
            scores[name] = math.exp(sum(math.log(max(r, 1e-9)) for r in rel) / len(rel))
        winner = max(scores, key=lambda n: scores[n])
        chosen[kernel] = {"label": winner, "score": scores[winner],
                          "cand": results[voters[0].name][winner]["cand"]}
    return chosen


def encoded(platform: Any, units: int, chosen: dict[str, Any]) -> dict[str, str]:
    """``{kernel: LaunchRow.encode() + ",fill_programs=N"}`` of the chosen rows; draft
    extend takes causal verify's (the same kernel form and query shape)."""
    from attnhal_triton.launch_table import lookup

    out = {}
    for kernel, c in chosen.items():
        row = apply(lookup(kernel, platform, HEAD, "bfloat16"), c["cand"], units)
        out[kernel] = f"{row.encode()},fill_programs={row.fill_programs}"
    if "extend_verify" in out:
        out["extend_draft"] = out["extend_verify"]
    return out


def warm(args: argparse.Namespace, shapes: list[Shape]) -> None:
    """Compile every candidate in ``--warm-workers`` processes (round-robin over shapes)."""
    n = min(args.warm_workers, len(shapes))
    cmd = [sys.executable, __file__, "--warm-slice", "", "--only", args.only or ""]
    procs = []
    for i in range(n):
        cmd[3] = f"{i}/{n}"
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            print(f"warm worker failed (rc {p.returncode}): {err[-400:]}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write every timing and the chosen rows here")
    parser.add_argument("--tiny", action="store_true", help="interpreter plumbing: tiny fp32 shapes, no timing")
    parser.add_argument("--warm-workers", type=int, default=0)
    parser.add_argument("--warm-slice", default="", help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="comma-separated kernels or shape-name prefixes")
    args = parser.parse_args()
    on_device = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if on_device else ("cpu", torch.float32)
    shapes = list(SHAPES if on_device else TINY)
    if args.only:
        keys = args.only.split(",")
        shapes = [s for s in shapes if s.kernel in keys or any(s.name.startswith(k) for k in keys)]
    platform = detect()
    units = UNITS.get(platform.arch_family, 128)
    if args.warm_slice:
        i, n = map(int, args.warm_slice.split("/"))
        for shape in shapes[i::n]:
            sweep_shape(shape, dtype, device, units, args.tiny, time_it=False)
        return 0
    print(f"platform {platform} ({units} units), {torch.cuda.get_device_name() if on_device else 'cpu'}",
          flush=True)
    if on_device and args.warm_workers:
        start = time.perf_counter()
        warm(args, shapes)
        print(f"warmed (compiled) in {time.perf_counter() - start:.0f} s", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for shape in shapes:
        start = time.perf_counter()
        results[shape.name] = sweep_shape(shape, dtype, device, units, args.tiny, on_device)
        ok = {k: e for k, e in results[shape.name].items() if e.get("ok")}
        bad = [k for k, e in results[shape.name].items() if not e.get("ok")]
        print(f"{shape.name}: {len(ok)} candidates agree with fp32, {len(bad)} do not "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        for k in bad[:3]:
            print(f"  not ok: {k}: {results[shape.name][k].get('error') or results[shape.name][k]['err']}")
        if on_device:
            top = sorted(ok.items(), key=lambda kv: kv[1]["seconds"])[:3]
            for name, e in top:
                extra = f", {e['tflops']:.0f} TFLOP/s" if "tflops" in e else ""
                print(f"  {name}: {e['gbps']:.0f} GB/s{extra}", flush=True)
    chosen = choose(shapes, results) if on_device else {}
    for kernel, c in chosen.items():
        print(f"chosen {kernel}: {c['label']} (geomean {c['score']:.2f} of each shape's best)")
    if args.json:
        Path(args.json).write_text(json.dumps({"platform": str(platform), "units": units,
                                               "results": results, "chosen": chosen,
                                               "launch": encoded(platform, units, chosen)},
                                              indent=1))
    failed = any(not e.get("ok") and "error" not in e for r in results.values() for e in r.values())
    return 1 if failed and args.tiny else 0


if __name__ == "__main__":
    raise SystemExit(main())
