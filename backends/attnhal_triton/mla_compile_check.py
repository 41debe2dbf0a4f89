"""Compile every MLA kernel form for CUDA and HIP targets without a GPU.

    python -m attnhal_triton.mla_compile_check [--json] [--forms mla_decode ...]
        [--targets cuda:80 hip:gfx942 ...] [--dtypes bfloat16 fp8 ...] [--allow-failures]
    python -m attnhal_triton.mla_compile_check --enumerated [--targets ...] [--dtypes ...]
        [--kv-dtypes ...] [--jobs N] [--out FILE.jsonl]

Like :mod:`attnhal_triton.compile_check` (whose compile, resource and table code it uses),
for :func:`attnhal_triton.mla_kernels.mla_kernel` with the launch rows of
:mod:`attnhal_triton.mla_table`: one compile per (form, target, dtype), head 576 = 512 + 64,
16 q heads over one KV head, page size 16 and the soft-cap on. The forms are every
combination of constexprs the backend launches: each phase, split or one pass (a batch that
fills the device is not split; decode then writes its output with the sinks), and V read from
K's tiles (``latent``: a ``v_in_k`` pool) or from its own tensor (``sepv``); ``vtail``: a 576
head that is not MLA (V 576 wide, its own tensor: the tail accumulator).
``--enumerated`` compiles instead every form :func:`attnhal_triton.mla_forms.mla_forms` lists
(per compute dtype x KV format, ``BLOCK_M`` as the sizing gives it), with registers, spills
and headroom as :mod:`attnhal_triton.compile_forms` reports them, appended to ``--out`` as
they finish.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnhal_triton.compile_check import _FP8, _gpu_target, format_table, kernel_source, target_platform
from attnhal_triton.compile_usage import compile_audited
from attnhal_triton.launch_table import LaunchRow, NoLaunchRowWarning
from attnhal_triton.mla_forms import MLA_INPUTS
from attnhal_triton.mla_table import mla_lookup

__all__ = ["FORMS", "TARGETS", "compile_job", "main", "run_mla_compile_check"]

TARGETS = ("cuda:80", "cuda:90", "cuda:100", "hip:gfx942", "hip:gfx950")
DTYPES = ("bfloat16", "float16", "float32", "fp8")
NUM_Q_HEADS = 16



@dataclass(frozen=True)
class Form:
    """One compiled form: the row's kernel and the constexpr flags."""

    table_kernel: str
    flags: Mapping[str, bool]


def _forms() -> dict[str, Form]:
    out = {}
    for phase, (kernel, flags) in MLA_INPUTS.items():
        for split in (True, False) if kernel != "mla_prefill" else (False,):
            for latent in (True, False):
                name = f"{phase}{'' if split else '_onepass'}_{'latent' if latent else 'sepv'}"
                out[name] = Form(kernel, {"PACKED": False, "HAS_EXT_LENS": False, "HAS_EXTRA": False,
                                          "USE_MASK": False, **flags, "SPLIT": split, "HAS_SINKS": not split,
                                          "V_IN_K": latent, "V_TAIL": False})
        # A 576 head that is not MLA: V 576 wide, its own tensor (the tail accumulator).
        sepv = out[f"{phase}{'' if kernel != 'mla_prefill' else '_onepass'}_sepv"]
        out[f"{phase}_vtail"] = replace(sepv, flags={**sepv.flags, "V_TAIL": True})
    return out


FORMS: Mapping[str, Form] = _forms()
_ALIGNED = frozenset({"stride_qt", "stride_qh"})


@dataclass(frozen=True)
class Job:
    form: str
    target: str
    dtype: str

    @property
    def compute_dtype(self) -> str:
        return "bfloat16" if self.dtype == "fp8" else self.dtype

    @property
    def fp8_flavor(self) -> str:
        return target_platform(self.target).fp8_flavor.value if self.dtype == "fp8" else ""

    def row(self) -> LaunchRow:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoLaunchRowWarning)
            form = FORMS[self.form]
            return mla_lookup(form.table_kernel, target_platform(self.target), self.compute_dtype,
                              bool(form.flags["V_TAIL"]))


def _source(job: Job, row: LaunchRow) -> Any:
    from attnhal_triton import mla_kernels

    fn, fp8 = mla_kernels.mla_kernel, job.dtype == "fp8"
    # The row's BLOCK_M, the largest a launch takes (work.query_block only shrinks it).
    constexprs: dict[str, Any] = {
        **FORMS[job.form].flags, "L2_DOMAINS": 1, **row.constexprs, "NUM_Q_HEADS": NUM_Q_HEADS, "GROUP": NUM_Q_HEADS,
        "D_MAIN": 512, "D_TAIL": 64, "PAGE_SIZE": 16, "MASK_WORDS": 1, "HAS_SOFTCAP": True,
        "KV_SCALED": fp8, "KV_F16": fp8, "DOT_F32": False}
    return kernel_source(fn, constexprs, job.compute_dtype, job.fp8_flavor if fp8 else None, _ALIGNED)


