"""Compile every form the backend can launch, for CUDA and HIP targets, without a GPU.

    python -m attnhal_triton.compile_forms [--json] [--targets cuda:90 hip:gfx942 ...]
        [--kernels ...] [--dtypes ...] [--kv-dtypes ...] [--head-sizes ...] [--groups ...]
        [--sample N] [--jobs N] [--results FILE [--report]]

The forms are :func:`attnhal_triton.launch_forms.forms` of each target's platform (the
launch rows and sizing the backend uses, every group 1..16, head size, compute dtype, KV
format, tree and chain, split and unsplit); each is compiled down to cubin / hsaco by
:mod:`attnhal_triton.compile_check`'s compiler path and reported with its registers, spills
and **register headroom**: the registers a program may hold (CUDA: 255, or the row's
``maxnreg``; HIP: 512 VGPRs + AGPRs per lane over the row's ``waves_per_eu``) minus those it
uses. A form whose row spills is compiled again as :mod:`attnhal_triton.spill_relief` relieves
it on a device (the report names the relief and the row's own spill); exit 1 on an error, a
spill as launched or a negative headroom. ``--sample N`` compiles every
N-th form (the suite's share); the whole enumeration is the default. ``--report`` compiles
nothing and says how much of the selection a results file holds (the whole enumeration takes
many runs here: each goes on where the file stops).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnhal.kv_format import kv_format
from attnhal_triton import compile_check as cc
from attnhal_triton.compile_usage import compile_audited
from attnhal_triton.launch_forms import MAX_GROUP, Form, forms
from attnhal_triton.launch_table import KERNELS
from attnhal_triton.spill_relief import choose

__all__ = ["FORM_TARGETS", "REGISTERS", "budget", "compile_all", "compile_form", "main", "report", "run_forms"]

#: The targets every form is compiled for: Ampere, Hopper, Blackwell; MI300, MI350.
FORM_TARGETS = ("cuda:80", "cuda:90", "cuda:100", "hip:gfx942", "hip:gfx950")
#: Triton's pointer element type of each non-fp8 storage, and of e5m2 (one encoding everywhere).
_STORAGE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e5m2": "fp8e5"}


#: Registers one thread (CUDA) or lane (HIP: VGPRs + AGPRs) may hold, per vendor; a row's
#: options lower it (``maxnreg``; ``waves_per_eu`` waves share a HIP SIMD's file).
REGISTERS = {"cuda": 255, "hip": 512}


def budget(target: str, options: dict[str, int]) -> int:
    """Registers a program of this launch may hold per thread (CUDA) or lane (HIP)."""
    top = REGISTERS[cc.target_platform(target).vendor.value]
    return min(top, options.get("maxnreg", top)) // max(1, options.get("waves_per_eu", 1))


def _pointer(form: Form, target: str) -> str:
    """K/V's pointer type: the storage of the form's KV format on the target."""
    flavor = cc.target_platform(target).fp8_flavor
    storage = kv_format(form.kv_dtype).storage_name(flavor)
    return _STORAGE.get(storage) or cc._FP8[flavor.value]


def _kernel(function: str) -> Any:
    """The jit function named ``function`` (the GQA kernels' or ``mla_kernel``)."""
    from attnhal_triton import kernels, mla_kernels

    return getattr(mla_kernels if function == "mla_kernel" else kernels, function)


def _source(form: Form, target: str) -> Any:
    return cc.kernel_source(_kernel(form.function), form.constexprs, form.dtype, None,
                            kv_pointer=_pointer(form, target))


def _payload(target: str, form: Form) -> tuple[str, Form]:
    """A picklable (target, form) for a worker process (a row's mappings are read-only proxies)."""
    row = replace(form.row, blocks=dict(form.row.blocks), extra=dict(form.row.extra))
    object.__setattr__(row, "blocks", dict(row.blocks))
    object.__setattr__(row, "extra", dict(row.extra))
    return target, replace(form, row=row, constexprs=dict(form.constexprs))


def _describe(target: str, form: Form) -> dict[str, Any]:
    """A results row's description of ``form`` on ``target``, before its compile's figures."""
    group, tokens, batch = form.example
    return {"form_id": form_id(target, form), "kernel": form.kernel, "target": target, "dtype": form.dtype,
            "kv_dtype": form.kv_dtype, "head_size": form.head_size, "group": group, "query_tokens": tokens,
            "batch": batch, "split": bool(form.constexprs.get("SPLIT", form.kernel == "decode")),
            "blocks": {k: v for k, v in form.constexprs.items() if k.startswith("BLOCK_")}, "row": form.row.key()}


#: What a compile measured, as opposed to which form it was (:func:`_describe`); a row written
#: before a field existed lacks it (None). ``relief``: what :mod:`attnhal_triton.spill_relief` changed
#: from the row's form to launch it ("" nothing); ``row_spills``: the row's own form's bytes.
_FIGURES = ("code_key", "ok", "registers", "spills", "headroom", "shared", "error", "relief", "row_spills")


def _figures(target: str, form: Form, options: dict[str, Any]) -> dict[str, Any]:
    """Compile ``form`` with launch ``options``: its registers, spills, headroom, shared memory and
    problem ("" none)."""
    gpu = cc._gpu_target(target)
    checks = compile_audited(_source(form, target), gpu, options,
                             form.dtype == "float32" or bool(form.constexprs.get("DOT_F32")))
    headroom = budget(target, options) - checks["registers"]
    problem = checks["error"] or (f"{checks['spills']} spilled, headroom {headroom}"
                                  if checks["spills"] != 0 or headroom < 0 else "")
    return {"registers": checks["registers"], "spills": checks["spills"], "headroom": headroom,
            "shared": checks["shared"], "ok": not problem, "error": problem}


def _tried_key(constexprs: Mapping[str, Any], options: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(constexprs.items())), tuple(sorted(options.items()))


def compile_form(item: tuple[str, Form], known_key: str | None = None) -> dict[str, Any]:
    """Compile one (target, form) as it launches: the row's form, or where that spills the form
    :func:`attnhal_triton.spill_relief.choose` relieves it to (as the backend does on a device).
    ``known_key``: its :func:`code_key`, where the caller has it. Never raises (an error is
    reported in the row)."""
    target, form = item
    result: dict[str, Any] = {**_describe(target, form), **dict.fromkeys(_FIGURES), "ok": False, "error": "",
                              "seconds": 0.0}
    start = time.perf_counter()
    try:
        result["code_key"] = known_key or code_key(target, form)
        tried: dict[tuple[Any, ...], dict[str, Any]] = {}  # each compile's figures, by its form

        def probe(constexprs: Mapping[str, Any], options: Mapping[str, Any]) -> int:
            figures = _figures(target, replace(form, constexprs=dict(constexprs)), dict(options))
            tried[_tried_key(constexprs, options)] = figures
            return int(figures["spills"])

        relief = choose(probe, form.constexprs, form.row.launch_options, form.row.uncapped)
        result.update(tried[_tried_key(relief.constexprs, relief.options)], relief=relief.label,
                      row_spills=relief.row_spills)
    except Exception as exc:  # report every failure, keep compiling the rest
        text = str(exc).strip()
        result["error"] = f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


@functools.lru_cache(maxsize=None)
def _source_key(function: str) -> str:
    """Triton's key of a kernel's source and the jit functions it calls: a results file's
    rows of an older kernel do not count by :func:`form_id` (they may by :func:`code_key`)."""
    return str(_kernel(function).cache_key)[:16]


def form_id(target: str, form: Form) -> str:
    """A form's identity on a target and its kernel's source (what a results file is keyed by)."""
    return json.dumps([_source_key(form.function), target, *form.key()], default=str)


_LOCATION = re.compile(r"\s+loc\(")


def _without_locations(ir_text: str) -> str:
    """MLIR text without its source locations: ``#loc`` lines and every ``loc(...)`` suffix."""
    lines = []
    for line in ir_text.splitlines():
        if line.startswith("#loc"):
            continue
        while (found := _LOCATION.search(line)) is not None:
            depth, end = 0, found.end() - 1
            while end < len(line):
                depth += {"(": 1, ")": -1}.get(line[end], 0)
                if depth == 0:
                    break
                end += 1
            line = line[:found.start()] + line[end + 1:]
        lines.append(line)
    return "\n".join(lines)


def code_key(target: str, form: Form) -> str | None:
    """A form's identity by the code it compiles to: Triton's version, the target, the launch
    options and Triton's front-end IR of the form without source locations (0.04 s, where a
    compile takes 1-3 s). An edit that leaves a form's IR alone (a branch its constexprs do not
    take, a comment, a moved line) leaves its key, so a results row of it still counts.
    ``None`` where this Triton's front end is not reachable so (the row then counts by
    :func:`form_id` only)."""
    import triton

    try:
        from triton._C.libtriton import ir
        from triton.compiler.compiler import make_backend

        gpu = cc._gpu_target(target)
        backend = make_backend(gpu)
        options = backend.parse_options(dict(form.row.launch_options))
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        module = _source(form, target).make_ir(gpu, options, backend.get_codegen_implementation(options),
                                               backend.get_module_map(), context)
    except (ImportError, AttributeError, TypeError):  # another Triton's internals: no key, not an error
        return None
    ident = json.dumps([triton.__version__, target, sorted(form.row.launch_options.items())], default=str)
    return hashlib.sha1((ident + _without_locations(str(module))).encode()).hexdigest()[:20]


def _serving_first(item: tuple[str, Form]) -> tuple[Any, ...]:
    """16-bit queries over 16-bit or fp8 caches at the common head sizes come first, so a
    partial run of a results file covers what models run."""
    target, form = item
    return ("float32" in (form.dtype, form.kv_dtype), form.head_size not in (64, 128, 256),
            FORM_TARGETS.index(target) if target in FORM_TARGETS else len(FORM_TARGETS))


def _done(results: Path | None) -> dict[str, dict[str, Any]]:
    if results is None or not results.exists():
        return {}
    rows = (json.loads(line) for line in results.read_text().splitlines() if line.strip())
    return {r["form_id"]: r for r in rows if "form_id" in r}


def run_forms(targets: Sequence[str] = FORM_TARGETS, sample: int = 1, jobs: int = 1,
              results: Path | None = None, **select: Any) -> list[dict[str, Any]]:
    """Compile every ``sample``-th form of each target (``select``: :func:`forms`'s filters).
    ``results``: a JSON-lines file each compile is appended to as it finishes; forms already
    in it are not compiled again (a run can stop and go on)."""
    if cc._interpreting():
        raise RuntimeError("compiling needs a process without TRITON_INTERPRET (use main(), "
                           "which re-runs itself without it)")
    return compile_all(_work(targets, sample, select), jobs, results)


def _work(targets: Sequence[str], sample: int, select: Mapping[str, Any]) -> list[tuple[str, Form]]:
    work = [_payload(t, f) for t in targets for f in forms(cc.target_platform(t), **select)][::max(1, sample)]
    return sorted(work, key=_serving_first)


def report(targets: Sequence[str], sample: int, results: Path, **select: Any) -> tuple[list[str], bool]:
    """What ``results`` holds of the selected enumeration under this kernel source, compiling
    nothing: :func:`summary` of its rows against every selected form. ``True`` when every form
    is there and each launches clean."""
    work = _work(targets, sample, select)
    done = _done(results)
    rows = [done[i] for i in (form_id(*w) for w in work) if i in done]
    lines = summary(rows, 0.0, totals=Counter(t for t, _ in work))
    lines[-1] = (f"{len(rows):,} of {len(work):,} forms in {results} ({sum(r['seconds'] for r in rows):.0f} "
                 f"compile-seconds); {len(work) - len(rows):,} not compiled yet")
    return lines, len(rows) == len(work) and all(r["ok"] for r in rows)


def compile_all(work: Sequence[tuple[str, Form]], jobs: int = 1, results: Path | None = None) -> list[dict[str, Any]]:
    """:func:`compile_form` of each (target, form) of ``work`` in its order, ``jobs`` at a time;
    with ``results``, each row is appended to that JSON-lines file as it finishes, and forms
    already in it are taken from it, not compiled again: by :func:`form_id` (this source), or
    by :func:`code_key` (another source, the same code: the row names it under ``reused``; the
    workers take the key as they go, so a large file does not hold the compiles back). With
    ``results`` the file is the cache: Triton's own is left as it was."""
    done = _done(results)
    rows = [done[i] for i in (form_id(*w) for w in work) if i in done]
    todo = [w for w in work if form_id(*w) not in done]
    known = {r["code_key"]: r for r in done.values() if r.get("code_key")}
    _know(known)
    each = _compile_or_reuse if results is None else _compile_into_results
    with ProcessPoolExecutor(max_workers=jobs, initializer=_know, initargs=(known,)) if jobs > 1 \
            else contextlib.nullcontext() as pool:
        for row in pool.map(each, todo, chunksize=1) if pool else map(each, todo):
            rows.append(row)
            _append(results, [row])
    return rows


#: The rows of a results file by code key, in each process that compiles (:func:`_know`).
_KNOWN: dict[str, dict[str, Any]] = {}


def _know(rows: Mapping[str, dict[str, Any]]) -> None:
    _KNOWN.clear()
    _KNOWN.update(rows)


def _compile_or_reuse(item: tuple[str, Form]) -> dict[str, Any]:
    """A known row of ``item``'s code, described as ``item``; else :func:`compile_form`."""
    key = _code_key_or_none(item) if _KNOWN else None
    row = _KNOWN.get(key or "")
    if row is None:
        return compile_form(item, key)
    return {**_describe(*item), **{k: row.get(k) for k in _FIGURES}, "seconds": 0.0, "reused": row["form_id"]}


@contextlib.contextmanager
def _scratch_cache() -> Iterator[None]:
    """Triton's cache in a folder removed after the compile."""
    from triton import knobs

    with tempfile.TemporaryDirectory(prefix="attnhal-form-") as folder, knobs.cache.scope():
        knobs.cache.dir = folder
        yield


def _compile_into_results(item: tuple[str, Form]) -> dict[str, Any]:
    """:func:`_compile_or_reuse` for a results file, which is then the enumeration's cache:
    Triton's keeps ~1 MB a compiled form (the whole GQA enumeration: ~80 GB of disk)."""
    with _scratch_cache():
        return _compile_or_reuse(item)


def _code_key_or_none(item: tuple[str, Form]) -> str | None:
    try:
        return code_key(*item)
    except Exception:  # its front end fails: compile_form compiles it and reports why
        return None


def _append(results: Path | None, rows: Sequence[dict[str, Any]]) -> None:
    if results is not None and rows:
        with results.open("a") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)


