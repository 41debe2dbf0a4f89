"""The KV page size SGLang's argument resolution settles on: backend constraints first, then its default.

SGLang 0.5.23 replaces the page size a backend cannot take, with a warning, whether the
user gave one or not (``arg_groups/overrides.py:1143-1197`` ``_mla_backend_page_constraints``,
then ``1262-1296`` ``_fa4_page_constraint``), and only then fills its default of 1
(``1340-1362`` ``_page_size_default``). attnhal plans with the page size SGLang would run
and says who set it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from attnhal.platform import Platform, arch_sets
from attnhal.spec import ModelKind

__all__ = ["DEFAULT_PAGE_SIZE", "PageSize", "model_note", "resolve_page_size"]

#: SGLang's default page size on CUDA/HIP when none is given (arg_groups/overrides.py:1361-1362).
DEFAULT_PAGE_SIZE = 1
#: ``get_platform().is_sm100``: CUDA compute capability 10.x (utils/common.py:309-313), by vendor.
_SM100 = arch_sets({"cuda": ("sm100..sm109",)})


@dataclass(frozen=True)
class PageSize:
    """The page size SGLang runs with, the one given (``None``: no ``--page-size``), and why."""

    value: int
    given: int | None = None
    set_by: str | None = None  # the backend whose constraint replaced the page size
    engine_set: bool = False  # SGLang's own resolution (executed) replaced it

    @property
    def note(self) -> str | None:
        """``set by SGLang for trtllm_mla`` (with the replaced value), or None when nothing was replaced."""
        if self.set_by is None and not self.engine_set:
            return None
        given = f", replacing --page-size {self.given}" if self.given is not None else ""
        who = f"SGLang for {self.set_by}" if self.set_by is not None else "SGLang's own resolution"
        return f"set by {who}{given}"

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "given": self.given, "set_by": self.set_by}


@dataclass(frozen=True)
class _Constraint:
    """One backend's rule: where SGLang looks for the backend, the sizes it keeps, the size it sets."""

    backend: str
    roles: tuple[str, ...]  # server-argument names SGLang compares with the backend name
    keeps: Collection[int]  # page sizes left as they are (empty: always replaced)
    sets: int
    applies: Callable[[Mapping[str, Any], ModelKind | None, Platform | None], bool] = lambda *_: True


_BASE, _DECODE, _PREFILL, _DRAFT = ("attention_backend", "decode_attention_backend", "prefill_attention_backend",
                                    "speculative_draft_attention_backend")


def _fa4_applies(values: Mapping[str, Any], model: ModelKind | None, platform: Platform | None) -> bool:
    """fa4 on SM100, non-MLA model, no EAGLE tree (overrides.py:1274-1286: the page-tree cascade
    of ``topk > 1`` aborts in the FA4 kernel at page size > 1). SGLang reads the EAGLE topk
    flag as given, so n-gram trees get 128 too."""
    on_sm100 = platform is not None and platform.arch in _SM100.get(platform.vendor, ())
    return on_sm100 and model in (ModelKind.MHA, ModelKind.GQA) and (values.get("speculative_eagle_topk") or 0) <= 1


#: In SGLang's order; each rule sees the page size the previous ones left.
_CONSTRAINTS = (
    _Constraint("flashmla", (_BASE, _DECODE), (), 64),  # overrides.py:1147-1154
    _Constraint("trtllm_mla", (_BASE, _DECODE), (32, 64), 64),  # overrides.py:1155-1163
    _Constraint("cutedsl_mla", (_BASE, _DECODE, _PREFILL), (32, 64), 64),  # overrides.py:1164-1173
    _Constraint("trtllm_mha", (_BASE, _DECODE, _PREFILL, _DRAFT), (16, 32, 64, 128), 64),  # overrides.py:1174-1187
    _Constraint("fa4", (_BASE, _DECODE, _PREFILL), (), 128, _fa4_applies),  # overrides.py:1274-1296
)


def resolve_page_size(values: Mapping[str, Any], model: ModelKind | None = None,
                      platform: Platform | None = None) -> PageSize:
    """The page size SGLang resolves from the converted server arguments ``values``.

    ``model`` and ``platform`` are needed by fa4's rule only (non-MLA models on SM100); without
    them that rule is not applied. The last rule that replaced the page size names the backend.
    """
    given = values.get("page_size")
    page, set_by = given, None
    for rule in _CONSTRAINTS:
        named = any(values.get(role) == rule.backend for role in rule.roles)
        if named and page not in rule.keeps and rule.applies(values, model, platform):
            if page != rule.sets:
                set_by = rule.backend
            page = rule.sets
    if page is None:
        return PageSize(DEFAULT_PAGE_SIZE, None, None)
    return PageSize(page, given, set_by)


def model_note(values: Mapping[str, Any], model: ModelKind | None) -> str | None:
    """What the page size leaves open without the model kind: fa4's rule reads it (SGLang reads
    it from the checkpoint), so without ``--model`` that rule is not applied — said, not guessed."""
    fa4 = next(rule for rule in _CONSTRAINTS if rule.backend == "fa4")
    if model is None and any(values.get(role) == fa4.backend for role in fa4.roles):
        return ("page size: SGLang sets 128 for fa4 on SM100 with a non-MLA model (arg_groups/overrides.py:1274-1296); "
                "give --model (mha, gqa, mla) to apply it")
    return None
