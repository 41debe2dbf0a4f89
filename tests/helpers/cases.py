"""Test helpers over the conformance kit's builders (:mod:`attnhal.testing.cases`).

:func:`random_spec` draws, from a plain seed, the per-request fields of a
:class:`~attnhal.testing.cases.CaseRecipe` (lengths, draft tree, shared draft
ancestors) for the fixed examples that do not run under hypothesis;
:func:`~attnhal.testing.cases.build_case` builds it. :func:`expected` is the fp64
reference (:mod:`attnhal.testing.oracle`) of a built case.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attnhal.phases import Phase
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, CaseRecipe
from attnhal.testing.oracle import _one_thread, reference_forward

__all__ = ["DEFAULT_SPECS", "expected", "one_thread", "random_spec"]

#: The speculative config a spec phase gets when none is given (a chain of 3 tokens
#: for target_verify and draft_extend, 3 draft steps for draft_decode).
DEFAULT_SPECS = {Phase.TARGET_VERIFY: SpecConfig.eagle(2), Phase.DRAFT_EXTEND: SpecConfig.eagle(2),
                 Phase.DRAFT_DECODE: SpecConfig.eagle(3)}


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run a test on one intra-op thread.

    Why: these tests run thousands of ops on tiny tensors; on a small shared
    machine the thread pool's barriers cost far more than they save (a busy
    sibling core stalls every parallel op by a scheduler time slice).
    """
    with _one_thread():
        yield


def random_spec(phase: Phase, seed: int, *, requests: int = 2, spec: SpecConfig | None = None,
                prefix_lens: tuple[int, ...] | list[int] | None = None,
                new_lens: tuple[int, ...] | list[int] | None = None, draft_step: int = 0,
                tree: bool | None = None, **fields: Any) -> CaseRecipe:
    """A :class:`CaseRecipe` of ``phase`` whose unspecified fields are drawn from ``seed``.

    Prefixes ``0..12`` per request; ``prefill`` new tokens ``0..9``; ``draft_extend``
    accepted tokens ``1..draft_extend_len``; a random draft tree for ``target_verify``
    when ``topk > 1`` (or ``tree=True``); random shared ancestors (``draft_picks``) for
    ``draft_decode``; slots scattered through the pool. ``fields`` go to the CaseRecipe.
    """
    rng = random.Random(seed)
    if spec is None:
        spec = DEFAULT_SPECS.get(phase)
    prefix = tuple(prefix_lens) if prefix_lens is not None else tuple(rng.randint(0, 12) for _ in range(requests))
    n = len(prefix)
    extra: dict[str, Any] = {}
    if phase is Phase.PREFILL:
        extra["new_lens"] = tuple(new_lens) if new_lens is not None else tuple(rng.randint(0, 9) for _ in range(n))
    elif phase is Phase.DRAFT_EXTEND:
        assert spec is not None
        extra["new_lens"] = (tuple(new_lens) if new_lens is not None
                             else tuple(rng.randint(1, spec.draft_extend_len) for _ in range(n)))
    elif phase is Phase.TARGET_VERIFY:
        assert spec is not None
        if tree if tree is not None else spec.topk > 1:
            T = spec.num_draft_tokens
            extra["tree_parents"] = tuple((-1, *(rng.randrange(j) for j in range(1, T))) for _ in range(n))
    elif phase is Phase.DRAFT_DECODE:
        assert spec is not None
        extra["draft_step"] = draft_step
        extra["draft_picks"] = tuple(tuple(tuple(rng.randrange(spec.topk) for _ in range(draft_step))
                                           for _ in range(spec.topk)) for _ in range(n))
    if phase is Phase.PREFILL or phase is Phase.DECODE:
        spec = None
    fields.setdefault("slot_seed", seed + 1)
    return CaseRecipe(phase, prefix_lens=prefix, spec=spec, seed=seed, **extra, **fields)


def expected(case: Case, layer: int | None = None) -> torch.Tensor:
    """The fp64 reference output of ``case`` (at ``layer``, by default the case's)."""
    return reference_forward(case.q, case.k, case.v, case.layer if layer is None else layer, case.batch,
                             case.pool, case.config.sm_scale, case.config)
