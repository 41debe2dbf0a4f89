"""Where SGLang's own decision differs from the backends' abilities, for one configuration.

The catalogue lists, per backend, the engine decisions of ``docs/catalog.md`` (``D1``..)
as notes (``meta.engine_differs``, each ending ``docs/catalog.md Dn``). A note is reported
only when its rule applies to the configuration planned: the roles, the spec, the
platform, the model and the page size. Each rule below restates the entry's condition.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from attnhal.catalog import load
from attnhal.engines.sglang.resolution import EngineConfig
from attnhal.platform import Platform, Vendor, as_platform
from attnhal.spec import ModelKind, SpecAlgorithm

__all__ = ["RULES", "EngineDiffers", "engine_differs", "entry_of"]

_ENTRY = re.compile(r"docs/catalog\.md (D\d+)\s*$")


@dataclass(frozen=True)
class EngineDiffers:
    """One catalogued engine decision that applies to the configuration."""

    entry: str  # "D1": the heading of docs/catalog.md
    backend: str  # "sglang:aiter"
    text: str  # the catalogue's note

    def __str__(self) -> str:
        return f"engine differs ({self.backend}): {self.text}"

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "backend": self.backend, "text": self.text}


def entry_of(note: str) -> str:
    """``"D1"`` from a catalogue note ending ``docs/catalog.md D1``; ``ValueError`` otherwise."""
    found = _ENTRY.search(note)
    if found is None:
        raise ValueError(f"engine_differs={note!r} (supported: a note ending 'docs/catalog.md Dn')")
    return found.group(1)


#: Per vendor, the backend SGLang's draft-extend graph rule reads (eagle_worker_v2.py:546-609): the
#: draft-*decode* backend on HIP (546-565), the draft-extend backend on CUDA (601-609).
_EXTEND_RULE_READS: Mapping[Vendor, str] = {Vendor.HIP: "draft_decode", Vendor.CUDA: "draft_extend"}


def _hip_extend_eager(config: EngineConfig, platform: Platform) -> bool:
    """Where SGLang's rule reads the draft-*decode* backend, draft extend is captured only when
    that is aiter's multi-step one: with a triton or aiter draft extend and no aiter draft decode
    (one step, or another decode backend) it runs eagerly. aiter trees fail at draft extend
    anyway (its ``run_limits``), so they are not this difference."""
    roles, spec = config.roles, config.spec
    extend = roles.get("draft_extend")
    return (_EXTEND_RULE_READS.get(platform.vendor) == "draft_decode" and extend in ("aiter", "triton")
            and roles.get("draft_decode") != "aiter" and not (extend == "aiter" and spec.topk > 1))


def _split(config: EngineConfig) -> bool:
    return config.roles.get("prefill") != config.roles.get("decode")


def _tree(config: EngineConfig) -> bool:
    return config.spec.speculative and config.spec.topk > 1


def _page_one(config: EngineConfig, platform: Platform) -> bool:
    return config.page_size(platform).value == 1


Rule = Callable[[EngineConfig, Platform], bool]

#: docs/catalog.md entry -> when it applies (the same conditions as the entry's text).
RULES: Mapping[str, Rule] = {
    "D1": lambda c, p: _hip_extend_eager(c, p) and not _split(c) and c.roles.get("draft_extend") == "aiter",
    "D2": lambda c, p: _hip_extend_eager(c, p) and not _split(c) and c.roles.get("draft_extend") == "triton",
    "D7": lambda c, p: _hip_extend_eager(c, p) and _split(c),
    "D3": lambda c, p: (c.context.model is ModelKind.MLA and _tree(c) and c.roles.get("target_verify") == "flashinfer"
                        and (c.spec.num_steps == 1 or c.spec.algorithm is SpecAlgorithm.NGRAM)),
    "D4": lambda c, p: _tree(c) and c.roles.get("target_verify") == "dsa" and _page_one(c, p),
    "D6": lambda c, p: (_tree(c) and c.spec.algorithm is SpecAlgorithm.NGRAM
                        and c.roles.get("target_verify") == "torch_native" and _page_one(c, p)),
}


def engine_differs(config: EngineConfig, platform: Platform | str) -> tuple[EngineDiffers, ...]:
    """The catalogued engine decisions that apply to ``config`` on ``platform``, once per entry
    (a split pair's shared entry is said once), in role order. A note whose entry has no rule
    in :data:`RULES` is an error: it could never be said when it applies."""
    where = as_platform(platform)
    out: dict[str, EngineDiffers] = {}
    for name in dict.fromkeys(n for n in config.roles.values() if n is not None):
        for note in load(f"sglang:{name}").meta.get("engine_differs", ()):
            entry = entry_of(note)
            if entry not in RULES:
                raise ValueError(f"engine_differs entry={entry} of sglang:{name} (supported: {', '.join(RULES)})")
            if RULES[entry](config, where):
                out.setdefault(entry, EngineDiffers(entry, f"sglang:{name}", note))
    return tuple(out.values())
