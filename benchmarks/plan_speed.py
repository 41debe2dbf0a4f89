"""Planner speed: microseconds per ``plan()`` for a descriptor with 10 variants, one run.

    python benchmarks/plan_speed.py [--repeats 9] [--plans 2000]

Contenders, planned for the same spec config (EAGLE, 3 steps, topk 2, 4 draft tokens),
platform (``hip:gfx942``) and request context (MLA, page size 64, bf16):

* ``10 variants``: one descriptor with 10 conditional claims, every role; the context
  makes 5 of them apply, so ``plan`` resolves and checks them (the target:
  < 100 us per plan).
* ``10 variants, split roles``: the same plus a second descriptor for decode (two resolutions).
* ``no variants``: the same base claims without variants (what resolution adds).
* ``10 variants, cold``: ``10 variants`` with the planner's cache cleared before each plan:
  the first plan of new inputs (resolution, reason messages, decisions all computed).
* ``python loop``: ``sum(range(1000))``, a calibration: on a loaded machine every number
  stretches alike, so compare the ratios, measured in this one run.

Each timing is the median over ``--repeats`` interleaved rounds of ``--plans`` plans.
The planner caches what it derives from one descriptor under one (platform, context,
spec) — the resolved claims, reason messages and per-phase decisions — so the warm
contenders measure a plan of inputs planned before (an engine re-planning, adaptive
step counts); ``cold`` measures the first plan.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from attnhal.capabilities import BackendCapabilities, SpecLimits, Variant, When
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.planner import GraphPolicy, PhaseBackends, decide, plan
from attnhal.platform import parse
from attnhal.spec import RequestContext, SpecConfig

BASE = BackendCapabilities(
    name="ten-variants", vendors={"cuda", "hip"}, phases=set(Phase), models={"mha", "gqa", "mla"},
    graph=dict.fromkeys(GRAPH_PHASES, SpecLimits()), multi_step=SpecLimits(), features={"custom_mask"},
    page_sizes={1, 16, 32, 64}, kv_dtypes={"bfloat16", "float16", "fp8_e4m3"},
    archs={"cuda": ("sm80..sm90", "sm100.."), "hip": ("gfx942", "gfx950")},
)
VARIANTS = (
    Variant(When(model={"mla"}), {"graph": {Phase.DRAFT_EXTEND: None}}, note="mla: no draft-extend graph"),
    Variant(When(model={"mla"}), remove={"features": {"custom_mask"}}, note="mla: no tree mask"),
    Variant(When(model={"mla"}), {"page_sizes": {64}}, note="mla: page 64"),
    Variant(When(page_size={16, 32, 64}, topk=None), {"run_limits": {Phase.TARGET_VERIFY: SpecLimits(max_topk=1)}},
            note="paged: chains only"),
    Variant(When(vendor={"hip"}), {"graph": {Phase.TARGET_VERIFY: SpecLimits(max_topk=1)}}, note="hip verify"),
    Variant(When(arch={"cuda": ("sm100..",)}), {"page_sizes": {16, 32, 64, 128}}, note="blackwell pages"),
    Variant(When(fp8={"none"}), remove={"kv_dtypes": {"fp8_e4m3"}}, note="no fp8"),
    Variant(When(algorithm={"ngram"}), {"multi_step": None}, note="ngram"),
    Variant(When(kv_dtype={"fp8_e4m3"}), {"head_sizes": {128}}, note="fp8 heads"),
    Variant(When(num_steps=(1,)), {"graph": {Phase.DRAFT_DECODE: None}}, note="one step"),
)
TEN = replace(BASE, variants=VARIANTS)
SPEC = SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
PLATFORM = parse("hip:gfx942")
CONTEXT = RequestContext(model="mla", page_size=64, dtype="bfloat16")
POLICY = GraphPolicy()




def cold(backends: PhaseBackends) -> object:
    decide._resolved.cache_clear()  # private: the benchmark measures the uncached path
    return plan(SPEC, PLATFORM, backends, POLICY, CONTEXT)


def contenders() -> dict[str, Callable[[], object]]:
    same, base = PhaseBackends.same(TEN, SPEC), PhaseBackends.same(BASE, SPEC)
    split = PhaseBackends.split(TEN, replace(TEN, name="decode-side"), SPEC, mode="decode")
    return {
        "10 variants": lambda: plan(SPEC, PLATFORM, same, POLICY, CONTEXT),
        "10 variants, split roles": lambda: plan(SPEC, PLATFORM, split, POLICY, CONTEXT),
        "no variants": lambda: plan(SPEC, PLATFORM, base, POLICY, CONTEXT),
        "10 variants, cold": lambda: cold(same),
        "python loop": lambda: sum(range(1000)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--plans", type=int, default=2000)
    args = parser.parse_args()
    runs = contenders()
    applied = plan(SPEC, PLATFORM, PhaseBackends.same(TEN, SPEC), POLICY, CONTEXT)[Phase.TARGET_VERIFY].variants
    print(f"load average before: {os.getloadavg()[0]:.2f}; variants applied per plan: {len(applied)} of 10")
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():  # interleaved: load drift hits every contender alike
            start = time.perf_counter()
            for _ in range(args.plans):
                fn()
            times[name].append((time.perf_counter() - start) / args.plans * 1e6)
    calib = statistics.median(times["python loop"])
    print(f"{'contender':<26} {'us per call':>12} {'x python loop':>14}")
    for name, samples in times.items():
        us = statistics.median(samples)
        print(f"{name:<26} {us:>12.1f} {us / calib:>14.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
