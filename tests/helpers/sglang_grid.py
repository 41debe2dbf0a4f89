"""The SGLang differential grid: cases, the two views of a case, their differences.

A case is one command line a user could type (backend flags, speculative flags, page size,
model kind) on one emulated platform. SGLang's view comes from executing its own code (the
SGLang tier's ``harness.engine_view``), or from the recording of that execution
(:mod:`sglang_recording`) where SGLang is not installed; attnhal's from its public adapter
(``attnhal_sglang``). A difference is a short label; :mod:`sglang_expected` says which
are catalogued engine discrepancies and which are adapter defects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Emulated platforms per catalogued vendor (intel_amx, the CPU backend, is outside this grid:
#: SGLang on CPU captures no speculative graph, eagle_worker_v2's first check).
VENDOR_PLATFORMS = {"cuda": ("cuda:sm90", "cuda:sm100"), "hip": ("hip:gfx942",)}
STEPS = (1, 2, 3, 5)
TOPKS = (1, 2, 4, 8)
PAGES = (None, 16, 64)  # None: the user gives no --page-size
MODELS = ("mha", "mla")
#: Split prefill/decode backends per vendor.
SPLIT = {"cuda": ("triton", "fa3", "flashinfer"), "hip": ("triton", "aiter")}
SPEC_PHASES = ("draft_decode", "draft_extend", "target_verify")


@dataclass(frozen=True)
class Case:
    backend: str | None  # --attention-backend (None: not given, SGLang picks its default)
    platform: str
    model: str
    num_steps: int
    topk: int
    page_size: int | None = None
    decode_backend: str | None = None  # --decode-attention-backend (split)
    attention_mode: str | None = None  # --speculative-attention-mode
    algorithm: str | None = "EAGLE"  # None: no speculation

    @property
    def label(self) -> str:
        base = self.backend or "(default)"
        return base if self.decode_backend is None else f"{base}/{self.decode_backend}"

    @property
    def vendor(self) -> str:
        return self.platform.split(":")[0]

    def args(self) -> dict[str, Any]:
        """The server arguments, as ``ServerArgs`` field names (the adapter takes the same)."""
        args: dict[str, Any] = {}
        if self.backend is not None:
            args["attention_backend"] = self.backend
        if self.algorithm == "NGRAM":
            args.update(speculative_algorithm=self.algorithm, speculative_num_draft_tokens=self.num_steps * self.topk + 1,
                        speculative_ngram_max_bfs_breadth=self.topk)
        elif self.algorithm is not None:
            args.update(speculative_algorithm=self.algorithm, speculative_num_steps=self.num_steps,
                        speculative_eagle_topk=self.topk,
                        speculative_num_draft_tokens=self.num_steps * self.topk + 1)
        if self.page_size is not None:
            args["page_size"] = self.page_size
        if self.decode_backend is not None:
            args["decode_attention_backend"] = self.decode_backend
        if self.attention_mode is not None:
            args["speculative_attention_mode"] = self.attention_mode
        return args

    def __str__(self) -> str:
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.args().items())
        return f"{self.platform} {self.model}: {flags}"


def models_of(backend: str) -> tuple[str, ...]:
    """The grid's model kinds the catalogued backend serves (an MLA-only backend on an MHA model
    is refused inside the backend's ``__init__``, which the harness skips)."""
    from attnhal import catalog

    served = {m.value for m in catalog.load(f"sglang:{backend}").descriptor.models}
    return tuple(m for m in MODELS if m in served)


def backends_by_vendor() -> dict[str, tuple[str, ...]]:
    """Catalogued SGLang backends per vendor of the grid (from their descriptors)."""
    from attnhal import catalog

    out: dict[str, list[str]] = {vendor: [] for vendor in VENDOR_PLATFORMS}
    for entry in catalog.entries("sglang"):
        for vendor in sorted(v.value for v in entry.descriptor.vendors):
            if vendor in out:
                out[vendor].append(entry.name)
    return {vendor: tuple(names) for vendor, names in out.items()}


def single_cases() -> Iterator[Case]:
    for vendor, names in backends_by_vendor().items():
        for name in names:
            for platform in VENDOR_PLATFORMS[vendor]:
                for model in models_of(name):
                    for page in PAGES:
                        for steps in STEPS:
                            for topk in TOPKS:
                                yield Case(name, platform, model, steps, topk, page)


def split_cases() -> Iterator[Case]:
    for vendor, names in SPLIT.items():
        platform = VENDOR_PLATFORMS[vendor][0]
        for prefill in names:
            for decode in names:
                if prefill != decode:
                    for mode in ("prefill", "decode"):
                        for steps in STEPS:
                            for topk in (1, 2):
                                yield Case(prefill, platform, "mha", steps, topk, None, decode, mode)


