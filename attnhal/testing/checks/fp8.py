"""The fp8 life cycle of a ``kv_dtype[fp8_*]`` claim: scales set late, values past the range.

* **Late scales.** An engine builds its attention backends first and loads the
  checkpoint's per-layer K/V scales into the pool afterwards (``pool.k_scale[layer] = s``),
  possibly after its graphs were captured. A backend must read the scales at every
  forward, and a replay must follow scales set after the capture: nothing calls the
  backend when a scale changes. Checked eagerly (scales set after construction, before
  the cache is written) and through every claimed graph phase (set after the capture).
* **Saturation.** New K/V whose ``x / scale`` lies past the format's largest finite value
  are stored saturated, in every flavour (:func:`attnhal.testing.oracle.quantize`:
  e4m3fn ±448, e4m3fnuz ±240, e5m2 ±57344), never as NaN or inf: a bare conversion
  saturates in one flavour and not in the others.
* **Large scales.** Scales of 2^12 under large q (:func:`large_scale_cases`): ``q * k_scale``
  past fp16's range, where the fp32 math stays finite.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from attnhal.backend import KVPool, kv_storage_dtype
from attnhal.phases import GRAPH_PHASES, Phase
from attnhal.platform import Fp8Flavor, GraphKind
from attnhal.testing.cases import CaseRecipe, attention_config, build_case, make_pool
from attnhal.testing.checks.claims import Claim, ClaimFalsified, ClaimKind
from attnhal.testing.checks.common import blame, with_example
from attnhal.testing.checks.expected import resize
from attnhal.testing.checks.graphs import in_limits, replay_fixed
from attnhal.testing.checks.phases import canonical_cases, check_eager
from attnhal.testing.checks.target import Target, checkable_dtypes

__all__ = ["LARGE_K_SCALE", "LATE_K_SCALE", "LATE_V_SCALE", "check_late_scales", "large_scale_cases", "late_scales",
           "saturation_fields"]

#: The scales set late, layer ``l``: K ``LATE_K_SCALE / (l + 1)``, V ``LATE_V_SCALE * (l + 1)``
#: (per layer, none 1, none the recipe's, none in the recipe's ratio of V to K).
LATE_K_SCALE, LATE_V_SCALE = 0.125, 1.5
#: ``k_scale`` of the large-scale cases (``v_scale`` twice it): 32 * 2^12 = 2^17 > 65,504.
LARGE_K_SCALE = 2.0**12


def saturation_fields(kv_dtype: str, flavour: str) -> dict[str, Any]:
    """Recipe fields whose K and V lie past the range of ``kv_dtype`` (in ``flavour``) once
    divided by the scales: ``k_scale = 2^floor(log2(16 / max))`` under K integers up to 32,
    V up to ``4 max v_scale``, so that most values saturate and the rest do not."""
    top = torch.finfo(kv_storage_dtype(kv_dtype, Fp8Flavor(flavour))).max
    k_scale = 2.0 ** math.floor(math.log2(16 / top))
    return {"kv_dtype": kv_dtype, "fp8_flavor": flavour, "kv_scale": k_scale, "qk_magnitude": 32,
            "v_magnitude": 4 * top * 2 * k_scale}


def large_scale_cases(target: Target, kv_dtype: str, flavours: list[str]) -> list[CaseRecipe]:
    """Large scales with large q, in every checkable compute dtype and flavour (decode, or the
    first claimed phase): ``k_scale`` :data:`LARGE_K_SCALE` under integer q/k of magnitude 32
    (``q * k_scale`` is 2^17, past fp16's range: a kernel that folds the scale into q, or
    dequantizes K, in fp16 overflows), V of magnitude 2^15 (stored ``V / 2^13``, outputs within
    fp16's range). The fp32 math is finite; the tolerance widens with the logits and |V|."""
    caps = target.caps
    phase = Phase.DECODE if Phase.DECODE in caps.phases else next(p for p in Phase if p in caps.phases)
    return [replace(canonical_cases(caps, phase, dtype, min(caps.head_sizes))[0], kv_dtype=kv_dtype,
                    fp8_flavor=f, kv_scale=LARGE_K_SCALE, qk_magnitude=32, v_magnitude=2.0**15)
            for dtype in checkable_dtypes(target) for f in flavours]


def late_scales(layers: int) -> tuple[list[float], list[float]]:
    """The K and V scales of each layer that the kit sets late."""
    return [LATE_K_SCALE / (i + 1) for i in range(layers)], [LATE_V_SCALE * (i + 1) for i in range(layers)]


def _rescale(pool: KVPool) -> None:
    """Set the late scales in place, as an engine loading its checkpoint does."""
    k, v = late_scales(pool.num_layers)
    pool.k_scale.copy_(torch.tensor(k))
    pool.v_scale.copy_(torch.tensor(v))


def check_late_scales(target: Target, claim: Claim, variants: list[dict[str, Any]]) -> list[Phase]:
    """Scales set after construction (every claimed phase, eager) and after capture (every
    claimed graph phase) with each of ``variants`` (the claim's KV fields); returns the graph
    phases replayed."""
    caps = target.caps
    dtype, head = checkable_dtypes(target)[0], min(caps.head_sizes)
    for fields in variants:
        for phase in (p for p in Phase if p in caps.phases):
            _late_eager(target, claim, replace(canonical_cases(caps, phase, dtype, head)[0], **fields))
    if target.platform.graph_kind is GraphKind.NONE:
        return []
    replayed = []
    for phase in (p for p in GRAPH_PHASES if p in caps.graph):
        graph_claim = Claim(ClaimKind.GRAPH, phase.value)
        base = replace(canonical_cases(caps, phase, dtype, head)[0], **variants[0])
        if not in_limits(target, graph_claim, base):
            continue
        try:
            replay_fixed(target, graph_claim, [resize(base, n, base.seed + n) for n in (2, 1)], after_capture=_rescale)
        except ClaimFalsified as exc:
            raise ClaimFalsified(claim, f"scales set after the capture: {exc.claim}: {exc.detail}") from exc
        replayed.append(phase)
    return replayed


def _late_eager(target: Target, claim: Claim, recipe: CaseRecipe) -> None:
    """Build the backend on a pool with the recipe's scales, then set the late ones and write
    the cache (as an engine loading its checkpoint does), then run."""
    pool = make_pool(recipe, device=target.device)
    with blame(claim, "constructing the backend"):
        backend = target.new_backend(attention_config(recipe), pool)
    _rescale(pool)
    case = build_case(recipe, pool=pool)
    try:
        k, v = late_scales(pool.num_layers)
        check_eager(target, claim, case, backend, how=f", scales k {k[case.layer]:g} / v {v[case.layer]:g} of "
                                                      f"layer {case.layer} set after the backend was built")
    except ClaimFalsified as exc:
        raise with_example(exc, recipe) from exc
