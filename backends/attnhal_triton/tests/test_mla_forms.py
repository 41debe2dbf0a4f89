"""The MLA launch forms: what the backend launches is what :func:`mla_forms` lists, and what
``python -m attnhal_triton.mla_compile_check --enumerated`` compiles.

The whole enumeration's compile is a command (docs/triton_mla.md), not a test. Here: the
constexprs of the MLA op's launches of every phase, recorded, not run (latent pool, separate
V, a 576-wide V, 16 and 128 heads, an fp8 cache; the interpreter's and gfx942's rows) are
among the enumerated forms; the counts per target; every head count, group and mask-word
count is a form of its own (constexprs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from triton_cases import run, shape

from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal.testing.cases import build_case
from attnhal_triton import TritonBackend, mla_kernels, mla_ops
from attnhal_triton import compile_check as cc
from attnhal_triton.compile_forms import FORM_TARGETS
from attnhal_triton.mla_forms import MLA_INPUTS, V_FORMS, mla_forms
from attnhal_triton.mla_traffic import latent_pool

#: Constexprs the enumeration takes at one value (its module docstring says why).
_FIXED = ("PAGE_SIZE", "HAS_SOFTCAP", "HAS_SINKS", "DOT_F32", "NUM_Q_HEADS")


def _varying(constexprs: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, v) for k, v in constexprs.items() if k not in _FIXED))


def _launches(monkeypatch: pytest.MonkeyPatch, cases: list[tuple[Any, bool, str]]) -> list[tuple[str, tuple[Any, ...]]]:
    """(q dtype, varying constexprs) of every MLA launch of each (recipe, latent pool, rows);
    fails if an integer argument would make the JIT compile another kernel than the check."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    specialised: list[str] = []

    class Spy:
        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                constexprs = {k: v for k, v in kwargs.items() if k.isupper()}
                seen.append((str(args[0].dtype).removeprefix("torch."), _varying(constexprs)))
                specialised.extend(cc.specialisation_mismatches(
                    mla_kernels.mla_kernel, mla_kernels.MLA_RUNTIME_INTS, args, constexprs))
                # Not launched: this test reads the launch's arguments only (outputs are others' tests),
                # and the interpreter's run of gfx942's blocks was most of its minute.
            return launch

    monkeypatch.setattr(mla_ops, "_kernels", lambda: type("K", (), {"mla_kernel": Spy()}))
    for recipe, latent, rows in cases:
        case = build_case(recipe, pool=latent_pool(recipe) if latent else None)
        run(case, TritonBackend(case.config, case.pool, platform=parse(rows)), write=False)
    assert not specialised, sorted(set(specialised))[:5]
    return seen


def _mla(phase: Phase, dtype: str, heads: int = 16, kv_dtype: str | None = None, **kw: Any) -> Any:
    recipe = shape(phase, kv_heads=1, group=heads, head_size=576, dtype=dtype, lens=(40, 5), kv_dtype=kv_dtype,
                   page_size=16, **kw).recipe
    return replace(recipe, v_head_size=512)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reduce reads the unlaunched kernel's scratch
