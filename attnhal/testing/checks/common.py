"""What every check shares: running examples through hypothesis, blaming a claim for a
crash, and comparing outputs and caches."""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch
from hypothesis import example, given, seed
from hypothesis import strategies as st

from attnhal.backend import ForwardBatch, KVPool
from attnhal.capabilities import Tolerance
from attnhal.testing.cases import Case, CaseRecipe
from attnhal.testing.checks.claims import Claim, ClaimFalsified, NothingToCheck
from attnhal.testing.checks.coverage import note
from attnhal.testing.checks.target import Target
from attnhal.testing.oracle import real_tokens, reference_forward, store

#: Random examples per round when a check runs for a time (``Target.seconds``).
ROUND = 4


def run_examples(target: Target, name: str, strategy: st.SearchStrategy[Any], fixed: Sequence[Any],
                 body: Callable[[Any], None]) -> int:
    """Run ``body`` on the fixed examples then the drawn ones; returns the count.

    Drawn: ``target.max_examples``, or with ``target.seconds`` rounds of :data:`ROUND`
    examples (each its own seed) until the time is spent or ``max_examples`` are run.
    """
    count = [0]
    body = _noted(body)  # not a line of test(): hypothesis derandomizes by test()'s source

    def test(case: Any) -> None:
        body(case)
        count[0] += 1

    if not fixed and target.max_examples == 0:
        raise NothingToCheck(f"no fixed example of {name} fits this run's bounds and no random one is drawn "
                             "(examples=0): nothing to check")
    test.__name__ = test.__qualname__ = name  # hypothesis names the counterexample after it
    wrapped: Any = test
    for case in reversed(fixed):
        wrapped = example(case=case)(wrapped)
    if target.seconds is None:
        target.hypothesis_settings()(given(case=strategy)(wrapped))()
        return count[0]
    end = time.monotonic() + target.seconds
    first = replace(target, max_examples=min(ROUND, target.max_examples))
    first.hypothesis_settings()(given(case=strategy)(wrapped))()
    base = zlib.crc32(name.encode())
    rounds = 1
    while time.monotonic() < end and count[0] - len(fixed) < target.max_examples:
        more = replace(target, max_examples=min(ROUND, target.max_examples - (count[0] - len(fixed))),
                       derandomize=False, database=None)
        drawn = more.hypothesis_settings(explicit=False)(given(case=strategy)(test))
        seed(base + rounds)(drawn)()
        rounds += 1
    return count[0]


def _noted(body: Callable[[Any], None]) -> Callable[[Any], None]:
    """``body`` noting each example it runs for the coverage report."""
    def run(case: Any) -> None:
        note(case)
        body(case)

    return run


def input_tolerance(tol: Tolerance, case: Case) -> Tolerance:
    """``tol`` (declared for unit-scale inputs) for the inputs of ``case``.

    ``atol`` counts in units of V's magnitude (the output is a weighted mean of V). With
    large logits (large q/k, or an explicit scale above the default) the softmax is
    ill-conditioned: a correct fp32 exponent of a logit ``s`` is off by ``~eps * |s|``, so
    the largest logit ``L`` adds ``4 eps L`` (times V's magnitude).
    """
    recipe = case.recipe
    if recipe.qk_magnitude == 1 and recipe.v_magnitude == 1 and recipe.scale is None:
        return tol
    atol = tol.atol
    if recipe.qk_magnitude > 1 or recipe.scale is not None:
        largest = _largest_logit(case)
        note(recipe, largest_logits=round(largest))
        atol += 4 * torch.finfo(torch.float32).eps * largest
    return replace(tol, atol=atol * recipe.v_magnitude)


