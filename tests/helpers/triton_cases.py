"""Cases of the Triton kernel tests: a conformance-kit recipe plus the platform row the
kernels launch with, built by the kit's builder and compared with the kit's oracle.

A :class:`TritonCase` is a :class:`~attnhal.testing.cases.CaseRecipe` (phase, heads,
lengths, tree, features) and a platform spec whose launch-table row the kernels use
(``"cpu"``: the interpreter's row; ``"cuda:sm90"``, ``"hip:gfx942"``: simulated targets'
rows, with their block sizes and split counts). :func:`shape` writes a recipe in the
terms the kernel tests think in (KV length per row, KV heads x group, ``T`` tokens);
:func:`triton_cases` draws them.

The tests run under the Triton interpreter: ``TRITON_INTERPRET=1`` is set by
the repository's root ``conftest.py`` before any kernel is defined (Triton reads it at decoration time).
bf16 runs the kernels' ``DOT_F32`` path (the interpreter's bf16 ``tl.dot`` is broken,
triton-lang/triton#11584): the native bf16 dot is compiled by the compile check, not run here.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import attnhal.testing.strategies as hst
from attnhal.backend import KVPool
from attnhal.phases import Phase
from attnhal.platform import Fp8Flavor, Platform, parse
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, CaseRecipe, build_case
from attnhal.testing.oracle import reference_forward

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the Triton kernel tests run under the interpreter: TRITON_INTERPRET=1 "
                f"(the root conftest.py sets it unless the environment gives {os.environ.get('TRITON_INTERPRET')!r})",
                allow_module_level=True)
pytest.importorskip("triton")

from attnhal_triton import TritonBackend, ops  # noqa: E402 - after the interpreter check

EXAMPLES = int(os.environ.get("ATTNHAL_TRITON_EXAMPLES", "3"))
SLOW = bool(os.environ.get("ATTNHAL_SLOW"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = ("float32", "float16", "bfloat16")
# The interpreter row plus rows of real archs (their block sizes and split counts
# exercise the kernels' masking differently); launch options are ignored here. The real
# rows launch 16-32 split programs per row, idle ones included: ATTNHAL_SLOW only.
PLATFORMS = ("cpu", "cuda:sm90", "hip:gfx942") if SLOW else ("cpu",)
#: fp8 caches: ``k_scale`` of the recipe (``v_scale`` is twice it): neither is 1, so a
#: kernel that skips either scale fails.
FP8_KV_SCALE = 0.25


@dataclass(frozen=True)
class TritonCase:
    """A kit recipe and the platform whose launch row the kernels use."""

    recipe: CaseRecipe
    platform: str = "cpu"


def shape(phase: Phase, *, kv_heads: int = 2, group: int = 4, head_size: int = 32, dtype: str = "float32",
          platform: str = "cpu", lens: tuple[int, ...] = (70, 5), news: tuple[int, ...] = (3, 2), tokens: int = 4,
          tree: bool = True, seed: int = 7, step: int | None = None, page_size: int = 1,
          window: int | None = None, softcap: float | None = None, sinks: bool = False,
          kv_dtype: str | None = None) -> TritonCase:
    """A case of ``phase`` in kernel terms (the defaults are the tests' fixed case).

    ``lens``: per row, the tokens in the cache before the new ones of ``prefill``,
    ``draft_extend`` and ``target_verify``; the row's ``seq_lens`` for ``decode`` (its new
    token included) and ``draft_decode``. ``news``: new tokens per row of ``prefill`` and
    ``draft_extend``. ``tokens``: ``T`` of
    ``target_verify`` and ``draft_extend``, ``num_steps`` of ``draft_decode``. ``tree``:
    ``target_verify`` with a draft tree (``topk`` 2, parents seeded by ``seed``), and
    ``draft_decode`` at its last step unless ``step`` is given. ``kv_dtype``: an fp8 cache
    (``fp8_e4m3`` in ``platform``'s flavour) with scales :data:`FP8_KV_SCALE` and twice it.
    """
    bs = len(lens)
    fields: dict[str, Any] = {"prefix_lens": tuple(lens)}
    if phase is Phase.PREFILL:
        fields["new_lens"] = tuple(news[:bs])
    elif phase is Phase.DECODE:
        fields["prefix_lens"] = tuple(n - 1 for n in lens)  # decode writes its token into the row
    elif phase is Phase.TARGET_VERIFY:
        fields["spec"] = SpecConfig.eagle(tokens - 1, topk=2, num_draft_tokens=tokens) if tree else \
            SpecConfig.eagle(tokens - 1)
        if tree:
            rng = random.Random(seed)
            fields["tree_parents"] = tuple((-1, *(rng.randrange(j) for j in range(1, tokens))) for _ in range(bs))
    elif phase is Phase.DRAFT_EXTEND:
        fields |= {"spec": SpecConfig.eagle(tokens - 1), "new_lens": tuple(news[:bs])}
    else:
        fields |= {"spec": SpecConfig.eagle(tokens), "draft_step": tokens - 1 if step is None else step}
    if kv_dtype is not None:
        flavor = parse(platform).fp8_flavor
        fields |= {"kv_dtype": kv_dtype, "kv_scale": FP8_KV_SCALE,
                   "fp8_flavor": (flavor if flavor is not Fp8Flavor.NONE else Fp8Flavor.OCP).value}
    recipe = CaseRecipe(phase, dtype=dtype, num_q_heads=kv_heads * group, num_kv_heads=kv_heads,
                        head_size=head_size, seed=seed, slot_seed=seed + 1, page_size=page_size,
                        sliding_window=window, logit_softcap=softcap, sinks=sinks, **fields)
    return TritonCase(recipe, platform)


_HEADS = st.sampled_from([(1, 1), (2, 4), (1, 8), (2, 1), (1, 20)])  # (kv heads, group)


@st.composite
def triton_cases(draw: st.DrawFn, phase: Phase, max_len: int = 200) -> TritonCase:
    """1-4 rows of ``phase`` up to ``max_len`` positions, MHA/GQA/MQA heads of size 16-64,
    every dtype, ``T`` of 2-6, trees or chains (per-row trees), on the launch rows of :data:`PLATFORMS`."""
    bs = draw(st.integers(1, 4))
    kv_heads, group = draw(_HEADS)
    tokens = draw(st.integers(2, 6))
    low = {Phase.PREFILL: 0, Phase.TARGET_VERIFY: 0, Phase.DECODE: 1}.get(phase, 1)
    news_max = tokens if phase is Phase.DRAFT_EXTEND else 70
    lens = tuple(draw(st.lists(st.integers(low, max_len), min_size=bs, max_size=bs)))
    news = tuple(draw(st.lists(st.integers(1, news_max), min_size=bs, max_size=bs)))
    tree = draw(st.booleans())
    case = shape(phase, kv_heads=kv_heads, group=group, head_size=draw(st.sampled_from([16, 32, 64])),
                 dtype=draw(st.sampled_from(DTYPES)), platform=draw(st.sampled_from(PLATFORMS)), lens=lens,
                 news=news, tokens=tokens, tree=tree, seed=draw(st.integers(0, 2**16)),
                 step=None if tree else draw(st.integers(0, tokens - 1)))
    if tree and phase is Phase.TARGET_VERIFY:  # a drawn tree per row, in place of the seeded one
        parents = tuple(draw(hst.tree_parents(tokens)) for _ in range(bs))
        case = TritonCase(replace(case.recipe, tree_parents=parents), case.platform)
    return case


def build(case: TritonCase, pool: KVPool | None = None, rows: Platform | None = None) -> tuple[Case, TritonBackend]:
    """The kit's case of ``case.recipe`` (in ``pool``, rewritten, if given) and a Triton
    backend over its pool launching with the row of ``rows`` (default: ``case.platform``)."""
    built = build_case(case.recipe, pool=pool)
    return built, TritonBackend(built.config, built.pool, platform=rows or parse(case.platform))


def run(case: Case, backend: TritonBackend, write: bool = True) -> torch.Tensor:
    """``backend``'s forward of ``case``: ``[num_tokens, Hq, Dv]``; ``write=False`` passes
    ``k = v = None`` (the new tokens' K/V already in the pool: the random ones it holds)."""
    backend.init_forward_metadata(case.batch)
    k, v = (case.k, case.v) if write else (None, None)
    return backend.forward(case.q, k, v, case.layer, case.batch)


def expected(case: Case, backend: TritonBackend, write: bool = True, q: torch.Tensor | None = None) -> torch.Tensor:
    """The kit's fp64 oracle for :func:`run` of ``case`` under ``backend``'s config (``q``:
    other queries of the same shape)."""
    k, v = (case.k, case.v) if write else (None, None)
    cfg = backend.config
    return reference_forward(case.q if q is None else q, k, v, case.layer, case.batch, case.pool, cfg.sm_scale, cfg)


def assert_close(backend: TritonBackend, got: torch.Tensor, want: torch.Tensor,
                 tokens: list[int] | None = None) -> None:
    """``got`` finite and within the backend's declared tolerance of ``want`` (on ``tokens``, default all)."""
    tol = backend.capabilities.tolerance(str(got.dtype).removeprefix("torch."))
    assert torch.isfinite(got).all()
    got, want = got.double().cpu(), want.double().cpu()
    if tokens is not None:
        got, want = got[tokens], want[tokens]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


def check(case: TritonCase) -> None:
    """Every query token of ``case`` (``draft_extend``'s padding ones too: the table defines
    what they attend) within tolerance of the oracle, in the query's shape and dtype."""
    built, backend = build(case)
    got = run(built, backend)
    assert got.shape == built.q.shape and got.dtype == built.q.dtype
    assert_close(backend, got, expected(built, backend))


Launch = tuple[Any, tuple[Any, ...], dict[str, Any]]


def record_launches(case: Case, backend: TritonBackend) -> list[Launch]:
    """(op, args, kwargs) of every custom-op launch of ``backend``'s forward of ``case``
    (``k = v = None``), recorded as they run."""
    recorded: list[Launch] = []
    saved = {name: getattr(ops, name) for name in ("decode_partial", "decode_reduce", "extend")}

    def recorder(op: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            recorded.append((op, args, kwargs))
            op(*args, **kwargs)
        return call

    try:
        for name, op in saved.items():
            setattr(ops, name, recorder(op))
        run(case, backend, write=False)
    finally:
        for name, op in saved.items():
            setattr(ops, name, op)
    return recorded
