"""Compile every kernel for CUDA and HIP targets without a GPU.

    python -m attnhal_triton.compile_check [--json] [--kernels decode extend_prefill ...]
        [--targets cuda:80 hip:gfx942 ...] [--dtypes float16 ...] [--head-sizes 128 ...]

For each (kernel variant, target, dtype, head size) the kernel is compiled with the
launch row :func:`attnhal_triton.launch_table.lookup` picks for that target's arch
family (and, with ``--fallback``, the fallback row too) by
``triton.compile(ASTSource(...), target=GPUTarget(...))`` down to cubin / hsaco, and
the table reports registers, spills, scratch and shared memory:

* CUDA: ``ptxas -v`` on the generated PTX (registers per thread; spill stores +
  loads in bytes; stack frame bytes);
* HIP: the code object's metadata (VGPRs + AGPRs per lane; VGPR + SGPR spill
  counts; private segment bytes).

Compilation does not work in a process with ``TRITON_INTERPRET`` set (triton reads
it when kernels are decorated), so :func:`run_compile_check` runs itself in a child
process without it when needed, and ``main`` re-executes itself likewise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from attnhal.platform import Platform, parse
from attnhal_triton.compile_usage import compile_audited
from attnhal_triton.launch_table import LaunchRow, NoLaunchRowWarning, fallback_row, lookup
from attnhal_triton.work import head_block

__all__ = ["DEFAULT_TARGETS", "VARIANTS", "compile_target", "format_table", "main", "run_compile_check",
           "served_by", "serving_lines", "target_platform"]

#: ``"cuda:<capability>"`` or ``"hip:<gfx arch>"``; the warp size follows the platform.
#: cuda:86/89/100 take aliased sm80/sm90 rows (``launch_table.ALIASES``).
DEFAULT_TARGETS = ("cuda:80", "cuda:86", "cuda:89", "cuda:90", "cuda:100", "cuda:120",
                   "hip:gfx90a", "hip:gfx942", "hip:gfx950")
#: ``fp8``: a bf16 model over an fp8 KV cache in the target's e4m3 flavour
#: (``Platform.fp8_flavor``; targets without one are not compiled for it).
DTYPES = ("float16", "bfloat16", "float32", "fp8")
HEAD_SIZES = (64, 128, 256)
#: Query heads per KV head compiled for (Llama-3-8B-like GQA).
GROUP = 4

_TRITON_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
#: Triton's pointer type of each e4m3 flavour (OCP e4m3fn = "fp8e4nv", MI300's fnuz = "fp8e4b8").
_FP8 = {"e4m3fn": "fp8e4nv", "e4m3fnuz": "fp8e4b8"}


@dataclass(frozen=True)
class Variant:
    """One compiled form of a kernel: its table name and the phase's constexpr flags."""

    table_kernel: str
    function: str
    flags: Mapping[str, bool | int] = field(default_factory=dict)


#: Every kernel form the backend launches, by the phase(s) it serves; each has its own
#: launch-table rows. Every form is compiled with page size 16 and the soft-cap on
#: (the heavier form; window and scales are runtime values), prefill and the reduce
#: with sinks.
_COMMON: dict[str, bool | int] = {"PAGE_SIZE": 16, "HAS_SOFTCAP": True}
_EXTEND: dict[str, bool | int] = {**_COMMON, "MASK_WORDS": 1}
VARIANTS: Mapping[str, Variant] = {
    "decode": Variant("decode", "decode_partial_kernel", _COMMON),  # decode and draft_decode
    "decode_reduce": Variant("decode_reduce", "decode_reduce_kernel", {"HAS_SINKS": True}),
    "extend_prefill": Variant("extend_prefill", "extend_kernel", {
        **_EXTEND, "PACKED": True, "HAS_EXT_LENS": True, "USE_MASK": False, "SPLIT": False,
        "HAS_SINKS": True}),
    "extend_verify": Variant("extend_verify", "extend_kernel", {
        **_EXTEND, "PACKED": False, "HAS_EXT_LENS": False, "USE_MASK": False, "SPLIT": True,
        "HAS_SINKS": False}),
    "extend_verify_tree": Variant("extend_verify_tree", "extend_kernel", {
        **_EXTEND, "PACKED": False, "HAS_EXT_LENS": False, "USE_MASK": True, "SPLIT": True,
        "HAS_SINKS": False}),
    "extend_draft": Variant("extend_draft", "extend_kernel", {
        **_EXTEND, "PACKED": False, "HAS_EXT_LENS": True, "USE_MASK": False, "SPLIT": True,
        "HAS_SINKS": False}),
}

