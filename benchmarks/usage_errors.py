"""Usage-error latency: seconds from process start to the one-line refusal, without ``--platform``.

    python benchmarks/usage_errors.py [--repeat 5]

Each bad command line runs as a fresh ``python -m attnhal ...`` process (``ATTNHAL_PLATFORM``
unset, so a platform would be detected from torch) and is timed from spawn to exit, the
median of ``--repeat`` runs, after one untimed run that lets Python write its bytecode caches
(``PYTHONDONTWRITEBYTECODE`` is dropped for the children: an installed package has its ``.pyc``
files, and compiling attnhal's sources on every start is not what a user waits for). Beside them, in the same run: ``python -c pass`` (the
interpreter's own start) and ``python -c "import torch"`` (what a refusal would cost if it
waited for platform detection). The goal is < 0.5 s per refusal on a quiet machine; the
ratio to the torch import says how much of that wait the early checks save, whatever the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

#: Bad inputs, each refused with exit 2 before torch loads (tests/cli/test_early_refusal.py).
BAD = (
    ("plan", "--backend", "/nonexistent.toml"),
    ("plan", "--spec-steps", "1", "--topk", "3"),
    ("explain", "--backend", "nosuch"),
    ("demo", "--topk", "2", "--draft-tokens", "30"),
    ("conformance", "torch", "--platform", "bogus"),
)


def _seconds(argv: list[str], expect: int, repeat: int, env: dict[str, str]) -> float:
    subprocess.run(argv, capture_output=True, cwd=ROOT, env=env)  # bytecode caches written, not timed
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
        times.append(time.perf_counter() - start)
        if proc.returncode != expect:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode} (expected {expect}): {proc.stderr.strip()}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per command line (the median is printed)")
    repeat = max(1, parser.parse_args().repeat)
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNHAL_PLATFORM", "PYTHONDONTWRITEBYTECODE")}
    py = sys.executable
    interpreter = _seconds([py, "-c", "pass"], 0, repeat, env)
    torch_import = _seconds([py, "-c", "import torch"], 0, repeat, env)
    print(f"python -c pass: {interpreter:.3f} s; python -c 'import torch': {torch_import:.3f} s "
          f"(median of {repeat}; load {os.getloadavg()[0]:.1f})")
    print(f"{'command':<48} {'seconds':>8} {'x import torch':>15}")
    worst = 0.0
    for bad in BAD:
        t = _seconds([py, "-m", "attnhal", *bad], 2, repeat, env)
        worst = max(worst, t)
        print(f"{'attnhal ' + ' '.join(bad):<48} {t:>8.3f} {t / torch_import:>15.2f}")
    verdict = "met" if worst < 0.5 else "not met here (see the load and the interpreter's own start above)"
    print(f"worst refusal: {worst:.3f} s; goal < 0.5 s: {verdict}")


if __name__ == "__main__":
    main()
