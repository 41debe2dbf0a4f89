"""Which parameters a kernel build runs with here: measured once per CPU model, kept with the build.

The first process that loads a build on a CPU model it has no record for runs the sweep
(:mod:`attnhal_cpu.sweep`, once per cache width, at most about 3 s for both) and writes ``tuned-<key>.json`` into the build's cache
entry (keyed by the CPU model; the entry itself is per instruction set), atomically; later
processes read it. On a CPU that also runs narrower builds (an AVX-512 host runs the AVX2 build;
``others``), the same first process then builds and tunes those too and races them, each at its
own parameters (:func:`attnhal_cpu.sweep.race`), per cache width: the record names the build
that runs each width (a wider vector is not always faster: a Zen 4 executes a 512-bit operation
as two 256-bit halves). Nothing here ever blocks a run or fails a build: a sweep that fails or
runs past its budget, a record another process is still writing past :data:`WAIT_S`, or an
unreadable cache leaves the defaults (:data:`~attnhal_cpu.params.HOST_DEFAULTS`) for this process,
saying why, and caches nothing, so a later process measures again. A killed sweep writes
nothing and releases its lock (the kernel does, :mod:`attnhal_cpu.buildlock`). A record that
does not parse, or holds values out of range, is measured again and replaced.

``ATTNHAL_CPU_TUNE``: unset or ``auto``: the record, else measure; ``0`` (or ``off``): the
defaults, no sweep (reproducible runs); ``again``: measure and replace the record.
``ATTNHAL_CPU_PARAMS="prefetch=32,max_vectors=16,fp32.prefetch_burst=1"``: these values (any
subset; the rest default; ``fp32.`` or ``half.`` before a name sets one cache width only), no sweep.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from attnhal.errors import AttnhalError
from attnhal_cpu import buildlock
from attnhal_cpu.buildcache import Progress, report_to_stderr
from attnhal_cpu.params import HOST_DEFAULTS, WIDTH_NAMES, WIDTHS, HostParams, KernelParams, parse_host_params
from attnhal_cpu.sweep import BUDGET_S, SweepResult, Timer, race, sweep

__all__ = ["FORMAT", "MODES", "PARAMS_ENV", "TUNE_ENV", "Contender", "MakeTimer", "Tuning", "cpu_model",
           "record_path", "tune", "will_measure"]

TUNE_ENV = "ATTNHAL_CPU_TUNE"
PARAMS_ENV = "ATTNHAL_CPU_PARAMS"
MODES = ("auto", "1", "0", "off", "again")
#: Seconds to wait for another process's sweep (which takes about 3 s) before keeping the defaults.
WAIT_S = 10.0
FORMAT = 2
#: ``make_timer(width)``: a build's timer on the sweep's shapes of a cache width;
#: ``make_timer(width, race=True)``: on the race's (:data:`~attnhal_cpu.sweep.RACE_SHAPES`).
MakeTimer = Callable[..., Timer]
#: ``builds`` of a :class:`Tuning`: (cache width, instruction set of the build that runs it).
Builds = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Tuning:
    """The parameters this process uses and where they came from.

    ``source``: ``measured`` (by this process), ``cached`` (an earlier process's record),
    ``set`` (``ATTNHAL_CPU_PARAMS``) or ``defaulted``; ``detail`` says when and how, or why not;
    ``builds``: the cache widths another build runs faster here, with its instruction set (that
    build's own record holds its parameters; ``params`` are this build's own for every width).
    """

    params: HostParams
    source: str
    detail: str
    builds: Builds = ()

    def build_for(self, width: str, own: str) -> str:
        """The instruction set of the build that runs cache width ``width`` (``own``: this build's)."""
        return dict(self.builds).get(width, own)

    def choice(self) -> str:
        """The parameters, and which cache widths another build runs."""
        return f"{self.params}" + "".join(f"; {WIDTH_NAMES[w]} runs on the {isa} build" for w, isa in self.builds)

    def __str__(self) -> str:
        return f"{self.choice()} ({self.source}: {self.detail})"


@dataclass(frozen=True)
class Contender:
    """A narrower build this CPU also runs, loaded and tuned: its instruction set, its own
    parameters (``source`` as :class:`Tuning`'s: a race needs ``measured`` or ``cached`` ones) and a
    timer factory per cache width."""

    isa: str
    params: HostParams
    source: str
    make_timer: MakeTimer


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU model the parameters are measured for: vendor, model name, family, model and
    stepping (virtual machines often say only ``AMD EPYC``; the numbers tell a Zen 3 from a Zen 4)."""
    try:
        with open(cpuinfo) as f:
            block = f.read().split("\n\n")[0]
    except OSError:
        return f"{platform.system()} {platform.machine()} {platform.processor()}".strip()
    fields = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in block.splitlines())}
    return (f"{fields.get('vendor_id', '?')} {fields.get('model name', '?')} family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')} stepping {fields.get('stepping', '?')}")


def record_path(directory: Path, cpu: str) -> Path:
    return directory / f"tuned-{hashlib.sha256(cpu.encode()).hexdigest()[:12]}.json"


class _Corrupt(AttnhalError, ValueError):
    pass


def _read(path: Path, cpu: str, isa: str, others: Sequence[str]) -> Tuning | None:
    """The record at ``path`` (None: none yet). Raises :class:`_Corrupt` saying why it is unusable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if record["format"] != FORMAT or record["cpu"] != cpu or record["isa"] != isa:
            raise _Corrupt(f"written for {record['cpu']!r} {record['isa']} format {record['format']}")
        params = HostParams(**{w: KernelParams(**record["params"][w]) for w in WIDTHS})
        builds = tuple((w, record["builds"][w]) for w in WIDTHS if record["builds"][w] != isa)
        if any(b not in others for _, b in builds):
            raise _Corrupt(f"builds {record['builds']} (supported: {[isa, *others]})")
        detail = _detail(record)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _Corrupt(f"{path.name}: {type(exc).__name__}: {exc}") from None
    return Tuning(params, "cached", f"measured {detail}", builds)


def _write(path: Path, cpu: str, isa: str, results: dict[str, SweepResult], raced: _Raced, seconds: float,
           load: str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record: dict[str, Any] = {
        "format": FORMAT, "cpu": cpu, "isa": isa, "params": {w: r.params.to_dict() for w, r in results.items()},
        "builds": {w: raced.builds.get(w, isa) for w in WIDTHS}, "when": when, "seconds": round(seconds, 3),
        "race_seconds": round(raced.seconds, 3), "load": load,
        "trials": {w: [[p.to_dict(), [round(t * 1e3, 4) for t in ts]] for p, ts in r.trials]
                   for w, r in results.items()},
        "race": {w: {b: [round(t * 1e3, 4) for t in ts] for b, ts in times.items()}
                 for w, times in raced.times.items()},
        "left_out": raced.left_out}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return _detail(record)


def _detail(record: dict[str, Any]) -> str:
    """When a record was measured, in how long, and at what load."""
    race = record.get("race") or {}
    raced = f" + a race of {len(race['fp32'])} builds in {record['race_seconds']:.1f} s" if race else ""
    return f"{record['when']} in {record['seconds']:.1f} s{raced}, load {record['load']}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


#: ``run_sweep(timer, tile, budget_s)``: :func:`attnhal_cpu.sweep.sweep` or a stand-in.
Sweeper = Callable[[Timer, int, float], SweepResult]
#: ``run_race(timers, current)``: :func:`attnhal_cpu.sweep.race` or a stand-in.
Racer = Callable[[Mapping[str, Callable[[int], float]], str], tuple[str, dict[str, tuple[float, ...]]]]


@dataclass(frozen=True)
class _Raced:
    """What racing the builds found: per cache width the winner (where not this build) and every
    build's fastest times; ``left_out``: builds that would not build or load, with why."""

    builds: dict[str, str]
    times: dict[str, dict[str, tuple[float, ...]]]
    left_out: dict[str, str]
    seconds: float = 0.0


def tune(directory: Path, isa: str, make_timer: MakeTimer, tile: int, *,
         progress: Progress = report_to_stderr, cpu: str | None = None, run_sweep: Sweeper = sweep,
         others: Mapping[str, Callable[[], Contender]] = MappingProxyType({}), run_race: Racer = race) -> Tuning:
    """The parameters for the build in cache entry ``directory`` (instruction set ``isa``, ``tile``
    positions per tile) on this CPU; ``make_timer(width)`` times the build on a cache of that
    width (:data:`~attnhal_cpu.params.WIDTHS`); ``others[isa]()`` loads and tunes a narrower build
    this CPU also runs (called only when measuring), to race it per width. See the module doc.
    Never raises on a sweep or cache problem: the defaults come back with the reason."""
    if os.environ.get(PARAMS_ENV):
        try:
            chosen = parse_host_params(os.environ[PARAMS_ENV])
        except ValueError as exc:
            return Tuning(HOST_DEFAULTS, "defaulted", f"{PARAMS_ENV}: {exc}")
        return Tuning(chosen, "set", f"{PARAMS_ENV}={os.environ[PARAMS_ENV]}")
    mode = os.environ.get(TUNE_ENV) or "auto"
    if mode not in MODES:
        return Tuning(HOST_DEFAULTS, "defaulted", f"{TUNE_ENV}={mode!r} (supported: {', '.join(MODES)})")
    if mode in ("0", "off"):
        return Tuning(HOST_DEFAULTS, "defaulted", f"{TUNE_ENV}={mode}: no sweep")
    cpu = cpu or cpu_model()
    path = record_path(directory, cpu)

    def measure() -> tuple[dict[str, SweepResult], _Raced, float]:
        results, seconds = _sweep_widths(make_timer, tile, run_sweep)
        return results, _race(isa, make_timer, results, others, run_race, progress), seconds

    try:
        return _tune(path, isa, tuple(others), measure, progress, cpu, again=mode == "again")
    except Exception as exc:  # noqa: BLE001 - tuning is an optimisation: it never stops a run
        return Tuning(HOST_DEFAULTS, "defaulted", f"{type(exc).__name__}: {exc}")


def will_measure(directory: Path, cpu: str | None = None) -> bool:
    """Whether :func:`tune` for the build in cache entry ``directory`` would measure now (no record
    for this CPU yet, or ``ATTNHAL_CPU_TUNE=again``; neither switch turning it off): the caller may
    then start building the narrower builds early, in parallel. A record that turns out unusable
    is measured all the same, only without that head start."""
    mode = os.environ.get(TUNE_ENV) or "auto"
    if os.environ.get(PARAMS_ENV) or mode not in MODES or mode in ("0", "off"):
        return False
    return mode == "again" or not record_path(directory, cpu or cpu_model()).exists()


def _sweep_widths(make_timer: MakeTimer, tile: int,
                  run_sweep: Sweeper) -> tuple[dict[str, SweepResult], float]:
    """One sweep per cache width, all within :data:`~attnhal_cpu.sweep.BUDGET_S` (setup included)."""
    start = time.monotonic()
    results = {}
    for width in WIDTHS:
        timer = make_timer(width)
        results[width] = run_sweep(timer, tile, BUDGET_S - (time.monotonic() - start))
    return results, time.monotonic() - start


def _race(isa: str, make_timer: MakeTimer, results: Mapping[str, SweepResult],
          others: Mapping[str, Callable[[], Contender]], run_race: Racer, progress: Progress) -> _Raced:
    """Load and tune each of ``others`` (a build that will not load is left out, saying why), then
    race them with this build, each at its own parameters, per cache width. Raises when a
    contender's parameters could not be measured (a busy host): nothing is then cached."""
    if not others:
        return _Raced({}, {}, {})
    progress("tune", f"building and tuning the narrower builds this CPU also runs ({', '.join(others)}) "
                     "to race them with the host's build (once per CPU model)")
    contenders, left_out = [], {}
    for name, load in others.items():
        try:
            contenders.append(load())
        except Exception as exc:  # noqa: BLE001 - one build that fails leaves the others to race
            left_out[name] = f"{type(exc).__name__}: {exc}"
    for c in contenders:
        if c.source not in ("measured", "cached"):
            raise RuntimeError(f"the {c.isa} build's parameters were {c.source}, not measured: no race")
    builds, times, start = {}, {}, time.monotonic()
    for width in WIDTHS:
        timers = {isa: functools.partial(make_timer(width, race=True), results[width].params)}
        timers.update({c.isa: functools.partial(c.make_timer(width, race=True), getattr(c.params, width))
                       for c in contenders})
        winner, times[width] = run_race(timers, isa)
        if winner != isa:
            builds[width] = winner
    return _Raced(builds, times, left_out, time.monotonic() - start)


def _tune(path: Path, isa: str, others: Sequence[str],
          measure: Callable[[], tuple[dict[str, SweepResult], _Raced, float]],
          progress: Progress, cpu: str, again: bool) -> Tuning:
    why = "no record yet" if not again else f"{TUNE_ENV}=again"
    if not again:
        try:
            found = _read(path, cpu, isa, others)
            if found is not None:
                return found
        except _Corrupt as exc:
            why = f"the record was unusable ({exc})"
    if not buildlock.supported():
        return Tuning(HOST_DEFAULTS, "defaulted", "no flock on this platform to guard the record")

    def waiting(holder: str, waited: float) -> None:
        progress("tune-wait", f"waiting for {holder} to finish measuring the kernel's parameters ({path.parent})")

    try:
        with buildlock.exclusive(path.with_name("tune.lock"), WAIT_S, waiting, WAIT_S):
            if not again:  # measured by the process we waited for?
                try:
                    found = _read(path, cpu, isa, others)
                    if found is not None:
                        return found
                except _Corrupt:
                    pass
            progress("tune", f"measuring the kernel's parameters on this CPU ({cpu}, {isa}; {why}; at most "
                             f"about 3 s, once per CPU model; {TUNE_ENV}=0 skips it)")
            load = _load()
            try:
                results, raced, seconds = measure()
            except Exception as exc:  # noqa: BLE001 - the defaults serve; nothing is cached
                progress("tune-failed", f"kept the default parameters: {type(exc).__name__}: {exc}")
                return Tuning(HOST_DEFAULTS, "defaulted", f"the sweep failed: {type(exc).__name__}: {exc}")
            detail = _write(path, cpu, isa, results, raced, seconds, load)
            tuned = Tuning(HostParams(**{w: r.params for w, r in results.items()}), "measured", detail,
                           tuple((w, raced.builds[w]) for w in WIDTHS if w in raced.builds))
            progress("tuned", f"chose {tuned.choice()} in {seconds:.1f} s")
            return tuned
    except buildlock.LockTimeout as exc:
        return Tuning(HOST_DEFAULTS, "defaulted", f"another process was still measuring: {exc}")
