"""Spill relief: the compiler referees the launch table, one kernel form at a time.

The launch table (:mod:`attnhal_triton.launch_table`) keys its rows by kernel, arch family,
head size and dtype; a row's form still varies with what the table cannot see (the group,
the query tokens per row, the KV format, the input flags), and in 1.4-2.5 % of the NVIDIA forms
sampled (docs/triton.md) the row's tiles spill a few bytes of registers: a bf16 query over an
fp16 cache converts each K/V tile and holds both copies, and ptxas caps some programs at 128 or
168 registers by itself.

Before a form launches for the first time the backend compiles it (the compile the launch
would do anyway), reads the compiler's own spill count, and if it spilled, tries the
:func:`reliefs` in order until one does not: the row's options with the register cap
lifted (the vendor's options from ``LaunchRow.uncapped``: CUDA ``maxnreg`` 255, HIP
``waves_per_eu`` 1), then both at ``BLOCK_N`` halved, down to 16 positions; only then the same
with one pipeline stage. Only ``BLOCK_N`` and launch options change: ``BLOCK_N`` is the K/V loop's step,
so the grid, the splits and every buffer sized from the blocks stay as the metadata planned
them. The choice is made once per form and process, before the first launch (a form's
launches never mix tilings), and the offline enumeration (``python -m
attnhal_triton.compile_forms``) makes the same choice with the cross-compiler, so its report
names the form that launches.

Under Triton's interpreter there is no compiler to ask: the row's form runs as it is.

This module imports neither torch nor triton.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MIN_BLOCK_N", "RELIEVED", "Relief", "as_tabled", "choose", "compiler_spills", "launch", "relieved",
           "reliefs"]

_LOG = logging.getLogger("attnhal_triton")

#: The narrowest K/V step a relief goes to (``tl.dot``'s minimum operand extent).
MIN_BLOCK_N = 16

#: ``probe(constexprs, options)``: bytes of register spill of that form, or None where no
#: compiler reports it (the interpreter).
Probe = Callable[[Mapping[str, Any], Mapping[str, Any]], "int | None"]


@dataclass(frozen=True)
class Relief:
    """The form a launch takes: its ``constexprs`` and ``options``; ``label`` says what was
    changed from the row's (``""``: nothing); ``spills``: bytes the compiler reported for it
    (None: not compiled); ``row_spills``: the row's own form's bytes (None: not compiled)."""

    constexprs: Mapping[str, Any]
    options: Mapping[str, Any]
    label: str = ""
    spills: int | None = None
    row_spills: int | None = None


def reliefs(constexprs: Mapping[str, Any], options: Mapping[str, Any], uncapped: Mapping[str, Any]
            ) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(label, constexprs, options)`` to try after the row's own form, least change first: at
    each ``BLOCK_N`` (the row's, then halved down to :data:`MIN_BLOCK_N`) the row's options, then
    the register cap lifted; only then the same with one pipeline stage (a stage's prefetched tiles
    hold registers too, but a memory-bound loop loses its overlap). A form equal to one already
    listed is skipped; ``label`` names what changed."""
    block_n = constexprs.get("BLOCK_N")
    steps = [block_n]
    while isinstance(block_n, int) and block_n // 2 >= MIN_BLOCK_N:
        block_n //= 2
        steps.append(block_n)
    seen = {(steps[0], tuple(sorted(options.items())))}  # the row's own form
    for stages in ({}, {"num_stages": 1}):
        for step in steps:
            shrunk = dict(constexprs) if step is None else {**constexprs, "BLOCK_N": step}
            for variant in ({**stages}, {**stages, **uncapped}):
                opts = {**options, **variant}
                key = (step, tuple(sorted(opts.items())))
                if key in seen:
                    continue
                seen.add(key)
                changed = [f"BLOCK_N={step}"] if step != steps[0] else []
                changed += [f"{k}={v}" for k, v in variant.items() if options.get(k) != v]
                yield ",".join(changed), shrunk, opts


