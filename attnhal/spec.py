"""What is being planned for: the speculative config and the request/model context.

These two records are the planner's inputs besides the platform and the
descriptors. They sit below :mod:`attnhal.capabilities` so that the import graph
runs one way: platform -> spec -> reasons -> phases -> capabilities -> planner.

Public entry points validate their arguments: a wrong type is a ``TypeError``
and a value out of range a ``ValueError``, each naming the argument, the value
and what is allowed. Numbers that size work have documented upper bounds
(:data:`MAX_NUM_STEPS`, :data:`MAX_TOPK`, :data:`MAX_DRAFT_TOKENS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from attnhal.bounds import Bound
from attnhal.errors import InvalidValue

__all__ = [
    "DTYPES",
    "HEAD_SIZE",
    "PAGE_SIZE",
    "KV_DTYPES",
    "MAX_DRAFT_TOKENS",
    "MAX_NUM_STEPS",
    "MAX_TOPK",
    "ModelKind",
    "RequestContext",
    "SpecAlgorithm",
    "SpecConfig",
    "check_int",
    "check_type",
    "draft_tree_tokens",
]

#: Compute dtypes by their torch names (``torch.float16`` -> ``"float16"``).
DTYPES = ("float32", "float16", "bfloat16")
#: KV-cache dtypes; ``fp8_e4m3`` resolves to the platform's :class:`~attnhal.platform.Fp8Flavor`.
KV_DTYPES = (*DTYPES, "fp8_e4m3", "fp8_e5m2")

#: Upper bounds of the speculative settings: beyond them no engine runs, and a
#: typo (``--spec-steps 100000``) must not size buffers.
MAX_NUM_STEPS = 64
MAX_TOPK = 64
MAX_DRAFT_TOKENS = 1024
#: A head dimension (the largest in use is 576, DeepSeek's MLA) and a KV page in tokens: the
#: request context, descriptor files and the CLI's flags all check these two bounds.
HEAD_SIZE = Bound("head_size", 1, 1024)
PAGE_SIZE = Bound("page_size", 1, 4096)


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` if it is an int in ``[minimum, maximum]``; bools, floats and strings are refused."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}={value!r} (supported: an int, got {type(value).__name__})")
    if value < minimum or (maximum is not None and value > maximum):
        raise InvalidValue(name, value, f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}")
    return value


def draft_tree_tokens(num_steps: int, topk: int) -> int:
    """The most tokens an EAGLE tree of ``num_steps`` and ``topk`` can verify: its
    ``topk + (num_steps - 1) * topk**2`` candidate nodes plus the root (see
    :attr:`SpecConfig.max_draft_tokens`); ``num_steps + 1`` for a chain."""
    return topk + (num_steps - 1) * topk ** 2 + 1


def check_type(name: str, value: object, kind: type) -> None:
    """Raise ``TypeError`` naming ``name`` unless ``value`` is a ``kind``."""
    if not isinstance(value, kind):
        raise TypeError(f"{name}={value!r} (supported: a {kind.__name__})")


def _enum(enum: type[Enum], name: str, value: object) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise InvalidValue(name, value, ", ".join(m.value for m in enum)) from None


class SpecAlgorithm(str, Enum):
    """Speculative-decoding algorithms engines run.

    Which phases each runs is data in :data:`attnhal.phases.ALGORITHM_PHASES`:

    - ``none``: plain decoding (prefill, decode).
    - ``eagle``, ``eagle3``, ``mtp``: a draft head on the target's hidden states;
      draft_extend, draft_decode (``num_steps > 1``) and target_verify.
    - ``standalone``: a separate small draft model with its own KV cache. Same
      phases as EAGLE; it differs in what the draft reads (its own embeddings,
      not the target's hidden states), not in attention.
    - ``ngram``: drafts from an n-gram cache of the context (lookahead); no draft
      model, so target_verify only. ``num_steps`` is the draft depth, ``topk``
      the branching of the draft tree.
    """

    NONE = "none"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    STANDALONE = "standalone"
    NGRAM = "ngram"


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings.

    ``num_draft_tokens`` defaults to ``num_steps + 1`` for a chain (``topk == 1``);
    a tree (``topk > 1``) must give it, at most ``topk + (num_steps - 1) * topk**2 + 1``
    (:attr:`max_draft_tokens`: the candidates an EAGLE draft tree offers, plus the root).
    Bounds: ``num_steps <= 64``, ``topk <= 64``, ``num_draft_tokens <= 1024``.
    """

    algorithm: SpecAlgorithm = SpecAlgorithm.NONE
    num_steps: int = 1
    topk: int = 1
    num_draft_tokens: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithm", _enum(SpecAlgorithm, "algorithm", self.algorithm))
        check_int("num_steps", self.num_steps, 1, MAX_NUM_STEPS)
        check_int("topk", self.topk, 1, MAX_TOPK)
        check_int("num_draft_tokens", self.num_draft_tokens, 0, MAX_DRAFT_TOKENS)
        if self.num_draft_tokens == 0:
            if self.topk > 1 and self.speculative:
                raise InvalidValue("num_draft_tokens", 0, f"2..{self.max_draft_tokens}; a tree, topk={self.topk} "
                                   "> 1, must give the tokens it verifies")
            object.__setattr__(self, "num_draft_tokens", self.num_steps + 1)
        if not 2 <= self.num_draft_tokens <= self.max_draft_tokens:
            raise InvalidValue("num_draft_tokens", self.num_draft_tokens,
                               f"2..{self.max_draft_tokens} for num_steps={self.num_steps}, topk={self.topk}")

    @property
    def speculative(self) -> bool:
        return self.algorithm is not SpecAlgorithm.NONE

    @property
    def max_draft_tokens(self) -> int:
        """The draft tree's candidate nodes plus the root token.

        The first step proposes ``topk`` tokens; each later step expands the ``topk`` best
        branches by ``topk`` children each, so ``topk**2`` candidates. Verify takes the best
        ``num_draft_tokens - 1`` of all candidates (SGLang 0.5.23: ``organize_draft_results``,
        ``speculative/eagle_utils.py:100-110``), so a tree may verify more nodes than it keeps
        branches (``topk * num_steps``)."""
        return min(draft_tree_tokens(self.num_steps, self.topk), MAX_DRAFT_TOKENS)

    @property
    def draft_extend_len(self) -> int:
        """Query tokens per request in draft extend: the accepted tokens, padded."""
        return self.num_steps + 1 if self.topk == 1 else self.num_draft_tokens

    def with_steps(self, num_steps: int) -> SpecConfig:
        """This config at another step count (adaptive speculation): a chain keeps
        ``num_draft_tokens = num_steps + 1``; a tree keeps its ``num_draft_tokens``."""
        tokens = 0 if self.topk == 1 else self.num_draft_tokens
        return SpecConfig(self.algorithm, num_steps, self.topk, tokens)

    @classmethod
    def eagle(cls, num_steps: int, topk: int = 1, num_draft_tokens: int = 0,
              algorithm: SpecAlgorithm | str = SpecAlgorithm.EAGLE) -> SpecConfig:
        """An EAGLE-style config (also ``eagle3``, ``mtp``, ``standalone`` through ``algorithm``)."""
        return cls(SpecAlgorithm(algorithm), num_steps, topk, num_draft_tokens)

    @classmethod
    def ngram(cls, num_draft_tokens: int, breadth: int = 1) -> SpecConfig:
        """N-gram / lookahead drafting: ``num_draft_tokens`` verified per request, a tree
        of ``breadth`` branches per level (``breadth > 1`` needs a tree mask)."""
        check_int("breadth", breadth, 1, MAX_TOPK)
        # the deepest n-gram draft has MAX_NUM_STEPS levels: at most that tree's tokens are verified
        most = min(draft_tree_tokens(MAX_NUM_STEPS, breadth), MAX_DRAFT_TOKENS)
        if isinstance(num_draft_tokens, int) and not isinstance(num_draft_tokens, bool) and num_draft_tokens > most:
            raise InvalidValue("num_draft_tokens", num_draft_tokens,
                               f"2..{most} for an n-gram draft of breadth {breadth}, at most {MAX_NUM_STEPS} levels deep")
        check_int("num_draft_tokens", num_draft_tokens, 2, MAX_DRAFT_TOKENS)
        return cls(SpecAlgorithm.NGRAM, min(num_draft_tokens - 1, MAX_NUM_STEPS), breadth, num_draft_tokens)


class ModelKind(str, Enum):
    """The attention layout of the model: which kernels a backend needs."""

    MHA = "mha"  # one KV head per query head
    GQA = "gqa"  # query heads share KV heads (MQA included)
    MLA = "mla"  # multi-head latent attention (DeepSeek): compressed KV, different kernels


@dataclass(frozen=True)
class RequestContext:
    """The model and KV-cache facts a plan is made for; ``None`` = not given (not checked).

    Attributes
    ----------
    model: attention layout (:class:`ModelKind`).
    dtype: compute dtype by name (:data:`DTYPES`).
    kv_dtype: KV-cache dtype by name (:data:`KV_DTYPES`).
    head_size: head dimension (1..1024).
    page_size: tokens per KV page (1..4096), as in :class:`~attnhal.backend.KVPool`.
    """

    model: ModelKind | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    head_size: int | None = None
    page_size: int | None = None

    def __post_init__(self) -> None:
        if self.model is not None:
            object.__setattr__(self, "model", _enum(ModelKind, "model", self.model))
        for name, allowed in (("dtype", DTYPES), ("kv_dtype", KV_DTYPES)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise InvalidValue(name, value, ", ".join(allowed))
        for bound in (HEAD_SIZE, PAGE_SIZE):
            value = getattr(self, bound.field)
            if value is not None:
                check_int(bound.field, value, bound.low, bound.high)
