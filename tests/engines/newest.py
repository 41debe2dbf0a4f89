#!/usr/bin/env python3
"""A maintainer's check, not run in CI: does attnhal still agree with an engine's newest release?

    tests/engines/newest.py sglang|vllm [--version V] [--keep-going]

1. the release: ``--version``, else the newest the package index lists (``pip index versions``);
2. a venv for it in ``${ATTNHAL_ENGINE_ENVS:-~/.cache/attnhal/engine-envs}/ENGINE-newest-V``
   (reused when complete): torch 2.13.0 (CPU), ``ENGINE==V`` with the dependencies pip resolves
   (a new release has no pinned requirement file yet), the stand-ins of ``stubs/`` and attnhal
   editable, as ``setup.sh`` builds the pinned one;
3. the engine's tier in it (``tests/engines/ENGINE``), recording the release's executed
   decisions to a temporary file (``ATTNHAL_RECORD_TO``) instead of comparing them;
4. what changed against the engine's recording in ``tests/engines/recorded/`` (``recording_diff.report``),
   and the tier's failures: the adapter's, catalogue's or plugin's work for the new release.

Needs the network for step 2 (the tier itself refuses it). Exit 0 when the tier passed and no
recorded decision changed, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "helpers"))

import recording_diff  # noqa: E402

ENGINES = ("sglang", "vllm")


def newest(engine: str) -> str:
    """The newest release the package index lists for ``engine``."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", engine, "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    found = re.search(rf"^{re.escape(engine)} \(([^)]+)\)", out, flags=re.MULTILINE)
    if found is None:
        raise SystemExit(f"newest: no release of {engine} in `pip index versions` output:\n{out}")
    return found.group(1)


def build(engine: str, version: str) -> Path:
    """The venv for ``engine==version`` (built once; a stamp marks a complete build)."""
    root = Path(os.environ.get("ATTNHAL_ENGINE_ENVS", Path.home() / ".cache" / "attnhal" / "engine-envs"))
    env = root / f"{engine}-newest-{version}"
    stamp = env / "attnhal-engine-env.stamp"
    if stamp.is_file():
        return env
    shutil.rmtree(env, ignore_errors=True)
    python = env / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, f"{engine}=={version}"], check=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    shutil.copy(HERE / "stubs" / "_attnhal_stub.py", site)
    for package in (p for p in (HERE / "stubs").iterdir() if p.is_dir()):
        if not (site / package.name).exists():  # a real package the release pulled in wins over a stand-in
            shutil.copytree(package, site / package.name)
    subprocess.run([*pip, "--no-deps", "--no-build-isolation", "-e", str(REPO)], check=True)
    stamp.write_text(version + "\n", encoding="utf-8")
    return env


def run_tier(engine: str, env: Path, record: Path) -> tuple[int, list[str]]:
    """The tier's exit status and its failure lines."""
    environ = {**os.environ, "ATTNHAL_ENGINE_TIER": engine, "ATTNHAL_RECORD_TO": str(record),
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "backends"), str(REPO / "engines")])}
    done = subprocess.run([str(env / "bin" / "python"), "-m", "pytest", f"tests/engines/{engine}", "-q", "-rf",
                           "--confcutdir", "tests/engines", "-p", "no:attnhal"], cwd=REPO, env=environ,
                          capture_output=True, text=True)
    lines = done.stdout.splitlines()
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return done.returncode, failures + lines[-1:]


def compare(engine: str, record: Path) -> tuple[bool, list[str]]:
    """Whether any recorded decision changed, and the report (no recording: said)."""
    recorded = sorted((REPO / "tests" / "engines" / "recorded").glob(f"{engine}-*.jsonl"))
    if not recorded:
        return False, [f"no recording of {engine} in tests/engines/recorded/: the tier's result only"]
    if not record.is_file():
        return True, [f"the tier wrote no recording to {record} (did it stop before the grid?)"]
    old, new = recording_diff.load(recorded[-1]), recording_diff.load(record)
    lines = recording_diff.report(old, new)
    return lines[-1] != "no decision changed", lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=ENGINES)
    parser.add_argument("--version", help="the release to check (default: the newest on the package index)")
    args = parser.parse_args(argv)
    version = args.version or newest(args.engine)
    print(f"newest: {args.engine} {version}", flush=True)
    env = build(args.engine, version)
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / f"{args.engine}-{version}.jsonl"
        status, tier = run_tier(args.engine, env, record)
        changed, report = compare(args.engine, record)
    print("\n".join([f"tier ({env}): " + ("passed" if status == 0 else f"exit {status}"), *tier, *report]))
    return 0 if status == 0 and not changed else 1


if __name__ == "__main__":
    sys.exit(main())
