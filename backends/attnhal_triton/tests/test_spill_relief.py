"""Spill relief: a form whose compile spills launches in the first relieved form that does not.

The ladder's order and the choice on planted compilers; the launch path deciding once per form
(a fake JIT function that reports spills as Triton's loaded binary does); the backend under the
interpreter with a planted compiler that spills at ``BLOCK_N`` 64 (the relieved launch is exact);
with the real cross-compiler, a form the sampled enumeration found spilling on sm90
(docs/triton.md) launches relieved and spill-free; and on a GPU, a planted spilling row relieved
by the device's own compiler (skipped without one; the device session runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from compiling import run_compiling
from triton_cases import assert_close, build, expected, run, shape

from attnhal.phases import Phase
from attnhal.platform import parse
from attnhal_triton import kernels, ops, spill_relief
from attnhal_triton.launch_table import UNCAPPED, lookup
from attnhal_triton.spill_relief import choose, reliefs

_CAP = dict(UNCAPPED["cuda"])


def test_the_ladder_lifts_the_cap_halves_the_kv_step_then_drops_a_stage() -> None:
    row = {"num_warps": 8, "num_stages": 2}
    steps = [(label, c["BLOCK_N"], o) for label, c, o in reliefs({"BLOCK_N": 64, "BLOCK_M": 32}, row, _CAP)]
    one = {"num_stages": 1}
    assert steps == [
        ("maxnreg=255", 64, {**row, **_CAP}),
        ("BLOCK_N=32", 32, row), ("BLOCK_N=32,maxnreg=255", 32, {**row, **_CAP}),
        ("BLOCK_N=16", 16, row), ("BLOCK_N=16,maxnreg=255", 16, {**row, **_CAP}),
        ("num_stages=1", 64, {**row, **one}), ("num_stages=1,maxnreg=255", 64, {**row, **one, **_CAP}),
        ("BLOCK_N=32,num_stages=1", 32, {**row, **one}),
        ("BLOCK_N=32,num_stages=1,maxnreg=255", 32, {**row, **one, **_CAP}),
        ("BLOCK_N=16,num_stages=1", 16, {**row, **one}),
        ("BLOCK_N=16,num_stages=1,maxnreg=255", 16, {**row, **one, **_CAP})]
    # A row already uncapped at one stage, or a fallback row (no vendor options): what is left to change.
    assert [s[0] for s in reliefs({"BLOCK_N": 32}, {"maxnreg": 255, "num_stages": 1}, _CAP)] == ["BLOCK_N=16"]
    assert [s[0] for s in reliefs({"BLOCK_N": 16}, {"num_stages": 2}, {})] == ["num_stages=1"]
    assert [s[0] for s in reliefs({"BLOCK_M": 16}, {"num_stages": 1}, _CAP)] == ["maxnreg=255"]  # no BLOCK_N


def test_the_first_spill_free_form_is_chosen() -> None:
    seen: list[tuple[int, bool]] = []

    def probe(constexprs: Any, options: Any) -> int:
        seen.append((constexprs["BLOCK_N"], "maxnreg" in options))
        return 0 if constexprs["BLOCK_N"] <= 32 and "maxnreg" in options else 24

    relief = choose(probe, {"BLOCK_N": 64}, {"num_warps": 4, "num_stages": 1}, _CAP)
    assert (relief.label, relief.spills, relief.row_spills) == ("BLOCK_N=32,maxnreg=255", 0, 24)
    assert relief.constexprs == {"BLOCK_N": 32} and relief.options == {"num_warps": 4, "num_stages": 1, **_CAP}
    assert seen == [(64, False), (64, True), (32, False), (32, True)]  # stops at the first clean one
    # The row's own form when it is clean, or when no compiler can tell (the interpreter).
    assert choose(lambda c, o: 0, {"BLOCK_N": 64}, {}, _CAP).label == ""
    assert choose(lambda c, o: None, {"BLOCK_N": 64}, {}, _CAP) == spill_relief.Relief({"BLOCK_N": 64}, {})
    # Every form spills: the least, and the figures say so.
    least = choose(lambda c, o: c["BLOCK_N"] // 4 + 8 * ("maxnreg" not in o), {"BLOCK_N": 64}, {"num_stages": 1},
                   _CAP)
    assert (least.label, least.spills, least.row_spills) == ("BLOCK_N=16,maxnreg=255", 4, 24)


def test_a_relief_the_compiler_refuses_is_passed_over() -> None:
    """A variant that fails to compile or load (a resource it exceeds) is not a relief: the next
    is tried, and where none is usable the row's own form launches; the row's own failure is the
    launch's (raised as it would be without relief)."""
    def probe(constexprs: Any, options: Any) -> int:
        if "maxnreg" in options:
            raise RuntimeError("out of resource: threads")
        return 0 if constexprs["BLOCK_N"] <= 32 else 16

    assert choose(probe, {"BLOCK_N": 64}, {"num_stages": 2}, _CAP).label == "BLOCK_N=32"
    refused = choose(lambda c, o: 16 if o == {"num_stages": 2} else probe(c, {"maxnreg": 1}), {"BLOCK_N": 64},
                     {"num_stages": 2}, _CAP)
    assert (refused.label, refused.constexprs, refused.spills) == ("", {"BLOCK_N": 64}, 16)
    with pytest.raises(RuntimeError, match="threads"):
        choose(lambda c, o: probe(c, {"maxnreg": 1}), {"BLOCK_N": 64}, {}, _CAP)