# Pointer element types; Q/Out take the compute dtype, K/V the cache dtype.
_POINTERS = {"MidO": "fp32", "MidLse": "fp32", "ReqToPage": "i32", "ReqIdx": "i64",
             "SeqLens": "i32", "NumSplits": "i32", "QoIndptr": "i32", "ExtLens": "i32",
             "Extra": "i64", "Tree": "i32", "KScale": "fp32",
             "VScale": "fp32", "Sinks": "fp32"}
_FLOAT_SCALARS = frozenset({"qk_scale", "softcap"})
# Strides that are multiples of the head size (>= 16) in every real layout: the JIT
# would specialise them as divisible by 16, so the check does too.
_ALIGNED = frozenset({"stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
                      "stride_ob", "stride_oh", "stride_os", "stride_outt", "stride_outh"})


def target_platform(target: str) -> Platform:
    """The platform of a target spec: ``"cuda:86"`` -> ``cuda:sm86``, ``"hip:gfx942"`` as is."""
    vendor, _, arch = target.partition(":")
    return parse(f"{vendor}:{'sm' + arch if arch.isdigit() else arch}")


def compile_target(platform: Platform) -> str:
    """The target spec of a platform, :func:`target_platform`'s inverse: ``cuda:sm90`` -> ``"cuda:90"``."""
    return f"{platform.vendor.value}:{platform.arch.removeprefix('sm')}"


@dataclass(frozen=True)
class Job:
    variant: str
    target: str
    dtype: str
    head_size: int
    fallback: bool

    def platform(self) -> Platform:
        return target_platform(self.target)

    @property
    def compute_dtype(self) -> str:
        return "bfloat16" if self.dtype == "fp8" else self.dtype

    @property
    def fp8_flavor(self) -> str:
        """The e4m3 flavour of an ``fp8`` job (the target platform's), else ``""``."""
        return self.platform().fp8_flavor.value if self.dtype == "fp8" else ""

    def row(self, kernel: str) -> LaunchRow:
        if self.fallback:
            return fallback_row(kernel, self.head_size, self.compute_dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoLaunchRowWarning)
            return lookup(kernel, self.platform(), self.head_size, self.compute_dtype)


def _gpu_target(spec: str) -> Any:
    from triton.backends.compiler import GPUTarget

    vendor, _, arch = spec.partition(":")
    platform = Job("", spec, "", 0, False).platform()
    return GPUTarget(vendor, int(arch) if arch.isdigit() else arch, platform.warp_size)


def _constexprs(job: Job, variant: Variant, row: LaunchRow) -> dict[str, Any]:
    values: dict[str, Any] = {"HEAD_DIM": job.head_size, **variant.flags}
    if variant.table_kernel == "decode_reduce":
        splits = job.row("decode").kv_splits
        values["BLOCK_S"] = 1 << max(0, splits - 1).bit_length()
        return values
    fp8 = job.dtype == "fp8"  # a bf16 query over the cache, as the ops launch it
    values.update(GROUP=GROUP, DOT_F32=False, KV_SCALED=fp8, KV_F16=fp8, **row.constexprs)
    if variant.function == "extend_kernel":
        values.update(NUM_Q_HEADS=GROUP * 8)  # 8 KV heads
        values.setdefault("L2_DOMAINS", 1)  # the row's where it deals programs to several L2s
    if variant.table_kernel == "decode":
        values["BLOCK_H"] = head_block(row, GROUP)  # as the backend launches it
    return values


def _source(job: Job, variant: Variant, row: LaunchRow) -> Any:
    from attnhal_triton import kernels

    fp8_flavor = job.fp8_flavor if job.dtype == "fp8" else None
    return kernel_source(getattr(kernels, variant.function), _constexprs(job, variant, row), job.compute_dtype,
                         fp8_flavor)