@pytest.mark.parametrize("rows", ["cpu", "hip:gfx942"])
def test_every_mla_launch_is_an_enumerated_form(rows: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [(_mla(p, "float32"), True, rows) for p in Phase]
    cases += [(_mla(Phase.TARGET_VERIFY, "float16", tree=False), False, rows),
              (_mla(Phase.DECODE, "bfloat16", kv_dtype="fp8_e5m2"), True, rows),
              (_mla(Phase.DECODE, "float32", heads=128), True, rows),
              (shape(Phase.TARGET_VERIFY, kv_heads=2, group=2, head_size=576, lens=(40, 5)).recipe, False, rows)]
    launched = _launches(monkeypatch, cases)
    assert len(launched) == len(cases)
    listed = {(f.dtype, _varying(dict(f.constexprs))) for f in mla_forms(
        parse(rows), dtypes=("float32", "float16", "bfloat16"), kv_dtypes=("float32", "float16", "fp8_e5m2"))}
    missing = [x for x in launched if x not in listed]
    assert not missing, missing[:2]


def test_the_enumeration_per_target() -> None:
    counts = {t: mla_forms(parse(p)) for t, p in zip(FORM_TARGETS, ("cuda:sm80", "cuda:sm90", "cuda:sm100",
                                                                    "hip:gfx942", "hip:gfx950"))}
    for target, every in counts.items():
        print(target, len(every))
        # every phase's inputs and V layout (verify's chain compiles decode's binary: same flags, same row)
        flags = {(f.constexprs["PACKED"], f.constexprs["HAS_EXT_LENS"], f.constexprs["HAS_EXTRA"],
                  f.constexprs["USE_MASK"], f.constexprs["V_IN_K"], f.constexprs["V_TAIL"]) for f in every}
        assert flags == {(*(inputs.get(k, False) for k in ("PACKED", "HAS_EXT_LENS", "HAS_EXTRA", "USE_MASK")), v_in_k,
                          v_head == 576) for _, inputs in MLA_INPUTS.values() for v_head, v_in_k in V_FORMS.values()}
        assert {f.constexprs["SPLIT"] for f in every if f.kernel.startswith("decode")} == {True, False}
        assert all(not f.constexprs["SPLIT"] for f in every if f.kernel.startswith("prefill"))
    # sm80 has no e4m3 flavour: no fp8_e4m3 forms there
    assert "fp8_e4m3" not in {f.kv_dtype for f in counts["cuda:80"]}
    assert "fp8_e4m3" in {f.kv_dtype for f in counts["hip:gfx942"]}
    # NVIDIA's 16-bit rows hold 32 q rows; decode of 16 heads sizes its block to 16
    assert {f.constexprs["BLOCK_M"] for f in counts["cuda:90"] if f.dtype == "bfloat16"} == {16, 32}


def test_every_head_count_and_group_is_a_form() -> None:
    """The q heads are constexprs (run-time ones spilled on NVIDIA): MLA's 16..128 heads (its one
    KV head: the group is the head count) and a 576 V's groups 1..16 are each enumerated."""
    every = mla_forms(parse("cuda:sm90"), dtypes=("bfloat16",), kv_dtypes=("bfloat16",))
    assert {f.constexprs["GROUP"] for f in every if not f.constexprs["V_TAIL"]} == {16, 32, 64, 128}
    assert all(f.constexprs["NUM_Q_HEADS"] == f.constexprs["GROUP"] for f in every if not f.constexprs["V_TAIL"])
    assert {f.constexprs["GROUP"] for f in every if f.constexprs["V_TAIL"]} == set(range(1, 17))
    assert {f.constexprs["MASK_WORDS"] for f in every if f.constexprs["USE_MASK"]} == {1, 2}


def test_a_stopped_enumeration_has_some_of_each_dtype_and_kv_format() -> None:
    """The compile run takes each (phase form, dtype, KV format) in turn, so its first forms span
    them all."""
    from attnhal_triton.mla_compile_check import _interleaved

    every = mla_forms(parse("hip:gfx942"))
    combos = {(f.dtype, f.kv_dtype) for f in every}
    classes = {(f.kernel, f.dtype, f.kv_dtype) for f in every}
    ordered = _interleaved(every)
    assert sorted(ordered, key=id) == sorted(every, key=id)
    assert {(f.kernel, f.dtype, f.kv_dtype) for f in ordered[:len(classes)]} == classes
    assert {(f.dtype, f.kv_dtype) for f in ordered[:len(combos)]} == combos == {
        (d, kv) for d in ("float16", "bfloat16", "float32")
        for kv in ("float16", "bfloat16", "float32", "fp8_e4m3", "fp8_e5m2")}


def test_a_16_bit_query_over_an_fp32_cache_runs_fp32_dots() -> None:
    """Its fp32 rows are sized for fp32 dots (16-bit dots over converted tiles spilled on NVIDIA)."""
    from attnhal_triton.mla_forms import fp32_dots

    assert fp32_dots("bfloat16", "float32") and fp32_dots("float16", "float32")
    assert not fp32_dots("float32", "float32") and not fp32_dots("bfloat16", "fp8_e4m3")
    assert not fp32_dots("float16", "bfloat16")
    every = mla_forms(parse("cuda:sm90"))
    assert {(f.dtype, f.kv_dtype) for f in every if f.constexprs["DOT_F32"]} == {
        ("bfloat16", "float32"), ("float16", "float32")}