class _FakeJit:
    """A JIT function as Triton's: ``warmup`` compiles (here: reports ``BLOCK_N`` 64 spilling 2 words
    once loaded), ``[grid](...)`` launches."""

    __name__ = "fake_kernel"

    def __init__(self) -> None:
        self.compiled: list[int] = []
        self.launched: list[int] = []

    def warmup(self, *args: Any, grid: Any, BLOCK_N: int, **options: Any) -> Any:
        self.compiled.append(BLOCK_N)
        binary = SimpleNamespace(n_spills=None)
        binary._init_handles = lambda: setattr(binary, "n_spills", 2 if BLOCK_N > 32 else 0)
        return binary

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, BLOCK_N, **options: self.launched.append(BLOCK_N)


def test_a_form_is_decided_once_then_launched_relieved(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(spill_relief, "RELIEVED", {})
    jit = _FakeJit()
    with caplog.at_level("INFO", logger="attnhal_triton"):
        for _ in range(3):
            relief = spill_relief.launch(jit, (1, 1, 1), ("q",), {"BLOCK_N": 64}, {"num_stages": 1}, {},
                                         compiled=True)
    assert (relief.label, relief.row_spills, relief.spills) == ("BLOCK_N=32", 8, 0)  # 2 words = 8 bytes
    assert jit.compiled == [64, 32] and jit.launched == [32, 32, 32]
    line = "fake_kernel {'BLOCK_N': 64}: BLOCK_N=32 (row 8 B spilled, launched 0 B)"
    assert spill_relief.relieved() == [line] and caplog.messages == ["spill relief: " + line]  # logged once
    # As tabled: the row's form launches, nothing is compiled ahead or recorded; after it, relief again.
    with spill_relief.as_tabled():
        assert spill_relief.launch(jit, (1, 1, 1), ("q",), {"BLOCK_N": 64}, {"num_stages": 1}, {},
                                   compiled=True).label == ""
    assert jit.compiled == [64, 32] and jit.launched == [32, 32, 32, 64] and len(spill_relief.RELIEVED) == 1
    assert spill_relief.launch(jit, (1, 1, 1), ("q",), {"BLOCK_N": 64}, {"num_stages": 1}, {},
                               compiled=True).label == "BLOCK_N=32"
    # Under the interpreter nothing is compiled ahead: the row's form launches.
    monkeypatch.setattr(spill_relief, "RELIEVED", {})
    assert spill_relief.launch(jit, (1, 1, 1), ("q",), {"BLOCK_N": 64}, {}, {}, compiled=False).label == ""
    assert jit.compiled == [64, 32] and jit.launched[-1] == 64


@pytest.mark.parametrize("phase", [Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.DECODE], ids=lambda p: p.value)
def test_the_backend_launches_relieved_forms_exactly(phase: Phase, monkeypatch: pytest.MonkeyPatch) -> None:
    """sm90's rows under the interpreter, with a planted compiler whose forms spill at a K/V step
    above 32: every tree verify, draft extend and decode launch takes ``BLOCK_N`` 32 or less, and the
    output is exact."""
    spilling = lambda kernel, grid, args: lambda c, o: 8 if c.get("BLOCK_N", 0) > 32 else 0  # noqa: E731
    monkeypatch.setattr(spill_relief, "compiler_spills", spilling)
    monkeypatch.setattr(spill_relief, "RELIEVED", {})
    names = ("decode_partial_kernel", "extend_kernel", "decode_reduce_kernel")
    compiled = SimpleNamespace(INTERPRETED=False, **{k: getattr(kernels, k) for k in names})
    monkeypatch.setattr(ops, "_kernels", lambda: compiled)
    case = shape(phase, head_size=64, dtype="float16", platform="cuda:sm90", lens=(40, 9), kv_heads=1)
    built, backend = build(case)
    got = run(built, backend)
    launched = {key[0]: r for key, r in spill_relief.RELIEVED.items() if "BLOCK_N" in r.constexprs}
    assert launched and all(r.constexprs["BLOCK_N"] <= 32 and r.row_spills == 8 for r in launched.values())
    assert max(row.blocks.get("BLOCK_N", 0) for row in backend.rows.values()) == 64  # the rows said 64
    assert_close(backend, got, expected(built, backend))


_ONE_FORM = textwrap.dedent("""
    import json
    from attnhal_triton import compile_check as cc
    from attnhal_triton.compile_forms import _payload, compile_form
    from attnhal_triton.launch_forms import forms
    [form] = [f for f in forms(cc.target_platform("cuda:90"), kernels=("extend_verify",), dtypes=("bfloat16",),
                               kv_dtypes=("float16",), head_sizes=(128,), groups=(7,)) if f.example[1:] == (5, 65536)]
    print(json.dumps(compile_form(_payload("cuda:90", form))))
""")


def test_a_form_that_spilled_on_sm90_launches_relieved() -> None:
    """Found by the sampled enumeration (2026-12-07): sm90's causal verify row at head 128 (64x64,
    4 warps) spilled 24 bytes at 255 registers for a bf16 query over an fp16 cache, group 7, 5
    tokens, unsplit. Compiled by Triton's ptxas: relieved to a 32-position K/V step, 0 spills."""
    done = run_compiling("-c", _ONE_FORM)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout)
    assert row["row_spills"] > 0 and row["relief"] == "BLOCK_N=32", row
    assert row["ok"] and row["spills"] == 0 and row["headroom"] >= 0, row
    assert lookup("extend_verify", parse("cuda:sm90"), 128, "bfloat16").blocks["BLOCK_N"] == 64  # the row as it was