def kernel_source(fn: Any, constexprs: Mapping[str, Any], compute_dtype: str, fp8_flavor: str | None,
                  aligned: frozenset[str] = _ALIGNED, kv_pointer: str | None = None) -> Any:
    """Triton's ``ASTSource`` of kernel ``fn``: constexprs as given, every other argument typed
    by its name (K/V ``kv_pointer`` where given, else fp8 of ``fp8_flavor``, else
    ``compute_dtype`` like Q and Out; metadata pointers; fp32 or i32 scalars), pointers and
    ``aligned`` strides 16-divisible; the other integers unspecialised, as the kernels'
    ``do_not_specialize`` lists launch them."""
    from triton.compiler import ASTSource

    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    if kv_pointer is None and fp8_flavor is not None:
        kv_pointer = _FP8[fp8_flavor]
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        if name in ("K", "V") and kv_pointer is not None:
            signature[name] = "*" + kv_pointer
        elif name in ("Q", "K", "V", "Out"):
            signature[name] = "*" + _TRITON_DTYPE[compute_dtype]
        elif name in _POINTERS:
            signature[name] = "*" + _POINTERS[name]
        else:
            signature[name] = "fp32" if name in _FLOAT_SCALARS else "i32"
        if signature[name].startswith("*") or name in aligned:
            attrs[(index,)] = [["tt.divisibility", 16]]
    return ASTSource(fn, signature, dict(constexprs), attrs)


def specialisation_mismatches(fn: Any, runtime_ints: Iterable[str], args: Sequence[Any],
                              constexprs: Mapping[str, Any], aligned: frozenset[str] = _ALIGNED) -> list[str]:
    """The integer arguments of a launch ``fn[grid](*args, **constexprs)`` whose value Triton's
    JIT would compile into another kernel than :func:`kernel_source` builds: outside the
    kernel's ``do_not_specialize`` (``runtime_ints``) the JIT makes 1 a constant and marks a
    multiple of 16 divisible, and the check assumes the latter of ``aligned`` strides only."""
    params = [p for p in fn.arg_names if p not in constexprs]
    wrong = []
    for param, value in zip(params, args, strict=True):
        if not isinstance(value, int) or isinstance(value, bool) or param in runtime_ints:
            continue
        jit = "constant" if value == 1 else "divisible" if value % 16 == 0 else "plain"
        if jit != ("divisible" if param in aligned else "plain"):
            wrong.append(f"{fn.__name__}.{param}={value}")
    return wrong


def served_by(row: LaunchRow) -> str:
    """The row set a row belongs to: ``"cuda:sm80"``, ``"hip:gfx94"`` or ``"fallback"``."""
    return f"{row.vendor}:{row.arch_family}" if row.vendor else "fallback"


def _compile_one(job: Job) -> dict[str, Any]:
    """Compile one job; never raises (errors are reported in the row)."""
    variant = VARIANTS[job.variant]
    row = job.row(variant.table_kernel)
    result: dict[str, Any] = {**asdict(job), "kernel": job.variant, "row": row.key(),
                              "served_by": served_by(row), "fp8_flavor": job.fp8_flavor,
                              "ok": False, "registers": None, "spills": None, "scratch": None,
                              "shared": None, "dot_types": None, "error": "", "seconds": 0.0}
    del result["variant"]
    start = time.perf_counter()
    try:
        result.update(compile_audited(_source(job, variant, row), _gpu_target(job.target), row.launch_options,
                                      job.compute_dtype == "float32"))
    except Exception as exc:  # report every failure, keep compiling the rest
        result["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def _jobs(kernels: Iterable[str], targets: Iterable[str], dtypes: Iterable[str],
          head_sizes: Iterable[int], fallback: bool) -> list[Job]:
    jobs = [Job(k, t, d, h, fb) for fb in ((False, True) if fallback else (False,))
            for t in targets for k in kernels for d in dtypes for h in head_sizes]
    # fp8 e4m3 only where the target computes in an e4m3 flavour (platform data).
    return [j for j in jobs if j.dtype != "fp8" or j.fp8_flavor in _FP8]


def _interpreting() -> bool:
    return "TRITON_INTERPRET" in os.environ


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def run_compile_check(kernels: Sequence[str] | None = None, targets: Sequence[str] | None = None,
                      dtypes: Sequence[str] | None = None, head_sizes: Sequence[int] | None = None,
                      fallback: bool = False, jobs: int | None = None) -> list[dict[str, Any]]:
    """Compile the kernel variants for the targets; one dict per compile.

    Each dict: ``kernel, target, dtype, head_size, fallback, row`` (the launch row's
    key), ``served_by`` (its row set: ``"cuda:sm80"`` for ``cuda:86``, which aliases it,
    or ``"fallback"``), ``fp8_flavor, ok, registers, spills, scratch, shared, error,
    seconds``. Runs in a child process when this
    process has ``TRITON_INTERPRET`` set.
    """
    kernels = list(kernels or VARIANTS)
    unknown = sorted(set(kernels) - set(VARIANTS))
    if unknown:
        raise ValueError(f"kernels={unknown} (supported: {', '.join(VARIANTS)})")
    targets, dtypes = list(targets or DEFAULT_TARGETS), list(dtypes or DTYPES)
    head_sizes = list(head_sizes or HEAD_SIZES)
    for target in targets:  # here, not in a worker process, so a bad target is one clear error
        try:
            Job("", target, "", 0, False).platform()
        except ValueError as exc:
            raise ValueError(f"targets={target!r}: {exc}") from None
    if _interpreting():
        return _run_child(kernels, targets, dtypes, head_sizes, fallback, jobs)
    work = _jobs(kernels, targets, dtypes, head_sizes, fallback)
    workers = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    if workers == 1:
        return [_compile_one(j) for j in work]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_compile_one, work))


