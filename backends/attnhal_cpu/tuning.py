"""Which parameters a kernel build runs with here: measured once per CPU model, kept with the build.

The first process that loads a build on a CPU model it has no record for runs the sweep
(:mod:`attnhal_cpu.sweep`, once per cache width, at most about 3 s for both) and writes ``tuned-<key>.json`` into the build's cache
entry (keyed by the CPU model; the entry itself is per instruction set), atomically; later
processes read it. Nothing here ever blocks a run or fails a build: a sweep that fails or
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

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnhal.errors import AttnhalError
from attnhal_cpu import buildlock
from attnhal_cpu.buildcache import Progress, report_to_stderr
from attnhal_cpu.params import HOST_DEFAULTS, WIDTHS, HostParams, KernelParams, parse_host_params
from attnhal_cpu.sweep import BUDGET_S, SweepResult, Timer, sweep

__all__ = ["FORMAT", "MODES", "PARAMS_ENV", "TUNE_ENV", "Tuning", "cpu_model", "record_path", "tune"]

TUNE_ENV = "ATTNHAL_CPU_TUNE"
PARAMS_ENV = "ATTNHAL_CPU_PARAMS"
MODES = ("auto", "1", "0", "off", "again")
#: Seconds to wait for another process's sweep (which takes about 3 s) before keeping the defaults.
WAIT_S = 10.0
FORMAT = 1


@dataclass(frozen=True)
class Tuning:
    """The parameters this process uses and where they came from.

    ``source``: ``measured`` (by this process), ``cached`` (an earlier process's record),
    ``set`` (``ATTNHAL_CPU_PARAMS``) or ``defaulted``; ``detail`` says when and how, or why not.
    """

    params: HostParams
    source: str
    detail: str

    def __str__(self) -> str:
        return f"{self.params} ({self.source}: {self.detail})"


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


def _read(path: Path, cpu: str, isa: str) -> Tuning | None:
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
        detail = f"{record['when']} in {record['seconds']:.1f} s, load {record['load']}"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _Corrupt(f"{path.name}: {type(exc).__name__}: {exc}") from None
    return Tuning(params, "cached", f"measured {detail}")


def _write(path: Path, cpu: str, isa: str, results: dict[str, SweepResult], seconds: float, load: str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record: dict[str, Any] = {
        "format": FORMAT, "cpu": cpu, "isa": isa, "params": {w: r.params.to_dict() for w, r in results.items()},
        "when": when, "seconds": round(seconds, 3), "load": load,
        "trials": {w: [[p.to_dict(), [round(t * 1e3, 4) for t in ts]] for p, ts in r.trials]
                   for w, r in results.items()}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return f"{when} in {seconds:.1f} s, load {load}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


#: ``run_sweep(timer, tile, budget_s)``: :func:`attnhal_cpu.sweep.sweep` or a stand-in.
Sweeper = Callable[[Timer, int, float], SweepResult]


def tune(directory: Path, isa: str, make_timer: Callable[[str], Timer], tile: int, *,
         progress: Progress = report_to_stderr, cpu: str | None = None, run_sweep: Sweeper = sweep) -> Tuning:
    """The parameters for the build in cache entry ``directory`` (instruction set ``isa``, ``tile``
    positions per tile) on this CPU; ``make_timer(width)`` times the build on a cache of that
    width (:data:`~attnhal_cpu.params.WIDTHS`). See the module doc. Never raises on a sweep or
    cache problem: the defaults come back with the reason."""
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
    try:
        return _tune(path, isa, make_timer, tile, progress, cpu, run_sweep, again=mode == "again")
    except Exception as exc:  # noqa: BLE001 - tuning is an optimisation: it never stops a run
        return Tuning(HOST_DEFAULTS, "defaulted", f"{type(exc).__name__}: {exc}")


def _measure(make_timer: Callable[[str], Timer], tile: int, run_sweep: Sweeper) -> tuple[dict[str, SweepResult], float]:
    """One sweep per cache width, all within :data:`~attnhal_cpu.sweep.BUDGET_S` (setup included)."""
    start = time.monotonic()
    results = {}
    for width in WIDTHS:
        timer = make_timer(width)
        results[width] = run_sweep(timer, tile, BUDGET_S - (time.monotonic() - start))
    return results, time.monotonic() - start


def _tune(path: Path, isa: str, make_timer: Callable[[str], Timer], tile: int, progress: Progress, cpu: str,
          run_sweep: Sweeper, again: bool) -> Tuning:
    why = "no record yet" if not again else f"{TUNE_ENV}=again"
    if not again:
        try:
            found = _read(path, cpu, isa)
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
                    found = _read(path, cpu, isa)
                    if found is not None:
                        return found
                except _Corrupt:
                    pass
            progress("tune", f"measuring the kernel's parameters on this CPU ({cpu}, {isa}; {why}; at most "
                             f"about 3 s, once per CPU model; {TUNE_ENV}=0 skips it)")
            load = _load()
            try:
                results, seconds = _measure(make_timer, tile, run_sweep)
            except Exception as exc:  # noqa: BLE001 - the defaults serve; nothing is cached
                progress("tune-failed", f"kept the default parameters: {type(exc).__name__}: {exc}")
                return Tuning(HOST_DEFAULTS, "defaulted", f"the sweep failed: {type(exc).__name__}: {exc}")
            detail = _write(path, cpu, isa, results, seconds, load)
            params = HostParams(**{w: r.params for w, r in results.items()})
            progress("tuned", f"chose {params} in {seconds:.1f} s")
            return Tuning(params, "measured", detail)
    except buildlock.LockTimeout as exc:
        return Tuning(HOST_DEFAULTS, "defaulted", f"another process was still measuring: {exc}")
