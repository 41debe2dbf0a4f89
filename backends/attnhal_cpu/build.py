"""Build (or load from the cache) the C++ kernel, once per process.

The sources (``csrc/``: ``attention.cpp`` and the headers it includes) ship as package
data and are compiled on first use into attnhal's own build cache
(:mod:`attnhal_cpu.buildcache`: ``$ATTNHAL_CPU_BUILD_DIR``, default
``~/.cache/attnhal/cpu-kernel``), one entry per torch version, instruction set, source
content (headers included) and compiler; later processes load the installed library in
about 0.1 s. The instruction set is chosen from what torch reports for the CPU the process
runs on (``torch.backends.cpu.get_cpu_capability()``) and the kernel's tile width follows
it; an AVX-512 CPU with the bf16 dot product (``avx512_bf16``) whose compiler accepts
``-mavx512bf16`` gets the ``AVX512_BF16`` build, whose bf16 scores use ``vdpbf16ps``. Each
build registers its op under a namespace of its own (``torch.ops.attnhal_cpu_avx2.attend``),
so that several load into one process: the first process on a CPU model also builds the
narrower builds the CPU runs (:data:`NARROWER`), tunes each and races them with the host's
(:mod:`attnhal_cpu.tuning`); the record names the build that runs each cache width, and later
processes load just those. The compiler is invoked directly (``$CXX``, default ``c++``) with
torch's include paths; the flags are those ``torch.utils.cpp_extension`` would use.

A build that fails (no compiler, a compiler error, a wait for another build's lock past
its bound) is remembered with its error for this process: the backend is then unavailable
with that error as its reason — it never runs another implementation in its place — and
the next process builds again.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from attnhal_cpu.buildcache import BuildError, Compiler, Entry, LibrarySpec, cache_root, cache_state, discard
from attnhal_cpu.buildcache import ensure_built, find_compiler, locate
from attnhal_cpu.params import HOST_DEFAULTS, WIDTH_NAMES, WIDTHS, HostParams
from attnhal_cpu.sweep import RACE_SHAPES, SHAPES, Timer, kernel_timer
from attnhal_cpu.tuning import Contender, MakeTimer, Tuning, tune, will_measure

__all__ = ["NARROWER", "NativeBuild", "choose_isa", "kernel_spec", "load_build", "native_build", "op_namespace",
           "tune_entry"]

SOURCE_DIR = Path(__file__).with_name("csrc")
LIBRARY = "attnhal_cpu"

_AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c")
#: Compiler flags per instruction set. Keys are torch's capability names, plus
#: ``AVX512_BF16``: AVX-512 with the bf16 dot product (see :func:`choose_isa`).
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "AVX512_BF16": (*_AVX512, "-mavx512bf16"),
    "AVX512": _AVX512,
    "AVX2": ("-mavx2", "-mfma", "-mf16c"),
    "DEFAULT": (),
}
#: The narrower builds a CPU of each instruction set also runs, raced against its own once per CPU
#: model (a Zen 4 executes 512-bit operations as two 256-bit halves; docs/cpu.md).
NARROWER: dict[str, tuple[str, ...]] = {"AVX512_BF16": ("AVX512", "AVX2"), "AVX512": ("AVX2",), "AVX2": (),
                                        "DEFAULT": ()}
#: OpenMP: the kernel parallelises with ``at::parallel_for``, which is OpenMP in torch's CPU builds.
BASE_FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-fno-math-errno", "-ffp-contract=fast")


@dataclass(frozen=True)
class NativeBuild:
    """The outcome of building/loading the extension in this process.

    ``error`` is None on success; ``seconds`` covers compile (or cache load) and load;
    ``entry`` is the cache entry (None when no compiler was found to key it by); ``tuning``:
    the parameters the kernel runs with here and where they came from (:mod:`attnhal_cpu.tuning`);
    ``narrower``: the tunings of the narrower builds that run a cache width here (``tuning.builds``),
    by instruction set; their ops are loaded.
    """

    name: str
    isa: str
    seconds: float
    error: str | None = None
    path: str | None = None
    compiled: bool = False
    entry: Entry | None = None
    tuning: Tuning | None = None
    narrower: Mapping[str, Tuning] = field(default_factory=dict)

    @property
    def own_isa(self) -> str:
        """This build's instruction set (a key of :data:`ISA_FLAGS`)."""
        return self.isa.split(":")[0]

    def runs(self, width: str) -> tuple[str, Tuning | None]:
        """The op namespace of the build that runs cache ``width`` here, and that build's tuning."""
        if self.tuning is None:
            return self.name, None
        isa = self.tuning.build_for(width, self.own_isa)
        return op_namespace(isa), self.narrower.get(isa, self.tuning)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def params(self) -> HostParams:
        return self.tuning.params if self.tuning is not None else HOST_DEFAULTS

    def cache(self) -> str:
        """The cache entry and what it holds now: ``built``, ``building by pid N ...``,
        ``failed: why``, ``interrupted: ...`` or ``not built``."""
        if self.entry is None:
            return f"{cache_root()}: not built"
        state = cache_state(self.entry)
        shown = state.state if self.error is not None and state.detail and state.detail in self.error else str(state)
        return f"{self.entry.directory}: {shown}"

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.name}: build failed after {self.seconds:.1f} s: {self.error}; cache {self.cache()}"
        how = "compiled and loaded" if self.compiled else "loaded from the build cache"
        return (f"{self.name}: {how} in {self.seconds:.2f} s ({self.isa}; {self.path}); cache {self.cache()}; "
                f"parameters: {self.parameters()}")

    def parameters(self) -> str:
        """The parameters and where they came from; where a narrower build runs a cache width here,
        per width the build that runs it and its parameters."""
        if self.tuning is None or not self.narrower:
            return str(self.tuning)
        runs = {w: self.runs(w) for w in WIDTHS}
        return "; ".join(f"{WIDTH_NAMES[w]} on {ns}: {getattr(t.params if t else HOST_DEFAULTS, w)}"
                         for w, (ns, t) in runs.items()) + \
            f" (raced with the host's build, {self.tuning.source}: {self.tuning.detail})"


