"""Which claims of a catalogue entry run here, and the report of a kit run over the rest.

A claim that cannot run in this process is *not checked here*, with its reason, never
dropped and never waived: the report lists it, and the run fails on it unless the caller
waives unchecked claims. What cannot run here:

- under the Triton interpreter, a bf16 ``tl.dot`` computes on raw bit patterns (a Triton
  limitation, triton-lang/triton#11584, not SGLang's): every ``phase[P, bfloat16]`` of
  ``sglang:triton`` is not checked, and the other claims draw no bf16 case;
- ``vendor[cuda]``, ``vendor[hip]``: no such device (the kit's own rule);
- under the interpreter, ``batch_invariant`` unless ``ATTNHAL_SLOW=1`` (minutes of 64-row batches);
- ``kv_dtype[fp8_*]``: SGLang's KV pool stores fp8 as ``uint8`` bytes (``mem_cache/memory_pool.py:2029-2031``)
  and its backend writes bytes into the pool it is given; the kit hands it attnhal's fp8 pool, so the
  write fails before any kernel runs (run on 2026-12-06: ``Index put requires the source and destination
  dtypes match``). Whether SGLang's Triton kernels compute attention over an fp8 cache correctly is
  therefore not checked here; the other claims draw no fp8 case.

Under the interpreter the kit's bounds are lowered as for attnhal's own Triton backend in
CI (:data:`INTERPRETER_BOUNDS`: the interpreter runs a kernel's blocks one by one); the
report's notes say so, and longer contexts are unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import os
from dataclasses import replace
from functools import cache
from typing import Any

import attnhal.catalog as catalog
from attnhal.capabilities import BackendCapabilities
from attnhal_sglang.kit.adapter import SGLangAttention, adapter_class
from attnhal_sglang.kit.runtime import TRITON_KERNELS, engine_reasons
from attnhal.testing.checks import ClaimResult, Status, claims
from attnhal.testing.report import ConformanceReport, run_conformance

__all__ = ["INTERPRETER_BOUNDS", "KIT_BACKENDS", "checked_class", "not_checked", "run_kit", "runner", "unrunnable"]

#: Catalogue entries whose SGLang classes the adapter runs here.
KIT_BACKENDS = ("sglang:torch_native", "sglang:triton")

#: ``max_seq_len`` and ``max_cost`` of a run under the Triton interpreter (a KV block boundary
#: of 64 is crossed; a 4097-token context is not run).
INTERPRETER_BOUNDS = {"max_seq_len": 70, "max_cost": 2**20}

_BF16_DOT = ("the Triton interpreter computes bf16 tl.dot on raw bit patterns (triton-lang/triton#11584, a Triton "
             "limitation): SGLang's bf16 kernels are unchecked here; other claims draw no bf16 case")


_FP8_POOL = ("SGLang stores an fp8 KV cache as uint8 bytes (mem_cache/memory_pool.py:2029-2031) and the kit's pool "
             "is attnhal's fp8 tensor: SGLang's write fails before its kernels run, so whether they compute fp8 "
             "attention correctly is not checked here; other claims draw no fp8 case")


#: Claims too slow for the interpreter in CI; ``ATTNHAL_SLOW=1`` runs them (as for attnhal's own Triton backend).
_SLOW_CLAIMS = ("batch_invariant",)
_SLOW = ("its batches of 64 mixed rows on every phase take minutes in the Triton interpreter (about 450 s for "
         "attnhal's own Triton kernels): run with ATTNHAL_SLOW=1, or on a GPU")


def runner(ref: str) -> Callable[..., ConformanceReport] | None:
    """How ``attnhal conformance`` checks SGLang catalogue name ``ref``, or None (not such a name).

    ``sglang:triton`` / ``sglang:torch_native``: :func:`run_kit` (without SGLang: ``LookupError``
    naming what to install); another entry: :func:`unrunnable`'s report when SGLang is installed,
    else None (the name stays a descriptor, refused as such).
    """
    if ref not in {e.qualified_name for e in catalog.entries("sglang")}:
        return None
    missing = engine_reasons()
    if ref in KIT_BACKENDS:
        if missing:
            raise LookupError("; ".join(missing))
        return run_kit
    return None if missing else _unrunnable_run


def _unrunnable_run(ref: str, *, platform: Any = None, allow_unchecked: bool = False, strict: bool = False,
                    **_: Any) -> ConformanceReport:
    report = unrunnable(ref, platform)
    report.allow_unchecked, report.strict = allow_unchecked, strict
    return report


def unrunnable(ref: str, platform: Any = None) -> ConformanceReport:
    """The report of a catalogued SGLang backend the kit does not run here: every claim of
    the entry not checked, with the reason (its kernels are native GPU code, not SGLang's
    Triton or torch code)."""
    from attnhal.platform import as_platform
    from attnhal.reasons import fmt_set

    entry = catalog.load(ref)
    caps, where = entry.descriptor, as_platform(platform)
    why = (f"SGLang {entry.version}'s {entry.name} backend is not run on {where.name}: its kernels are native code "
           f"for {fmt_set(v.value for v in caps.vendors)} (sgl-kernel, FlashInfer, aiter, ...), not SGLang's Triton "
           f"or torch code; the kit runs {', '.join(KIT_BACKENDS)} here")
    report = ConformanceReport(caps.name, f"sglang {entry.name} (catalogue entry)", where.name,
                               where.device_name or where.torch_device, where.graph_kind.value, 0)
    report.results = [ClaimResult(c, Status.NOT_CHECKED, why) for c in claims(caps)]
    return report


def _entry(ref: str) -> catalog.CatalogEntry:
    if ref not in KIT_BACKENDS:
        raise LookupError(f"backend={ref} (supported by the SGLang kit: {', '.join(KIT_BACKENDS)})")
    return catalog.load(ref)


def _interpreted(ref: str) -> bool:
    """Whether ``ref``'s kernels are Triton kernels run by the interpreter in this process."""
    return ref.partition(":")[2] in TRITON_KERNELS and os.environ.get("TRITON_INTERPRET") == "1"


