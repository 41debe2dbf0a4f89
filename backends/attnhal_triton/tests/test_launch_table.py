"""Triton backend: launch table lookups, descriptor, light imports and the cross-vendor compile
check (in a subprocess without TRITON_INTERPRET). Its vendor-branch scan is the repository-wide one
in tests/core/test_invariants.py."""

import os

# Before triton or any kernel module is imported: triton reads it at decoration time.
os.environ["TRITON_INTERPRET"] = "1"

import dataclasses  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from compiling import run_compiling  # noqa: E402

from attnhal.backend import AttentionConfig, KVPool  # noqa: E402
from attnhal.capabilities import Feature, Phase, SpecLimits  # noqa: E402
from attnhal.platform import Fp8Flavor, parse  # noqa: E402
from attnhal_triton import CAPABILITIES, FALLBACK, NoLaunchRowWarning, lookup  # noqa: E402
from attnhal_triton.compile_check import DEFAULT_TARGETS, DTYPES, HEAD_SIZES, VARIANTS, target_platform  # noqa: E402
from attnhal_triton.device_fill import UNITS  # noqa: E402
from attnhal_triton.launch_table import (  # noqa: E402
    ALIASES,
    EXTEND_VARIANTS,
    KERNELS,
    LaunchRow,
    rows_for,
)

HIP_ONLY = {"waves_per_eu", "matrix_instr_nonkdim", "kpack"}
KNOWN = {"cuda:sm80": "sm80", "cuda:sm90": "sm90", "cuda:sm120": "sm120", "hip:gfx90a": "gfx90",
         "hip:gfx942": "gfx94", "hip:gfx950": "gfx95"}


# --- lookup ---------------------------------------------------------------------------

def _no_warning(kernel: str, spec: str, head: int = 128, dtype: str = "float16") -> LaunchRow:
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoLaunchRowWarning)
        return lookup(kernel, parse(spec), head, dtype)


@pytest.mark.parametrize("kernel", KERNELS)
def test_hip_gfx942_picks_the_gfx94_hip_row(kernel: str) -> None:
    row = _no_warning(kernel, "hip:gfx942")
    assert (row.vendor, row.arch_family) == ("hip", "gfx94")
    if kernel != "decode_reduce":
        assert HIP_ONLY <= set(row.launch_options)


@pytest.mark.parametrize("kernel", KERNELS)
def test_cuda_sm90_picks_the_sm90_row_without_hip_options(kernel: str) -> None:
    row = _no_warning(kernel, "cuda:sm90")
    assert (row.vendor, row.arch_family) == ("cuda", "sm90")
    assert not HIP_ONLY & set(row.launch_options)


