"""The host-tuned kernel parameters: the sweep's choice, its record in the build cache (kept,
reused, rebuilt when corrupt), and the defaults whenever a sweep fails, is killed, or is
switched off. Timers are fakes here (no timing in tests); the kernel runs only in the last
tests, which check its results with non-default parameters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnhal_cpu import buildlock, sweep, tuning
from attnhal_cpu.params import DEFAULTS, HOST_DEFAULTS, HostParams, KernelParams, parse_host_params, parse_params
from attnhal_cpu.params import split_count
from attnhal_cpu.sweep import HostBusy, SweepResult, SweepTimeout
from attnhal_cpu.tuning import PARAMS_ENV, TUNE_ENV, record_path, tune
from repo import ROOT

pytestmark = pytest.mark.skipif(not buildlock.supported(), reason="needs fcntl")
CPU = "TestVendor Test CPU family 1 model 2 stepping 3"


def fake_timer(faster: dict[str, int], gain: float = 0.1):
    """Every launch takes 10 ms per shape, less ``gain`` for each parameter at its ``faster`` value."""
    def timer(params: KernelParams, shape: int) -> float:
        hits = sum(getattr(params, name) == value for name, value in faster.items())
        return 0.010 * (1 + shape) * (1 - gain) ** hits
    return timer


def quiet() -> float:
    return 0.0


def test_sweep_takes_a_faster_value_and_keeps_the_default_on_a_tie() -> None:
    result = sweep.sweep(fake_timer({"prefetch": 64, "prefetch_burst": 1, "tasks_per_thread": 2}), tile=8, load=quiet)
    assert result.params == KernelParams(prefetch=64, prefetch_burst=1, max_vectors=DEFAULTS.max_vectors,
                                         tasks_per_thread=2)
    tried = {p.prefetch for p, _ in result.trials}
    assert tried == {0, 8, 16, 32, 64}
    # A gain below GAIN is noise: the current choice stays.
    small = sweep.sweep(fake_timer({"max_vectors": 16}, gain=sweep.GAIN / 4), tile=8, load=quiet)
    assert small.params == DEFAULTS


def test_sweep_rounds_prefetch_to_whole_tiles() -> None:
    result = sweep.sweep(fake_timer({"prefetch": 32}), tile=16, load=quiet)
    assert {p.prefetch for p, _ in result.trials} == {0, 16, 32, 64}


def test_sweep_measures_positions_per_tile() -> None:
    """tile_vectors is measured first; a wider tile then rounds the prefetch candidates to its width."""
    result = sweep.sweep(fake_timer({"tile_vectors": 4}), tile=8, load=quiet)
    assert result.params.tile_vectors == 4 and result.params.prefetch == 32  # 16 positions -> one 32-wide tile
    assert {p.tile_vectors for p, _ in result.trials} == {1, 2, 4}
    assert {p.prefetch for p, _ in result.trials if p.tile_vectors == 4} == {0, 32, 64}
    assert sweep.sweep(fake_timer({}), tile=8, load=quiet).params.tile_vectors == DEFAULTS.tile_vectors == 1


def test_sweep_gives_up_past_its_budget_or_on_a_busy_host() -> None:
    ticks = iter(range(1000))
    with pytest.raises(SweepTimeout, match="ran past 3 s"):
        sweep.sweep(fake_timer({}), tile=8, clock=lambda: float(next(ticks)), load=quiet)
    with pytest.raises(HostBusy, match="load average 5.00 per cpu"):
        sweep.sweep(fake_timer({}), tile=8, load=lambda: 5.0)


class Counting:
    """A stand-in for the sweep that records its calls (one per cache width) and returns ``params``
    for fp32 caches, ``half`` (default: the same) for 2-byte ones."""

    def __init__(self, params: KernelParams, half: KernelParams | None = None) -> None:
        self.params, self.half, self.calls = params, half or params, 0

    def __call__(self, timer, tile: int, budget_s: float) -> SweepResult:
        chosen = self.params if timer == "fp32" else self.half
        self.calls += 1
        return SweepResult(chosen, ((chosen, (0.001, 0.002)),), 0.5)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TUNE_ENV, raising=False)
    monkeypatch.delenv(PARAMS_ENV, raising=False)


def run_tune(directory: Path, fake, cpu: str = CPU) -> tuning.Tuning:
    return tune(directory, "AVX2", lambda width: width, 8, progress=lambda stage, msg: None, cpu=cpu, run_sweep=fake)


def test_the_sweep_result_is_cached_and_reused(tmp_path: Path, clean_env) -> None:
    chosen = HostParams(KernelParams(prefetch=32, prefetch_burst=1, max_vectors=16), KernelParams(tasks_per_thread=2))
    fake = Counting(chosen.fp32, chosen.half)
    first = run_tune(tmp_path, fake)
    assert (first.source, first.params, fake.calls) == ("measured", chosen, 2)  # one sweep per cache width
    record = json.loads(record_path(tmp_path, CPU).read_text())
    assert record["cpu"] == CPU and record["isa"] == "AVX2" and record["params"] == chosen.to_dict()
    again = run_tune(tmp_path, fake)
    assert (again.source, again.params, fake.calls) == ("cached", chosen, 2)
    assert again.params.for_itemsize(4) == chosen.fp32 and again.params.for_itemsize(2) == chosen.half
    assert again.detail.startswith("measured ")
    other = run_tune(tmp_path, Counting(DEFAULTS), cpu="Another CPU")  # keyed by the CPU model
    assert other.source == "measured" and run_tune(tmp_path, fake).params == chosen and fake.calls == 2


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": 1, "cpu": CPU, "isa": "AVX2"}),
                                  json.dumps({"format": 1, "cpu": CPU, "isa": "AVX2", "when": "x", "seconds": 1,
                                              "load": "0", "params": {"prefetch": -5}}), ""])
def test_a_corrupt_record_is_measured_again(tmp_path: Path, clean_env, text: str) -> None:
    record_path(tmp_path, CPU).write_text(text)
    chosen = KernelParams(prefetch=8)
    fake = Counting(chosen)
    got = run_tune(tmp_path, fake)
    assert (got.source, got.params, fake.calls) == ("measured", HostParams(chosen, chosen), 2)
    assert run_tune(tmp_path, fake).source == "cached" and fake.calls == 2


def test_a_failed_sweep_leaves_the_defaults_and_caches_nothing(tmp_path: Path, clean_env) -> None:
    def failing(timer, tile, budget_s):
        if timer == "half":  # the fp32 sweep finished: still nothing is kept
            raise SweepTimeout("the sweep ran past 3 s")
        return SweepResult(KernelParams(prefetch=64), (), 1.0)
    got = run_tune(tmp_path, failing)
    assert got.params == HOST_DEFAULTS and got.source == "defaulted" and "ran past 3 s" in got.detail
    assert not record_path(tmp_path, CPU).exists()


KILLED_CHILD = """
import sys, time
from pathlib import Path
from attnhal_cpu.tuning import tune
def sweeping(timer, tile, budget_s):
    Path(sys.argv[2]).touch()
    time.sleep(60)
