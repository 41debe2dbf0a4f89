"""A cache for one native library that no killed build can hang or poison.

An entry is one directory, ``<root>/<name>-<tag>-<digest>/``, whose digest covers
everything the binary depends on: every source and header (by content), the compiler
(its path and ``--version``), the flags and the caller's identity strings (torch
version, platform). An edit to any header therefore lands in a new entry, and two
different compilers never share one. The entry holds

- ``<name>.so``: the installed library. It appears only by an atomic rename of a
  finished link, so its presence means "built", and it is the only file ever loaded;
- ``lock``: locked while a process builds (:mod:`attnhal_cpu.buildlock`: the kernel
  releases it when its holder dies, so a killed build never blocks a later one); it
  names the holder's pid, host and start time, which a waiter quotes;
- ``failed.txt``: why the last build failed (kept until a build succeeds);
- ``tmp-<pid>-<token>/``: a build in progress; ones left by killed builders are
  removed by the next builder (it holds the lock, so no other build can be running),
  after it stops any compiler still running there.

Waiting for the lock and every compiler or linker step are bounded
(``ATTNHAL_CPU_BUILD_TIMEOUT`` seconds, default 600); the wait ends with a
:class:`BuildError` naming the lock file and its holder. Progress goes to a callback
(stderr by default) as ``(stage, message)``: ``wait`` when the lock is taken and every few
seconds after; ``locked``, ``compile`` and ``link`` (each reported while its command runs),
``install``, ``built`` or ``failed`` once; ``progress`` every few seconds of a long step.

Linux and macOS only: ``fcntl`` is required (on Windows every build fails with a
:class:`BuildError` saying so; the kernel's GCC vector extensions do not build with
MSVC either).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from attnhal.errors import AttnhalError
from attnhal_cpu import buildlock

__all__ = ["BuildError", "CacheState", "Compiler", "Entry", "LibrarySpec", "Progress", "cache_root",
           "cache_state", "discard", "ensure_built", "find_compiler", "locate", "report_to_stderr",
           "timeout_s", "ROOT_ENV", "TIMEOUT_ENV"]

ROOT_ENV = "ATTNHAL_CPU_BUILD_DIR"
TIMEOUT_ENV = "ATTNHAL_CPU_BUILD_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
#: Seconds between progress messages while waiting or compiling.
PROGRESS_EVERY_S = 10.0

#: ``progress(stage, message)``; an empty message is a stage with nothing to print.
Progress = Callable[[str, str], None]


class BuildError(AttnhalError, RuntimeError):
    """The library could not be built or loaded (the message says why)."""


@dataclass(frozen=True)
class LibrarySpec:
    """What to build: ``sources`` are compiled, ``headers`` only hashed (they are included).

    ``tag`` is the readable part of the entry name (e.g. the instruction set);
    ``identity`` holds anything else the binary depends on (e.g. the torch version).
    """

    name: str
    tag: str
    sources: tuple[Path, ...]
    headers: tuple[Path, ...]
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    identity: tuple[str, ...] = ()


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str


@dataclass(frozen=True)
class Entry:
    """One cache entry: where ``spec`` built with ``compiler`` lives."""

    spec: LibrarySpec
    compiler: Compiler
    directory: Path

    @property
    def library(self) -> Path:
        return self.directory / f"{self.spec.name}.so"

    @property
    def lock_path(self) -> Path:
        return self.directory / "lock"

    @property
    def failure_path(self) -> Path:
        return self.directory / "failed.txt"


@dataclass(frozen=True)
class CacheState:
    """``built``, ``building`` (``detail``: the holder), ``failed`` (``detail``: why), ``interrupted``
    (a builder died half-way; ``detail`` says which) or ``not built``."""

    state: str
    detail: str = ""

    def __str__(self) -> str:
        if self.state == "building":
            return f"building by {self.detail}"
        return f"{self.state}: {self.detail}" if self.detail else self.state


def cache_root() -> Path:
    """``$ATTNHAL_CPU_BUILD_DIR``, else ``$XDG_CACHE_HOME/attnhal/cpu-kernel`` (default ``~/.cache``)."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnhal" / "cpu-kernel"