@pytest.mark.parametrize("spec", ["hip:gfx1100", "cuda:sm75", "cuda:sm103"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_unknown_arch_takes_the_fallback_with_a_warning(kernel: str, spec: str) -> None:
    platform = parse(spec)
    with pytest.warns(NoLaunchRowWarning, match=platform.arch):
        row = lookup(kernel, platform, 128, "bfloat16")
    assert row in FALLBACK and row.vendor is None and not HIP_ONLY & set(row.launch_options)


def test_the_interpreter_row_serves_cpu_without_a_warning() -> None:
    for kernel in KERNELS:
        assert _no_warning(kernel, "cpu").vendor == "cpu"


@pytest.mark.parametrize("spec", sorted(KNOWN))
def test_every_known_family_has_a_general_row_per_kernel(spec: str) -> None:
    platform = parse(spec)
    assert platform.arch_family == KNOWN[spec]
    for kernel in KERNELS:
        rows = rows_for(kernel, platform.vendor.value, platform.arch_family)
        assert any(r.head_size is None and r.dtype is None for r in rows), (spec, kernel)
        for head in CAPABILITIES.head_sizes:
            for dtype in CAPABILITIES.dtypes:
                assert lookup(kernel, platform, head, dtype) in rows


def test_most_specific_row_wins() -> None:
    sm80 = parse("cuda:sm80")
    assert lookup("extend_verify", sm80, 256, "float16").head_size == 256
    assert lookup("extend_verify", sm80, 128, "float32").dtype == "float32"
    assert lookup("extend_verify", sm80, 64, "bfloat16").head_size is None
    gfx = parse("hip:gfx90a")
    both = lookup("extend_draft", gfx, 256, "float32")
    assert (both.head_size, both.dtype) == (256, "float32")


@pytest.mark.parametrize("spec,family", [("cuda:sm86", "sm80"), ("cuda:sm89", "sm80"),
                                         ("cuda:sm100", "sm90")])
def test_aliased_archs_take_a_compiled_familys_rows(spec: str, family: str) -> None:
    """Aliases are table data: no warning, the rows of the aliased family."""
    for kernel in KERNELS:
        row = _no_warning(kernel, spec)
        assert (row.vendor, row.arch_family) == ("cuda", family)


def test_sm120_has_its_own_rows_where_the_sm80_rows_spill_there() -> None:
    """sm120 keeps Ampere's shapes except decode at head size 64 (the sm80 row spills under
    sm_120's ptxas); the override does not reach fp32, whose own row stays first."""
    sm80, sm120 = parse("cuda:sm80"), parse("cuda:sm120")
    assert _no_warning("decode", "cuda:sm120").arch_family == "sm120"
    assert lookup("decode", sm120, 64, "float16").blocks["BLOCK_N"] == 32
    assert lookup("decode", sm80, 64, "float16").blocks["BLOCK_N"] == 64
    def as_sm120(row: LaunchRow) -> LaunchRow:  # the same shapes; the fill follows the SM count
        fill = row.fill_programs * UNITS["sm120"] // UNITS["sm80"]
        return dataclasses.replace(row, arch_family="sm120", fill_programs=fill)

    assert lookup("decode", sm120, 64, "float32") == as_sm120(lookup("decode", sm80, 64, "float32"))
    for kernel in EXTEND_VARIANTS:
        for head in CAPABILITIES.head_sizes:
            for dtype in CAPABILITIES.dtypes:
                assert lookup(kernel, sm120, head, dtype) == as_sm120(lookup(kernel, sm80, head, dtype))


def test_one_row_set_per_kernel_variant() -> None:
    """Each extend form has its own rows: at head size 128 on sm90 the rows measured on an
    H200 (prefill 128x64; the split forms' BLOCK_M an upper bound the launch shrinks to
    draft tokens x group); HIP tree verify its own smaller tiles."""
    sm90 = parse("cuda:sm90")
    blocks = {k: dict(lookup(k, sm90, 128, "bfloat16").blocks) for k in EXTEND_VARIANTS}
    assert blocks["extend_prefill"]["BLOCK_M"] == 128
    assert blocks["extend_verify"] == blocks["extend_draft"]
    assert blocks["extend_verify_tree"]["BLOCK_M"] <= blocks["extend_verify"]["BLOCK_M"]
    gfx = parse("hip:gfx942")
    assert lookup("extend_verify_tree", gfx, 128, "float16").blocks["BLOCK_M"] == 32
    assert lookup("extend_verify", gfx, 128, "float16").blocks["BLOCK_M"] == 64
    # Split forms carry the family's split settings; prefill does not split.
    assert lookup("extend_verify", gfx, 128, "float16").kv_splits == 64
    assert lookup("extend_prefill", gfx, 128, "float16").kv_splits == 1


def test_rows_reject_lower_case_blocks_and_unknown_kernels() -> None:
    with pytest.raises(ValueError):
        LaunchRow("decode", None, None, {"block_n": 64})
    with pytest.raises(ValueError):
        LaunchRow("nope", None, None, {})
    with pytest.raises(ValueError):
        lookup("nope", parse("cuda:sm90"), 128, "float16")


def test_backend_takes_its_rows_from_the_platform() -> None:
    pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=2, head_dim=64, dtype=torch.float16,
                  max_reqs=2, max_context_len=8)
    cfg = AttentionConfig(8, 2, 64, torch.float16)
    from attnhal_triton import TritonBackend

    hip = TritonBackend(cfg, pool, platform=parse("hip:gfx942"))
    assert hip.rows["extend_verify"] == lookup("extend_verify", parse("hip:gfx942"), 64, "float16")
    assert hip.num_kv_splits == 64
    with pytest.warns(NoLaunchRowWarning, match="gfx1100"):
        TritonBackend(cfg, pool, platform=parse("hip:gfx1100"))


def test_backend_refuses_configs_its_descriptor_excludes() -> None:
    from attnhal_triton import TritonBackend

    pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=2, head_dim=80, dtype=torch.float16,
                  max_reqs=2, max_context_len=8)
    with pytest.raises(ValueError, match=r"head_size=80 \(supported"):
        TritonBackend(AttentionConfig(8, 2, 80, torch.float16), pool, platform=parse("cuda:sm90"))