def choose(probe: Probe, constexprs: Mapping[str, Any], options: Mapping[str, Any],
           uncapped: Mapping[str, Any]) -> Relief:
    """The form to launch: the row's own if the compiler reports no spill (or cannot report),
    else the first of :func:`reliefs` that does not spill; where every one spills, the one
    that spills least (the compiler's figures say so in the returned :class:`Relief`). A relief
    the compiler or the driver refuses (a resource it exceeds) is passed over: relief never
    turns a launch the row could make into an error."""
    first = probe(constexprs, options)
    best = Relief(dict(constexprs), dict(options), "", first, first)
    if not first:  # 0 bytes, or no compiler to ask
        return best
    for label, cx, opts in reliefs(constexprs, options, uncapped):
        try:
            spills = probe(cx, opts)
        except Exception as exc:  # the row's own form compiled; this variant is simply not a relief
            _LOG.debug("spill relief: %s not taken: %s: %s", label, type(exc).__name__, exc)
            continue
        if spills is None:
            continue
        if spills < (best.spills or 0):
            best = Relief(cx, opts, label, spills, first)
        if spills == 0:
            break
    return best


def compiler_spills(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...]) -> Probe:
    """The probe of a real device: compile ``kernel`` for these ``args`` without launching it
    (the compile its launch would do) and read the spill the driver reports when it loads
    the binary (4-byte words of local memory, CUDA and HIP alike)."""
    def probe(constexprs: Mapping[str, Any], options: Mapping[str, Any]) -> int | None:
        compiled = kernel.warmup(*args, grid=grid, **constexprs, **options)
        if compiled is None or not hasattr(compiled, "_init_handles"):  # a cache hook or async compile took it
            return None
        compiled._init_handles()  # loads the binary: where Triton reads n_regs / n_spills
        return int(compiled.n_spills) * 4
    return probe


#: The form each (kernel, argument dtypes and devices, row form) launched with in this process.
RELIEVED: dict[tuple[Any, ...], Relief] = {}


def launch(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: Mapping[str, Any],
           options: Mapping[str, Any], uncapped: Mapping[str, Any], compiled: bool) -> Relief:
    """Launch ``kernel[grid](*args, **constexprs, **options)`` as :func:`choose` relieves it,
    deciding once per form (``compiled``: a compiler reports spills; False under the interpreter).
    Returns the form launched."""
    if _AS_TABLED.get():
        kernel[grid](*args, **constexprs, **options)
        return Relief(dict(constexprs), dict(options))
    # The ops build constexprs and options in a fixed order, and every tensor of a launch is on
    # its first argument's device (arg_devices.on_one_device): a cheap key (4.5 µs a launch on the Zen 4 host).
    key = (kernel, getattr(args[0], "device", None), tuple(getattr(a, "dtype", None) for a in args),
           tuple(constexprs.items()), tuple(options.items()))
    relief = RELIEVED.get(key)
    if relief is None:
        probe = compiler_spills(kernel, grid, args) if compiled else _no_compiler
        relief = RELIEVED[key] = choose(probe, constexprs, options, uncapped)
        if relief.label:  # a server's log says which launch row missed, and what runs instead
            _LOG.info("spill relief: %s", _line(key, relief))
    kernel[grid](*args, **relief.constexprs, **relief.options)
    return relief


#: True while :func:`as_tabled` holds (per thread and task).
_AS_TABLED = contextvars.ContextVar("attnhal_spill_relief_as_tabled", default=False)


@contextlib.contextmanager
def as_tabled() -> Iterator[None]:
    """Launch every form as its launch row gives it, spilling or not, deciding and recording
    nothing: what relief changed can then be measured against it (benchmarks/relief_speed.py).
    A graph captured inside replays the row's forms."""
    token = _AS_TABLED.set(True)
    try:
        yield
    finally:
        _AS_TABLED.reset(token)


def _no_compiler(constexprs: Mapping[str, Any], options: Mapping[str, Any]) -> None:
    return None


def relieved() -> list[str]:
    """One line per form this process launched relieved: the kernel, what changed, the bytes the
    row's form spilled and the relieved one's (for logs and benchmark reports)."""
    return [_line(key, r) for key, r in RELIEVED.items() if r.label]


def _line(key: tuple[Any, ...], relief: Relief) -> str:
    return (f"{getattr(key[0], '__name__', key[0])} {dict(key[3])}: {relief.label} "
            f"(row {relief.row_spills} B spilled, launched {relief.spills} B)")