_LOCK = threading.Lock()
_RESULT: NativeBuild | None = None


def _capability() -> str:
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return capability if capability in ISA_FLAGS else "DEFAULT"


def cpu_has_bf16_dot() -> bool:
    """Whether the CPU this process runs on has ``avx512_bf16`` (torch's cpuinfo query; a torch
    without that query reports False, and the build is plain AVX-512)."""
    import torch

    query = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(query is not None and query())


def compiler_has_bf16_dot(compiler: Compiler) -> bool:
    """Whether ``compiler`` accepts ``-mavx512bf16`` (it then defines ``__AVX512BF16__``)."""
    argv = [compiler.path, *ISA_FLAGS["AVX512_BF16"], "-dM", "-E", "-x", "c++", os.devnull]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "__AVX512BF16__" in out.stdout


def choose_isa(capability: str, compiler: Compiler) -> str:
    """The build's instruction set: torch's ``capability``, raised to ``AVX512_BF16`` when it is
    ``AVX512`` and both the CPU and ``compiler`` have the bf16 dot product. A capability
    forced lower (``ATEN_CPU_CAPABILITY=avx2``) stays that low."""
    if capability == "AVX512" and cpu_has_bf16_dot() and compiler_has_bf16_dot(compiler):
        return "AVX512_BF16"
    return capability


def op_namespace(isa: str) -> str:
    """The op namespace of instruction set ``isa``'s build (``attnhal_cpu_avx512_bf16``)."""
    return f"{LIBRARY}_{isa.lower()}"


def kernel_spec(isa: str, source_dir: Path = SOURCE_DIR, namespace: str | None = None) -> LibrarySpec:
    """The kernel's build for instruction set ``isa`` (a key of :data:`ISA_FLAGS`): every
    ``.cpp`` of ``source_dir`` compiled, every ``.h`` hashed into the cache key; its op registered
    under ``namespace`` (default :func:`op_namespace`)."""
    import torch
    from torch.utils import cpp_extension

    includes = [flag for path in cpp_extension.include_paths() for flag in ("-isystem", path)]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return LibrarySpec(
        name=LIBRARY, tag=f"{isa.lower()}-torch{torch.__version__}",
        sources=tuple(sorted(source_dir.glob("*.cpp"))), headers=tuple(sorted(source_dir.glob("*.h"))),
        cflags=(*includes, abi, *BASE_FLAGS, *ISA_FLAGS[isa], f"-DATTNHAL_CPU_NS={namespace or op_namespace(isa)}"),
        ldflags=("-fopenmp", *(f"-L{p}" for p in cpp_extension.library_paths()), "-lc10", "-ltorch_cpu", "-ltorch"),
        identity=(torch.__version__, sys.platform, platform.machine()))


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


def _load(entry: Entry) -> None:
    """Load the installed library; one that will not load is removed so that the next run rebuilds it."""
    import torch

    try:
        torch.ops.load_library(str(entry.library))
    except OSError as exc:
        reason = f"{entry.library} did not load: {exc}"
        discard(entry, reason)
        raise BuildError(reason) from exc


#: Builds loaded in this process, by instruction set: their cache entry and compiled flag.
_LOADED: dict[str, tuple[Entry, bool]] = {}


def load_build(isa: str, compiler: Compiler) -> tuple[Entry, bool, Any]:
    """Build (or find in the cache) and load ``isa``'s build, once per process: its entry, whether
    it was compiled now, and its ops (``torch.ops.<namespace>``)."""
    import torch

    if isa not in _LOADED:
        entry = locate(kernel_spec(isa), compiler=compiler)
        compiled = ensure_built(entry)
        _load(entry)
        _LOADED[isa] = entry, compiled
    entry, compiled = _LOADED[isa]
    return entry, compiled, getattr(torch.ops, op_namespace(isa))


