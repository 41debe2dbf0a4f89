"""The cpu kernel's build cache: a killed build never hangs or poisons a later one.

Most tests build a tiny library (``tests/helpers/cpu_build_child.py``: a header and a one-line
function, no torch headers, well under a second to compile) through the same
``attnhal_cpu.buildcache`` code the kernel uses, in child processes that are killed at
chosen stages. The compiler is a wrapper script around ``c++`` that the tests can make
slow (so that a kill at ``compile``/``link`` lands while the command runs), fail, or hang.
One end-to-end check on the real kernel (``attnhal info`` after a killed first build)
compiles it from scratch and runs with ``ATTNHAL_SLOW=1``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnhal_cpu import buildcache, buildlock
from attnhal_cpu.buildcache import BuildError, cache_state, ensure_built, locate
from cpu_build_child import tiny_spec, write_sources
from repo import ROOT

CHILD = ROOT / "tests" / "helpers" / "cpu_build_child.py"
pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "c++") is None or not buildlock.supported(),
                                reason="needs a C++ compiler and fcntl")

WRAPPER = """#!/bin/sh
# c++, slowed down, failing or hanging while a file of that name sits next to this script
d=$(dirname "$0")
case " $* " in *" --version "*) exec {cxx} "$@";; esac
if [ -f "$d/fail" ]; then echo "tiny.cpp:1: error: injected failure" >&2; exit 1; fi
if [ -f "$d/hang" ]; then exec sleep 60; fi
case " $* " in *" -c "*) [ -f "$d/slow-compile" ] && sleep 5;; *" -shared "*) [ -f "$d/slow-link" ] && sleep 5;; esac
exec {cxx} "$@"
"""


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """(sources, cache root, wrapper dir, env with CXX = the wrapper)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cxx = bin_dir / "cxx"
    cxx.write_text(WRAPPER.format(cxx=shutil.which(os.environ.get("CXX") or "c++")))
    cxx.chmod(0o755)
    env = {**os.environ, "CXX": str(cxx)}
    return write_sources(tmp_path / "src", 42), tmp_path / "cache", bin_dir, env


