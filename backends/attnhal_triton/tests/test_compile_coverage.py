"""The compile share CI builds (``python -m attnhal_triton.compile_coverage``): one form per
(target, kernel function, precision), the heaviest by the register estimate, compiled for
cuda:80/90/100 and gfx942/950 in a child process without TRITON_INTERPRET, 0 spills.
The whole enumeration is a command (docs/triton.md: counts, and which share runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from attnhal.platform import parse
from attnhal_triton.compile_coverage import MLA_TIGHTEST, gqa_share, mla_share, register_demand
from attnhal_triton.compile_check import DEFAULT_TARGETS, compile_target, target_platform
from attnhal_triton.compile_forms import FORM_TARGETS
from attnhal_triton.compile_usage import _hip_usage, _ptxas
from attnhal_triton.mla_compile_check import FORMS
from attnhal_triton.work import row_dtype


def test_hip_registers_count_the_agprs_once() -> None:
    """gfx942's metadata: ``.vgpr_count`` is already VGPRs + AGPRs (456 = 256 + 200)."""
    asm = ("; NumVgprs: 256\n; NumAgprs: 200\n; TotalNumVgprs: 456\n.agpr_count: 200\n"
           ".vgpr_count: 456\n.vgpr_spill_count: 0\n.sgpr_spill_count: 0\n.private_segment_fixed_size: 0\n")
    assert _hip_usage(SimpleNamespace(asm={"amdgcn": asm}))["registers"] == 456
    no_comment = asm.replace("; TotalNumVgprs: 456\n", "")
    assert _hip_usage(SimpleNamespace(asm={"amdgcn": no_comment}))["registers"] == 456


def test_ptxas_is_found_on_old_and_new_triton_releases(monkeypatch) -> None:
    """Triton 3.6 and 3.9 pick ptxas per architecture (``get_ptxas(arch)``); 3.4 has one
    (``get_ptxas()``): the compile check reads registers on both (docs/triton.md, Triton releases)."""
    import triton.backends.nvidia.compiler as nvidia

    monkeypatch.setattr(nvidia, "get_ptxas", lambda arch: SimpleNamespace(path=f"/ptxas-for-{arch}"))
    assert _ptxas(100) == "/ptxas-for-100"
    monkeypatch.setattr(nvidia, "get_ptxas", lambda: SimpleNamespace(path="/the-one-ptxas"))
    assert _ptxas(90) == "/the-one-ptxas"


def test_a_platform_names_its_compile_target() -> None:
    """What benchmarks/gpu_session.sh compiles the share for on a lent machine: the device's own target."""
    for target in (*DEFAULT_TARGETS, "cuda:100", "hip:gfx950"):
        assert compile_target(target_platform(target)) == target
    assert compile_target(parse("cuda:sm90")) == "cuda:90"


def test_an_fp32_cache_takes_the_fp32_rows() -> None:
    assert row_dtype("bfloat16", "float32") == "float32" and row_dtype("float16", "bfloat16") == "float16"
    assert row_dtype("bfloat16", "fp8_e4m3") == "bfloat16" and row_dtype("float32", "float16") == "float32"


def test_register_demand_grows_with_tiles_and_fp8_widening() -> None:
    base = dict(target="cuda:90", options={"num_warps": 4}, rows=32, n=64, d_qk=128, d_v=128)
    assert register_demand(**base, q_bytes=2, kv_bytes=2) < register_demand(**base, q_bytes=2, kv_bytes=4)
    assert register_demand(**base, q_bytes=2, kv_bytes=2) < register_demand(**base, q_bytes=2, kv_bytes=1)
    assert register_demand(**{**base, "options": {"num_warps": 8}}, q_bytes=2, kv_bytes=2) < \
        register_demand(**base, q_bytes=2, kv_bytes=2)
    hip = register_demand("hip:gfx942", {"num_warps": 4, "waves_per_eu": 2}, 32, 64, 128, 128, 2, 2)
    assert hip == register_demand("hip:gfx942", {"num_warps": 4}, 32, 64, 128, 128, 2, 2) * 2


def test_one_form_per_class() -> None:
    by_function = gqa_share("cuda:90")
    assert sorted((f.function, f.dtype == "float32") for f in by_function) == sorted(
        (fn, fp32) for fn in ("decode_partial_kernel", "decode_reduce_kernel", "extend_kernel") for fp32 in (0, 1))
    assert len(gqa_share("cuda:90", "kernel")) == 12 and len(mla_share("hip:gfx942", "kernel")) == 10
    assert {job.compute_dtype == "float32" for job in mla_share("cuda:80")} == {True, False}
    # cuda:80 has no e4m3 flavour: its 16-bit MLA pick is a 16-bit cache, the others' fp8.
    assert {j.dtype for j in mla_share("cuda:80") if j.dtype != "float32"} == {"bfloat16"}
    assert [(j.form, j.dtype) for j in mla_share("cuda:90") if j.dtype != "float32"] == [
        ("verify_tree_onepass_sepv", "fp8"), MLA_TIGHTEST[("cuda:90", "16-bit")]]
    assert all(form in FORMS for form, _ in MLA_TIGHTEST.values())


def test_the_share_compiles_spill_free_on_every_target() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "attnhal_triton.compile_coverage", "--json", "--jobs", "2"],
                          capture_output=True, text=True, env=env, check=False, timeout=1800)
    rows = json.loads(done.stdout)
    print(f"{len(rows)} compiles in {time.perf_counter() - start:.0f} s")
    # 8 a target, and the measured-tightest MLA form beside the estimate's on the 3 NVIDIA targets
    assert {r["target"] for r in rows} == set(FORM_TARGETS) and len(rows) == 8 * len(FORM_TARGETS) + 3
    bad = [(r["target"], r["kernel"], r["dtype"], r.get("kv_dtype"), r["head_size"], r["error"])
           for r in rows if not r["ok"]]
    assert done.returncode == 0 and not bad, bad
    assert all(r["spills"] == 0 and r["headroom"] >= 0 and r["registers"] > 0 for r in rows)


def test_the_backend_takes_the_fp32_rows_over_an_fp32_cache() -> None:
    """A bf16 model over an fp32 cache on sm90: the fp32 rows (the 16-bit rows spilled 208 bytes)."""
    from attnhal.phases import Phase
    from attnhal.platform import parse
    from attnhal_triton.launch_table import KERNELS, lookup
    from triton_cases import build, shape

    _, backend = build(shape(Phase.TARGET_VERIFY, head_size=128, dtype="bfloat16", kv_dtype="float32",
                             platform="cuda:sm90"))
    assert backend.rows == {k: lookup(k, parse("cuda:sm90"), 128, "float32") for k in KERNELS}
    assert backend.rows["extend_verify"] != lookup("extend_verify", parse("cuda:sm90"), 128, "bfloat16")