def _run_child(kernels: list[str], targets: list[str], dtypes: list[str], head_sizes: list[int],
               fallback: bool, jobs: int | None) -> list[dict[str, Any]]:
    argv = [sys.executable, "-m", "attnhal_triton.compile_check", "--json",
            "--kernels", *kernels, "--targets", *targets, "--dtypes", *dtypes,
            "--head-sizes", *map(str, head_sizes), "--allow-failures"]
    argv += ["--fallback"] if fallback else []
    argv += ["--jobs", str(jobs)] if jobs else []
    done = subprocess.run(argv, env=_clean_env(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"compile check child failed ({done.returncode}): {done.stderr[-2000:]}")
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A fixed-width table of :func:`run_compile_check` rows plus a summary line."""
    head = ("kernel", "target", "dtype", "head", "row", "regs", "spills", "scratch", "smem", "status")
    lines = [[r["kernel"], r["target"],
              f"fp8_{r['fp8_flavor']}" if r.get("fp8_flavor") else r["dtype"], str(r["head_size"]), r["row"],
              _num(r["registers"]), _num(r["spills"]), _num(r["scratch"]), _num(r["shared"]),
              "ok" if r["ok"] else f"ERROR {r['error']}"] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    failed = sum(not r["ok"] for r in rows)
    spilled = sum(bool(r["ok"] and r["spills"]) for r in rows)
    out += serving_lines(rows)
    out.append(f"{len(rows)} compiles: {len(rows) - failed} ok, {failed} failed, {spilled} with spills "
               "(CUDA: ptxas registers/thread, spill bytes; HIP: VGPR+AGPR/lane, spill count)")
    return "\n".join(out)


def serving_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per target naming the row set(s) its compiles used, so an alias
    (``cuda:86: rows of cuda:sm80``) is visible next to the spills it is checked for."""
    by_target: dict[str, list[str]] = {}
    for r in rows:
        sets = by_target.setdefault(r["target"], [])
        if r["served_by"] not in sets:
            sets.append(r["served_by"])
    return [f"{target}: rows of {', '.join(sets)}" for target, sets in by_target.items()]


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m attnhal_triton.compile_check",
                                description="Compile attnhal's Triton kernels for CUDA and HIP without a GPU.")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--kernels", nargs="+", choices=list(VARIANTS), metavar="KERNEL",
                   help=f"kernel variants (default: all of {', '.join(VARIANTS)})")
    p.add_argument("--targets", nargs="+", metavar="TARGET",
                   help=f"targets like cuda:90 or hip:gfx942 (default: {' '.join(DEFAULT_TARGETS)})")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, metavar="DTYPE", help="default: all")
    p.add_argument("--head-sizes", nargs="+", type=int, metavar="D",
                   help=f"default: {' '.join(map(str, HEAD_SIZES))}")
    p.add_argument("--fallback", action="store_true", help="also compile the fallback rows")
    p.add_argument("--jobs", type=int, help="parallel compiles (default: CPU count)")
    p.add_argument("--allow-failures", action="store_true",
                   help="exit 0 even with errors or spills")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if _interpreting():
        # Re-run this command in a clean process: compiling needs TRITON_INTERPRET unset.
        command = [sys.executable, "-m", "attnhal_triton.compile_check",
                   *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(command, env=_clean_env(), check=False).returncode
    try:
        rows = run_compile_check(args.kernels, args.targets, args.dtypes, args.head_sizes,
                                 args.fallback, args.jobs)
    except ValueError as exc:
        print(f"{_parser().prog}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    bad = any(not r["ok"] or r["spills"] for r in rows)
    return 0 if args.allow_failures or not bad else 1


if __name__ == "__main__":
    sys.exit(main())