def _runnable(ref: str, caps: BackendCapabilities) -> tuple[BackendCapabilities, dict[str, str]]:
    """The descriptor the kit runs here (claims that cannot run removed) and why each removed claim is not."""
    fp8 = {d for d in caps.kv_dtypes or () if d.startswith("fp8")}
    unfp8 = replace(caps, kv_dtypes=(caps.kv_dtypes or frozenset()) - fp8) if fp8 else caps
    no_fp8 = {c.name: _FP8_POOL for c in claims(caps) if c.name not in {k.name for k in claims(unfp8)}}
    if not _interpreted(ref):
        return unfp8, no_fp8
    slow = {} if os.environ.get("ATTNHAL_SLOW") == "1" else {c.name: _SLOW for c in claims(caps) if c.name in _SLOW_CLAIMS}
    if "bfloat16" not in unfp8.dtypes:
        return unfp8, {**no_fp8, **slow}
    narrowed = replace(unfp8, dtypes=unfp8.dtypes - {"bfloat16"})
    kept = {c.name for c in claims(narrowed)}
    return narrowed, {**no_fp8, **{c.name: _BF16_DOT for c in claims(unfp8) if c.name not in kept}, **slow}


@cache
def checked_class(ref: str) -> type[SGLangAttention]:
    """The adapter class of catalogue entry ``ref`` with the descriptor that runs here."""
    entry = _entry(ref)
    caps, _ = _runnable(ref, entry.descriptor)
    return adapter_class(caps, entry.name)


def not_checked(ref: str) -> Mapping[str, str]:
    """Claim name -> why the entry's claim is not checked in this process (beyond the kit's own rules)."""
    entry = _entry(ref)
    return _runnable(ref, entry.descriptor)[1]


def run_kit(ref: str, **kwargs: Any) -> ConformanceReport:
    """:func:`~attnhal.testing.report.run_conformance` on SGLang's backend ``ref`` (``sglang:NAME``):
    every claim of the catalogue entry, in its order; those that cannot run here reported so."""
    entry = _entry(ref)
    skipped = not_checked(ref)
    if _interpreted(ref):
        for name, value in INTERPRETER_BOUNDS.items():
            kwargs.setdefault(name, value)
    wanted = claims(entry.descriptor)
    only = kwargs.pop("only", None)
    if only is not None:
        wanted = [c for c in wanted if c.name.startswith(tuple(only))]
    report = run_conformance(checked_class(ref), only=[c.name for c in wanted if c.name not in skipped], **kwargs)
    done = {r.claim.name: r for r in report.results}
    report.results = [done.get(c.name) or ClaimResult(c, Status.NOT_CHECKED, skipped[c.name]) for c in wanted
                      if c.name in done or c.name in skipped]
    return report