def _build() -> NativeBuild:
    isa = _capability()
    name = op_namespace(isa)
    start = time.perf_counter()
    entry: Entry | None = None
    try:
        compiler = find_compiler()
        isa = choose_isa(isa, compiler)
        name = op_namespace(isa)
        entry = locate(kernel_spec(isa), compiler=compiler)
        early = _build_early(NARROWER[isa], compiler) if will_measure(entry.directory) else []
        entry, compiled, ops = load_build(isa, compiler)
        for thread in early:
            thread.join()
        described = str(ops.isa())
    except Exception as exc:  # noqa: BLE001 - any build or load failure is the backend's reason
        return NativeBuild(name, isa, time.perf_counter() - start, error=_short(exc), entry=entry)
    seconds = time.perf_counter() - start

    jobs: dict[Any, list[Any]] = {}  # per cache width, the K/V every build's timer reads; freed after tuning
    tuned: dict[str, Tuning] = {}  # the narrower builds' own tunings, as the race measured or read them

    def contender(other: str) -> Callable[[], Contender]:
        def load() -> Contender:
            entry, _, ops = load_build(other, compiler)
            own = tuned[other] = tune_entry(entry, other, ops, jobs=jobs)
            return Contender(other, own.params, own.source, _timers(ops, jobs))
        return load

    tuning = tune_entry(entry, isa, ops, {other: contender(other) for other in NARROWER[isa]}, jobs)
    tuning, narrower = _narrower(tuning, compiler, tuned)
    return NativeBuild(name, f"{isa}: {described}", seconds, path=str(entry.library), compiled=compiled,
                       entry=entry, tuning=tuning, narrower=narrower)


def _build_early(isas: Sequence[str], compiler: Compiler) -> list[threading.Thread]:
    """Start building ``isas`` beside the host's own build (each compile is one process: on a
    2-CPU host the three builds of an AVX-512 CPU took 63 s one after another). A failure is left
    for :func:`load_build` to meet, and report, when the race loads that build."""
    def build(isa: str) -> None:
        try:
            ensure_built(locate(kernel_spec(isa), compiler=compiler))
        except Exception:  # noqa: BLE001, S110 - load_build retries and reports it
            pass
    threads = [threading.Thread(target=build, args=(isa,), daemon=True) for isa in isas]
    for thread in threads:
        thread.start()
    return threads


def _narrower(tuning: Tuning, compiler: Compiler, tuned: Mapping[str, Tuning]) -> tuple[Tuning, dict[str, Tuning]]:
    """Load the narrower builds ``tuning`` runs widths on, with their own tunings (``tuned``: those
    this process has already); a width whose build will not load stays on the host's build
    (``tuning.detail`` says why)."""
    narrower: dict[str, Tuning] = {}
    for width, isa in tuning.builds:
        try:
            entry, _, ops = load_build(isa, compiler)
            narrower[isa] = narrower.get(isa) or tuned.get(isa) or tune_entry(entry, isa, ops)
        except Exception as exc:  # noqa: BLE001 - the host's own build serves that width
            kept = tuple(b for b in tuning.builds if b[0] != width)
            tuning = replace(tuning, builds=kept, detail=f"{tuning.detail}; {width}: the {isa} build did not "
                                                         f"load ({_short(exc)}), the host's build runs it")
    return tuning, narrower


def _timers(ops: Any, jobs: dict[Any, list[Any]]) -> MakeTimer:
    """``make_timer(width, race=False)`` of the build whose ops are ``ops`` (the sweep's shapes, or
    the race's); ``jobs``: the timing jobs several builds' timers share (the same K/V, allocated by
    the first)."""
    import torch

    def make_timer(width: str, race: bool = False) -> Timer:
        shapes = RACE_SHAPES if race else SHAPES
        return kernel_timer(ops, torch.get_num_threads(), width, jobs=jobs.setdefault((width, race), []),
                            shapes=shapes)
    return make_timer


def tune_entry(entry: Entry, isa: str, ops: Any, others: Mapping[str, Callable[[], Contender]] = MappingProxyType({}),
               jobs: dict[Any, list[Any]] | None = None) -> Tuning:
    """The parameters of the build in ``entry`` whose ops (``torch.ops.<namespace>``) are loaded:
    its record for this CPU, or a sweep (:func:`attnhal_cpu.tuning.tune`); ``others``: narrower
    builds to race it with when measuring; ``jobs``: timing jobs shared with their timers."""
    return tune(entry.directory, isa, _timers(ops, {} if jobs is None else jobs), int(ops.tile_width()),
                others=others)
