"""The launch forms: what the backend launches is what the enumeration lists, and what the
compile check builds (``python -m attnhal_triton.compile_forms``).

The whole enumeration (every form on cuda:80/90/100 and gfx942/950) is a command, not a
test: ~90,000 compiles (see docs/triton.md). Here: the enumeration against the launches of
every phase (recorded, not run), the counts, and a few compiles in a child process.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from compiling import run_compiling
from triton_cases import build, run, shape

from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal_triton import compile_check as cc
from attnhal_triton import kernels, ops
from attnhal_triton.compile_forms import FORM_TARGETS, budget
from attnhal_triton.launch_forms import forms

#: Constexprs the enumeration takes at one value (its module docstring says why).
_FIXED = ("PAGE_SIZE", "HAS_SOFTCAP", "HAS_SINKS", "NUM_Q_HEADS", "DOT_F32")


_RUNTIME = {"decode_partial_kernel": kernels.DECODE_RUNTIME_INTS, "decode_reduce_kernel": kernels.REDUCE_RUNTIME_INTS,
            "extend_kernel": kernels.EXTEND_RUNTIME_INTS}


def _varying(constexprs: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, v) for k, v in constexprs.items() if k not in _FIXED))


def _recorded(monkeypatch: pytest.MonkeyPatch, case_shapes: list[Any]) -> list[tuple[str, str, tuple[Any, ...]]]:
    """(kernel function, q dtype, varying constexprs) of every launch of each case's forward;
    fails if an integer argument of a launch would make the JIT compile another kernel."""
    seen: list[tuple[str, str, tuple[Any, ...]]] = []
    specialised: list[str] = []

    class Spy:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                dtype = str(args[2 if self.name == "decode_reduce_kernel" else 0].dtype).removeprefix("torch.")
                constexprs = {k: v for k, v in kwargs.items() if k.isupper()}
                seen.append((self.name, dtype, _varying(constexprs)))
                specialised.extend(cc.specialisation_mismatches(getattr(kernels, self.name), _RUNTIME[self.name],
                                                                args, constexprs))
                # Not launched: this test reads the launches' arguments only (outputs are others' tests).
            return launch

    spies = {n: Spy(n) for n in ("decode_partial_kernel", "decode_reduce_kernel", "extend_kernel")}
    monkeypatch.setattr(ops, "_kernels", lambda: type("K", (), {**spies, "INTERPRETED": True}))
    for case_shape in case_shapes:
        case, backend = build(case_shape)
        run(case, backend, write=False)
    assert not specialised, sorted(set(specialised))[:5]
    return seen


def test_every_launch_of_every_phase_is_an_enumerated_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each phase (trees and chains, groups 1/4/7, an fp8 cache) on the interpreter's rows:
    the constexprs its op launches with are among :func:`forms` of the same platform."""
    cases = [shape(p, group=g, kv_heads=1, dtype="float16", kv_dtype=kv, tree=tree)
             for p in Phase for g in (1, 4, 7) for kv, tree in ((None, True), ("fp8_e5m2", False))]
    # An fp32 cache under a 16-bit query takes the fp32 rows (work.row_dtype), in both.
    cases += [shape(p, group=4, kv_heads=1, dtype="float16", kv_dtype="float32") for p in Phase]
    launched = _recorded(monkeypatch, cases)
    assert {name for name, _, _ in launched} == {"decode_partial_kernel", "decode_reduce_kernel", "extend_kernel"}
    listed = {(f.function, f.dtype, _varying(dict(f.constexprs)))
              for f in forms(parse("cpu"), dtypes=("float16",), kv_dtypes=("float16", "fp8_e5m2", "float32"),
                             groups=(1, 4, 7))}
    missing = sorted({x for x in launched if x not in listed}, key=str)
    assert not missing, missing[:3]


