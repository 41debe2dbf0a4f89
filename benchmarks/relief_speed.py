#!/usr/bin/env python3
"""What spill relief costs or saves: attnhal's forms as relieved against its launch rows' own forms.

    python benchmarks/relief_speed.py [--shapes KIND:BSxCTX[/gG][/dD],...] [--dtype bf16|fp16|fp32]
        [--tiny] [--json FILE]

Spill relief (``attnhal_triton/spill_relief.py``) launches a form whose compile spills in the
first spill-free form of its ladder (the register cap lifted, a shorter K/V step, one stage).
Whether the relieved form is faster than the spilling one is the device's to say: per shape
this runs attnhal's ``triton`` backend as it ships (relief on), lists the forms relief changed,
and where it changed any, runs the same batch with every form as its launch row gives it
(``spill_relief.as_tabled``), both timed as CUDA graphs in one process (``peer_cases.time_graph``)
and both gated against the fp32 reference (``peer_gate``: a wrong kernel fails). The ratio is
shipped / tabled seconds (below 1: relief is faster).

Default shapes: the gpu_peers shapes whose forms the enumeration found relieved on sm90 (bf16
causal verify of 1 + 3 tokens at head 128, groups 9 and 10, unsplit: 8 bytes spilled under the
row, relieved by a 32-position step; ``compile_forms --results``, 2026-12-07); on another device
or where nothing is relieved the run says so and times nothing twice. ``--tiny`` runs the plumbing
under Triton's interpreter, where nothing compiles ahead and so nothing is relieved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_cases import DTYPES, Shape, build_case, parse_shapes, reference, time_graph  # noqa: E402
from peer_gate import gate_limit, row_relative_error  # noqa: E402

DEFAULT_SHAPES = "chain4:64x2048/g10,chain4:256x1024/g10,chain4:256x1024/g9"
TINY_SHAPES = "chain4:2x32/g10,decode:2x32"


def measure(shape: Shape, dtype: torch.dtype, timed: bool) -> dict[str, Any]:
    """One shape: the relieved forms its launches took, and each way's error and seconds."""
    from attnhal_triton import spill_relief
    from attnhal_triton.backend import TritonBackend

    case = build_case(shape, dtype, torch.device("cuda" if timed else "cpu"))
    backend = TritonBackend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    before = set(spill_relief.relieved())

    def shipped() -> torch.Tensor:
        return backend.forward(case.q, None, None, 0, case.batch)

    def tabled() -> torch.Tensor:
        with spill_relief.as_tabled():
            return backend.forward(case.q, None, None, 0, case.batch)

    ref, limit = reference(case), gate_limit(dtype, case.shape.fp8)
    row: dict[str, Any] = {"shape": shape.key}
    first = shipped()  # the first launch decides each form
    row["relieved"] = sorted(set(spill_relief.relieved()) - before)
    ways = {"shipped": shipped, "tabled": tabled} if row["relieved"] or not timed else {"shipped": shipped}
    for way, run in ways.items():
        err = row_relative_error(first if way == "shipped" else run(), ref)
        if not err <= limit:  # NaN fails too
            raise SystemExit(f"relief_speed: {shape.key} {way}: row error {err:.2e} > {limit:.0e} of the row's norm")
        row[f"{way}_err"] = err
        row[f"{way}_s"] = time_graph(run) if timed else None
    if row.get("tabled_s"):
        row["ratio"] = row["shipped_s"] / row["tabled_s"]
    return row


def line(row: dict[str, Any]) -> str:
    """One shape's report line."""
    if not row["relieved"]:
        return f"{row['shape']}: no form relieved here (the launch rows' forms do not spill)"
    times = (f"shipped {row['shipped_s'] * 1e6:.1f} us, tabled {row['tabled_s'] * 1e6:.1f} us, "
             f"shipped / tabled = {row['ratio']:.3f}") if row.get("ratio") else "not timed"
    return f"{row['shape']}: {times}\n" + "".join(f"    relieved: {r}\n" for r in row["relieved"]).rstrip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=None, help=f"default: {DEFAULT_SHAPES} (--tiny: {TINY_SHAPES})")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 (--tiny: fp32)")
    p.add_argument("--tiny", action="store_true", help="no device: the interpreter's plumbing run, nothing timed")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the rows as JSON")
    args = p.parse_args(argv)
    timed = torch.cuda.is_available()
    if not timed and not args.tiny:
        p.error("no CUDA/HIP device (supported without one: --tiny)")
    if not timed:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    dtype = DTYPES[args.dtype or ("bf16" if timed else "fp32")]
    shapes = parse_shapes(args.shapes or (DEFAULT_SHAPES if timed else TINY_SHAPES))
    where = torch.cuda.get_device_name() if timed else "Triton interpreter: plumbing only, no speed"
    print(f"relief_speed: {where}; {args.dtype or ('bf16' if timed else 'fp32')}, {len(shapes)} shapes", flush=True)
    rows = [measure(shape, dtype, timed) for shape in shapes]
    for row in rows:
        print(line(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": where, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
