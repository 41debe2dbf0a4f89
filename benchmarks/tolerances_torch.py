"""Measure the torch backend's error against the fp64 reference, per dtype and KV dtype.

    python benchmarks/tolerances_torch.py [--cases 60]

For random cases of every phase (head configs, head sizes, slot layouts, tree
masks, accepted lengths, page sizes 1/16/64, and a random mix of sliding window,
soft-cap and sinks) it prints, per compute dtype and KV-cache dtype (fp8 in both e4m3
flavours and e5m2, with per-layer scales), the largest absolute error and the smallest
``tol`` with ``|out - ref| <= tol + tol * |ref|`` on every element, next to the
tolerance the descriptor declares for that pair. The reference reads the same
quantized cache (dequantized in fp64), so the fp8 rows measure the backend's compute,
not the quantization. Builds the cases with :func:`attnhal.testing.cases.build_case`
from ``tests/helpers/cases.py``'s seeded specs.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reference import expected, random_spec  # noqa: E402

from attnhal.phases import Phase
from attnhal.spec import SpecConfig
from attnhal.testing.cases import build_case
from attnhal_torch import TorchBackend

DTYPES = ("float32", "float16", "bfloat16")
HEADS = [(1, 1), (4, 2), (4, 1), (8, 2)]


def _params(phase: Phase, rng: random.Random, bs: int) -> dict[str, Any]:
    if phase is Phase.PREFILL:
        return {"new_lens": [rng.randint(0, 24) for _ in range(bs)]}
    if phase is Phase.TARGET_VERIFY:  # a draft tree when topk > 1
        topk = rng.randint(1, 3)
        return {"spec": SpecConfig.eagle(3, topk, rng.randint(2, 3 * topk + 1))}
    if phase is Phase.DRAFT_EXTEND:  # draft_extend_len t = num_steps + 1
        t = rng.randint(2, 6)
        return {"spec": SpecConfig.eagle(t - 1), "new_lens": [rng.randint(1, t) for _ in range(bs)]}
    if phase is Phase.DRAFT_DECODE:
        topk = rng.randint(1, 3)
        return {"spec": SpecConfig.eagle(4, topk, 4 * topk + 1), "draft_step": rng.randint(0, 2)}
    return {}


#: (KV dtype, fp8 flavour) pairs measured beside each compute dtype (None: the compute dtype).
KV = [(None, "e4m3fn"), ("fp8_e4m3", "e4m3fn"), ("fp8_e4m3", "e4m3fnuz"), ("fp8_e5m2", "e4m3fn")]


def _features(rng: random.Random) -> dict[str, Any]:
    """A random mix of page size and layer features (each on about half the time)."""
    out: dict[str, Any] = {"page_size": rng.choice([1, 16, 64])}
    if rng.random() < 0.5:
        out["sliding_window"] = rng.randint(0, 64)
    if rng.random() < 0.5:
        out["logit_softcap"] = rng.uniform(1.0, 30.0)
    out["sinks"] = rng.random() < 0.5
    return out


def measure(dtype_name: str, cases: int, kv_dtype: str | None = None,
            flavor: str = "e4m3fn") -> tuple[float, float]:
    """(max abs error, smallest tol = atol = rtol that passes) over ``cases`` random cases."""
    rng = random.Random(0)
    worst_abs, worst_tol = 0.0, 0.0
    for i in range(cases):
        phase = list(Phase)[i % len(Phase)]
        bs = rng.randint(1, 4)
        q, kv = rng.choice(HEADS)
        case = build_case(random_spec(phase, seed=i, num_q_heads=q, num_kv_heads=kv,
                                      head_size=rng.choice([16, 64, 128, 256]), dtype=dtype_name,
                                      prefix_lens=[rng.randint(0, 200) for _ in range(bs)],
                                      kv_dtype=kv_dtype, fp8_flavor=flavor, kv_scale=rng.choice([0.25, 1.0]),
                                      **_features(rng), **_params(phase, rng, bs)))
        ref = expected(case)
        backend = TorchBackend(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch).double()
        err = (out - ref).abs()
        if err.numel():
            worst_abs = max(worst_abs, err.max().item())
            worst_tol = max(worst_tol, (err / (1 + ref.abs())).max().item())
    return worst_abs, worst_tol


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=60)
    cases = ap.parse_args().cases
    caps = TorchBackend.capabilities
    print(f"{'dtype':9} {'kv dtype':20} {'max |err|':>10} {'needed tol':>11} {'declared atol/rtol':>19}")
    for name in DTYPES:
        for kv, flavor in KV:
            worst_abs, worst_tol = measure(name, cases, kv, flavor)
            tol = caps.tolerance_for(name, kv)
            shown = name if kv is None else f"{kv} ({flavor})" if kv == "fp8_e4m3" else kv
            print(f"{name:9} {shown:20} {worst_abs:10.2e} {worst_tol:11.2e} {tol.atol:9.1e}/{tol.rtol:.1e}")


if __name__ == "__main__":
    with torch.no_grad():
        main()
