"""benchmarks/gpu_session.sh on a machine without a GPU: CPU parts run, device parts skip, exit 0.

It runs as a lent machine would start it: under a Python that has torch, Triton and pytest but
not attnhal, with the wheel benchmarks/device_prep.sh writes (``--no-peers``: the engines' kernel
files come from their tier venvs, not built here). About 40-70 s on 2 cores when they are
quiet, 229 s under a load of 4-5 (2026-12-06: info 18 s, graph tests 44 s, the benchmark's
call-site check 47 s, the engines'-kernels plumbing 103 s, each in a child process). Where a
CUDA/HIP device is present the script *is* the device run (minutes): this test skips there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from repo import ROOT

#: The device parts of each plan (benchmarks/gpu_session.sh OUT [core|rest]).
DEVICE_PARTS = {"core": ("engines' kernels (gpu_peers core)", "triton bandwidth + prefill",
                         "compile share on this Triton"),
                "rest": ("engines' kernels (gpu_peers rest)", "spill relief vs the rows' forms",
                         "worker end to end (triton)", "worker on MLA (triton, eagle 1 and 3)", "capture aftermath",
                         "decode graph replay vs eager", "compile share on this Triton"),
                "mla": ("engines' kernels (gpu_peers mla)", "compile share on this Triton")}


def bare_python(tmp_path: Path) -> Path:
    """A python with this one's packages but not attnhal (its editable install is a ``.pth``
    hook, which ``-S`` skips), as a lent machine's python3 is."""
    wrapper = tmp_path / "bare-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{sysconfig.get_paths()["purelib"]}" '
                       f'exec {sys._base_executable} -S "$@"\n')
    wrapper.chmod(0o755)
    lacks = subprocess.run([str(wrapper), "-c", "import torch, triton, pytest, attnhal_triton"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert "No module named 'attnhal_triton'" in lacks.stderr, lacks.stderr
    return wrapper


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is present: run the session itself")
def test_session_script_on_cpu_runs_cpu_parts_and_skips_device_parts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTNHAL_PLATFORM", "PYTHONPATH")}
    device = tmp_path / "device"
    prep = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_prep.sh"), str(device), "--no-peers"],
                          env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0 and len(list(device.glob("attnhal-*.whl"))) == 1, prep.stdout + prep.stderr
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), str(tmp_path / "out")],
                          env={**env, "PYTHON": str(bare_python(tmp_path)), "ATTNHAL_DEVICE_DIR": str(device)},
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary == proc.stdout
    lines = summary.splitlines()
    assert ", plan core, " in lines[0]
    assert lines[1].startswith(f"attnhal from the wheel in {device};"), lines[1]
    assert "WARNING" not in proc.stderr, proc.stderr
    for part in DEVICE_PARTS["core"]:
        assert sum(line.startswith(f"SKIP {part}") and line.endswith("no CUDA/HIP device") for line in lines) == 1
    for part in ("attnhal info", "graph tests (device + seam)", "benchmark call sites vs sdpa (cpu)",
                 "engines' kernels plumbing (cpu)"):
        assert any(line.startswith(part) and " ok " in line for line in lines), summary
    assert lines[-1].endswith("no part failed")
    assert "platform: cpu" in (tmp_path / "out" / "info.txt").read_text()
    pytest_log = (tmp_path / "out" / "pytest.txt").read_text()
    assert re.search(r"\d+ passed, \d+ skipped", pytest_log) and "no device graph API here" in pytest_log
    bandwidth = (tmp_path / "out" / "bandwidth.txt").read_text()
    assert "check triton: max |err|" in bandwidth and "FAIL" not in bandwidth
    assert "interpreter: plumbing only, no speed" in bandwidth and "WRONG" not in bandwidth
    assert len(list((tmp_path / "out").iterdir())) <= 8  # what a lent machine sends back


def test_an_unknown_plan_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), str(tmp_path / "out"), "all"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "PLAN=all (supported: core, rest, mla)" in proc.stderr