def summary(rows: Sequence[dict[str, Any]], seconds: float, totals: Mapping[str, int] | None = None) -> list[str]:
    """Per target: forms (of ``totals[target]`` where given), those spill relief changed, failures
    and spills as launched, the least headroom and the form that has it."""
    lines = []
    for target in totals or dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target]
        bad = [r for r in mine if not r["ok"]]
        relieved = [r for r in mine if r.get("relief")]
        tight = min((r for r in mine if r["headroom"] is not None), key=lambda r: r["headroom"], default=None)
        where = (f"{tight['headroom']} ({tight['kernel']} {tight['dtype']}/{tight['kv_dtype']} d{tight['head_size']} "
                 f"g{tight['group']} T{tight['query_tokens']} {'split' if tight['split'] else 'unsplit'} "
                 f"{tight['blocks']})") if tight else "-"
        count = f"{len(mine):,} of {totals[target]:,}" if totals else f"{len(mine)}"
        lines.append(f"{target}: {count} forms, {len(relieved)} relieved (the row's form spilled), "
                     f"{len(bad)} failed or spilled as launched, least headroom {where}")
    lines.append(f"{len(rows)} forms compiled in {seconds:.0f} s "
                 f"({sum(r['seconds'] for r in rows):.0f} compile-seconds)")
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m attnhal_triton.compile_forms",
                                description="Compile every launchable form of attnhal's Triton kernels.")
    p.add_argument("--json", action="store_true", help="print one JSON row per form")
    p.add_argument("--targets", nargs="+", default=list(FORM_TARGETS), metavar="TARGET")
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS), metavar="KERNEL")
    p.add_argument("--dtypes", nargs="+", default=[], metavar="DTYPE", help="default: the descriptor's")
    p.add_argument("--kv-dtypes", nargs="+", default=[], metavar="KV", help="default: the descriptor's")
    p.add_argument("--head-sizes", nargs="+", type=int, default=[], metavar="D")
    p.add_argument("--groups", nargs="+", type=int, default=list(range(1, MAX_GROUP + 1)), metavar="G")
    p.add_argument("--sample", type=int, default=1, help="compile every N-th form (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="parallel compiles")
    p.add_argument("--results", type=Path, metavar="FILE",
                   help="append each compile to this JSON-lines file; forms already in it are not compiled again")
    p.add_argument("--report", action="store_true",
                   help="compile nothing: say what --results FILE holds of the selected forms (exit 1 unless all, clean)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if cc._interpreting():
        import subprocess

        command = [sys.executable, "-m", "attnhal_triton.compile_forms", *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(command, env=cc._clean_env(), check=False).returncode
    select = dict(kernels=args.kernels, dtypes=args.dtypes, kv_dtypes=args.kv_dtypes, head_sizes=args.head_sizes,
                  groups=args.groups)
    if args.report:
        if args.results is None or not args.results.is_file():
            print(f"compile_forms: --report needs --results FILE, an existing results file (got {args.results})",
                  file=sys.stderr)
            return 2
        lines, whole = report(args.targets, args.sample, args.results, **select)
        print("\n".join(lines))
        return 0 if whole else 1
    start = time.perf_counter()
    rows = run_forms(args.targets, args.sample, args.jobs, args.results, **select)
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            if not r["ok"]:
                print(f"FAIL {r['target']} {r['row']} {r['dtype']}/{r['kv_dtype']} g{r['group']} "
                      f"T{r['query_tokens']} bs{r['batch']} {r['blocks']}: {r['error']}")
        print("\n".join(summary(rows, time.perf_counter() - start)))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
