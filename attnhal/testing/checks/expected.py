"""Eager outputs and references of one case, every draft step included, for comparing a
replay or a multi-step draft against."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from attnhal.backend import AttentionBackend, ForwardBatch, MultiStepDraft
from attnhal.phases import Phase
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, CaseRecipe, new_qkv, reparent_rows
from attnhal.testing.checks.claims import Claim
from attnhal.testing.checks.common import blame
from attnhal.testing.checks.target import Target
from attnhal.testing.oracle import reference_forward


@dataclass
class Expected:
    """Eager outputs and fp64 references of every forward of one case (one per draft step)."""

    inputs: dict[str, torch.Tensor]
    eager: list[torch.Tensor]
    reference: list[torch.Tensor]
    batches: list[ForwardBatch]


def _eager_steps(target: Target, case: Case, multi: bool) -> tuple[list[AttentionBackend], list[ForwardBatch]]:
    """Fresh backends with the eager metadata of ``case``: one per draft step when ``multi``."""
    if multi:
        draft = MultiStepDraft(target.backend_cls, case.config, case.pool, case.recipe.spec or SpecConfig(),
                               **target.build_options)
        draft.init_forward_metadata(case.batch)
        return [draft.backend(s) for s in range(draft.num_forwards)], draft.step_batches(case.batch)
    backend = target.new_backend(case.config, case.pool)
    backend.init_forward_metadata(case.batch)
    return [backend], [case.batch]


def expected(target: Target, claim: Claim, case: Case, multi: bool) -> Expected:
    """Run ``case`` eagerly (every draft step, re-parenting in between), then restore the
    pool and the draft path so that a replay starts from the same state."""
    pool, layer = case.pool, case.layer
    saved = pool.k[layer].clone(), pool.v[layer].clone()
    path = case.batch.spec.draft_path if case.batch.spec is not None else None
    saved_path = path.clone() if path is not None else None
    gen = torch.Generator().manual_seed(case.recipe.seed + 1)
    with blame(claim, "eager run (the graph's expected result)"):
        backends, batches = _eager_steps(target, case, multi)
        out = Expected({}, [], [], list(batches))
        for s, (backend, batch) in enumerate(zip(backends, batches)):
            q, k, v = (case.q, case.k, case.v) if s == 0 else new_qkv(case.config, batch.num_tokens, gen, target.device)
            out.inputs |= {f"q{s}": q, f"k{s}": k, f"v{s}": v}
            if s and path is not None:
                rows = torch.tensor(reparent_rows(case.recipe, s), dtype=torch.int64, device=target.device)
                out.inputs[f"parent{s}"] = rows
                path[:, :s].copy_(path[rows, :s])
            out.reference.append(reference_forward(q, k, v, layer, batch, pool, case.config.sm_scale, case.config))
            out.eager.append(backend.forward(q, k, v, layer, batch).clone())
    pool.k[layer].copy_(saved[0])
    pool.v[layer].copy_(saved[1])
    if path is not None and saved_path is not None:
        path.copy_(saved_path)
    return out


def resize(recipe: CaseRecipe, n: int, seed: int) -> CaseRecipe:
    """``recipe`` with ``n`` requests (per-request fields cycled), at draft step 0 for
    ``draft_decode`` — where, without re-parenting drawn, every branch re-parents."""
    def cyc(values: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(values[i % len(values)] for i in range(n)) if values else values

    lens = tuple(p + 3 * i for i, p in enumerate(cyc(recipe.prefix_lens)))
    out = replace(recipe, prefix_lens=lens, new_lens=cyc(recipe.new_lens), tree_parents=cyc(recipe.tree_parents),
                  draft_picks=(), draft_step=0, reparent=tuple(cyc(r) for r in recipe.reparent), seed=seed)
    if recipe.phase is Phase.DRAFT_DECODE and recipe.spec is not None and not recipe.reparent:
        k = recipe.topk
        flip = tuple(tuple((b + 1) % k for b in range(k)) for _ in range(n))
        out = replace(out, reparent=(flip,) * max(recipe.spec.num_steps - 2, 0))
    return out


