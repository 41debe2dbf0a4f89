"""Build (or load from cache) the C++ kernel, once per process.

The sources ship as package data and are compiled on first use with
``torch.utils.cpp_extension.load``; the result is cached on disk by torch (under
``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), so later processes
load it in about a second. The instruction set is chosen at build time from what
torch reports for this CPU (``torch.backends.cpu.get_cpu_capability()``): the
extension name carries it, so a cache shared by machines of different kinds keeps
one build per instruction set, and the kernel's tile width follows it.

A build that fails (no compiler, no ninja, a compiler error) is remembered with its
error: the backend is then unavailable with that error as its reason — it never
runs another implementation in its place.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NativeBuild", "native_build"]

SOURCES = [Path(__file__).with_name("csrc") / "attention.cpp"]

#: Compiler flags per instruction set torch reports. Keys are torch's capability names.
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "AVX512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"),
    "AVX2": ("-mavx2", "-mfma", "-mf16c"),
    "DEFAULT": (),
}
#: OpenMP: the kernel parallelises with ``at::parallel_for``, which is OpenMP in torch's CPU builds.
BASE_FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-fno-math-errno", "-ffp-contract=fast")


@dataclass(frozen=True)
class NativeBuild:
    """The outcome of building/loading the extension in this process.

    ``error`` is None on success; ``seconds`` covers compile (or cache load) and load.
    """

    name: str
    isa: str
    seconds: float
    error: str | None = None
    path: str | None = None
    compiled: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.name}: build failed after {self.seconds:.1f} s: {self.error}"
        how = "compiled and loaded" if self.compiled else "loaded from the build cache"
        return f"{self.name}: {how} in {self.seconds:.2f} s ({self.isa}; {self.path})"


_LOCK = threading.Lock()
_RESULT: NativeBuild | None = None


def _isa() -> str:
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return capability if capability in ISA_FLAGS else "DEFAULT"


def _ensure_ninja_on_path() -> None:
    """A pip-installed ninja lives in the venv's bin, which may not be on PATH."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    if bin_dir:
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def _short(exc: BaseException) -> str:
    """The lines of a build error that say what went wrong (compiler output can be long)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = [ln for ln in lines if "error" in ln.lower() or "not found" in ln.lower()] or lines
    text = " | ".join(keep[:4])
    return f"{type(exc).__name__}: {text[:600]}"


def native_build() -> NativeBuild:
    """Build or load the extension (first call only; later calls return the same result)."""
    global _RESULT
    with _LOCK:
        if _RESULT is None:
            _RESULT = _build()
        return _RESULT


def _build() -> NativeBuild:
    import torch
    from torch.utils import cpp_extension

    isa = _isa()
    name = f"attnhal_cpu_{isa.lower()}"
    start, started_at = time.perf_counter(), time.time()
    try:
        _ensure_ninja_on_path()
        path = cpp_extension.load(
            name=name, sources=[str(s) for s in SOURCES],
            extra_cflags=[*BASE_FLAGS, *ISA_FLAGS[isa]], extra_ldflags=["-fopenmp"],
            is_python_module=False, verbose=False)
        described = str(torch.ops.attnhal_cpu.isa())
    except Exception as exc:  # noqa: BLE001 - any build or load failure is the backend's reason
        return NativeBuild(name, isa, time.perf_counter() - start, error=_short(exc))
    compiled = path is not None and os.path.getmtime(str(path)) >= started_at - 1
    return NativeBuild(name, f"{isa}: {described}", time.perf_counter() - start, path=str(path), compiled=compiled)
