"""The share of the compile forms CI builds, chosen by a rule, and the counts of the whole.

    python -m attnhal_triton.compile_coverage [--json] [--by function|kernel] [--targets ...] [--jobs N]
        [--counts]

Every launchable form compiled for cuda:80/90/100 and gfx942/950 is about 87,000 GQA forms
(:func:`attnhal_triton.launch_forms.forms`) plus 18,978 MLA forms
(:func:`attnhal_triton.mla_forms.mla_forms`): days of CPU at 5-10 s a compile. CI compiles one
form per class instead, the one a register estimate says is heaviest:

* a class is (target, kernel, precision): ``--by function`` (the suite's) takes the kernel
  function (``decode_partial_kernel``, ``decode_reduce_kernel``, ``extend_kernel``,
  ``mla_kernel``), ``--by kernel`` the launch-table kernel, i.e. the phase's form
  (``extend_verify_tree``, ``mla_decode``, ...); precision is ``fp32`` or ``16-bit`` (a
  16-bit query over any cache: fp8 is widened to fp16 in registers);
* the heaviest form of a class has the most 32-bit words of live tiles per thread (CUDA)
  or lane (HIP) over its register budget (:func:`register_demand`: the fp32 accumulator,
  the query block, the K and V tiles, fp8's widened copies, the scores), ties broken
  towards an fp8 cache, a tree mask, the one-pass form (sinks), a separate V tensor, a
  group that is not a power of two, more mask words; for MLA also the form measured
  tightest (:data:`MLA_TIGHTEST`) beside the estimate's pick.

The estimate is not ptxas: a class's heaviest form by it is not proven its tightest
(docs/triton.md says what was compared). Each form is compiled by the compile checks' own
code (:func:`attnhal_triton.compile_forms.compile_form`,
:func:`attnhal_triton.mla_compile_check.compile_job`) and must have 0 spills and headroom
>= 0. Exit 1 otherwise. Runs itself without ``TRITON_INTERPRET`` when it is set.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from attnhal.kv_format import kv_format
from attnhal_triton import compile_check as cc
from attnhal_triton import mla_compile_check as mcc
from attnhal_triton.compile_forms import FORM_TARGETS, _payload, budget, compile_form
from attnhal_triton.launch_forms import Form, forms

__all__ = ["BY", "MLA_TIGHTEST", "full_counts", "gqa_share", "main", "mla_share", "register_demand", "run_share"]

#: What a class is keyed by, besides (target, precision).
BY = ("function", "kernel")
#: Bytes of each 16/32-bit cache storage (fp8 is 1).
_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
#: Threads of a warp (CUDA) or lanes of a wavefront (HIP).
_LANES = {"cuda": 32, "hip": 64}


def _check_by(by: str) -> None:
    if by not in BY:
        raise ValueError(f"by={by!r} (supported: {', '.join(BY)})")


def _precision(dtype: str) -> str:
    return "fp32" if dtype == "float32" else "16-bit"


def register_demand(target: str, options: dict[str, int], rows: int, n: int, d_qk: int, d_v: int,
                    q_bytes: int, kv_bytes: int, separate_v: bool = True) -> float:
    """Estimated share of the register budget a thread/lane needs for one program's live
    tiles: ``rows`` query rows of ``d_qk`` (q block, scores over ``n`` positions) and an fp32
    accumulator of ``d_v``; K (and V, ``separate_v``) tiles of ``n`` positions in the cache's
    bytes, plus their fp16 copies when an fp8 cache (``kv_bytes`` 1) meets a 16-bit query."""
    tiles = n * (d_qk + (d_v if separate_v else 0))
    words = rows * d_v + rows * d_qk * q_bytes / 4 + tiles * kv_bytes / 4 + rows * n
    if kv_bytes == 1 and q_bytes == 2:
        words += tiles / 2
    threads = options.get("num_warps", 4) * _LANES[cc.target_platform(target).vendor.value]
    return words / threads / budget(target, options)


def _gqa_demand(target: str, form: Form) -> tuple[Any, ...]:
    c, d = form.constexprs, form.head_size
    q_bytes = 4 if form.dtype == "float32" else 2
    fmt = kv_format(form.kv_dtype)
    if form.function == "decode_reduce_kernel":  # partials [BLOCK_S, D] fp32, no K/V tiles
        demand = register_demand(target, dict(form.row.launch_options), c["BLOCK_S"], 0, d, d, 4, 4)
    else:
        kv_bytes = 1 if fmt.fp8 is not None else _BYTES[fmt.storage_name()]
        rows = c.get("BLOCK_M", c.get("BLOCK_H", 1))
        demand = register_demand(target, dict(form.row.launch_options), rows, c["BLOCK_N"], d, d, q_bytes, kv_bytes)
    group = c.get("GROUP", 1)
    return (round(demand, 6), fmt.fp8 is not None, bool(c.get("USE_MASK")), not c.get("SPLIT", True),
            bool(group & (group - 1)), c.get("MASK_WORDS", 1), group, d)


def gqa_share(target: str, by: str = "function") -> list[Form]:
    """The heaviest GQA form of each class on ``target`` (see the module docstring)."""
    _check_by(by)
    best: dict[tuple[str, str], tuple[tuple[Any, ...], Form]] = {}
    for form in forms(cc.target_platform(target)):
        key = (form.function if by == "function" else form.kernel, _precision(form.dtype))
        rank = _gqa_demand(target, form)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, form)
    return [form for _, form in best.values()]


def _mla_demand(job: mcc.Job) -> tuple[Any, ...]:
    row, flags = job.row(), mcc.FORMS[job.form].flags
    fp8, q_bytes = job.dtype == "fp8", 4 if job.dtype == "float32" else 2
    d_v = 576 if flags["V_TAIL"] else 512
    demand = register_demand(job.target, dict(row.launch_options), row.blocks["BLOCK_M"], row.blocks["BLOCK_N"],
                             576, d_v, q_bytes, 1 if fp8 else q_bytes, separate_v=not flags["V_IN_K"])
    return (round(demand, 6), fp8, flags["USE_MASK"], not flags["SPLIT"], not flags["V_IN_K"], flags["HAS_EXTRA"])


#: The MLA compile that measured the most registers of its (target, precision) in the run of
#: every MLA form (2026-12-06, Triton 3.9; NVIDIA only: that run's HIP figures counted the
#: AGPRs twice), where the estimate picks another: compiled beside the estimate's pick.
MLA_TIGHTEST: dict[tuple[str, str], tuple[str, str]] = {
    ("cuda:80", "16-bit"): ("verify_tree_sepv", "bfloat16"),  # 255 registers
    ("cuda:90", "16-bit"): ("verify_tree_latent", "fp8"),  # 254
    ("cuda:100", "16-bit"): ("verify_tree_onepass_latent", "fp8"),  # 248
}


def mla_share(target: str, by: str = "function") -> list[mcc.Job]:
    """The heaviest MLA compile of each class on ``target`` (by ``kernel``: per MLA form of
    the launch table, i.e. per phase), and with ``function`` the measured tightest of
    :data:`MLA_TIGHTEST` beside it."""
    _check_by(by)
    best: dict[tuple[str, str], tuple[tuple[Any, ...], mcc.Job]] = {}
    for name, form in mcc.FORMS.items():
        for dtype in mcc.DTYPES:
            job = mcc.Job(name, target, dtype)
            if dtype == "fp8" and job.fp8_flavor not in cc._FP8:
                continue
            key = ("mla_kernel" if by == "function" else form.table_kernel, _precision(job.compute_dtype))
            rank = _mla_demand(job)
            if key not in best or rank > best[key][0]:
                best[key] = (rank, job)
    picks = [job for _, job in best.values()]
    measured = [mcc.Job(form, target, dtype) for (t, _), (form, dtype) in MLA_TIGHTEST.items() if t == target]
    return picks + [job for job in measured if by == "function" and job not in picks]


def _compile_mla(job: mcc.Job) -> dict[str, Any]:
    result = mcc.compile_job(job)
    options = dict(job.row().launch_options)
    headroom = budget(job.target, options) - result["registers"] if result["registers"] is not None else None
    ok = result["ok"] and result["spills"] == 0 and headroom is not None and headroom >= 0
    return {**result, "function": "mla_kernel", "headroom": headroom, "ok": ok}


def _compile_gqa(item: tuple[str, Form]) -> dict[str, Any]:
    return {**compile_form(item), "function": item[1].function}


def _run(item: tuple[Callable[[Any], dict[str, Any]], Any]) -> dict[str, Any]:
    fn, arg = item
    return fn(arg)


def run_share(targets: Iterable[str] = FORM_TARGETS, by: str = "function", jobs: int = 1) -> list[dict[str, Any]]:
    """Compile the share of every target; one row per compile (``compile_form``'s keys)."""
    if cc._interpreting():
        raise RuntimeError("compiling needs a process without TRITON_INTERPRET (use main())")
    work: list[tuple[Callable[[Any], dict[str, Any]], Any]] = []
    for target in targets:
        work += [(_compile_gqa, _payload(target, form)) for form in gqa_share(target, by)]
        work += [(_compile_mla, job) for job in mla_share(target, by)]
    if jobs <= 1:
        return [_run(w) for w in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_run, work))


