"""Where a claim's examples reached: the ranges behind ``attnhal conformance --coverage``.

While :func:`~attnhal.testing.checks.run.check` runs a claim (:func:`collecting`), every
example the kit runs is noted (:func:`note`: the fixed and drawn recipes of
:func:`~attnhal.testing.checks.common.run_examples`, and the batches the metamorphic and
scale checks derive). :func:`take` returns, per quantity, the range reached — so a backend
author sees where the kit did not look (a claim whose contexts stop at 300 says nothing
about 65,536).

=======================  ================================================================
quantity                 of each example
=======================  ================================================================
``batch_sizes``          requests in the batch (``0``: an empty batch)
``context_lengths``      every request's KV length after the forward
``extend_lengths``       ``prefill`` new tokens per request
``acceptance_lengths``   ``draft_extend`` accepted tokens per request
``draft_tokens``         ``target_verify`` query tokens per request
``pool_slots``           slots of the KV pool (the element offsets a kernel computes)
``layers``               layers of the pool
``layer_patterns``       the per-layer windows of the pool (``-`` for full attention)
``query_heads``          query heads (128 on one KV head: DeepSeek-style MLA and MQA)
``rows_x_heads``         batch rows x query heads (past 65,535: CUDA's grid-y limit)
``head_sizes``           head sizes of q/k
``unowned_memory``       what filled memory the batch did not own (``nan``, ``pad``, ``stale``:
                         :mod:`attnhal.testing.cases.unowned`)
``v_magnitudes``         the largest |V| drawn (new and cached)
``largest_logits``       the largest ``|q . k| * scale`` of an example with large inputs
                         (integer q/k or an explicit scale), where the tolerance widens with it
``fp8_scales``           ``k_scale`` of an fp8 cache
``history``              batches one backend instance ran in turn (``batch_invariant``)
=======================  ================================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from attnhal.phases import Phase
from attnhal.testing.cases import CaseRecipe, pool_size

__all__ = ["QUANTITIES", "collecting", "format_coverage", "note", "take"]

QUANTITIES = ("batch_sizes", "context_lengths", "extend_lengths", "acceptance_lengths", "draft_tokens",
              "pool_slots", "layers", "layer_patterns", "query_heads", "rows_x_heads", "head_sizes", "unowned_memory",
              "v_magnitudes", "largest_logits", "fp8_scales", "history")
#: Quantities reported as the set of values seen, not a range.
_SETS = ("layer_patterns", "unowned_memory")

_current: list[dict[str, set[Any]]] = []
_taken: dict[str, dict[str, Any]] = {}


@contextlib.contextmanager
def collecting(claim_name: str) -> Iterator[None]:
    """Note the examples run inside under ``claim_name`` (for :func:`take`)."""
    seen: dict[str, set[Any]] = {q: set() for q in QUANTITIES}
    _current.append(seen)
    try:
        yield
    finally:
        _current.pop()
        _taken[claim_name] = _ranges(seen)


def note(example: Any, **overrides: Iterable[Any] | Any) -> None:
    """Note ``example`` (a recipe, or a tuple holding recipes) under the claim being checked;
    ``overrides`` replace what the recipe says (a batch the check derived from it)."""
    if not _current:
        return
    recipes = [x for x in (example if isinstance(example, (tuple, list)) else (example,)) if isinstance(x, CaseRecipe)]
    for recipe in recipes:
        values = {**_of(recipe), **{k: v if isinstance(v, (list, tuple, set)) else [v] for k, v in overrides.items()}}
        for key, items in values.items():
            _current[-1][key].update(items)


def take(claim_name: str) -> dict[str, Any]:
    """The ranges the last check of ``claim_name`` reached (empty if it ran nothing)."""
    return _taken.pop(claim_name, {})


def format_coverage(coverage: dict[str, Any]) -> str:
    """``batch sizes 0..64; context lengths 1..65537; ...`` (quantities reached only)."""
    return "; ".join(f"{key.replace('_', ' ')} {_show(value)}" for key, value in coverage.items())


def _of(recipe: CaseRecipe) -> dict[str, Iterable[Any]]:
    news = list(recipe.new_lens)
    window = recipe.sliding_window
    pattern = window if isinstance(window, tuple) else (window,) * recipe.num_layers
    return {"batch_sizes": [recipe.requests], "context_lengths": recipe.seq_lens(),
            "extend_lengths": news if recipe.phase is Phase.PREFILL else [],
            "acceptance_lengths": news if recipe.phase is Phase.DRAFT_EXTEND else [],
            "draft_tokens": [recipe.required_spec().num_draft_tokens] if recipe.phase is Phase.TARGET_VERIFY else [],
            "pool_slots": [pool_size(recipe).num_slots], "layers": [recipe.num_layers],
            "layer_patterns": [" ".join("-" if w is None else str(w) for w in pattern)],
            "query_heads": [recipe.num_q_heads], "rows_x_heads": [recipe.rows * recipe.num_q_heads],
            "head_sizes": [recipe.head_size], "unowned_memory": [recipe.unowned], "v_magnitudes": [recipe.v_magnitude],
            "fp8_scales": [recipe.kv_scale] if recipe.cache_dtype.itemsize == 1 else []}


def _ranges(seen: dict[str, set[Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, values in seen.items():
        if not values:
            continue
        if key in _SETS:
            out[key] = sorted(values)
        else:
            out[key] = [min(values), max(values)]
    return out


def _show(value: Any) -> str:
    if len(value) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        lo, hi = (str(v) if isinstance(v, int) else f"{v:g}" for v in value)
        return lo if value[0] == value[1] else f"{lo}..{hi}"
    return ", ".join(f"[{v}]" for v in value)
