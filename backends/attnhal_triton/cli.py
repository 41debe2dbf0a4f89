"""``attnhal compile-check``: the Triton compile check as a plugin command.

Registered through the ``attnhal.commands`` entry-point group (see
:mod:`attnhal.cli.plugins`); offered only where ``triton`` is importable. This module
imports neither torch nor triton: the check loads them when it runs.
"""

from __future__ import annotations

import argparse
import json
import warnings

from attnhal.cli.args import BadArgument, ParamType, bounded
from attnhal.cli.plugins import Command
from attnhal.platform import VENDORS, UnknownArchWarning, Vendor

__all__ = ["COMMAND"]

#: Largest head size and number of parallel compiles accepted, so no input runs away.
MAX_HEAD_SIZE = 512
MAX_JOBS = 64


class Target(ParamType):
    """A compile target: ``cuda:ARCH`` or ``hip:ARCH`` with an arch of attnhal's table. An arch
    missing from it (``cuda:999``) is refused here: LLVM does not know it either, and Triton
    would warn per kernel and then abort in C++."""

    VENDORS = (Vendor.CUDA, Vendor.HIP)

    def __call__(self, text: str) -> str:
        from attnhal_triton.compile_check import target_platform

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnknownArchWarning)
                platform = target_platform(text)
        except ValueError:
            raise BadArgument(text, str(self)) from None
        if platform.vendor not in self.VENDORS or not platform.known_arch:
            raise BadArgument(text, str(self))
        return text

    def __str__(self) -> str:
        known = "; ".join(f"{v.value}: {', '.join(a.removeprefix('sm') for a in VENDORS[v].known)}"
                          for v in self.VENDORS)
        return f"cuda:ARCH or hip:ARCH with an arch of attnhal's table ({known})"


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from attnhal_triton.compile_check import DEFAULT_TARGETS, DTYPES, HEAD_SIZES, VARIANTS

    p.add_argument("--kernels", nargs="+", choices=list(VARIANTS), metavar="KERNEL",
                   help=f"kernel variants: {', '.join(VARIANTS)} (default: all)")
    p.add_argument("--targets", nargs="+", metavar="TARGET", type=Target(),
                   help=f"targets like cuda:90 or hip:gfx942 (default: {' '.join(DEFAULT_TARGETS)})")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, metavar="DTYPE",
                   help=f"{', '.join(DTYPES)} (default: all)")
    p.add_argument("--head-sizes", nargs="+", type=bounded(1, MAX_HEAD_SIZE), metavar="D",
                   help=f"head sizes, %(type)s each (default: {' '.join(map(str, HEAD_SIZES))})")
    p.add_argument("--fallback", action="store_true", help="also compile the fallback launch rows")
    p.add_argument("--jobs", type=bounded(1, MAX_JOBS), help="parallel compiles, %(type)s (default: the CPU count)")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even with errors or spills")
    p.add_argument("--json", action="store_true", help="print one JSON object per compile")


def _run(args: argparse.Namespace) -> int:
    from attnhal_triton.compile_check import format_table, run_compile_check

    rows = run_compile_check(args.kernels, args.targets, args.dtypes, args.head_sizes, args.fallback, args.jobs)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    bad = any(not r["ok"] or r["spills"] for r in rows)
    return 0 if args.allow_failures or not bad else 1


COMMAND = Command(
    name="compile-check",
    help="compile the Triton kernels for CUDA and HIP targets without a GPU (registers, spills, shared memory)",
    add_arguments=_add_arguments,
    run=_run,
    requires=("triton",),
)
