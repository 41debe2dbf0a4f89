"""The compile share CI builds (``python -m attnhal_triton.compile_coverage``): per (target,
kernel function, precision) the heaviest form by the register estimate and forms until every
code-choosing constexpr value is compiled, for cuda:80/90/100 and gfx942/950 in a child
process without TRITON_INTERPRET, 0 spills.
The whole enumeration is a command (docs/triton.md: counts, and which share runs)."""

from __future__ import annotations

import json
import textwrap
import time
from types import SimpleNamespace

from compiling import run_compiling

from attnhal.platform import parse
from attnhal_triton.compile_coverage import MLA_TIGHTEST, _demand, branches, register_demand, share
from attnhal_triton.compile_check import DEFAULT_TARGETS, compile_target, target_platform
from attnhal_triton.compile_forms import FORM_TARGETS
from attnhal_triton.compile_usage import _hip_usage, _ptxas, audit
from attnhal_triton.launch_forms import forms
from attnhal_triton.mla_forms import mla_forms
from attnhal_triton.work import row_dtype


def test_hip_registers_count_the_agprs_once() -> None:
    """gfx942's metadata: ``.vgpr_count`` is already VGPRs + AGPRs (456 = 256 + 200)."""
    asm = ("; NumVgprs: 256\n; NumAgprs: 200\n; TotalNumVgprs: 456\n.agpr_count: 200\n"
           ".vgpr_count: 456\n.vgpr_spill_count: 0\n.sgpr_spill_count: 0\n.private_segment_fixed_size: 0\n")
    assert _hip_usage(SimpleNamespace(asm={"amdgcn": asm}))["registers"] == 456
    no_comment = asm.replace("; TotalNumVgprs: 456\n", "")
    assert _hip_usage(SimpleNamespace(asm={"amdgcn": no_comment}))["registers"] == 456


def test_audit_names_an_fp32_dot_in_a_16_bit_form_and_shared_memory_over_the_target() -> None:
    ttgir = "%1 = tt.dot %a, %b, %c : tensor<16x16xf32> * tensor<16x16xf32> -> tensor<16x16xf32>"
    compiled = SimpleNamespace(asm={"ttgir": ttgir}, metadata=SimpleNamespace(shared=1024))
    gfx942 = SimpleNamespace(arch="gfx942")
    assert "fp32 tl.dot in a 16-bit kernel" in audit(compiled, gfx942, f32_dots=False)["error"]
    assert audit(compiled, gfx942, f32_dots=True) == {"registers": -1, "spills": -1, "scratch": -1, "shared": 1024,
                                                       "dot_types": ["f32"], "ok": True, "error": ""}
    compiled.metadata.shared = 65537
    assert audit(compiled, gfx942, f32_dots=True)["error"] == "shared memory 65537 B > 65536 B of the target"


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


def test_the_share_has_each_class_heaviest_and_every_branch() -> None:
    """Per (function, precision) class on cuda:90: its heaviest form by the estimate, and every
    value of every code-choosing constexpr of the class in some form of the share, two tree
    mask words included (the path that spilled 3.5 KB in fp32 MLA tree verify)."""
    platform = target_platform("cuda:90")
    enumerated = [*forms(platform), *mla_forms(platform)]
    picks = share("cuda:90")
    for function in ("decode_partial_kernel", "decode_reduce_kernel", "extend_kernel", "mla_kernel"):
        for fp32 in (False, True):
            members = [f for f in enumerated if f.function == function and (f.dtype == "float32") == fp32]
            mine = [f for f in picks if f.function == function and (f.dtype == "float32") == fp32]
            assert max(members, key=lambda f: _demand("cuda:90", f)) in mine
            assert set().union(*map(branches, mine)) == set().union(*map(branches, members)), (function, fp32)
            if function in ("extend_kernel", "mla_kernel"):
                assert any(f.constexprs["USE_MASK"] and f.constexprs["MASK_WORDS"] == 2 for f in mine)
    assert len(picks) <= 6 * 4 + len(MLA_TIGHTEST), "the share grew: CI compiles it on five targets"
    assert len(share("hip:gfx942", "kernel")) > len(share("hip:gfx942"))


def test_the_measured_tightest_mla_forms_are_enumerated_forms() -> None:
    assert {target for target, _ in MLA_TIGHTEST} == set(FORM_TARGETS)
    for target in FORM_TARGETS:
        enumerated = {(f.kernel, f.dtype, f.kv_dtype, f.example): f for f in mla_forms(target_platform(target))}
        picks = share(target)
        for precision in ("16-bit", "fp32"):
            spec = MLA_TIGHTEST[(target, precision)]
            assert (spec[1] == "float32") == (precision == "fp32") and enumerated[spec] in picks, (target, spec)


def test_the_share_compiles_spill_free_on_every_target() -> None:
    start = time.perf_counter()
    done = run_compiling("-m", "attnhal_triton.compile_coverage", "--json", "--jobs", "2", timeout=1800)
    rows = json.loads(done.stdout)
    print(f"{len(rows)} compiles in {time.perf_counter() - start:.0f} s")
    assert {r["target"] for r in rows} == set(FORM_TARGETS)
    assert len(rows) == sum(len(share(target)) for target in FORM_TARGETS)
    bad = [(r["target"], r["kernel"], r["dtype"], r["kv_dtype"], r["head_size"], r["error"])
           for r in rows if not r["ok"]]
    assert done.returncode == 0 and not bad, bad
    assert all(r["spills"] == 0 and r["headroom"] >= 0 and r["registers"] > 0 for r in rows)
    # The table itself, not spill relief, keeps the share spill-free: a row that makes its heaviest
    # forms spill is a regression even though relief would launch them clean.
    relieved = [(r["target"], r["kernel"], r["dtype"], r["kv_dtype"], r["relief"]) for r in rows if r["relief"]]
    assert not relieved, relieved


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


def test_cuda_figures_come_from_the_compiles_own_ptxas_run() -> None:
    """A compile's registers and spills are read from its own ``ptxas -v`` log (no second ptxas
    run: ~10 % of a form's compile); a Triton cache hit, which runs no ptxas, runs it again and
    reads the same figures."""
    script = textwrap.dedent("""
        from attnhal.platform import parse
        from attnhal_triton import compile_usage as cu
        from attnhal_triton.compile_check import _gpu_target
        from attnhal_triton.compile_forms import _scratch_cache, _source
        from attnhal_triton.launch_forms import forms

        form = forms(parse("cuda:sm90"), kernels=("decode",), head_sizes=(128,), groups=(4,))[0]
        calls, ptxas = [], cu._ptxas
        cu._ptxas = lambda arch: calls.append(arch) or ptxas(arch)  # ptxas run again by the audit
        with _scratch_cache():  # the first compiles (its own ptxas log), the second is a cache hit
            runs = [cu.compile_audited(_source(form, "cuda:90"), _gpu_target("cuda:90"), form.row.launch_options,
                                       False) for _ in range(2)]
        figures = [{k: r[k] for k in ("registers", "spills", "scratch")} for r in runs]
        print(figures[0]["registers"] > 0, figures[0] == figures[1], calls)
    """)
    done = run_compiling("-c", script, timeout=300)
    assert done.stdout.split() == ["True", "True", "[90]"], done.stderr[-2000:]
