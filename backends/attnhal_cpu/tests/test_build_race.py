"""The race between builds: an AVX-512 CPU also runs the narrower builds, and the one that is
faster here runs each cache width. Fake timers and races for the choice and its record (no timing
in tests); the real builds of this host for their namespaces, outputs and the kit's claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnhal_cpu import build, buildlock, sweep
from attnhal_cpu.params import DEFAULTS, HOST_DEFAULTS, HostParams, KernelParams
from attnhal_cpu.sweep import HostBusy, SweepResult, SweepTimeout
from attnhal_cpu.tuning import PARAMS_ENV, TUNE_ENV, Contender, Tuning, record_path, tune, will_measure

pytestmark = pytest.mark.skipif(not buildlock.supported(), reason="needs fcntl")
CPU = "TestVendor Test CPU family 1 model 2 stepping 3"
NARROW = HostParams(KernelParams(prefetch=32), KernelParams(prefetch=8))


def steady(seconds: float):
    return lambda shape: seconds * (1 + shape)


def test_race_takes_a_faster_build_only_past_the_gain() -> None:
    quiet = lambda: 0.0  # noqa: E731 - the load average
    winner, times = sweep.race({"AVX512": steady(0.010), "AVX2": steady(0.009)}, "AVX512", load=quiet)
    assert winner == "AVX2" and times["AVX2"] == (0.009, 0.018) and set(times) == {"AVX512", "AVX2"}
    near = 0.010 * (1 - sweep.GAIN / 4)
    assert sweep.race({"AVX512": steady(0.010), "AVX2": steady(near)}, "AVX512", load=quiet)[0] == "AVX512"
    with pytest.raises(HostBusy, match="load average 5.00 per cpu"):
        sweep.race({"AVX512": steady(0.010)}, "AVX512", load=lambda: 5.0)
    ticks = iter(range(1000))
    with pytest.raises(SweepTimeout, match="ran past 3 s"):
        sweep.race({"AVX512": steady(0.010)}, "AVX512", clock=lambda: float(next(ticks)), load=quiet)


class Race:
    """A stand-in for :func:`attnhal_cpu.sweep.race` whose winner per call is scripted; it records the
    builds and the parameters each was raced with."""

    def __init__(self, *winners: str) -> None:
        self.winners, self.calls = list(winners), []

    def __call__(self, timers, current: str):
        self.calls.append({name: run.args[0] for name, run in timers.items()})
        return self.winners.pop(0), {name: (0.001, 0.002) for name in timers}


def sweeping(timer, tile: int, budget_s: float) -> SweepResult:
    return SweepResult(DEFAULTS, ((DEFAULTS, (0.001, 0.002)),), 0.1)


def narrow(source: str = "measured"):
    return lambda: Contender("AVX2", NARROW, source, lambda width, race=False: lambda params, shape: 0.001)


def run_tune(directory: Path, others, race) -> Tuning:
    return tune(directory, "AVX512", lambda width, race=False: lambda params, shape: 0.001, 16,
                progress=lambda stage, msg: None, cpu=CPU, run_sweep=sweeping, others=others, run_race=race)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TUNE_ENV, raising=False)
    monkeypatch.delenv(PARAMS_ENV, raising=False)


def test_the_faster_build_runs_each_width_and_the_record_keeps_it(tmp_path: Path, clean_env) -> None:
    race = Race("AVX2", "AVX512")  # fp32 raced first, then half
    got = run_tune(tmp_path, {"AVX2": narrow()}, race)
    assert got.source == "measured" and got.builds == (("fp32", "AVX2"),) and got.params == HOST_DEFAULTS
    assert got.build_for("fp32", "AVX512") == "AVX2" and got.build_for("half", "AVX512") == "AVX512"
    # each build raced at its own parameters for the width
    assert race.calls == [{"AVX512": DEFAULTS, "AVX2": NARROW.fp32}, {"AVX512": DEFAULTS, "AVX2": NARROW.half}]
    record = json.loads(record_path(tmp_path, CPU).read_text())
    assert record["builds"] == {"fp32": "AVX2", "half": "AVX512"} and set(record["race"]["fp32"]) == {"AVX512", "AVX2"}
    assert "fp32 runs on the AVX2 build" in str(got)

    def never():
        raise AssertionError("a cached record loads no other build")
    again = run_tune(tmp_path, {"AVX2": never}, Race())
    assert again.source == "cached" and again.builds == got.builds


def test_a_record_naming_a_build_this_host_lacks_is_measured_again(tmp_path: Path, clean_env) -> None:
    run_tune(tmp_path, {"AVX2": narrow()}, Race("AVX2", "AVX2"))
    path = record_path(tmp_path, CPU)
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "builds": {"fp32": "AVX9", "half": "AVX512"}}))
    got = run_tune(tmp_path, {"AVX2": narrow()}, Race("AVX512", "AVX512"))
    assert got.source == "measured" and got.builds == ()


def test_a_build_that_will_not_load_is_left_out_of_the_race(tmp_path: Path, clean_env) -> None:
    def broken() -> Contender:
        raise build.BuildError("c++: error: unrecognized option")
    race = Race("AVX512", "AVX512")
    got = run_tune(tmp_path, {"AVX2": broken}, race)
    assert got.source == "measured" and got.builds == () and race.calls == [{"AVX512": DEFAULTS}] * 2
    assert "unrecognized option" in json.loads(record_path(tmp_path, CPU).read_text())["left_out"]["AVX2"]


@pytest.mark.parametrize("how", ["defaulted contender", "busy host"])
def test_a_race_that_cannot_measure_caches_nothing(tmp_path: Path, clean_env, how: str) -> None:
    def busy(timers, current):
        raise HostBusy("load average 5.00 per cpu")
    contender = narrow("defaulted" if how == "defaulted contender" else "measured")
    got = run_tune(tmp_path, {"AVX2": contender}, busy)
    assert got.params == HOST_DEFAULTS and got.source == "defaulted" and got.builds == ()
    assert ("not measured" if how == "defaulted contender" else "load average") in got.detail
    assert not record_path(tmp_path, CPU).exists()


def test_the_narrower_builds_start_early_only_when_a_race_will_run(tmp_path: Path, clean_env, monkeypatch) -> None:
    assert will_measure(tmp_path, CPU)  # no record yet
    run_tune(tmp_path, {"AVX2": narrow()}, Race("AVX2", "AVX2"))
    assert not will_measure(tmp_path, CPU) and will_measure(tmp_path, "Another CPU")
    monkeypatch.setenv(TUNE_ENV, "again")
    assert will_measure(tmp_path, CPU)
    monkeypatch.setenv(TUNE_ENV, "0")
    assert not will_measure(tmp_path / "fresh", CPU)
    monkeypatch.delenv(TUNE_ENV)
    monkeypatch.setenv(PARAMS_ENV, "prefetch=8")
    assert not will_measure(tmp_path / "fresh", CPU)


def test_a_chosen_build_that_will_not_load_leaves_its_width_to_the_host_build(monkeypatch) -> None:
    def refuse(isa: str, compiler):
        raise build.BuildError(f"{isa}: did not load")
    monkeypatch.setattr(build, "load_build", refuse)
    tuning, narrower = build._narrower(Tuning(HOST_DEFAULTS, "cached", "measured then", (("fp32", "AVX2"),)), None, {})
    assert tuning.builds == () and narrower == {} and "fp32: the AVX2 build did not load" in tuning.detail
    native = build.NativeBuild("attnhal_cpu_avx512", "AVX512", 0.1, tuning=tuning)
    assert native.runs("fp32") == ("attnhal_cpu_avx512", tuning)


# --- this host's builds -------------------------------------------------------------------------

def _host_isa() -> str:
    from attnhal.platform import parse
    from attnhal_cpu import CpuBackend

    why = "; ".join(r.message for r in CpuBackend.runtime_reasons(parse("cpu")))
    if why:
        pytest.skip(f"cpu kernel unavailable: {why}")
    return build.native_build().own_isa


def test_the_host_build_runs_where_its_record_says() -> None:
    pytest.importorskip("torch")
    from attnhal_cpu.ops import host_kernel

    native = build.native_build()
    if not native.ok:
        pytest.skip(f"cpu kernel unavailable: {native.error}")
    for width, itemsize in (("fp32", 4), ("half", 2)):
        namespace, tuning = native.runs(width)
        kernel = host_kernel(itemsize)
        assert kernel.name == namespace and tuning is not None and kernel.params == tuning.params
        assert str(kernel.op).endswith(f"{namespace}.attend"), kernel.op


def test_every_narrower_build_loads_beside_the_host_build_and_keeps_the_claims() -> None:
    """Each build the race may pick on this host, in this one process under its own namespace: its
    instruction set, and the kit's cheap claims with its op (the defaults)."""
    pytest.importorskip("torch")
    from attnhal.testing.report import run_conformance
    from attnhal_cpu.buildcache import find_compiler
    from attnhal_cpu.ops import Kernel, attend_op

    narrower = build.NARROWER[_host_isa()]
    if not narrower:
        pytest.skip("this host runs no narrower build (an AVX2 or generic CPU)")
    for isa in narrower:
        _, _, ops = build.load_build(isa, find_compiler())
        assert str(ops.isa()).split(",")[0] == isa.lower().split("_")[0], ops.isa()
        kernel = Kernel(attend_op(build.op_namespace(isa)), HostParams(), f"forced {isa}")
        report = run_conformance("cpu", max_examples=0, platform="cpu", only=("phase[decode, float32]",
                                 "phase[target_verify, bfloat16]", "graph[decode]"), backend_kwargs={"kernel": kernel})
        assert report.ok, report.format()
