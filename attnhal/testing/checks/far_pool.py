"""A KV pool whose element offsets pass 2^31, allocated without committing its memory.

A kernel that computes ``slot * num_kv_heads * head_size`` in 32 bits wraps past 2^31
elements. :func:`check_far_pool` runs a small batch whose slots all lie past that offset:
the pool's layer is ``torch.empty`` (on a CPU, pages nobody writes are never committed;
on a device, one allocation of a few GiB), and only the slots the batch reads are copied
in from a compact case whose reference is computed as usual. The report gives the
resident memory the case added (``/proc/self/statm``, where there is one).
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import replace

import torch

import attnhal.testing.strategies as hst
from attnhal.kv_format import kv_format
from attnhal.backend import KVPool
from attnhal.testing.cases import Case, CaseRecipe, build_case
from attnhal.testing.checks.claims import Claim, ClaimFalsified
from attnhal.testing.checks.common import blame, check_output, input_tolerance, with_example
from attnhal.testing.checks.coverage import note
from attnhal.testing.checks.fixed import at_lengths
from attnhal.testing.checks.target import Target
from attnhal.testing.checks.variants import fp8_flavours
from attnhal.testing.oracle import reference_forward

__all__ = ["FAR_ELEMENTS", "check_far_pool", "far_recipe"]

#: Element offsets of the batch's slots start past this (2^31: a signed 32-bit offset wraps).
FAR_ELEMENTS = 2**31


def far_recipe(target: Target, base: CaseRecipe) -> CaseRecipe:
    """``base`` with two short requests, one KV head, one layer, in the narrowest claimed
    cache (fp8 where claimed, else a 16-bit dtype where claimed): the cheapest far pool."""
    caps = target.caps
    fp8 = [f for f in hst.kv_fields(caps, fp8_flavours(target)[:1]) if kv_format(f["kv_dtype"]).scaled]
    narrow = [d for d in ("float16", "bfloat16") if d in caps.dtypes]
    recipe = replace(at_lengths(base, (9, 5)), num_q_heads=2, num_kv_heads=1, num_layers=1, layer=0,
                     dtype=narrow[0] if narrow else base.dtype)
    return replace(recipe, **{k: v for k, v in fp8[0].items() if k != "kv_scale"}) if fp8 else recipe


def check_far_pool(target: Target, claim: Claim, base: CaseRecipe) -> str:
    """Run the far case against the compact case's reference; returns what ran."""
    recipe = far_recipe(target, base)
    start = time.perf_counter()
    compact = build_case(recipe, device=target.device)
    want = reference_forward(compact.q, compact.k, compact.v, 0, compact.batch, compact.pool,
                             compact.config.sm_scale, compact.config)
    rss = _resident()
    far, offset = _far(compact)
    pool = far.pool
    note(recipe, pool_slots=pool.num_slots)
    what = (f"a pool of {pool.num_slots} slots x {pool.num_kv_heads} x {pool.head_dim} {pool.dtype} "
            f"(slots from {offset}: element offsets past 2^31), {recipe.phase.value}, seq lens {recipe.seq_lens()}")
    with blame(claim, f"{what}: the backend"):
        backend = target.new_backend(far.config, pool)
        backend.init_forward_metadata(far.batch)
        out = backend.forward(far.q, far.k, far.v, 0, far.batch)
    added = _resident() - rss
    tol = input_tolerance(target.caps.tolerance_for(recipe.dtype, recipe.kv_dtype), compact)
    try:
        check_output(claim, out, far.q, want, far.batch, tol, what)
    except ClaimFalsified as exc:
        raise with_example(exc, recipe) from None
    gib = (pool.k[0].nbytes + pool.v[0].nbytes) / 2**30
    mem = f", {added / 2**20:.0f} MiB resident" if added >= 0 else ""
    return f"pool past 2^31 elements ({gib:.1f} GiB allocated{mem}, {time.perf_counter() - start:.1f} s)"


def _far(case: Case) -> tuple[Case, int]:
    """``case`` moved to the far end of a pool of the same shape: every slot ``s > 0`` becomes
    ``s + offset`` (the padding page stays first), only the slots the batch reads or writes copied."""
    pool, batch = case.pool, case.batch
    P, per_slot = pool.page_size, pool.num_kv_heads * pool.head_dim
    offset = -(-(FAR_ELEMENTS // per_slot + 1) // P) * P
    rows = pool.req_to_page.shape[0]
    total = offset + pool.num_slots + P
    far = copy.copy(pool)
    far.k = [torch.empty((total, *pool.k[0].shape[1:]), dtype=pool.dtype, device=pool.device)]
    far.v = [torch.empty((total, *pool.v[0].shape[1:]), dtype=pool.dtype, device=pool.device)]
    for big, small in ((far.k[0], pool.k[0]), (far.v[0], pool.v[0])):
        big[:P].copy_(small[:P])  # the padding page
        big[P + offset:].copy_(small[P:])  # the compact pool's slots: all that is ever written
    table = pool.req_to_page.clone()
    table[1:rows] += offset // P
    far.req_to_page = table
    loc = batch.out_cache_loc + torch.where(batch.out_cache_loc > 0, offset, 0)
    spec = batch.spec
    if spec is not None and spec.draft_path is not None:
        spec = replace(spec, draft_path=spec.draft_path + offset)
    return replace(case, pool=far, batch=replace(batch, out_cache_loc=loc, spec=spec)), offset


def _resident() -> int:
    """This process's resident memory in bytes (-1 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return -1
