"""What attnhal's SGLang plugin costs a server, measured in fresh processes in one run.

Each process imports ``sglang.srt.plugins`` and times SGLang's own ``load_plugins()`` call, with
attnhal's plugin (``SGLANG_PLUGINS=attnhal``) and without it (``SGLANG_PLUGINS`` naming no
installed plugin), then the import of the EAGLE worker a speculative server makes. Without
speculation the plugin must cost < 5 % of SGLang's plugin loading or < 50 ms, and must not import
the speculative workers; with speculation the hook must be applied when the worker is imported.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from entry_point_overlay import overlay
from tier_summary import LINES as SUMMARY

WORKER = "sglang.srt.speculative.eagle_worker_v2"
PROBE = f"""
import json, sys, time
from sglang.srt.plugins import load_plugins
start = time.perf_counter()
load_plugins()
loaded = time.perf_counter() - start
workers = sorted(m for m in sys.modules if m.startswith("sglang.srt.speculative."))
attnhal = sorted(m for m in sys.modules if m == "attnhal" or m.startswith("attnhal."))
start = time.perf_counter()
import {WORKER} as worker
imported = time.perf_counter() - start
hooked = hasattr(vars(worker.EagleDraftWorker)["_capture_cuda_graphs"], "__wrapped__")
print(json.dumps({{"load": loaded, "workers": workers, "import": imported, "hooked": hooked, "attnhal": attnhal}}))
"""
RUNS = 3  # per side, alternating: the medians are compared


def _probe(plugins: str) -> dict[str, object]:
    with overlay() as record:  # this clone's entry points, whoever installed the environment
        path = os.pathsep.join([str(record.parent), os.environ.get("PYTHONPATH", "")])
        return _run(plugins, {**os.environ, "PYTHONPATH": path})


def _run(plugins: str, env: dict[str, str]) -> dict[str, object]:
    env = {**env, "SGLANG_PLUGINS": plugins, "ATTNHAL_SGLANG_GRAPHS": "audit"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_plugin_costs_a_server_without_speculation_nearly_nothing() -> None:
    runs: dict[str, list[dict[str, object]]] = {"with": [], "without": []}
    for _ in range(RUNS):
        runs["without"].append(_probe("attnhal-not-installed"))
        runs["with"].append(_probe("attnhal"))
    load = {side: statistics.median(float(r["load"]) for r in found) for side, found in runs.items()}  # type: ignore[arg-type]
    imports = {side: statistics.median(float(r["import"]) for r in found) for side, found in runs.items()}  # type: ignore[arg-type]
    cost = load["with"] - load["without"]
    SUMMARY.append(f"plugin load cost (median of {RUNS} fresh processes each): load_plugins() {load['with']:.3f} s "
                   f"with attnhal, {load['without']:.3f} s without: {cost * 1000:+.0f} ms "
                   f"({cost / load['without'] * 100:+.1f} %); importing {WORKER} afterwards: "
                   f"{imports['with']:.2f} s with, {imports['without']:.2f} s without")
    # Neither a speculative worker nor attnhal imported by load_plugins().
    assert all(r["workers"] == [] and r["attnhal"] == [] for r in runs["with"]), runs["with"][0]
    assert cost < max(0.05 * load["without"], 0.050), (load, runs)
    assert all(r["hooked"] for r in runs["with"]) and not any(r["hooked"] for r in runs["without"])