def compile_job(job: Job) -> dict[str, Any]:
    """Compile one job; never raises (errors are reported in the row)."""
    row = job.row()
    result: dict[str, Any] = {"kernel": job.form, "target": job.target, "dtype": job.dtype, "head_size": 576,
                              "row": row.key(), "served_by": f"{row.vendor}:{row.arch_family}" if row.vendor
                              else "fallback", "fp8_flavor": job.fp8_flavor, "ok": False, "registers": None,
                              "spills": None, "scratch": None, "shared": None, "dot_types": None, "error": "",
                              "seconds": 0.0}
    start = time.perf_counter()
    try:
        result.update(compile_audited(_source(job, row), _gpu_target(job.target), row.launch_options,
                                      job.compute_dtype == "float32"))
    except Exception as exc:  # report every failure, keep compiling the rest
        text = str(exc).strip()
        result["error"] = f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def run_mla_compile_check(forms: Sequence[str] | None = None, targets: Sequence[str] | None = None,
                          dtypes: Sequence[str] | None = None, jobs: int | None = None) -> list[dict[str, Any]]:
    """One dict per compile (the keys of :func:`attnhal_triton.compile_check.run_compile_check`'s);
    runs in a child process when this one has ``TRITON_INTERPRET`` set."""
    forms, targets, dtypes = list(forms or FORMS), list(targets or TARGETS), list(dtypes or DTYPES)
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        raise ValueError(f"forms={unknown} (supported: {', '.join(FORMS)})")
    if "TRITON_INTERPRET" in os.environ:
        argv = [sys.executable, "-m", "attnhal_triton.mla_compile_check", "--json", "--allow-failures",
                "--forms", *forms, "--targets", *targets, "--dtypes", *dtypes]
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        done = subprocess.run(argv + (["--jobs", str(jobs)] if jobs else []), env=env, capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"MLA compile check child failed ({done.returncode}): {done.stderr[-2000:]}")
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        return rows
    work = [Job(f, t, d) for t in targets for f in forms for d in dtypes
            if d != "fp8" or Job(f, t, d).fp8_flavor in _FP8]
    workers = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    if workers == 1:
        return [compile_job(j) for j in work]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(compile_job, work))


def _interleaved(forms: list[Any]) -> list[Any]:
    """``forms`` taken in turn from each (phase form, dtype, KV format), the dtypes and formats
    turning fastest, tree verify first (the tightest forms): a stopped run has some of each."""
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for form in forms:
        groups.setdefault((form.kernel, form.dtype, form.kv_dtype), []).append(form)
    order = [groups[key] for key in sorted(groups, reverse=True)]
    return [g[i] for i in range(max(map(len, order), default=0)) for g in order if i < len(g)]


def run_enumerated(targets: Sequence[str], out: str, jobs: int = 1, **select: Any) -> list[dict[str, Any]]:
    """Compile every form of :func:`attnhal_triton.mla_forms.mla_forms` (``select``: its filters)
    on each target with :func:`attnhal_triton.compile_forms.compile_form` (registers, spills,
    headroom), each form on every target before the next, taking each (dtype, KV format) in
turn; each result is appended to ``out``
    as one JSON line when it is done, and a form already there is not compiled again
    (:func:`attnhal_triton.compile_forms.compile_all`)."""
    from attnhal_triton.compile_forms import _payload, compile_all
    from attnhal_triton.mla_forms import mla_forms

    per_target = {t: _interleaved(mla_forms(target_platform(t), **select)) for t in targets}
    work = [_payload(t, forms[i]) for i in range(max(map(len, per_target.values()), default=0))
            for t, forms in per_target.items() if i < len(forms)]
    return compile_all(work, jobs, Path(out))


def _enumerated(args: argparse.Namespace) -> int:
    """``--enumerated``: the whole MLA enumeration, with a summary per target."""
    from attnhal_triton.compile_forms import summary

    if "TRITON_INTERPRET" in os.environ:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, "-m", "attnhal_triton.mla_compile_check", *sys.argv[1:]], env=env,
                              check=False).returncode
    start = time.perf_counter()
    select = {"dtypes": args.dtypes or (), "kv_dtypes": args.kv_dtypes or ()}
    rows = run_enumerated(args.targets or list(TARGETS), args.out, args.jobs or 1, **select)
    for r in rows:
        if not r["ok"]:
            print(f"FAIL {r['target']} {r['kernel']} {r['dtype']}/{r['kv_dtype']} {r['blocks']}: {r['error']}")
    print("\n".join(summary(rows, time.perf_counter() - start)))
    return 0 if args.allow_failures or all(r["ok"] for r in rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnhal_triton.mla_compile_check",
                                description="Compile attnhal's MLA Triton kernel forms for CUDA and HIP without a GPU.")
    p.add_argument("--enumerated", action="store_true",
                   help="every launchable form (attnhal_triton.mla_forms), not one per phase form and dtype")
    p.add_argument("--kv-dtypes", nargs="+", metavar="KV", help="--enumerated: default the descriptor's")
    p.add_argument("--out", default="mla_forms.jsonl", help="--enumerated: JSON lines appended as compiled")
    p.add_argument("--json", action="store_true")
    p.add_argument("--forms", nargs="+", choices=list(FORMS), metavar="FORM", help="default: all")
    p.add_argument("--targets", nargs="+", metavar="TARGET", help=f"default: {' '.join(TARGETS)}")
    p.add_argument("--dtypes", nargs="+", metavar="DTYPE", help=f"default: all ({' '.join(DTYPES)}; "
                   "--enumerated: the descriptor's compute dtypes)")
    p.add_argument("--jobs", type=int)
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even with errors or spills")
    args = p.parse_args(argv)
    if args.enumerated:
        return _enumerated(args)
    bad_dtypes = sorted(set(args.dtypes or ()) - set(DTYPES))
    if bad_dtypes:
        p.error(f"--dtypes={bad_dtypes} (supported: {', '.join(DTYPES)})")
    rows = run_mla_compile_check(args.forms, args.targets, args.dtypes, args.jobs)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    bad = any(not r["ok"] or r["spills"] for r in rows)
    return 0 if args.allow_failures or not bad else 1


if __name__ == "__main__":
    sys.exit(main())