def _largest_logit(case: Case) -> float:
    """``max |scale * q . k|`` over the queries and every key of the layer (a bound on the attended)."""
    slots = {s for row in case.row_slots for s in row} | set(case.batch.out_cache_loc.tolist())
    info = case.batch.spec
    if info is not None and info.draft_path is not None:
        slots |= set(info.draft_path.flatten().tolist())
    index = torch.tensor(sorted(slots), dtype=torch.int64)
    keys = case.pool.dequantized(case.layer)[0].detach().cpu()[index].float()  # [S, KV, D], the new K written or not:
    keys = torch.cat([keys, case.k.detach().cpu().float()])       # both bound the attended logits
    q = case.q.detach().cpu().float()
    n, h, d = q.shape
    if not q.numel() or not len(index):
        return 0.0  # no query token (every prefill row empty): nothing is compared
    kv = keys.shape[1]
    grouped = q.reshape(n, kv, h // kv, d)
    logits = torch.einsum("nkgd,skd->nkgs", grouped, keys).abs()
    # A backend that stored non-finite keys is caught by the comparison, not by its tolerance.
    finite = logits[logits.isfinite()]
    return float(finite.max()) * case.config.sm_scale if finite.numel() else 0.0


@contextlib.contextmanager
def blame(claim: Claim, what: str) -> Iterator[None]:
    """Any error of the backend inside is a falsification of ``claim``."""
    try:
        yield
    except ClaimFalsified:
        raise
    except Exception as exc:  # noqa: BLE001 - a crash of a claimed capability is a broken claim
        raise ClaimFalsified(claim, f"{what} raised {type(exc).__name__}: {exc}") from exc


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def heads(recipe: CaseRecipe) -> str:
    kind = "MHA" if recipe.num_q_heads == recipe.num_kv_heads else "MQA" if recipe.num_kv_heads == 1 else "GQA"
    return f"{recipe.num_q_heads} q / {recipe.num_kv_heads} kv heads ({kind})"


def mismatch(got: torch.Tensor, want: torch.Tensor, tokens: Sequence[int], tol: Tolerance,
              names: tuple[str, str] = ("out", "ref")) -> str | None:
    """Why ``got`` is not ``want`` within ``atol + rtol * |want|`` on ``tokens``, or None."""
    if not tokens:
        return None
    index = torch.tensor(list(tokens), dtype=torch.int64)
    g, w = got.detach().cpu().double()[index], want.detach().cpu().double()[index]
    if not torch.isfinite(g).all():
        bad = (~torch.isfinite(g)).nonzero()[0].tolist()
        return f"non-finite output at token {tokens[bad[0]]}, head {bad[1]}"
    diff = (g - w).abs()
    excess = diff - (tol.atol + tol.rtol * w.abs())
    if excess.max() <= 0:
        return None
    t, h, _ = (int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    over = int((excess > 0).sum())
    a, b = names
    return (f"max |{a} - {b}| = {diff.max():.3g} (token {tokens[t]}, head {h}: |{a}| {g[t, h].abs().max():.3g} "
            f"vs |{b}| {w[t, h].abs().max():.3g}) exceeds atol {tol.atol:g} + rtol {tol.rtol:g}*|{b}| "
            f"in {over} of {excess.numel()} elements")


def check_output(claim: Claim, out: object, q: torch.Tensor, want: torch.Tensor, batch: ForwardBatch,
                  tol: Tolerance, what: str) -> None:
    if not isinstance(out, torch.Tensor):
        raise ClaimFalsified(claim, f"{what} returned {type(out).__name__} (supported: a tensor)")
    shape = (*q.shape[:2], want.shape[-1])  # the output head size is V's
    if out.shape != shape or out.dtype != q.dtype:
        raise ClaimFalsified(claim, f"{what} returned {list(out.shape)} {out.dtype} "
                                    f"(supported: shape {list(shape)} and q's dtype {q.dtype})")
    problem = mismatch(out, want, real_tokens(batch), tol)
    if problem is None and out.numel() and not torch.isfinite(out).all():
        problem = "non-finite output in padding tokens (they must be finite)"
    if problem is not None:
        raise ClaimFalsified(claim, f"{what}: {problem}")


def check_cache(claim: Claim, pool: KVPool, layer: int, before: tuple[torch.Tensor, torch.Tensor],
                 batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor, what: str) -> None:
    """Only ``out_cache_loc`` (and the padding slot) of ``layer`` changed, to the new K/V
    (stored as :func:`~attnhal.testing.oracle.quantize` defines: fp8 saturates per flavour)."""
    expect = pool.layer_copy(layer)
    expect.k[0].copy_(before[0])
    expect.v[0].copy_(before[1])
    store(expect, 0, batch.out_cache_loc, k, v)
    for name, cache, want in (("K", pool.k[layer], expect.k[0]), ("V", pool.v[layer], expect.v[0])):
        wrong = (bits(cache) != bits(want)).flatten(1).any(1)
        wrong[0] = False  # the padding slot: padding tokens write there, in any order
        if wrong.any():
            slots = wrong.nonzero().flatten().tolist()
            raise ClaimFalsified(claim, f"{what}: the {name} cache differs from the expected write at slots "
                                        f"{slots[:8]} (only out_cache_loc may change, to the new tokens' {name})")



_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` comparable with ``!=``: floating tensors as integers of their size, so that a NaN
    the kit left in memory equals itself (and fp8, which torch does not compare on CPU, works)."""
    return t.view(_SAME_SIZE_INTS[t.dtype.itemsize]) if t.is_floating_point() else t


def with_example(exc: ClaimFalsified, recipe: CaseRecipe) -> ClaimFalsified:
    """Attach the (fixed) example as hypothesis attaches a drawn one."""
    exc.__notes__ = [*getattr(exc, "__notes__", []), f"Failing example: {recipe!r}"]
    return exc


def forward_checked(target: Target, claim: Claim, backend: Any, case: Case, what: str) -> torch.Tensor:
    """``backend.forward`` on ``case`` (its metadata already initialised) checked against the
    oracle within the claim's tolerance for the case's inputs; returns a copy of the output."""
    want = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale,
                             case.config)
    with blame(claim, f"{what}: the backend"):
        out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    tol = input_tolerance(target.caps.tolerance_for(case.recipe.dtype, case.recipe.kv_dtype), case)
    try:
        check_output(claim, out, case.q, want, case.batch, tol, what)
    except ClaimFalsified as exc:
        raise with_example(exc, case.recipe) from None
    return out.clone()
