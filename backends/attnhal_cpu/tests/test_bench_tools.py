"""The cpu benchmarks' host line and build comparison: what they print and build, without timing anything."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from repo import ROOT

pytest.importorskip("torch")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_host_line_names_model_flags_and_what_is_missing(tmp_path) -> None:
    bench = _module("decode_cpu")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\n"
                       "flags\t\t: fpu avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16\n")
    line = bench.host_line(str(cpuinfo))
    assert line.startswith("host: AMD EPYC (family 25 model 17)")
    assert "flags: avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16;" in line
    assert "lacks: avx512_fp16 amx_bf16;" in line and "torch capability" in line
    assert "cpu flags unknown" in bench.host_line(str(tmp_path / "missing"))


def test_build_comparison_renames_each_copy_and_refuses_an_unknown_isa(tmp_path) -> None:
    compare = _module("cpu_builds")
    copy = compare.sources(".", tmp_path / "b7", "attnhal_cpu_b7")
    text = (copy / "attention.cpp").read_text()
    assert "TORCH_LIBRARY(ATTNHAL_CPU_NS," in text and "TORCH_LIBRARY(attnhal_cpu," not in text
    from attnhal_cpu.build import kernel_spec

    assert "-DATTNHAL_CPU_NS=attnhal_cpu_b7" in kernel_spec("AVX2", copy, "attnhal_cpu_b7").cflags
    before = "d7014b3"  # a revision whose sources name the namespace literally
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", before], capture_output=True).returncode == 0:
        old = compare.sources(before, tmp_path / "old", "attnhal_cpu_b8")
        assert "TORCH_LIBRARY_IMPL(attnhal_cpu_b8," in (old / "attention.cpp").read_text()
    assert {p.name for p in copy.iterdir()} == {p.name for p in (ROOT / "backends/attnhal_cpu/csrc").iterdir()}
    with pytest.raises(SystemExit, match=r"ISA='AVX9' \(supported: REV@ISA with ISA in \["):
        compare.load(".@AVX9", 0, tmp_path)


def test_summary_restates_each_build_on_the_acceptance_shape() -> None:
    bench = _module("decode_cpu")
    from attnhal_cpu import CpuBackend

    paged = [bench.Contender("cpu avx2", CpuBackend), bench.Contender("cpu default", CpuBackend)]
    result = bench.Result(16, 2048, "float32", kv_bytes=10 ** 9, read_gbs=20.0,
                          seconds={"sdpa gqa": 0.2, "sdpa folded": 0.1, "cpu avx2 p16": 0.08, "cpu avx2 p64": 0.05})
    other = bench.Result(1, 8192, "float32", kv_bytes=10 ** 9, read_gbs=20.0,
                         seconds={"sdpa gqa": 0.2, "sdpa folded": 0.1, "cpu avx2 p16": 0.01})
    text = bench.summary([result, other], paged)
    assert text.splitlines()[1] == "  cpu avx2: float32 p16 62% 1.25x; float32 p64 100% 2.00x", text
    assert "cpu default" not in text  # no figures, no line


def test_parameter_comparison_refuses_a_bad_set_before_building_anything() -> None:
    params = _module("cpu_params")
    with pytest.raises(SystemExit, match=r"PARAMS: 'tile=8' \(supported: NAME=INT with NAME in \["):
        params.main(["-", "tile=8"])


def test_read_order_probe_builds_and_prints_every_order(tmp_path) -> None:
    """benchmarks/cpu_read_order.c (the access order's read ceiling, docs/cpu.md): it compiles
    warning-free and runs a small pool; a bad size is refused with exit 2, naming the rule."""
    import shutil
    import subprocess

    if shutil.which("cc") is None or "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("needs a C compiler and an AVX2 host")
    exe = tmp_path / "probe"
    build = subprocess.run(["cc", "-O2", "-mavx2", "-fopenmp", "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                            str(ROOT / "benchmarks" / "cpu_read_order.c")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe), "2", "16", "2", "64", "16"], capture_output=True, text=True, timeout=60,
                         env={"OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    names = [line.split("  ")[1].strip() for line in run.stdout.splitlines()[1:]]
    orders = ["head-major", "2 heads a pass", "4 heads a pass", "slot-major"]
    assert names == ["sequential", *(f"{o}{p}" for o in orders for p in ("", ", prefetch 16"))]
    refused = subprocess.run([str(exe), "2", "7", "2", "64"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "CTX a multiple of PAGE" in refused.stderr