def child(src: Path, root: Path, env: dict[str, str], *flags: str) -> tuple[int, list[dict[str, object]]]:
    out = subprocess.run([sys.executable, str(CHILD), "--src", str(src), "--root", str(root), *flags],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    return out.returncode, [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def stages(lines: list[dict[str, object]]) -> list[object]:
    return [line["stage"] for line in lines if "stage" in line]


def running_in(directory: Path) -> list[int]:
    """Processes whose working directory lies in ``directory`` (Linux; elsewhere none are seen)."""
    found = []
    for pid in (p.name for p in Path("/proc").glob("[0-9]*")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(directory.resolve())):
                found.append(int(pid))
        except OSError:
            continue
    return found


def entry_of(src: Path, root: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> buildcache.Entry:
    monkeypatch.setenv("CXX", env["CXX"])
    return locate(tiny_spec(src), root)


@pytest.mark.parametrize("stage", ["locked", "compile", "link", "install"])
def test_killed_build_leaves_nothing_loadable_and_the_next_run_builds(setup, monkeypatch, stage) -> None:
    """SIGKILL before the compile (lock held), while the compiler runs, while the linker
    runs, and after the link but before the install: no library appears, the OS released
    the lock, and the next run builds and loads."""
    src, root, bin_dir, env = setup
    slow = bin_dir / f"slow-{stage}"  # a compile or link command then runs for 5 s
    slow.touch()
    code, lines = child(src, root, env, "--kill-at", stage)
    assert code == -signal.SIGKILL and stages(lines)[-1] == stage, lines
    entry = entry_of(src, root, env, monkeypatch)
    assert not entry.library.exists()
    assert buildlock.holder(entry.lock_path) is None
    assert cache_state(entry).state == ("not built" if stage == "locked" else "interrupted"), cache_state(entry)
    slow.unlink()
    code, lines = child(src, root, env)
    assert code == 0 and lines[-1] == {"compiled": True, "answer": 42}, lines
    assert "wait" not in stages(lines)
    assert cache_state(entry).state == "built"
    assert not list(entry.directory.glob("tmp-*"))  # the killed build's directory is gone,
    assert not running_in(entry.directory)          # and so is the compiler it left running


def test_two_builds_at_once_compile_once(setup, tmp_path) -> None:
    """A holds the lock and is compiling when B starts; B waits, then loads A's build."""
    src, root, _, env = setup
    b_waits = tmp_path / "b-waits"
    a = subprocess.Popen([sys.executable, str(CHILD), "--src", str(src), "--root", str(root),
                          "--pause-at", "compile", "--until", str(b_waits)],
                         stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert a.stdout is not None
    a_lines = []
    for line in a.stdout:  # until A is compiling
        a_lines.append(json.loads(line))
        if a_lines[-1].get("stage") == "compile":
            break
    code_b, b_lines = child(src, root, env, "--touch-at", "wait", "--touch", str(b_waits))
    a_lines += [json.loads(line) for line in a.stdout if line.strip()]
    assert a.wait(timeout=60) == 0 and code_b == 0, (a_lines, b_lines)
    assert stages(a_lines).count("compile") == 1 and "compile" not in stages(b_lines), (a_lines, b_lines)
    assert "wait" in stages(b_lines)
    assert a_lines[-1] == {"compiled": True, "answer": 42} and b_lines[-1] == {"compiled": False, "answer": 42}


def test_lock_left_by_a_dead_process_does_not_block(setup, monkeypatch) -> None:
    src, root, _, env = setup
    entry = entry_of(src, root, env, monkeypatch)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    entry.directory.mkdir(parents=True)
    entry.lock_path.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "earlier"}))
    start = time.monotonic()
    code, lines = child(src, root, env, "--timeout", "30")
    assert code == 0 and lines[-1] == {"compiled": True, "answer": 42}, lines
    assert "wait" not in stages(lines) and time.monotonic() - start < 30


def test_wait_past_the_bound_names_the_lock_and_its_holder(setup, tmp_path, monkeypatch) -> None:
    src, root, _, env = setup
    holder = subprocess.Popen([sys.executable, str(CHILD), "--src", str(src), "--root", str(root),
                               "--pause-at", "locked", "--until", str(tmp_path / "never")],
                              stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline())["stage"] == "locked"
        entry = entry_of(src, root, env, monkeypatch)
        state = cache_state(entry)
        assert state.state == "building" and f"pid {holder.pid} " in str(state), state
        start = time.monotonic()
        code, lines = child(src, root, env, "--timeout", "1.5")
        waited = time.monotonic() - start
        assert code == 1, lines
        error = str(lines[-1]["error"])
        assert str(entry.lock_path) in error and f"pid {holder.pid} on host {socket.gethostname()}" in error, error
        assert "ATTNHAL_CPU_BUILD_TIMEOUT" in error and 1.5 <= waited < 20, (error, waited)
        assert "wait" in stages(lines)
    finally:
        holder.kill()
        holder.wait()
    assert buildlock.holder(entry.lock_path) is None


def test_header_only_edit_rebuilds(setup, monkeypatch) -> None:
    """The key hashes headers too: editing only the header builds a new entry with the new value."""
    src, root, _, env = setup
    first = entry_of(src, root, env, monkeypatch)
    assert ensure_built(first, lambda stage, message: None) is True
    assert ensure_built(first, lambda stage, message: None) is False
    write_sources(src, 43)  # tiny.cpp unchanged, tiny.h changed
    second = locate(tiny_spec(src), root)
    assert second.directory != first.directory
    assert ensure_built(second, lambda stage, message: None) is True
    assert ctypes.CDLL(str(second.library)).tiny_answer() == 43
    assert ctypes.CDLL(str(first.library)).tiny_answer() == 42


def test_kernel_key_covers_every_header(tmp_path) -> None:
    """The real kernel's spec lists every csrc header, and a one-byte header edit changes its entry."""
    pytest.importorskip("torch")
    from attnhal_cpu.build import SOURCE_DIR, kernel_spec

    spec = kernel_spec("DEFAULT")
    assert {p.name for p in spec.headers} == {p.name for p in SOURCE_DIR.glob("*.h")} >= {"simd.h", "tiles.h",
                                                                                          "worker.h"}
    assert [p.name for p in spec.sources] == ["attention.cpp"]
    copy = tmp_path / "csrc"
    shutil.copytree(SOURCE_DIR, copy)
    before = locate(kernel_spec("DEFAULT", copy), tmp_path).directory
    (copy / "tiles.h").write_text((copy / "tiles.h").read_text() + "\n")
    assert locate(kernel_spec("DEFAULT", copy), tmp_path).directory != before


def test_bf16_dot_is_chosen_only_where_cpu_and_compiler_have_it(monkeypatch, tmp_path) -> None:
    """AVX512_BF16 needs an AVX-512 capability, the CPU's avx512_bf16 and a compiler that takes
    -mavx512bf16; the choice is part of the cache key (its own entry, its own flags)."""
    pytest.importorskip("torch")
    from attnhal_cpu import build
    from attnhal_cpu.buildcache import find_compiler

    compiler = find_compiler()
    for cpu, cc, capability, want in [(True, True, "AVX512", "AVX512_BF16"), (False, True, "AVX512", "AVX512"),
                                      (True, False, "AVX512", "AVX512"), (True, True, "AVX2", "AVX2"),
                                      (True, True, "DEFAULT", "DEFAULT")]:
        monkeypatch.setattr(build, "cpu_has_bf16_dot", lambda cpu=cpu: cpu)
        monkeypatch.setattr(build, "compiler_has_bf16_dot", lambda _c, cc=cc: cc)
        assert build.choose_isa(capability, compiler) == want, (cpu, cc, capability)
    dot, plain = (locate(build.kernel_spec(isa), tmp_path, compiler) for isa in ("AVX512_BF16", "AVX512"))
    assert dot.directory != plain.directory and "avx512_bf16" in dot.directory.name
    assert "-mavx512bf16" in dot.spec.cflags and "-mavx512bf16" not in plain.spec.cflags


def test_compiler_probe_for_the_bf16_dot(tmp_path) -> None:
    """A compiler that rejects -mavx512bf16 (or is missing) is answered False."""
    from attnhal_cpu import build
    from attnhal_cpu.buildcache import Compiler

    refusing = tmp_path / "cc"
    refusing.write_text("#!/bin/sh\necho 'error: unrecognized option' >&2\nexit 1\n")
    refusing.chmod(0o755)
    assert not build.compiler_has_bf16_dot(Compiler(str(refusing), "refusing 1.0"))
    assert not build.compiler_has_bf16_dot(Compiler(str(tmp_path / "missing"), "missing"))


def test_this_host_builds_the_bf16_dot_when_it_has_one() -> None:
    """Where torch reports AVX512 and the CPU has avx512_bf16 (and g++ >= 10 / clang >= 9 take
    the flag), the loaded kernel is the bf16-dot build and says so."""
    torch = pytest.importorskip("torch")
    from attnhal_cpu import build
    from attnhal_cpu.buildcache import find_compiler

    compiler = find_compiler()
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not build.cpu_has_bf16_dot():
        pytest.skip("this CPU has no avx512_bf16 (or torch does not report AVX512)")
    if not build.compiler_has_bf16_dot(compiler):
        pytest.skip(f"{compiler.path} does not take -mavx512bf16")
    native = build.native_build()
    assert native.ok and native.isa.startswith("AVX512_BF16: avx512, bf16 dot"), native.describe()


def test_failed_build_is_recorded_and_the_next_run_builds(setup, monkeypatch) -> None:
    src, root, bin_dir, env = setup
    (bin_dir / "fail").touch()
    code, lines = child(src, root, env)
    assert code == 1 and "injected failure" in str(lines[-1]["error"]), lines
    entry = entry_of(src, root, env, monkeypatch)
    state = cache_state(entry)
    assert state.state == "failed" and "injected failure" in str(state), state
    (bin_dir / "fail").unlink()
    code, lines = child(src, root, env)
    assert code == 0 and lines[-1] == {"compiled": True, "answer": 42}, lines
    assert cache_state(entry).state == "built" and not entry.failure_path.exists()


def test_a_hung_compiler_is_stopped_at_the_bound(setup, monkeypatch) -> None:
    src, root, bin_dir, env = setup
    (bin_dir / "hang").touch()
    start = time.monotonic()
    code, lines = child(src, root, env, "--timeout", "1")
    assert code == 1 and "ran past 1 s" in str(lines[-1]["error"]) and time.monotonic() - start < 30, lines
    assert cache_state(entry_of(src, root, env, monkeypatch)).state == "failed"


def test_bad_timeout_and_missing_fcntl_are_reasons(setup, monkeypatch) -> None:
    src, root, _, env = setup
    entry = entry_of(src, root, env, monkeypatch)
    monkeypatch.setenv("ATTNHAL_CPU_BUILD_TIMEOUT", "soon")
    with pytest.raises(BuildError, match=r"ATTNHAL_CPU_BUILD_TIMEOUT='soon' \(supported: a number of seconds > 0\)"):
        ensure_built(entry)
    monkeypatch.delenv("ATTNHAL_CPU_BUILD_TIMEOUT")
    monkeypatch.setattr(buildlock, "fcntl", None)
    with pytest.raises(BuildError, match=r"supported: Linux and macOS"):
        ensure_built(entry)


def test_cache_root_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ATTNHAL_CPU_BUILD_DIR", str(tmp_path / "mine"))
    assert buildcache.cache_root() == tmp_path / "mine"
    monkeypatch.delenv("ATTNHAL_CPU_BUILD_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert buildcache.cache_root() == tmp_path / "xdg" / "attnhal" / "cpu-kernel"


def test_kernel_library_that_will_not_load_is_discarded(tmp_path, monkeypatch) -> None:
    """An installed file that dlopen refuses is removed (the next run rebuilds), with the reason."""
    pytest.importorskip("torch")
    from attnhal_cpu import build

    monkeypatch.setenv("ATTNHAL_CPU_BUILD_DIR", str(tmp_path))
    entry = locate(build.kernel_spec("DEFAULT"))
    entry.directory.mkdir(parents=True)
    entry.library.write_bytes(b"not a shared library")
    with pytest.raises(BuildError, match="did not load"):
        build._load(entry)
    assert not entry.library.exists()
    assert cache_state(entry).state == "failed"


@pytest.mark.skipif(not os.environ.get("ATTNHAL_SLOW"), reason="compiles the real kernel from scratch: ATTNHAL_SLOW=1")
def test_attnhal_info_finishes_after_a_killed_first_build(tmp_path) -> None:
    """The real kernel: `attnhal info --build` killed while compiling, then run again."""
    env = {**os.environ, "ATTNHAL_CPU_BUILD_DIR": str(tmp_path / "cache")}
    env.pop("ATTNHAL_CPU_BUILD_TIMEOUT", None)
    argv = [sys.executable, "-c", "from attnhal.cli import main; main(['info', '--build'])"]
    first = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    assert first.stderr is not None
    seen = []
    for line in first.stderr:
        seen.append(line)
        if "compiling attention.cpp" in line:
            break
    time.sleep(3)  # well into the compile
    first.kill()
    first.wait()
    assert any("compiling attention.cpp" in line for line in seen), seen
    start = time.monotonic()
    second = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    took = time.monotonic() - start
    assert second.returncode == 0, second.stderr
    cpu = next(line for line in second.stdout.splitlines() if line.startswith("cpu "))
    assert " available " in cpu, second.stdout
    assert "compiled and loaded" in second.stdout and ": built" in second.stdout, second.stdout
    assert not running_in(tmp_path / "cache")  # the first run's compiler was stopped, not waited for
    print(f"second run: {took:.1f} s")


def test_info_build_shows_the_cache_entry_and_its_state_in_text_and_json(capsys) -> None:
    pytest.importorskip("torch")
    from attnhal.cli import main
    from attnhal_cpu.build import native_build

    build = native_build()
    if not build.ok or build.entry is None:
        pytest.skip(f"cpu kernel unavailable: {build.error}")
    main(["info", "--json", "--build"])
    data = json.loads(capsys.readouterr().out)
    assert f"cache {build.entry.directory}: built" in data["builds"]["cpu"], data["builds"]
    assert f"parameters: {build.parameters()}" in data["builds"]["cpu"]
    main(["info", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert "builds" not in data and data["parameters"]["cpu"] == f"{build.name}: {build.parameters()}", data["parameters"]
    main(["info", "--build"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cpu ") and "attnhal_cpu_" in ln]
    line = next(ln for ln in lines if " cache " in ln)
    assert f"cache {build.entry.directory}: built" in line, line
    assert any(ln.split(None, 1)[1] == f"{build.name}: {build.parameters()}" for ln in lines), lines  # measured or not


def test_a_first_build_shows_its_progress_on_stderr(setup, monkeypatch, capsys) -> None:
    """By default (no progress callback) a first build says it is one, what it compiles while it
    runs, and when it is done; a build already in the cache says nothing."""
    src, root, bin_dir, env = setup
    (bin_dir / "slow-compile").touch()
    monkeypatch.setattr(buildcache, "PROGRESS_EVERY_S", 1.0)
    entry = entry_of(src, root, env, monkeypatch)
    assert ensure_built(entry) is True
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"attnhal_cpu: building {entry.library.name} once, on first use (about a minute")
    assert any(line.startswith("attnhal_cpu: compiling tiny.cpp for ") for line in lines), lines
    assert any(line.startswith("attnhal_cpu: still compiling tiny.cpp") for line in lines), lines
    assert lines[-1].startswith(f"attnhal_cpu: built {entry.library} in "), lines
    assert ensure_built(entry) is False and capsys.readouterr().err == ""