def algorithm_cases() -> Iterator[Case]:
    """EAGLE3, NEXTN and STANDALONE through the same worker decision, on a smaller grid."""
    for algorithm, model in (("EAGLE3", "mha"), ("NEXTN", "mla"), ("STANDALONE", "mha")):
        for vendor, names in backends_by_vendor().items():
            for name in names:
                if model not in models_of(name):
                    continue
                for platform in VENDOR_PLATFORMS[vendor]:
                    for steps in (1, 3):
                        for topk in (1, 2):
                            yield Case(name, platform, model, steps, topk, None, algorithm=algorithm)


def ngram_cases() -> Iterator[Case]:
    """NGRAM: verify only (``num_steps`` is unused; ``topk`` is the BFS breadth)."""
    for vendor, names in backends_by_vendor().items():
        for name in names:
            for platform in VENDOR_PLATFORMS[vendor]:
                for model in models_of(name):
                    for page in PAGES:
                        for breadth in TOPKS:
                            yield Case(name, platform, model, 1, breadth, page, algorithm="NGRAM")


#: Speculative settings of the default-backend grid: (algorithm, num_steps, topk); SGLang's pick
#: reads whether speculation is on, the EAGLE topk and the page size.
DEFAULT_SPECS = ((None, 1, 1), ("EAGLE", 1, 1), ("EAGLE", 3, 1), ("EAGLE", 3, 4), ("NGRAM", 1, 1), ("NGRAM", 1, 4))


def default_cases() -> Iterator[Case]:
    """No --attention-backend: SGLang's default per model, platform, spec settings and page size,
    and with only a decode backend given (SGLang fills the base one)."""
    for platform in (p for platforms in VENDOR_PLATFORMS.values() for p in platforms):
        for model in MODELS:
            for algorithm, steps, topk in DEFAULT_SPECS:
                for page in (None, 16):
                    yield Case(None, platform, model, steps, topk, page, algorithm=algorithm)
            yield Case(None, platform, model, 3, 1, None, "triton", algorithm="EAGLE")


def grids() -> dict[str, list[Case]]:
    """The grid's parts by name (their cases in a fixed order)."""
    return {"single": list(single_cases()), "split": list(split_cases()), "algorithms": list(algorithm_cases()),
            "ngram": list(ngram_cases()), "default": list(default_cases())}


def all_cases() -> list[Case]:
    return [case for cases in grids().values() for case in cases]


# --- the two views -----------------------------------------------------------------------------

@dataclass(frozen=True)
class View:
    """One side's reading of a case."""

    accepted: bool
    why: str = ""  # the refusal (engine: its exception; attnhal: the plan's reasons)
    page_size: int | None = None
    roles: tuple[str | None, str | None] = (None, None)  # (prefill, decode)
    runs: frozenset[str] = frozenset()
    captured: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = field(default_factory=dict)


def attnhal_view(case: Case) -> View:
    """attnhal's adapter and plan for the same flags (public API only)."""
    import attnhal_sglang as sglang

    try:
        config = sglang.from_server_args(case.args(), model=case.model, platform=case.platform)
    except ValueError as exc:
        return View(False, f"adapter: {exc}")
    result = config.plan(case.platform)
    roles = (config.roles.get("prefill"), config.roles.get("decode"))
    runs = frozenset(p for p in SPEC_PHASES if result[p].runs)
    captured = frozenset(p for p in SPEC_PHASES if result[p].capture)
    why = "; ".join(sorted({str(r) for d in result.phases.values() if d.blocking for r in d.reasons}))
    return View(result.valid, why, page_size=result.context.page_size, roles=roles, runs=runs, captured=captured)


def differences(engine: View, attnhal: View) -> frozenset[str]:
    """What differs, as short labels (empty: attnhal agrees with SGLang)."""
    out = set()
    if engine.page_size is not None and engine.page_size != attnhal.page_size:
        out.add(f"page_size: engine {engine.page_size}, attnhal {attnhal.page_size}")
    if engine.accepted and engine.roles != attnhal.roles and attnhal.roles != (None, None):
        out.add(f"roles: engine {engine.roles}, attnhal {attnhal.roles}")
    if engine.accepted != attnhal.accepted:
        out.add("engine runs, attnhal invalid" if engine.accepted else "engine refuses, attnhal valid")
        return frozenset(out)
    if not engine.accepted:
        return frozenset(out)
    for phase in SPEC_PHASES:
        if (phase in engine.runs) != (phase in attnhal.runs):
            out.add(f"{phase}: runs differ")
        elif (phase in engine.captured) != (phase in attnhal.captured):
            out.add(f"{phase}: " + ("engine captures, attnhal eager" if phase in engine.captured
                                    else "attnhal captures, engine eager"))
    return frozenset(out)