def full_counts(targets: Sequence[str] = FORM_TARGETS) -> dict[str, dict[str, int]]:
    """Per target, the whole enumeration: GQA forms and MLA forms."""
    from attnhal_triton.mla_forms import mla_forms

    return {t: {"gqa": len(forms(cc.target_platform(t))), "mla": len(mla_forms(cc.target_platform(t)))}
            for t in targets}


def _line(r: dict[str, Any]) -> str:
    kv = r.get("kv_dtype", r["dtype"])
    return (f"{'ok  ' if r['ok'] else 'FAIL'} {r['target']:<11} {r['function']:<21} {r['kernel']:<22} "
            f"{r['dtype']}/{kv} d{r['head_size']} regs {r['registers']} spills {r['spills']} "
            f"headroom {r['headroom']} {r['seconds']:.1f} s {r['error']}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnhal_triton.compile_coverage",
                                description="Compile the heaviest launch form of each class, for CUDA and HIP.")
    p.add_argument("--json", action="store_true")
    p.add_argument("--by", choices=BY, default="function", help="a class per kernel function or per phase form")
    p.add_argument("--targets", nargs="+", default=list(FORM_TARGETS), metavar="TARGET")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--counts", action="store_true", help="also count the whole enumeration (~20 s)")
    args = p.parse_args(argv)
    if cc._interpreting():
        import subprocess

        command = [sys.executable, "-m", "attnhal_triton.compile_coverage", *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(command, env=cc._clean_env(), check=False).returncode
    start = time.perf_counter()
    rows = run_share(args.targets, args.by, args.jobs)
    if args.json:
        print(json.dumps(rows))
    else:
        print("\n".join(_line(r) for r in rows))
        if args.counts:
            for target, n in full_counts(args.targets).items():
                print(f"{target}: whole enumeration {n['gqa']} GQA forms + {n['mla']} MLA forms")
        print(f"{len(rows)} compiles in {time.perf_counter() - start:.0f} s, "
              f"{sum(not r['ok'] for r in rows)} failed or spilled")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
