"""What a compiled Triton kernel uses: registers, spills and scratch, per vendor's binary form.

CUDA: ``ptxas -v``'s log, registers per thread and spill bytes — the compile's own ptxas run
where :func:`compile_audited` saw it, else ptxas run again on the PTX (a Triton cache hit skips
the compile's); HIP: the code object's metadata, VGPRs + AGPRs per lane and spill counts.
:func:`audit` adds what makes a compile wrong even without a spill: an fp32 ``tl.dot`` in a
16-bit kernel, or more shared memory than the target's block may use.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["SHARED_LIMIT", "audit", "compile_audited", "dot_operand_types", "resource_usage"]

#: Shared memory (LDS) a block may use, by target arch: a kernel over it compiles but cannot
#: launch, so the checks report it as an error. Archs not listed are not checked.
SHARED_LIMIT = {"80": 166912, "86": 101376, "89": 101376, "90": 232448, "100": 232448, "120": 101376,
                "gfx90a": 65536, "gfx942": 65536, "gfx950": 163840}

_PTXAS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas(capability: int) -> str:
    """The ptxas Triton compiles ``capability`` with: recent releases pick one per architecture
    (3.6, 3.9), older ones have one (3.4)."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        return str(get_ptxas(capability).path)
    except TypeError:  # Triton 3.4's get_ptxas() takes no architecture
        return str(get_ptxas().path)


def _cuda_usage(compiled: Any, capability: int, log: str = "") -> dict[str, int]:
    """Registers and spills from ``ptxas -v``'s ``log`` of the compile, or where it has none from
    ptxas run again on the PTX with Triton's own options (as ``make_cubin`` gives them)."""
    if _PTXAS.search(log):
        return _usage_of(log)
    from triton.backends.nvidia.compiler import sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run(
            [_ptxas(capability), "-v", "--regAllocOptLevel=2",
             f"--gpu-name={sm_arch_from_capability(capability)}", ptx, "-o", os.path.join(tmp, "k.o")],
            check=True, capture_output=True, text=True).stderr
    return _usage_of(log)


def _usage_of(log: str) -> dict[str, int]:
    regs, spill = _PTXAS.search(log), _SPILL.search(log)
    return {"registers": int(regs.group(1)) if regs else -1,
            "spills": int(spill.group(2)) + int(spill.group(3)) if spill else -1,
            "scratch": int(spill.group(1)) if spill else -1}


def _hip_usage(compiled: Any) -> dict[str, int]:
    """VGPRs + AGPRs a lane, spill counts and scratch from the code object's metadata."""
    text = compiled.asm["amdgcn"]

    def meta(key: str) -> int:
        m = re.search(rf"\.{key}:\s+(\d+)", text)
        return int(m.group(1)) if m else -1

    # On CDNA2+ (one register file of 512 a lane) the metadata's ``.vgpr_count`` already
    # includes the AGPRs (gfx942: ``.vgpr_count 456`` = 256 VGPRs + 200 AGPRs); LLVM's
    # ``TotalNumVgprs`` comment states the total on every target with AGPRs.
    total = re.search(r";\s*TotalNumVgprs:\s+(\d+)", text)
    return {"registers": int(total.group(1)) if total else meta("vgpr_count"),
            "spills": meta("vgpr_spill_count") + meta("sgpr_spill_count"),
            "scratch": meta("private_segment_fixed_size")}


def resource_usage(compiled: Any, target: Any, ptxas_log: str = "") -> dict[str, int]:
    """``registers``, ``spills`` and ``scratch`` of a compiled kernel (``-1``: not reported), read
    from whichever binary form the target's compiler produced (PTX for CUDA, AMDGCN for HIP);
    ``ptxas_log``: the compile's own ``ptxas -v`` output, where the caller has it."""
    readers = {"ptx": lambda: _cuda_usage(compiled, int(target.arch), ptxas_log),
               "amdgcn": lambda: _hip_usage(compiled)}
    for stage, read in readers.items():
        if stage in compiled.asm:
            return read()
    return {"registers": -1, "spills": -1, "scratch": -1}


_DOT = re.compile(r"=\s*(?:tt\.dot|ttng\.warp_group_dot)\s[^:]*:(.*?)->")
_ELEMENT = re.compile(r"(?:tensor|memdesc)<(?:\d+x)+([a-zA-Z0-9]+)")


def dot_operand_types(compiled: Any) -> set[str]:
    """Element types of every dot operand in the kernel's TTGIR (``"bf16"``, ``"f32"``, ...):
    an fp32 operand in a 16-bit kernel means the FMA path on tensor-core hardware."""
    types: set[str] = set()
    for operands in _DOT.findall(compiled.asm.get("ttgir", "")):
        types.update(_ELEMENT.findall(operands))
    return types


def audit(compiled: Any, target: Any, f32_dots: bool, ptxas_log: str = "") -> dict[str, Any]:
    """:func:`resource_usage` plus ``shared`` bytes and ``dot_types``, with ``ok`` and ``error``:
    an fp32 dot where the form's dots are not fp32 (``f32_dots``: an fp32 query, or a 16-bit
    one over fp32 tiles), or more shared memory than ``target``'s block may use. Spills are
    the caller's to judge (its register budget)."""
    dots = sorted(dot_operand_types(compiled))
    shared = int(compiled.metadata.shared)
    limit = SHARED_LIMIT.get(str(target.arch))
    error = ""
    if not f32_dots and "f32" in dots:
        error = f"fp32 tl.dot in a 16-bit kernel (operands {dots}): 16-bit inputs belong on the tensor cores"
    elif limit is not None and shared > limit:
        error = f"shared memory {shared} B > {limit} B of the target"
    return {**resource_usage(compiled, target, ptxas_log), "shared": shared, "dot_types": dots, "ok": not error,
            "error": error}


def compile_audited(source: Any, target: Any, options: Mapping[str, Any], f32_dots: bool) -> dict[str, Any]:
    """``triton.compile`` of ``source`` for ``target`` (a ``GPUTarget``) with launch ``options``, and
    its :func:`audit`: the registers and spills of CUDA's from that compile's own ``ptxas -v`` run
    (Triton prints it when asked; a second ptxas run cost ~10 % of a form's compile)."""
    import triton
    from triton import knobs

    log = io.StringIO()
    ask = getattr(knobs, "nvidia", None)  # a Triton without the knob: ptxas runs again
    with warnings.catch_warnings(), ask.scope() if ask else contextlib.nullcontext(), contextlib.redirect_stdout(log):
        # Triton 3.9 announces a future default (fp fusion) on every compile; noise here.
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION")
        if ask:
            ask.dump_ptxas_log = True
        compiled = triton.compile(source, target=target, options=dict(options))
    return audit(compiled, target, f32_dots, log.getvalue())