tune(Path(sys.argv[1]), "AVX2", lambda width: None, 8, cpu={cpu!r}, run_sweep=sweeping)
"""


def test_a_killed_sweep_leaves_defaults_and_blocks_no_one(tmp_path: Path, clean_env) -> None:
    started = tmp_path / "sweeping"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD.format(cpu=CPU), str(tmp_path), str(started)],
                             cwd=ROOT, env=os.environ.copy(), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the child never started its sweep"
    assert buildlock.holder(tmp_path / "tune.lock") is not None  # it holds the lock while it measures
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not record_path(tmp_path, CPU).exists()  # nothing half-written is left to read
    assert buildlock.holder(tmp_path / "tune.lock") is None
    os.environ[TUNE_ENV] = "0"
    try:
        assert run_tune(tmp_path, Counting(KernelParams(prefetch=64))).params == HOST_DEFAULTS
    finally:
        del os.environ[TUNE_ENV]
    assert run_tune(tmp_path, Counting(KernelParams(prefetch=64))).source == "measured"  # the next run measures


def test_a_sweep_held_by_another_process_past_the_wait_leaves_defaults(tmp_path: Path, clean_env,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "WAIT_S", 0.3)
    fake = Counting(KernelParams(prefetch=64))
    with buildlock.exclusive(tmp_path / "tune.lock", 1.0, lambda holder, waited: None):
        got = run_tune(tmp_path, fake)
    assert got.source == "defaulted" and "still measuring" in got.detail and fake.calls == 0


def test_switches_skip_force_or_set_the_parameters(tmp_path: Path, clean_env, monkeypatch) -> None:
    fake = Counting(KernelParams(prefetch=64))
    monkeypatch.setenv(TUNE_ENV, "0")
    assert run_tune(tmp_path, fake) == tuning.Tuning(HOST_DEFAULTS, "defaulted", f"{TUNE_ENV}=0: no sweep")
    monkeypatch.setenv(TUNE_ENV, "sometimes")
    got = run_tune(tmp_path, fake)
    assert got.params == HOST_DEFAULTS and f"{TUNE_ENV}='sometimes' (supported: auto, 1, 0, off, again)" in got.detail
    monkeypatch.setenv(TUNE_ENV, "again")
    assert [run_tune(tmp_path, fake).source for _ in range(2)] == ["measured", "measured"] and fake.calls == 4
    monkeypatch.delenv(TUNE_ENV)
    monkeypatch.setenv(PARAMS_ENV, "prefetch=0, tasks_per_thread=1")
    got = run_tune(tmp_path, fake)
    assert got.source == "set" and got.params.fp32 == got.params.half == KernelParams(prefetch=0, tasks_per_thread=1)
    assert fake.calls == 4
    monkeypatch.setenv(PARAMS_ENV, "prefetch=-1")
    assert "prefetch=-1 (supported: an int in [0, 1024])" in run_tune(tmp_path, fake).detail


def test_parse_params_names_what_is_wrong() -> None:
    assert parse_params("max_vectors=8") == KernelParams(max_vectors=8)
    with pytest.raises(ValueError, match=r"'tile=8' \(supported: NAME=INT with NAME in \['prefetch'"):
        parse_params("tile=8")
    assert parse_host_params("prefetch=8, fp32.prefetch_burst=1") == HostParams(
        KernelParams(prefetch=8, prefetch_burst=1), KernelParams(prefetch=8))
    with pytest.raises(ValueError, match=r"'fp16.prefetch=8' \(supported: NAME=INT, or WIDTH.NAME=INT with WIDTH in"):
        parse_host_params("fp16.prefetch=8")
    assert parse_params("tile_vectors=2").op_args() == (DEFAULTS.prefetch, DEFAULTS.max_vectors, False, 2)
    with pytest.raises(ValueError, match=r"tile_vectors=3 \(supported: one of \[1, 2, 4\]\)"):
        parse_params("tile_vectors=3")
    assert split_count(1, 8192, 2, tasks_per_thread=8) == 16 and split_count(16, 2048, 2) == 1


# --- the kernel with other parameters than its defaults ---------------------------------------

def _kernel_reasons() -> str:
    from attnhal.platform import parse
    from attnhal_cpu import CpuBackend

    return "; ".join(r.message for r in CpuBackend.runtime_reasons(parse("cpu")))


@pytest.fixture(scope="module")
def kernel_op():
    pytest.importorskip("torch")
    why = _kernel_reasons()
    if why:
        pytest.skip(f"cpu kernel unavailable: {why}")
    from attnhal_cpu.ops import attend_op

    return attend_op()


def test_the_op_defaults_are_the_python_defaults(kernel_op) -> None:
    schema = str(kernel_op.default._schema)
    assert (f"int prefetch={DEFAULTS.prefetch}, int max_vectors={DEFAULTS.max_vectors}, "
            f"bool prefetch_burst={bool(DEFAULTS.prefetch_burst)}, int tile_vectors={DEFAULTS.tile_vectors}") in schema, \
        schema


#: Claims of the conformance kit run per parameter set: decode and verify over pages of 16, in graphs too.
CLAIMS = ("phase[decode, float32]", "phase[target_verify, bfloat16]", "page_size[16]", "graph[decode]")


@pytest.mark.parametrize("params", [DEFAULTS, KernelParams(prefetch=0, max_vectors=4, tasks_per_thread=1, tile_vectors=2),
                                    KernelParams(prefetch=64, prefetch_burst=1, max_vectors=8, tasks_per_thread=8,
                                                 tile_vectors=4)],
                         ids=["defaults", "no-prefetch-one-head-tile2", "far-burst-two-heads-tile4"])
def test_conformance_holds_with_these_parameters(kernel_op, params: KernelParams) -> None:
    """The kit's claims (a cheap subset; the full kit runs in test_conformance.py with the host's own
    parameters) with the defaults and with the extremes a sweep may choose."""
    from attnhal.testing.checks import Status
    from attnhal.testing.report import run_conformance
    from attnhal_cpu.ops import Kernel

    report = run_conformance("cpu", max_examples=0, platform="cpu", only=CLAIMS,
                             backend_kwargs={"kernel": Kernel(kernel_op, HostParams(params, params), "test")})
    assert report.ok, report.format()
    assert {r.claim.name for r in report.results if r.status is Status.VERIFIED} == set(CLAIMS)


def test_every_tile_width_gives_the_same_output(kernel_op) -> None:
    """Lengths that end mid-tile and mid-page, several splits, and one row masked to nothing: the
    tile width changes only the order of fp32 sums."""
    import torch

    gen = torch.Generator().manual_seed(3)
    rows, hq, hkv, d, page, per_row = 3, 8, 2, 72, 16, 8
    k, v = (torch.randn(rows * per_row * page + page, hkv, d, generator=gen) for _ in range(2))
    table = torch.arange(rows * per_row, dtype=torch.int32).view(rows, per_row) + 1
    q = torch.randn(rows, hq, d, generator=gen)
    lens = torch.tensor([37, 0, 101], dtype=torch.int32)
    outs, lses = [], []
    for tile_vectors in (1, 2, 4):
        for splits in (1, 3):
            out, mid_o, mid_lse = torch.empty_like(q), torch.empty(rows * hq * splits * d), torch.empty(rows * hq * splits)
            kernel_op(out, mid_o, mid_lse, q, k, v, table, torch.arange(rows), lens, None, None, None, 0, 1, page,
                      d ** -0.5, splits, *KernelParams(tile_vectors=tile_vectors).op_args())
            outs.append(out.clone())
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-6)
    pos = torch.arange(page * per_row)
    for r in (0, 2):
        slots = table[r, pos // page].long() * page + pos % page
        kr, vr = k[slots[:lens[r]]].transpose(0, 1), v[slots[:lens[r]]].transpose(0, 1)  # [hkv, len, d]
        ref = torch.nn.functional.scaled_dot_product_attention(q[r].view(hkv, hq // hkv, d), kr, vr)
        torch.testing.assert_close(outs[0][r], ref.reshape(hq, d), rtol=1e-5, atol=1e-5)
    assert not outs[0][1].any()  # a row of length 0 attends nothing


def test_the_op_refuses_other_tile_widths(kernel_op) -> None:
    import torch

    q = torch.zeros(1, 2, 8)
    kv = torch.zeros(16, 1, 8)
    with pytest.raises(RuntimeError, match=r"tile_vectors=3 \(supported: 1, 2, 4\)"):
        kernel_op(torch.empty_like(q), torch.empty(16), torch.empty(2), q, kv, kv, torch.zeros(1, 1, dtype=torch.int32),
                  torch.arange(1), torch.ones(1, dtype=torch.int32), None, None, None, 0, 1, 16, 1.0, 1, 16, 64,
                  False, 3)


@pytest.mark.parametrize("shape", ["rising", "spike", "within-slack", "falling"])
def test_the_reference_max_softmax_matches_sdpa(kernel_op, shape: str) -> None:
    """Scores that pass the reference max by more than kExpMax (8) every few positions, once by far
    late, by less than 8 (exponentiated against a stale max), or only fall: fp32 output equals SDPA's."""
    import torch

    ctx, d, page = 203, 16, 16
    pos = torch.arange(ctx, dtype=torch.float32)
    score = {"rising": 0.9 * pos, "spike": torch.where(pos == 170, 60.0, torch.sin(pos)),
             "within-slack": 7.5 * torch.sin(pos / 5), "falling": -0.9 * pos}[shape]
    k = torch.zeros(-(-ctx // page) * page + page, 1, d)
    k[page:page + ctx, 0, 0] = score  # q = e0 and scale 1: the score of position p is k[p, 0]
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(5))
    q = torch.zeros(1, 1, d)
    q[0, 0, 0] = 1.0
    table = torch.arange(1, -(-ctx // page) + 1, dtype=torch.int32).view(1, -1)
    ref = torch.nn.functional.scaled_dot_product_attention(q.view(1, 1, d), k[page:page + ctx, 0].view(1, ctx, d),
                                                           v[page:page + ctx, 0].view(1, ctx, d), scale=1.0)
    for tile_vectors in (1, 4):
        out, mid_o, mid_lse = torch.empty_like(q), torch.empty(2 * d), torch.empty(2)
        kernel_op(out, mid_o, mid_lse, q, k, v, table, torch.arange(1), torch.tensor([ctx], dtype=torch.int32), None,
                  None, None, 0, 1, page, 1.0, 2, *KernelParams(tile_vectors=tile_vectors).op_args())
        torch.testing.assert_close(out.view(1, d), ref.view(1, d), rtol=1e-5, atol=1e-6)