def test_the_enumeration_covers_groups_heads_dtypes_split_and_unsplit() -> None:
    every = forms(parse("cuda:sm90"))
    groups = {f.constexprs.get("GROUP") for f in every if f.kernel == "extend_verify_tree"}
    assert groups == set(range(1, 17))
    assert {f.head_size for f in every} == {16, 32, 64, 128, 256}
    assert {f.kv_dtype for f in every if f.kernel == "decode"} == {"float16", "bfloat16", "float32", "fp8_e4m3",
                                                                   "fp8_e5m2"}
    for kernel in ("extend_verify", "extend_verify_tree", "extend_draft"):
        assert {f.constexprs["SPLIT"] for f in every if f.kernel == kernel} == {True, False}, kernel
    # No e4m3 storage on sm80 (no flavour): the backend refuses it, so nothing to compile.
    assert all(f.kv_dtype != "fp8_e4m3" for f in forms(parse("cuda:sm80"), kernels=("decode",)))


def test_register_budget_per_vendor_row() -> None:
    assert budget("cuda:90", {"num_warps": 4}) == 255 and budget("cuda:90", {"maxnreg": 128}) == 128
    assert budget("hip:gfx942", {"waves_per_eu": 2}) == 256 and budget("hip:gfx950", {}) == 512
    assert FORM_TARGETS == ("cuda:80", "cuda:90", "cuda:100", "hip:gfx942", "hip:gfx950")