def timeout_s() -> float:
    """The bound on waiting for the lock and on each compiler step (``$ATTNHAL_CPU_BUILD_TIMEOUT``)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise BuildError(f"{TIMEOUT_ENV}={raw!r} (supported: a number of seconds > 0)")
    return value


def report_to_stderr(stage: str, message: str) -> None:
    if message:
        print(f"attnhal_cpu: {message}", file=sys.stderr, flush=True)


def find_compiler() -> Compiler:
    """``$CXX`` (default ``c++``) on PATH, with its ``--version`` (both go into the entry's key)."""
    name = os.environ.get("CXX") or "c++"
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"CXX={name} not found (supported: a C++17 compiler on PATH, or its path in CXX)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"CXX={path} --version failed: {exc}") from exc
    if out.returncode != 0:
        raise BuildError(f"CXX={path} --version exited {out.returncode}: {out.stderr.strip()[:200]}")
    return Compiler(path, out.stdout.strip())


def _digest(spec: LibrarySpec, compiler: Compiler) -> str:
    h = hashlib.sha256()

    def add(*parts: str | bytes) -> None:
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            h.update(len(data).to_bytes(8, "little") + data)

    add(spec.name, compiler.path, compiler.version, *spec.cflags, "|", *spec.ldflags, "|", *spec.identity)
    for path in sorted((*spec.sources, *spec.headers), key=lambda p: p.name):
        add(path.name, path.read_bytes())
    return h.hexdigest()[:16]


def locate(spec: LibrarySpec, root: Path | None = None, compiler: Compiler | None = None) -> Entry:
    """The entry ``spec`` builds into (finding the compiler unless given). Touches no file."""
    compiler = compiler or find_compiler()
    root = root if root is not None else cache_root()
    return Entry(spec, compiler, root / f"{spec.name}-{spec.tag}-{_digest(spec, compiler)}")


@contextmanager
def _locked(entry: Entry, timeout: float, progress: Progress) -> Iterator[None]:
    """Hold ``entry``'s lock; wait at most ``timeout`` s for it, saying so every few seconds."""
    if not buildlock.supported():
        raise BuildError(f"sys.platform={sys.platform} (supported: Linux and macOS; the build lock needs fcntl)")
    entry.directory.mkdir(parents=True, exist_ok=True)

    def waiting(holder: str, waited: float) -> None:
        progress("wait", f"waiting for the build lock {entry.lock_path}, held by {holder} "
                         f"({waited:.0f} s of at most {timeout:g} s)")

    try:
        with buildlock.exclusive(entry.lock_path, timeout, waiting, PROGRESS_EVERY_S):
            yield
    except buildlock.LockTimeout as exc:
        raise BuildError(f"{exc} (the bound is {TIMEOUT_ENV}={timeout:g}; a build takes about a minute)") from None


# --- building -------------------------------------------------------------------------------

def _important(log: str) -> str:
    """The lines of compiler output that say what went wrong (the whole output can be long)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    keep = [ln for ln in lines if "error" in ln.lower() or "not found" in ln.lower()] or lines[-4:]
    return " | ".join(keep[:4])[:600]


def _run_step(stage: str, what: str, argv: list[str], workdir: Path, timeout: float, progress: Progress) -> None:
    """Run one compiler or linker command; its output goes to a log file (no pipe to fill)."""
    log_path = workdir / f"{stage}.log"
    with open(log_path, "w") as log:  # a session of its own: stopping it stops cc1plus/as/ld too
        proc = subprocess.Popen(argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (workdir / "session").write_text(str(proc.pid))  # for the next builder, should this one be killed
    start = time.monotonic()
    deadline, note = start + timeout, start + PROGRESS_EVERY_S
    try:
        progress(stage, f"{what} in {workdir}")
        while True:
            try:
                code = proc.wait(timeout=max(0.0, min(deadline, note) - time.monotonic()))
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now >= deadline:
                    raise BuildError(f"{what} ran past {timeout:g} s ({TIMEOUT_ENV})") from None
                if now >= note:
                    note += PROGRESS_EVERY_S
                    progress("progress", f"still {what} ({now - start:.0f} s)")
    finally:
        if proc.poll() is None:  # interrupted or timed out: leave no compiler behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if code != 0:
        raise BuildError(f"{what} failed (exit {code}): {_important(log_path.read_text(errors='replace'))}")


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _stop_strays(workdir: Path) -> None:
    """Kill the compiler a killed builder left running in ``workdir`` (the kernel reparents it,
    and it would compete with this build for the CPU): the processes of its recorded session
    whose working directory is ``workdir``. Found through /proc, so on Linux only; elsewhere
    it runs to its end, writing only into a directory that is removed."""
    proc, record = Path("/proc"), workdir / "session"
    text = record.read_text().strip() if record.exists() else ""
    if not proc.is_dir() or not text.isdigit():
        return
    session, where = int(text), str(workdir.resolve())
    for pid in (int(p.name) for p in proc.iterdir() if p.name.isdigit()):
        try:
            if os.getsid(pid) == session and os.readlink(proc / str(pid) / "cwd") == where:
                os.kill(pid, signal.SIGKILL)
        except OSError:  # gone, or not ours to inspect
            continue


def _build(entry: Entry, timeout: float, progress: Progress) -> None:
    """Compile and link in a fresh temporary directory, then rename the library into place."""
    for leftover in entry.directory.glob("tmp-*"):  # from builders that died: we hold the lock
        _stop_strays(leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    spec, cxx = entry.spec, entry.compiler.path
    workdir = entry.directory / f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
    workdir.mkdir()
    try:
        objects = []
        for source in spec.sources:
            obj = workdir / f"{source.stem}.o"
            _run_step("compile", f"compiling {source.name} for {spec.tag}",
                      [cxx, "-fPIC", *spec.cflags, "-c", str(source), "-o", str(obj)], workdir, timeout, progress)
            objects.append(str(obj))
        linked = workdir / entry.library.name
        _run_step("link", f"linking {linked.name}", [cxx, *objects, "-shared", *spec.ldflags, "-o", str(linked)],
                  workdir, timeout, progress)
        progress("install", "")
        os.replace(linked, entry.library)
        entry.failure_path.unlink(missing_ok=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def ensure_built(entry: Entry, progress: Progress = report_to_stderr, timeout: float | None = None) -> bool:
    """Make ``entry.library`` exist; True when this call compiled it.

    The library is never half there: it is renamed into place after a complete link. A
    failure (or an interruption) is recorded in ``failed.txt`` and raised; the next call
    builds again.
    """
    if entry.library.exists():
        return False
    timeout = timeout_s() if timeout is None else timeout
    with _locked(entry, timeout, progress):
        if entry.library.exists():  # built by the process we waited for
            return False
        # A first build takes about a minute of compiling with no output of its own: say so up front.
        progress("locked", f"building {entry.library.name} once, on first use (about a minute; later runs "
                           f"load it from {entry.directory})")
        start = time.monotonic()
        try:
            _build(entry, timeout, progress)
        except BaseException as exc:
            reason = str(exc) if isinstance(exc, BuildError) else f"{type(exc).__name__}: {exc}"
            _write_atomically(entry.failure_path, reason)
            progress("failed", f"build of {entry.library.name} failed: {reason}")
            raise
        progress("built", f"built {entry.library} in {time.monotonic() - start:.1f} s")
    return True


def discard(entry: Entry, reason: str) -> None:
    """Remove an installed library that will not load, so that the next run rebuilds it."""
    with _locked(entry, timeout_s(), report_to_stderr):
        entry.library.unlink(missing_ok=True)
        _write_atomically(entry.failure_path, reason)


def cache_state(entry: Entry) -> CacheState:
    """What the cache holds for ``entry`` now (reads files and probes the lock; builds nothing)."""
    if entry.library.exists():
        return CacheState("built")
    holder = buildlock.holder(entry.lock_path)
    if holder is not None:
        return CacheState("building", holder)
    if entry.failure_path.exists():
        return CacheState("failed", entry.failure_path.read_text(errors="replace").strip())
    leftovers = sorted(p.name.split("-")[1] for p in entry.directory.glob("tmp-*"))
    if leftovers:
        return CacheState("interrupted", f"the build by pid {leftovers[0]} stopped before it finished; "
                                         "the next run rebuilds")
    return CacheState("not built")
