"""``layer_pattern`` and ``scale_edges``: heterogeneous layers, and sizes past narrow integers.

* ``layer_pattern`` — real models alternate layer kinds. On every claimed phase, one
  backend runs every layer of a :data:`LAYERS`-layer pool through one batch's metadata, as
  an engine does, with every claimed per-layer feature differing layer to layer: windows
  :data:`WINDOWS` (full, 6, 2, full), each layer's own sinks, and with a claimed fp8 cache
  the per-layer scales :data:`SCALES`. Each layer is checked against its own reference, so
  a backend that keys a per-layer behaviour on the wrong index (``layer % 2``, the first
  layer's scale) is falsified.
* ``scale_edges`` — where lengths and offsets leave narrow integers: a context of
  :data:`LONG_CONTEXT` (past 2^16; one request, two query heads), a prefill extend of
  :data:`LONG_EXTEND` new tokens (past 4096; ``--thorough`` only: its fp64 reference takes
  seconds), and a KV pool whose element offsets pass 2^31
  (:mod:`.far_pool`: the pool is a lazily committed allocation only touched where the batch
  reads). The long cases stay within ``max_seq_len`` (an interpreter's bound leaves them
  out, and the detail says so); the far pool fits every bound.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

import attnhal.testing.strategies as hst
from attnhal.kv_format import kv_format
from attnhal.testing.strategies import DEFAULT_MAX_SEQ_LEN
from attnhal.backend import AttentionBackend
from attnhal.phases import Feature, Phase
from attnhal.testing.cases import Case, CaseRecipe, build_case, make_pool, new_qkv
from attnhal.testing.checks.claims import Claim, ClaimFalsified
from attnhal.testing.checks.common import blame, forward_checked, heads
from attnhal.testing.checks.coverage import note
from attnhal.testing.checks.far_pool import check_far_pool
from attnhal.testing.checks.fixed import at_lengths, fits
from attnhal.testing.checks.phases import canonical_cases
from attnhal.testing.checks.target import Target, checkable_dtypes
from attnhal.testing.checks.variants import fp8_flavours

__all__ = ["LAYERS", "LONG_CONTEXT", "LONG_EXTEND", "SCALES", "WINDOWS", "check_layer_pattern", "check_scale_edges"]

LAYERS = 4
#: Per-layer windows: no layer shares its neighbours' (full, 6, 2, full), so that a
#: backend reading layer ``l``'s window from another index is off on some layer.
WINDOWS: tuple[int | None, ...] = (None, 6, 2, None)
#: Per-layer fp8 ``k_scale`` (``v_scale`` is twice it): each layer its own.
SCALES = (0.25, 0.5, 1.0, 0.125)
#: Past 2^16 = 65,536: a length held in 16 bits wraps to 1.
LONG_CONTEXT = 65_537
#: Past 4096 new tokens: an extend loop bounded at 4096 query tokens stops short.
LONG_EXTEND = 4_097
_FIRST = (Phase.DECODE, Phase.DRAFT_DECODE, Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.PREFILL)


def _base(target: Target, phase: Phase) -> CaseRecipe:
    caps = target.caps
    return canonical_cases(caps, phase, checkable_dtypes(target)[0], min(caps.head_sizes))[0]


# --- layer pattern ---------------------------------------------------------------------------

def check_layer_pattern(target: Target, claim: Claim) -> tuple[str, int]:
    fields = _pattern_fields(target)
    count = 0
    for phase in (p for p in Phase if p in target.caps.phases):
        recipe = replace(_base(target, phase), num_layers=LAYERS, layer=0, **fields)
        if fits(recipe, target.max_seq_len, target.max_cost):
            count += _run_layers(target, claim, recipe)
    shown = ", ".join(f"{k}={v}" for k, v in fields.items() if k != "fp8_flavor") or "no per-layer feature claimed"
    scales = f", k_scale {SCALES}" if fields.get("kv_dtype") else ""
    return (f"{LAYERS} layers through one batch's metadata, every claimed phase ({shown}{scales}); "
            f"{count} forwards"), count


def _pattern_fields(target: Target) -> dict[str, Any]:
    """Recipe fields of every claimed per-layer feature at once."""
    caps = target.caps
    out: dict[str, Any] = {}
    if Feature.SLIDING_WINDOW in caps.features:
        out["sliding_window"] = WINDOWS
    if Feature.SINKS in caps.features:
        out["sinks"] = True
    fp8 = [f for f in hst.kv_fields(caps, fp8_flavours(target)[:1]) if kv_format(f["kv_dtype"]).scaled]
    if fp8:
        out |= {"kv_dtype": fp8[0]["kv_dtype"], "fp8_flavor": fp8[0]["fp8_flavor"]}
    return out


def _run_layers(target: Target, claim: Claim, recipe: CaseRecipe) -> int:
    pool = make_pool(recipe, device=target.device)
    if pool.kv_format.scaled:  # set before the K/V are drawn: build_case stores them with these scales
        pool.k_scale.copy_(torch.tensor(SCALES, dtype=torch.float32))
        pool.v_scale.copy_(2 * torch.tensor(SCALES, dtype=torch.float32))
    case = build_case(recipe, pool=pool, device=target.device)
    note(recipe)
    gen = torch.Generator().manual_seed(recipe.seed + 11)
    with blame(claim, f"{_where(recipe)}: the backend"):
        backend = target.new_backend(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
    for layer in (2, 0, 3, 1):  # not in order: a backend counting its calls to find the layer is off
        q, k, v = new_qkv(case.config, case.batch.num_tokens, gen, target.device, recipe)
        window = case.config.window(layer)
        forward_checked(target, claim, backend, replace(case, q=q, k=k, v=v, layer=layer),
                         f"{_where(recipe)}, layer {layer} of {LAYERS} (window {window}"
                         f"{f', k_scale {SCALES[layer]}' if pool.kv_format.scaled else ''})")
    return LAYERS


def _where(recipe: CaseRecipe) -> str:
    return f"{recipe.phase.value}, {recipe.dtype}, {heads(recipe)}, seq lens {recipe.seq_lens()}"


# --- scale edges ------------------------------------------------------------------------------

def check_scale_edges(target: Target, claim: Claim) -> tuple[str, int]:
    phases = [p for p in _FIRST if p in target.caps.phases]
    ran, left = [], []
    for name, recipe in _long_cases(target, phases[0]):
        if target.max_seq_len < DEFAULT_MAX_SEQ_LEN:
            left.append(name)
            continue
        start = time.perf_counter()
        case = build_case(recipe, device=target.device)
        note(recipe)
        with blame(claim, f"{name}: the backend"):
            backend = target.new_backend(case.config, case.pool)
            backend.init_forward_metadata(case.batch)
        forward_checked(target, claim, backend, case, f"{name}, {_where(recipe)}")
        ran.append(f"{name} ({time.perf_counter() - start:.1f} s)")
    ran.append(check_far_pool(target, claim, _base(target, phases[0])))
    out = f"{'; '.join(ran)}"
    if left:
        out += f"; left out (max_seq_len={target.max_seq_len} is below the default): {', '.join(left)}"
    return out, len(ran)


def _long_cases(target: Target, phase: Phase) -> list[tuple[str, CaseRecipe]]:
    """A context past 2^16 in ``phase``; when thorough, a prefill extend past 4096 new tokens
    where prefill is claimed."""
    few: dict[str, Any] = {"num_q_heads": 2, "num_kv_heads": 1}
    out = [(f"context {LONG_CONTEXT}", replace(at_lengths(_base(target, phase), (LONG_CONTEXT,)), **few))]
    if Phase.PREFILL in target.caps.phases and target.thorough:  # its fp64 reference alone takes seconds
        extend = at_lengths(_base(target, Phase.PREFILL), (LONG_EXTEND + 3,), (LONG_EXTEND,))
        out.append((f"prefill extend of {LONG_EXTEND} tokens", replace(extend, **few)))
    return out
