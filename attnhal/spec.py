"""What is being planned for: the speculative config and the request/model context.

These two records are the planner's inputs besides the platform and the
descriptors. They sit below :mod:`attnhal.capabilities` so that the import graph
runs one way: platform -> spec -> reasons -> phases -> capabilities -> planner.

Public entry points validate their arguments: a wrong type is a ``TypeError``
and a value out of range an :class:`~attnhal.errors.InvalidValue` (a ``ValueError``)
carrying the field, the value and what is allowed. Each record keeps its bounds as
data, ``SpecConfig.BOUNDS`` and ``RequestContext.BOUNDS`` (one :class:`~attnhal.bounds.Bound`
per field, defined here once): the CLI declares its flags with the same objects
(:func:`attnhal.cli.args.within`), so a flag and the API cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, ClassVar

from attnhal.bounds import Bound
from attnhal.errors import InvalidValue
from attnhal.kv_format import KV_FORMATS, kv_format

__all__ = [
    "DRAFT_TOKENS",
    "DTYPES",
    "HEAD_SIZE",
    "KV_DTYPES",
    "NUM_STEPS",
    "PAGE_SIZE",
    "TOPK",
    "ModelKind",
    "RequestContext",
    "SpecAlgorithm",
    "SpecConfig",
    "check_bound",
    "check_type",
    "draft_tree_tokens",
]

#: Compute dtypes by their torch names (``torch.float16`` -> ``"float16"``).
DTYPES = ("float32", "float16", "bfloat16")
#: KV-cache dtypes: the names of :data:`attnhal.kv_format.KV_FORMATS` at import (records check
#: the live table, so a format registered later is valid too); ``fp8_e4m3`` is stored in the
#: platform's :class:`~attnhal.platform.Fp8Flavor`.
KV_DTYPES = tuple(KV_FORMATS)

#: Bounds of the speculative settings: beyond them no engine runs, and a typo
#: (``--spec-steps 100000``) must not size buffers. ``num_steps`` stops at 64, not at the
#: 16 the CLI once allowed: an engine's flags reach the planner through this record, so the
#: CLI's own flags take the same range (a longer draft is a plan question, not a typo).
NUM_STEPS = Bound("num_steps", 1, 64)
TOPK = Bound("topk", 1, 64)
DRAFT_TOKENS = Bound("num_draft_tokens", 2, 1024)
#: A head dimension (the largest in use is 576, DeepSeek's MLA) and a KV page in tokens: the
#: request context, descriptor files and the CLI's flags all check these two bounds.
HEAD_SIZE = Bound("head_size", 1, 1024)
PAGE_SIZE = Bound("page_size", 1, 4096)


def check_bound(bound: Bound, value: object, field: str | None = None) -> int:
    """``value`` if it is an int within ``bound``: a ``TypeError`` for another type, else
    :class:`InvalidValue` naming ``field`` (default: the bound's) with the bound as what is allowed."""
    name = field or bound.field
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}={value!r} (supported: an int, got {type(value).__name__})")
    if not bound.low <= value <= bound.high:
        raise InvalidValue(name, value, str(bound))
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
    Bounds: :attr:`BOUNDS` (``num_steps`` 1..64, ``topk`` 1..64, ``num_draft_tokens`` 2..1024;
    0 means "the default" above).

    Build one with the constructor of its algorithm: :meth:`eagle`, :meth:`eagle3`, :meth:`mtp`,
    :meth:`standalone`, :meth:`ngram` (or ``SpecConfig(algorithm, ...)`` for an algorithm in a variable).
    """

    #: Field -> its bound: the record checks these, the CLI's flags are declared with them.
    BOUNDS: ClassVar[Mapping[str, Bound]] = MappingProxyType(
        {"num_steps": NUM_STEPS, "topk": TOPK, "num_draft_tokens": DRAFT_TOKENS})

    algorithm: SpecAlgorithm = SpecAlgorithm.NONE
    num_steps: int = 1
    topk: int = 1
    num_draft_tokens: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithm", _enum(SpecAlgorithm, "algorithm", self.algorithm))
        check_bound(NUM_STEPS, self.num_steps)
        check_bound(TOPK, self.topk)
        if self.num_draft_tokens != 0:  # 0: the default below
            check_bound(DRAFT_TOKENS, self.num_draft_tokens)
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
        return min(draft_tree_tokens(self.num_steps, self.topk), DRAFT_TOKENS.high)

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
        """An EAGLE draft head: ``num_steps`` draft steps of ``topk`` branches, ``num_draft_tokens``
        verified (default ``num_steps + 1`` for a chain). ``algorithm`` may name EAGLE-3 too (as
        :meth:`eagle3`); mtp and standalone have their own constructors."""
        return cls._draft((SpecAlgorithm.EAGLE, SpecAlgorithm.EAGLE3), algorithm, num_steps, topk, num_draft_tokens)

    @classmethod
    def eagle3(cls, num_steps: int, topk: int = 1, num_draft_tokens: int = 0) -> SpecConfig:
        """EAGLE-3: an EAGLE draft head fed by several target layers (same attention phases)."""
        return cls(SpecAlgorithm.EAGLE3, num_steps, topk, num_draft_tokens)

    @classmethod
    def mtp(cls, num_steps: int, topk: int = 1, num_draft_tokens: int = 0) -> SpecConfig:
        """Multi-token prediction: the model's own MTP layers draft (DeepSeek); EAGLE's phases."""
        return cls(SpecAlgorithm.MTP, num_steps, topk, num_draft_tokens)

    @classmethod
    def standalone(cls, num_steps: int, topk: int = 1, num_draft_tokens: int = 0) -> SpecConfig:
        """A separate small draft model with its own KV cache; EAGLE's phases."""
        return cls(SpecAlgorithm.STANDALONE, num_steps, topk, num_draft_tokens)

    @classmethod
    def _draft(cls, allowed: tuple[SpecAlgorithm, ...], algorithm: object, num_steps: int, topk: int,
               num_draft_tokens: int) -> SpecConfig:
        chosen = _enum(SpecAlgorithm, "algorithm", algorithm)
        if chosen not in allowed:
            others = ", ".join(f"SpecConfig.{a.value}()" for a in SpecAlgorithm if a not in allowed and a.value != "none")
            raise InvalidValue("algorithm", chosen.value, f"{', '.join(a.value for a in allowed)} here; {others} "
                               "build the others")
        return cls(chosen, num_steps, topk, num_draft_tokens)

    @classmethod
    def ngram(cls, num_draft_tokens: int, breadth: int = 1) -> SpecConfig:
        """N-gram / lookahead drafting: ``num_draft_tokens`` verified per request, a tree
        of ``breadth`` branches per level (``breadth > 1`` needs a tree mask)."""
        check_bound(TOPK, breadth, "breadth")
        # the deepest n-gram draft has NUM_STEPS.high levels: at most that tree's tokens are verified
        most = min(draft_tree_tokens(NUM_STEPS.high, breadth), DRAFT_TOKENS.high)
        if isinstance(num_draft_tokens, int) and not isinstance(num_draft_tokens, bool) and num_draft_tokens > most:
            raise InvalidValue("num_draft_tokens", num_draft_tokens,
                               f"2..{most} for an n-gram draft of breadth {breadth}, "
                               f"at most {NUM_STEPS.high} levels deep")
        check_bound(DRAFT_TOKENS, num_draft_tokens)
        return cls(SpecAlgorithm.NGRAM, min(num_draft_tokens - 1, NUM_STEPS.high), breadth, num_draft_tokens)


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
    head_size: head dimension (:data:`HEAD_SIZE`: 1..1024).
    page_size: tokens per KV page (:data:`PAGE_SIZE`: 1..4096), as in :class:`~attnhal.backend.KVPool`.
    """

    #: Field -> its bound (the numeric fields; the named ones check against :data:`DTYPES`, :data:`KV_DTYPES`).
    BOUNDS: ClassVar[Mapping[str, Bound]] = MappingProxyType({"head_size": HEAD_SIZE, "page_size": PAGE_SIZE})

    model: ModelKind | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    head_size: int | None = None
    page_size: int | None = None

    def __post_init__(self) -> None:
        if self.model is not None:
            object.__setattr__(self, "model", _enum(ModelKind, "model", self.model))
        if self.dtype is not None and self.dtype not in DTYPES:
            raise InvalidValue("dtype", self.dtype, ", ".join(DTYPES))
        if self.kv_dtype is not None:
            kv_format(self.kv_dtype)  # a known format (the table, not a list of names)
        for name, bound in self.BOUNDS.items():
            value = getattr(self, name)
            if value is not None:
                check_bound(bound, value)
