"""The share of the compile forms CI builds, chosen by a rule, and the counts of the whole.

    python -m attnhal_triton.compile_coverage [--json] [--by function|kernel] [--targets ...] [--jobs N]
        [--counts]

Every launchable form compiled for cuda:80/90/100 and gfx942/950 is about 87,000 GQA forms
(:func:`attnhal_triton.launch_forms.forms`) plus 18,978 MLA forms
(:func:`attnhal_triton.mla_forms.mla_forms`): days of CPU at 1-3 s a compile. CI compiles a
share of those same enumerated forms instead, per class:

* a class is (target, kernel, precision): ``--by function`` (the suite's) takes the kernel
  function (``decode_partial_kernel``, ``decode_reduce_kernel``, ``extend_kernel``,
  ``mla_kernel``), ``--by kernel`` the phase's form (``extend_verify_tree``,
  ``verify_tree_latent``, ...); precision is ``fp32`` or ``16-bit`` (a 16-bit query over any
  cache: fp8 is widened to fp16 in registers);
* first the class's heaviest form: the most 32-bit words of live tiles per thread (CUDA) or
  lane (HIP) over its register budget (:func:`register_demand`: the fp32 accumulator, the
  query block, the K and V tiles, fp8's widened copies, the scores), ties broken towards an
  fp8 cache, a tree mask, the one-pass form (sinks), a separate V tensor, a group that is not
  a power of two, more mask words;
* then every branch: each value of each constexpr that chooses code rather than a size (the
  flags, the dot precision, the tree's mask words: :func:`branches`) that occurs in the class
  is compiled in at least one form of the share (greedy: the form with most values not yet
  compiled, ties to the heavier). A path only one value reaches (two mask words: 3.5 KB of
  spill in fp32 MLA tree verify, found by the whole enumeration, docs/triton_mla.md) is no
  longer left to the run of every form;
* for MLA also the form measured tightest (:data:`MLA_TIGHTEST`) in the run of every MLA form
  proper, beside the rule's picks.

The estimate is not ptxas: a class's heaviest form by it is not proven its tightest
(docs/triton.md says what was compared). Each form is compiled by
:func:`attnhal_triton.compile_forms.compile_form` (as the whole enumeration is) and must have
0 spills, headroom >= 0, no fp32 dot in a 16-bit form and fit the target's shared memory.
Exit 1 otherwise. Runs itself without ``TRITON_INTERPRET`` when it is set.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from attnhal.kv_format import kv_format
from attnhal_triton import compile_check as cc
from attnhal_triton.compile_forms import FORM_TARGETS, _payload, budget, compile_form
from attnhal_triton.launch_forms import Form, forms
from attnhal_triton.mla_forms import mla_forms

__all__ = ["BY", "MLA_TIGHTEST", "branches", "full_counts", "main", "register_demand", "run_share", "share"]

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


def _demand(target: str, form: Form) -> tuple[Any, ...]:
    """A form's rank in its class: :func:`register_demand`, then the tie-breaks."""
    c, d, options = form.constexprs, form.head_size, dict(form.row.launch_options)
    fmt = kv_format(form.kv_dtype)
    if form.function == "decode_reduce_kernel":  # partials [BLOCK_S, D] fp32, no K/V tiles
        demand = register_demand(target, options, c["BLOCK_S"], 0, d, d, 4, 4)
    else:
        kv_bytes = 1 if fmt.fp8 is not None else _BYTES[fmt.storage_name()]
        rows = c.get("BLOCK_M", c.get("BLOCK_H", 1))
        d_v = c["D_MAIN"] if "D_MAIN" in c and not c["V_TAIL"] else d  # MLA's V: the latent, or all 576
        demand = register_demand(target, options, rows, c["BLOCK_N"], d, d_v, 4 if form.dtype == "float32" else 2,
                                 kv_bytes, separate_v=not c.get("V_IN_K", False))
    group = c.get("GROUP", 1)
    return (round(demand, 6), fmt.fp8 is not None, bool(c.get("USE_MASK")), not c.get("SPLIT", True),
            not c.get("V_IN_K", False), bool(group & (group - 1)), c.get("MASK_WORDS", 1), group, d)


def branches(form: Form) -> frozenset[tuple[str, Any]]:
    """The (constexpr, value) pairs of ``form`` that choose code rather than a size: the flags
    (an fp8 cache's scaling and widening among them), the dot precision, the tree's mask words."""
    return frozenset((k, v) for k, v in form.constexprs.items() if isinstance(v, (bool, str)) or k == "MASK_WORDS")