# --- descriptor and imports ---------------------------------------------------------------

def test_descriptor() -> None:
    from attnhal_triton import TritonBackend

    caps = TritonBackend.capabilities
    assert caps is CAPABILITIES and caps.name == "triton" and caps.requires == ("triton",)
    assert set(caps.graph) == {Phase.DECODE, Phase.TARGET_VERIFY, Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND}
    assert caps.multi_step == SpecLimits() and caps.phases == frozenset(Phase)
    # Each claim is run by tests/test_triton_{kernels,features,graphs}.py under the interpreter
    # (MLA by test_mla.py).
    assert caps.features == {Feature.CUSTOM_MASK, Feature.SLIDING_WINDOW, Feature.LOGIT_SOFTCAP,
                             Feature.SINKS, Feature.MLA}
    assert caps.page_sizes == {1, 16, 64}
    assert caps.kv_dtypes == {"float16", "bfloat16", "float32", "fp8_e4m3", "fp8_e5m2"}


_BLOCK_TRITON = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Block())
"""


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False, timeout=120)


def test_package_imports_without_triton_and_without_torch() -> None:
    done = _python(_BLOCK_TRITON + """
import attnhal, attnhal_triton
assert "torch" not in sys.modules and "triton" not in sys.modules, sorted(sys.modules)
assert attnhal_triton.CAPABILITIES.requires == ("triton",)
from attnhal_triton import TritonBackend
assert TritonBackend.capabilities.name == "triton"
assert "triton" not in sys.modules
import torch
from attnhal.backend import AttentionConfig, KVPool
from attnhal.platform import parse
pool = KVPool(num_layers=1, num_slots=4, num_kv_heads=1, head_dim=16, dtype=torch.float32,
              max_reqs=1, max_context_len=4)
TritonBackend(AttentionConfig(1, 1, 16), pool, platform=parse("cuda:sm90"))
try:
    from attnhal_triton import kernels
except ModuleNotFoundError as exc:
    print("kernels need triton:", exc)