def _compile_forms(*args: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    return run_compiling("-m", "attnhal_triton.compile_forms", "--json", *args, timeout=1800, **env_vars)


def test_a_share_of_the_forms_compiles_with_headroom() -> None:
    """Decode at group 4 and 16, bf16 over an fp8 e5m2 cache at head 128, one target per
    vendor: compiled in a child process, 0 spills, headroom reported and >= 0."""
    done = _compile_forms("--targets", "cuda:90", "hip:gfx942", "--kernels", "decode", "--dtypes", "bfloat16",
                          "--kv-dtypes", "fp8_e5m2", "--head-sizes", "128", "--groups", "4", "16", "--jobs", "2")
    rows = json.loads(done.stdout)
    assert done.returncode == 0, [r for r in rows if not r["ok"]]
    assert {(r["target"], r["group"]) for r in rows} == {(t, g) for t in ("cuda:90", "hip:gfx942") for g in (4, 16)}
    assert all(r["spills"] == 0 and r["headroom"] >= 0 and r["registers"] > 0 for r in rows), rows


def test_a_run_into_a_results_file_leaves_tritons_cache_as_it_was(tmp_path: Any) -> None:
    """An enumeration keeps its compiles in its results file; Triton's cache (~1 MB a form,
    ~80 GB for every GQA form) gets none of them."""
    cache, results = tmp_path / "triton-cache", tmp_path / "forms.jsonl"
    cache.mkdir()
    done = _compile_forms("--targets", "cuda:90", "--kernels", "decode", "--dtypes", "bfloat16", "--kv-dtypes",
                          "bfloat16", "--head-sizes", "64", "--groups", "3", "--results", str(results),
                          TRITON_CACHE_DIR=str(cache))
    (row,) = json.loads(done.stdout)
    assert done.returncode == 0 and row["ok"] and row["registers"] > 0, row
    assert len(results.read_text().splitlines()) == 1 and not any(cache.iterdir())


def test_tree_verify_with_fp8_at_head_128_on_sm90_is_spill_free() -> None:
    """Found by the enumeration: the sm90 tree row at head 128 with 4 warps (32x64, 2 stages)
    spilled with an fp8 cache at group 7 (split and unsplit) and unsplit at group 4, forms
    the per-(kernel, dtype, head) matrix never built. 8 warps: every one of them compiles
    with 0 spills and headroom left."""
    done = _compile_forms("--targets", "cuda:90", "--kernels", "extend_verify_tree", "--dtypes", "bfloat16",
                          "--kv-dtypes", "fp8_e4m3", "--head-sizes", "128", "--groups", "4", "7", "--jobs", "2")
    rows = json.loads(done.stdout)
    assert {r["split"] for r in rows} == {True, False} and {r["group"] for r in rows} == {4, 7}
    assert done.returncode == 0 and all(r["ok"] and r["headroom"] > 0 for r in rows), \
        [(r["group"], r["query_tokens"], r["split"], r["error"]) for r in rows if not r["ok"]]


def test_an_fp32_query_over_an_fp8_cache_is_spill_free_on_sm90() -> None:
    """Found by the compile share's branch cover (2026-12-07): the fp32 decode row (2 stages)
    pipelined an fp8 cache's loads into 860 bytes of spill at head 128 and 15 KB at 256, and
    the fp32 tree verify row at head 256 (``maxnreg`` 128) spilled 8-16 bytes; the matrix
    compiles fp8 only under a bf16 query. Now one stage and ``maxnreg`` 128 / 255."""
    done = _compile_forms("--targets", "cuda:90", "--kernels", "decode", "--dtypes", "float32",
                          "--kv-dtypes", "fp8_e4m3", "fp8_e5m2", "--head-sizes", "64", "128", "256", "--groups", "16",
                          "--jobs", "2")
    tree = _compile_forms("--targets", "cuda:90", "--kernels", "extend_verify_tree", "--dtypes", "float32",
                          "--kv-dtypes", "fp8_e4m3", "--head-sizes", "256", "--groups", "7", "--jobs", "2")
    rows = json.loads(done.stdout) + json.loads(tree.stdout)
    assert len(rows) > 6 and {r["head_size"] for r in rows} == {64, 128, 256}
    assert done.returncode == tree.returncode == 0 and all(r["ok"] for r in rows), \
        [(r["kernel"], r["head_size"], r["query_tokens"], r["error"]) for r in rows if not r["ok"]]


def test_a_results_file_resumes_and_forgets_other_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """compile_all appends each row as it finishes and, run again on the same file, compiles
    only what is missing; a row keyed by another kernel source does not count."""
    from attnhal_triton import compile_forms

    compiled: list[str] = []

    def fake_compile(item: tuple[str, Any], known_key: str | None = None) -> dict[str, Any]:
        compiled.append(compile_forms.form_id(*item))
        return {"form_id": compiled[-1], "ok": True}

    monkeypatch.setattr(compile_forms, "compile_form", fake_compile)
    monkeypatch.setattr(compile_forms, "_source_key", lambda function: "this kernel")  # no cache_key interpreted
    work = [("cuda:90", f) for f in forms(parse("cuda:sm90"), kernels=("decode",), head_sizes=(128,))[:3]]
    results = tmp_path / "forms.jsonl"
    results.write_text(json.dumps({"form_id": "an older kernel's form", "ok": False}) + "\n")
    assert len(compile_forms.compile_all(work[:2], 1, results)) == 2 and len(compiled) == 2
    rows = compile_forms.compile_all(work, 1, results)
    assert len(compiled) == 3 and compiled[-1] == compile_forms.form_id(*work[2])
    assert sorted(r["form_id"] for r in rows) == sorted(compiled) and len(results.read_text().splitlines()) == 4


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_row_of_another_source_counts_when_its_form_compiles_to_the_same_code(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, jobs: int) -> None:
    """compile_all takes a row of another kernel source whose ``code_key`` is the form's own
    (the edit did not touch the form's code): described as this form, the figures of that row
    (None where that row predates a field), appended to the file, not compiled; the other forms
    compile — in this process or in worker processes alike."""
    from attnhal_triton import compile_forms

    compiled: list[str] = []
    work = [compile_forms._payload("cuda:90", f)  # picklable, for the workers
            for f in forms(parse("cuda:sm90"), kernels=("decode",), head_sizes=(128,))[:3]]
    monkeypatch.setattr(compile_forms, "compile_form", lambda item, key: compiled.append(item[1].key()) or
                        {"form_id": compile_forms.form_id(*item), "ok": True})
    monkeypatch.setattr(compile_forms, "_source_key", lambda function: "this kernel")
    monkeypatch.setattr(compile_forms, "code_key",  # the workers are forked: they see these patches
                        lambda target, form: "same" if form.key() == work[2][1].key() else None)
    results = tmp_path / "forms.jsonl"
    older = {"form_id": "an older kernel's form", "code_key": "same", "ok": True, "registers": 77, "spills": 0,
             "headroom": 178, "error": ""}  # written before rows had "shared"
    results.write_text(json.dumps(older) + "\n")
    rows = compile_forms.compile_all(work, jobs, results)
    assert compiled == ([work[0][1].key(), work[1][1].key()] if jobs == 1 else [])  # workers compile their own
    assert sorted(r["form_id"] for r in rows) == sorted(compile_forms.form_id(*w) for w in work)
    (reused,) = [r for r in rows if r.get("reused")]
    assert reused["reused"] == older["form_id"] and reused["registers"] == 77 and reused["shared"] is None
    assert reused["form_id"] == compile_forms.form_id(*work[2]) and reused["group"] == work[2][1].example[0]
    assert len(results.read_text().splitlines()) == 4


def test_a_report_says_how_much_of_the_enumeration_a_results_file_holds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """``--report`` compiles nothing: it counts the file's rows of this source against the
    selected forms, and is whole only with every form there and clean."""
    from attnhal_triton import compile_forms

    monkeypatch.setattr(compile_forms, "_source_key", lambda function: "this kernel")
    monkeypatch.setattr(compile_forms, "compile_form", lambda *item: pytest.fail("a report compiled"))
    select = dict(kernels=("decode",), dtypes=("bfloat16",), kv_dtypes=("bfloat16",), head_sizes=(128,),
                  groups=(1, 2))
    work = compile_forms._work(("cuda:90",), 1, select)
    results = tmp_path / "forms.jsonl"

    def write(*oks: bool) -> tuple[list[str], bool]:
        rows = [{**compile_forms._describe(*w), "ok": ok, "headroom": 9, "relief": "", "seconds": 1.0}
                for w, ok in zip(work, oks)]
        results.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return compile_forms.report(("cuda:90",), 1, results, **select)

    lines, whole = write(True)
    assert not whole and lines[0].startswith("cuda:90: 1 of 2 forms, 0 relieved") and "1 not compiled yet" in lines[-1]
    assert write(True, True)[1] and not write(True, False)[1]
    for missing in ([], ["--results", str(tmp_path / "no such file")]):  # bad input, not "0 of 2"
        assert compile_forms.main(["--report", "--targets", "cuda:90", "--kernels", "decode", *missing]) == 2


def test_a_code_key_ignores_source_locations_and_names_the_constexprs() -> None:
    from attnhal_triton.compile_forms import _without_locations

    ir = ('#loc = loc("/a/kernels.py":12:1)\n  %0 = tt.load %p loc(#loc3)\n'
          '  tt.func @k(%arg0: !tt.ptr<bf16> loc("Q"(#loc))) {\n#loc3 = loc("/a/kernels.py":40:7)\n')
    assert _without_locations(ir) == "  %0 = tt.load %p\n  tt.func @k(%arg0: !tt.ptr<bf16>) {"
    script = ("from attnhal.platform import parse\nfrom attnhal_triton.launch_forms import forms\n"
              "from attnhal_triton.compile_forms import code_key\n"
              "a, b = forms(parse('cuda:sm90'), kernels=('decode',), head_sizes=(128,), groups=(4, 8))[:2]\n"
              "key = code_key('cuda:90', a)\n"
              "print(key == code_key('cuda:90', a), key != code_key('cuda:90', b), key != code_key('cuda:80', a))")
    done = run_compiling("-c", script, timeout=300)
    assert done.stdout.split() == ["True", "True", "True"], done.stderr[-2000:]