def _cover(ranked: list[tuple[tuple[Any, ...], Form]]) -> list[Form]:
    """The heaviest form of a class, then forms until every branch of the class is compiled."""
    members = [(rank, branches(form), form) for rank, form in ranked]
    _, first, heaviest = max(members, key=lambda m: m[0])
    picks, missing = [heaviest], frozenset().union(*(b for _, b, _ in members)) - first
    while missing:
        _, chosen, best = max(members, key=lambda m: (len(m[1] & missing), m[0]))
        picks.append(best)
        missing -= chosen
    return picks


#: Per (target, precision), the MLA form that took the most registers in the run of every MLA
#: form proper (V latent or separate: 6,384 forms, 0 spills; 2026-12-07, Triton 3.9,
#: docs/triton_mla.md): (phase form, dtype, KV format, (q heads, query tokens, batch)), with its
#: registers. Compiled beside the share where the rule picks others.
MLA_TIGHTEST: dict[tuple[str, str], tuple[str, str, str, tuple[int, int, int]]] = {
    ("cuda:80", "16-bit"): ("verify_tree_sepv", "bfloat16", "bfloat16", (16, 2, 1)),  # 255
    ("cuda:80", "fp32"): ("verify_tree_sepv", "float32", "bfloat16", (16, 33, 1)),  # 186
    ("cuda:90", "16-bit"): ("verify_tree_latent", "bfloat16", "fp8_e4m3", (32, 33, 1)),  # 255
    ("cuda:90", "fp32"): ("verify_tree_sepv", "float32", "bfloat16", (16, 33, 1)),  # 179
    ("cuda:100", "16-bit"): ("verify_tree_latent", "bfloat16", "fp8_e4m3", (16, 33, 65536)),  # 248
    ("cuda:100", "fp32"): ("verify_tree_sepv", "float32", "bfloat16", (16, 33, 1)),  # 179
    ("hip:gfx942", "16-bit"): ("verify_tree_latent", "bfloat16", "float32", (16, 33, 65536)),  # 447
    ("hip:gfx942", "fp32"): ("verify_tree_sepv", "float32", "float32", (16, 2, 1)),  # 448
    ("hip:gfx950", "16-bit"): ("verify_tree_sepv", "bfloat16", "float32", (32, 33, 1)),  # 441
    ("hip:gfx950", "fp32"): ("verify_tree_sepv", "float32", "float32", (16, 33, 1)),  # 497
}


def share(target: str, by: str = "function") -> list[Form]:
    """The forms CI compiles on ``target`` (see the module docstring), GQA and MLA."""
    _check_by(by)
    platform = cc.target_platform(target)
    mla = mla_forms(platform)
    classes: dict[tuple[str, str], list[tuple[tuple[Any, ...], Form]]] = defaultdict(list)
    for form in (*forms(platform), *mla):
        key = (form.function if by == "function" else form.kernel, _precision(form.dtype))
        classes[key].append((_demand(target, form), form))
    picks = [form for ranked in classes.values() for form in _cover(ranked)]
    tightest = {spec for (t, _), spec in MLA_TIGHTEST.items() if t == target}
    return picks + [form for form in mla if (form.kernel, form.dtype, form.kv_dtype, form.example) in tightest
                    and form not in picks]


def run_share(targets: Iterable[str] = FORM_TARGETS, by: str = "function", jobs: int = 1) -> list[dict[str, Any]]:
    """Compile the share of every target; one row per compile (``compile_form``'s keys plus
    ``function``)."""
    if cc._interpreting():
        raise RuntimeError("compiling needs a process without TRITON_INTERPRET (use main())")
    work = [_payload(target, form) for target in targets for form in share(target, by)]
    if jobs <= 1:
        rows = [compile_form(w) for w in work]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            rows = list(pool.map(compile_form, work))
    return [{**row, "function": form.function} for row, (_, form) in zip(rows, work)]


def full_counts(targets: Sequence[str] = FORM_TARGETS) -> dict[str, dict[str, int]]:
    """Per target, the whole enumeration: GQA forms and MLA forms."""
    return {t: {"gqa": len(forms(cc.target_platform(t))), "mla": len(mla_forms(cc.target_platform(t)))}
            for t in targets}


def _line(r: dict[str, Any]) -> str:
    kv = r.get("kv_dtype", r["dtype"])
    return (f"{'ok  ' if r['ok'] else 'FAIL'} {r['target']:<11} {r['function']:<21} {r['kernel']:<22} "
            f"{r['dtype']}/{kv} d{r['head_size']} regs {r['registers']} spills {r['spills']} "
            f"headroom {r['headroom']} {r['seconds']:.1f} s {r['error']}"
            + (f" (relieved: {r['relief']}; the row's form spilled {r['row_spills']} B)" if r.get("relief") else ""))


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