""")
    assert done.returncode == 0, done.stderr
    assert "kernels need triton" in done.stdout


def test_import_attnhal_does_not_import_triton_or_backends() -> None:
    done = _python("import sys, attnhal; "
                   "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'attnhal_triton')))")
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


# --- cross-vendor compile check ------------------------------------------------------------

def _compile_check(*args: str, prelude: str = "", timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """``python -m attnhal_triton.compile_check ARGS`` without TRITON_INTERPRET; ``prelude``
    runs first in that process (to plant a row; with ``--jobs 1``: the worker pool cannot
    pickle a module run by runpy from ``-c``)."""
    command = ["-m", "attnhal_triton.compile_check"]
    if prelude:
        command = ["-c", prelude + "\nimport runpy, sys\nsys.argv[0] = 'compile_check'\n"
                   "runpy.run_module('attnhal_triton.compile_check', run_name='__main__')\n"]
    return run_compiling(*command, *args, timeout=timeout)


def _assert_spill_free(done: subprocess.CompletedProcess[str], cells: set[tuple[Any, ...]]) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(done.stdout)
    assert {(r["kernel"], r["target"], r["dtype"], r["head_size"]) for r in rows} == cells
    bad = [f"{r['row']} on {r['target']} {r['dtype']}: {r['spills']} spills {r['error']}"
           for r in rows if not r["ok"] or r["spills"] != 0 or r["registers"] <= 0]
    assert not bad, bad
    for r in rows:
        platform = target_platform(r["target"])
        family = ALIASES.get((platform.vendor.value, platform.arch_family), platform.arch_family)
        assert not r["fallback"] and r["served_by"] == f"{platform.vendor.value}:{family}", r


def _cells(targets: Iterable[str], dtypes: Iterable[str] = DTYPES,
           head_sizes: Iterable[int] = HEAD_SIZES) -> set[tuple[Any, ...]]:
    """Every (form, target, dtype, head size) the check compiles: fp8 only where the
    target has an e4m3 flavour."""
    return {(k, t, d, h) for k in VARIANTS for t in targets for d in dtypes for h in head_sizes
            if d != "fp8" or target_platform(t).fp8_flavor is not Fp8Flavor.NONE}


#: One target per vendor, at every form, dtype and head size, and each fp8 flavour of
#: that vendor: e4m3fn on sm90, e4m3fnuz on gfx942, e4m3fn on gfx950 (fp8 only).
CI_TARGETS = {"cuda": [("cuda:90", DTYPES)], "hip": [("hip:gfx942", DTYPES), ("hip:gfx950", ("fp8",))]}


@pytest.mark.parametrize("vendor", sorted(CI_TARGETS))
def test_compile_check_one_target_per_vendor_is_spill_free(vendor: str) -> None:
    """The launch rows of one target per vendor compile with 0 spills for every kernel form,
    dtype, head size and fp8 flavour. The other targets: the full-matrix test below."""
    for target, dtypes in CI_TARGETS[vendor]:
        done = _compile_check("--json", "--targets", target, "--dtypes", *dtypes)
        _assert_spill_free(done, _cells([target], dtypes))
        flavours = {r["fp8_flavor"] for r in json.loads(done.stdout) if r["dtype"] == "fp8"}
        assert flavours == {target_platform(target).fp8_flavor.value}


@pytest.mark.skipif(not os.environ.get("ATTNHAL_FULL_COMPILE_MATRIX"),
                    reason="990 compiles, ~20 CPU-minutes: set ATTNHAL_FULL_COMPILE_MATRIX=1")
def test_full_compile_matrix_is_spill_free() -> None:
    """Every kernel form, dtype and fp8 flavour on every default target, at every head size
    the descriptor claims (the check's default 64/128/256, then 16/32)."""
    _assert_spill_free(_compile_check("--json", timeout=7200), _cells(DEFAULT_TARGETS))
    small = sorted(set(CAPABILITIES.head_sizes) - set(HEAD_SIZES))
    _assert_spill_free(_compile_check("--json", "--head-sizes", *map(str, small), timeout=7200),
                       _cells(DEFAULT_TARGETS, head_sizes=small))


def test_small_head_sizes_lift_the_register_cap_on_nvidia_only() -> None:
    """ptxas caps the small head sizes' programs low and spills: their 16-bit NVIDIA rows
    carry ``maxnreg`` 255, the larger head sizes' and the tree form's rows do not; the fp32
    rows (FMA dots) lift it at every head size: decode to 128, extend to 255."""
    for spec in ("cuda:sm80", "cuda:sm89", "cuda:sm90", "cuda:sm100", "cuda:sm120"):
        assert "maxnreg" not in lookup("extend_verify_tree", parse(spec), 32, "bfloat16").launch_options
        for kernel in ("decode", "extend_prefill", "extend_verify", "extend_draft"):
            for head in CAPABILITIES.head_sizes:
                options = lookup(kernel, parse(spec), head, "bfloat16").launch_options
                assert (options.get("maxnreg") == 255) == (head in (16, 32)), (spec, kernel, head)
            fp32 = lookup(kernel, parse(spec), 16, "float32").launch_options
            assert fp32.get("maxnreg") == (128 if kernel == "decode" else 255), (spec, kernel)
    assert not any("maxnreg" in lookup("extend_prefill", parse("hip:gfx942"), h, "bfloat16").launch_options
                   for h in CAPABILITIES.head_sizes)


# Serve sm120 by the sm80 rows again: their decode row spills (44 bytes) there at head size 64.
_PLANT_SPILLING_ALIAS = """
import types
from attnhal_triton import launch_table
launch_table.ALIASES = types.MappingProxyType({**launch_table.ALIASES, ("cuda", "sm120"): "sm80"})
"""
_SM120_DECODE = ("--kernels", "decode", "--targets", "cuda:120", "--dtypes", "float16", "--head-sizes", "64",
                 "--jobs", "1")


def test_a_spilling_row_fails_the_check_and_the_check_names_the_row_serving_the_target() -> None:
    ours = _compile_check(*_SM120_DECODE)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    assert "decode@cuda:sm120[d=64,*]" in ours.stdout and "cuda:120: rows of cuda:sm120" in ours.stdout
    planted = _compile_check(*_SM120_DECODE, prelude=_PLANT_SPILLING_ALIAS)
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert "decode@cuda:sm80[d=*,*]" in planted.stdout and "cuda:120: rows of cuda:sm80" in planted.stdout
    assert "1 compiles: 1 ok, 0 failed, 1 with spills" in planted.stdout


def _compile_jobs(plant: str, jobs: str) -> list[dict[str, Any]]:
    """``compile_check._compile_one`` of each ``Job(...)`` in ``jobs`` (a Python list), in a
    process without TRITON_INTERPRET, after ``plant`` ran there."""
    code = ("import json\nfrom attnhal_triton import compile_check as cc\n" + plant +
            f"\nprint(json.dumps([cc._compile_one(j) for j in {jobs}]))\n")
    done = run_compiling("-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_an_fp32_dot_in_a_16_bit_kernel_fails_the_check() -> None:
    """16-bit and fp8 kernels keep their dots on the tensor cores: the check reads every dot's
    operand types in the TTGIR (bf16; f16 over an fp8 cache) and fails a planted fp32 cast."""
    jobs = ("[cc.Job(k, t, d, 128, False) for k in ('decode', 'extend_verify') "
            "for t in ('cuda:90', 'hip:gfx942') for d in ('bfloat16', 'fp8')]")
    ours = _compile_jobs("", jobs)
    assert {(r["dtype"], tuple(r["dot_types"])) for r in ours} == {("bfloat16", ("bf16",)), ("fp8", ("f16",))}
    assert all(r["ok"] for r in ours), ours
    plant = "_c = cc._constexprs\ncc._constexprs = lambda *a: {**_c(*a), 'DOT_F32': True}"
    planted = _compile_jobs(plant, jobs)
    assert all(not r["ok"] and "fp32 tl.dot in a" in r["error"] for r in planted), planted


def test_the_attnhal_command_exits_1_on_a_spill() -> None:
    cli = "\nimport sys\nfrom attnhal.cli import main\nsys.exit(main(['compile-check', *sys.argv[1:]]))\n"
    done = run_compiling("-c", _PLANT_SPILLING_ALIAS + cli, *_SM120_DECODE)
    assert done.returncode == 1 and "1 with spills" in done.stdout, done.stdout + done.stderr


def test_run_compile_check_leaves_an_interpreter_process_for_a_clean_one() -> None:
    """This process has TRITON_INTERPRET set: the function runs the check in a child."""
    from attnhal_triton.compile_check import format_table, run_compile_check

    rows = run_compile_check(kernels=["decode_reduce"], targets=["hip:gfx942"],
                             dtypes=["float16"], head_sizes=[64], fallback=True)
    assert [r["fallback"] for r in rows] == [False, True]
    assert all(r["ok"] and r["spills"] == 0 for r in rows), rows
    table = format_table(rows)
    assert "decode_reduce" in table and "2 compiles: 2 ok, 0 failed, 0 with spills" in table
