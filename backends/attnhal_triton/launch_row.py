"""One launch row: a kernel's launch settings for one (vendor, arch family[, head size][, dtype]),
and the string form the custom ops take it in (:meth:`LaunchRow.encode`, :func:`decode_launch`).
:mod:`attnhal_triton.launch_table` holds the rows.

This module imports neither torch nor triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["EXTEND_VARIANTS", "KERNELS", "MLA_KERNELS", "UNCAPPED", "LaunchRow", "decode_launch", "decode_uncapped"]

#: Kernel variants the table keys on: one row set per compiled form (see ``kernels.py``).
#: ``decode`` serves decode and draft_decode; ``decode_reduce`` merges the splits of
#: decode and of the split extend; the ``extend_*`` forms are prefill (packed, one
#: pass), target_verify causal / tree-masked and draft_extend (uniform, split KV).
KERNELS = ("decode", "decode_reduce", "extend_prefill", "extend_verify", "extend_verify_tree",
           "extend_draft")
#: MLA's forms (:mod:`attnhal_triton.mla_table` holds their rows), by phase.
MLA_KERNELS = ("mla_decode", "mla_prefill", "mla_verify", "mla_verify_tree", "mla_draft")
#: The extend variants, which share their rows' shapes unless a family overrides one.
EXTEND_VARIANTS = KERNELS[2:]
#: Launch options that lift the compiler's own register cap, by vendor: what
#: :mod:`attnhal_triton.spill_relief` tries when a form spills (ptxas caps some programs at 128
#: or 168 registers by itself; ``waves_per_eu`` 2 holds AMD's to half the VGPRs).
UNCAPPED: Mapping[str, Mapping[str, int]] = MappingProxyType({
    "cuda": MappingProxyType({"maxnreg": 255}), "hip": MappingProxyType({"waves_per_eu": 1})})
#: :meth:`LaunchRow.encode`'s prefix of the :data:`UNCAPPED` options (not launch options).
_UNCAP = "uncap."


@dataclass(frozen=True)
class LaunchRow:
    """Launch settings of one kernel for one (vendor, arch family[, head size][, dtype]).

    Attributes
    ----------
    kernel: one of :data:`KERNELS`.
    vendor, arch_family: ``Platform.vendor.value`` and ``Platform.arch_family``
        (``"cuda"``/``"sm90"``, ``"hip"``/``"gfx94"``); both ``None`` in a fallback row.
    head_size, dtype: ``None`` matches any.
    blocks: the kernel's block-size constexprs (upper-case names, e.g. ``BLOCK_N``).
    num_warps, num_stages: passed to every launch.
    kv_splits: most KV splits of a row (decode and split extend).
    split_len: positions per split at least: row ``r`` takes
        ``clamp(ceil(seq_len[r] / split_len), 1, S)`` splits, computed on the device, where
        ``S`` is the batch's split cap (:func:`attnhal_triton.work.batch_splits`).
    fill_programs: programs that keep every SM/CU of the family busy: a batch whose
        launch has fewer programs per split is split until it reaches this (at most
        ``kv_splits``); a batch that already fills the device is not split at all.
    dot_precision: ``tl.dot`` input precision for fp32 operands (``"ieee"`` everywhere;
        ``"tf32x3"`` where the vendor offers it: fp32-accurate on tensor cores).
    extra: vendor-only launch options (HIP: ``waves_per_eu``, ``matrix_instr_nonkdim``,
        ``kpack``; CUDA: ``maxnreg``); absent where they do not apply.
    """

    kernel: str
    vendor: str | None
    arch_family: str | None
    blocks: Mapping[str, int]
    num_warps: int = 4
    num_stages: int = 1
    kv_splits: int = 1
    split_len: int = 256
    fill_programs: int = 0
    head_size: int | None = None
    dtype: str | None = None
    dot_precision: str = "ieee"
    extra: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", MappingProxyType(dict(self.blocks)))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        bad = [k for k in self.blocks if not k.isupper()]
        if bad or self.kernel not in KERNELS + MLA_KERNELS:
            raise ValueError(f"LaunchRow kernel={self.kernel!r} blocks={sorted(self.blocks)} "
                             f"(supported: kernel in {KERNELS}, upper-case block names)")

    @property
    def launch_options(self) -> dict[str, int]:
        """Keyword options of ``kernel[grid](..., **launch_options)``."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, **self.extra}

    @property
    def specificity(self) -> int:
        return (self.head_size is not None) + (self.dtype is not None)

    def matches(self, head_size: int, dtype: str) -> bool:
        return self.head_size in (None, head_size) and self.dtype in (None, dtype)

    @property
    def constexprs(self) -> dict[str, int | str]:
        """Kernel constexprs the row sets (blocks plus ``DOT_PRECISION``)."""
        return {**self.blocks, "DOT_PRECISION": self.dot_precision}

    @property
    def uncapped(self) -> Mapping[str, int]:
        """The vendor's options that lift the register cap (:data:`UNCAPPED`; none in a fallback row)."""
        return UNCAPPED.get(self.vendor or "", MappingProxyType({}))

    def encode(self) -> str:
        """A string form for custom-op arguments: ``"BLOCK_N=64,num_warps=4,..."``.

        Upper-case keys are kernel constexprs, lower-case keys launch options
        (:func:`decode_launch` splits them back), ``uncap.``-prefixed keys :attr:`uncapped`
        (:func:`decode_uncapped`).
        """
        items = {**self.constexprs, **self.launch_options, **{_UNCAP + k: v for k, v in self.uncapped.items()}}
        return ",".join(f"{k}={v}" for k, v in items.items())

    def key(self) -> str:
        where = f"{self.vendor}:{self.arch_family}" if self.vendor else "fallback"
        return (f"{self.kernel}@{where}"
                f"[d={self.head_size or '*'},{self.dtype or '*'}]")


def _decode(encoded: str) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for item in filter(None, encoded.split(",")):
        name, _, text = item.partition("=")
        items[name] = int(text) if text.lstrip("-").isdigit() else text
    return items


def decode_launch(encoded: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``LaunchRow.encode()`` back to (constexprs, launch options)."""
    items = _decode(encoded)
    return ({k: v for k, v in items.items() if k.isupper()},
            {k: v for k, v in items.items() if not k.isupper() and not k.startswith(_UNCAP)})


def decode_uncapped(encoded: str) -> dict[str, Any]:
    """``LaunchRow.encode()`` back to the row's :attr:`LaunchRow.uncapped` options."""
    return {k.removeprefix(_UNCAP): v for k, v in _decode(encoded).items() if k.startswith(_UNCAP)}