_ON_DEVICE = textwrap.dedent("""
    import json, sys
    from dataclasses import replace
    from triton.runtime.errors import OutOfResources
    from triton_cases import assert_close, expected, run, shape
    from attnhal.phases import Phase
    from attnhal.platform import detect
    from attnhal.testing.cases import build_case
    from attnhal_triton import TritonBackend, spill_relief
    platform = detect()
    case = shape(Phase.TARGET_VERIFY, head_size=128, dtype="bfloat16", kv_heads=2, group=4, lens=(300, 77),
                 tokens=8, tree=False)
    built = build_case(case.recipe, device=platform.torch_device)
    backend = TritonBackend(built.config, built.pool, platform=platform)
    row = backend.rows["extend_verify"]  # planted: 64 x 128 tiles of a 128 head in 4 warps, 1 stage (80 KB)
    backend.use_launch_rows({"extend_verify": replace(row, blocks={**row.blocks, "BLOCK_M": 64, "BLOCK_N": 128},
                                                      num_warps=4, num_stages=1)})
    try:
        got = run(built, backend)
    except OutOfResources as exc:
        print(json.dumps({"shared": str(exc)}))
        sys.exit(0)
    assert_close(backend, got, expected(built, backend))
    print(json.dumps({"forms": [[r.label, r.row_spills, r.spills] for r in spill_relief.RELIEVED.values()]}))
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")
def test_a_spilling_row_is_relieved_by_the_devices_own_compiler() -> None:
    """On a GPU (the device session runs it): every launch's form is compiled by Triton's ``warmup``
    and its spill read from the driver before it runs (no form left unprobed), and a planted verify
    row too wide for the registers (64 x 128 tiles at head 128 in 4 warps) is relieved to a form that
    spills less (0 where a relief fits); the output is exact."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTNHAL_PLATFORM")}
    helpers = str(Path(__file__).resolve().parents[3] / "tests" / "helpers")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (helpers, env.get("PYTHONPATH"))))
    done = subprocess.run([sys.executable, "-c", _ON_DEVICE], capture_output=True, text=True, env=env, check=False,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    if "shared" in report:
        pytest.skip(f"the planted tiles exceed this device's shared memory: {report['shared']}")
    forms = report["forms"]
    assert forms and all(row is not None for _, row, _ in forms), forms  # every form was probed
    planted = [f for f in forms if f[1]]  # the forms whose row spilled
    if not planted:
        pytest.skip(f"the planted row fits this device's registers: {forms}")
    assert all(label and spills < row for label, row, spills in planted), planted
