"""The capability matrix (``docs/capabilities.md``), generated from the shipped backends' descriptors.

``attnhal docs`` writes it; ``attnhal docs --check`` (and a test) fails when it is stale.
The output depends only on the descriptors, never on this machine: it covers the
backends the ``attnhal`` distribution itself registers (:func:`shipped_registry`), not
the third-party backends that happen to be installed here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from attnhal.capabilities import BackendCapabilities, SpecLimits, Variant
from attnhal.phases import Phase
from attnhal.planner import GraphPolicy, PhaseBackends, plan
from attnhal.platform import parse
from attnhal.reasons import fmt_set
from attnhal.registry import GROUP, Registry
from attnhal.spec import SpecConfig

__all__ = ["DISTRIBUTION", "capability_matrix", "descriptor_fields", "shipped_registry"]

#: The distribution whose backends the matrix covers: the ones this project ships.
DISTRIBUTION = "attnhal"

PLATFORMS = ("cuda:sm100", "cuda:sm90", "cuda:sm80", "hip:gfx942", "hip:gfx90a", "cpu")
SPECS = (
    ("no speculation", SpecConfig()),
    ("eagle steps=1", SpecConfig.eagle(1)),
    ("eagle steps=3", SpecConfig.eagle(3)),
    ("eagle steps=3 topk=4 tokens=8", SpecConfig.eagle(3, 4, 8)),
)


def _names(items: Iterable[object]) -> str:
    values = sorted((getattr(i, "value", i) for i in items), key=lambda x: (isinstance(x, str), x))
    return ", ".join(str(v) for v in values) or "-"


def _limits(limits: SpecLimits | None) -> str:
    if limits is None:
        return "no"
    given = limits.to_dict()
    return "yes" + (" (" + ", ".join(f"{k} {v}" for k, v in given.items()) + ")" if given else "")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _per_phase(table: Mapping[Phase, Any], show: Callable[[Any], str]) -> str:
    return "; ".join(f"{p.value} {show(v)}" for p, v in sorted(table.items())) or "-"


def _descriptor_rows(caps: BackendCapabilities) -> list[tuple[str, str]]:
    tolerances = "; ".join(f"{d} {t.atol:g}/{t.rtol:g}" for d, t in sorted(caps.tolerances.items()))
    return [
        ("vendors", _names(caps.vendors)),
        ("min arch", _names(f"{v.value} {a}" for v, a in caps.min_arch.items())),
        ("archs", _names(f"{v.value} {a}" for v, a in caps.archs.items())),
        ("models", _names(caps.models or ())),
        ("phases", _names(caps.phases)),
        ("run limits", _per_phase(caps.run_limits, lambda lim: _limits(lim).removeprefix("yes "))),
        *((f"graph: {p.value}", _limits(caps.graph.get(p))) for p in Phase if p is not Phase.PREFILL),
        ("multi-step draft", _limits(caps.multi_step)),
        ("dtypes", _names(caps.dtypes)),
        ("kv dtypes", _names(caps.kv_dtypes or ())),
        ("head sizes", _names(caps.head_sizes)),
        ("page sizes", _names(caps.page_sizes)),
        ("features", _names(caps.features)),
        ("graph seq-len fill", str(caps.seq_len_fill)),
        ("per-phase fill", _per_phase(caps.phase_fill, str)),
        ("needs host seq lens", "yes" if caps.needs_host_seq_lens else "no"),
        ("tolerances (atol/rtol)", tolerances),
        ("requires", _names(caps.requires)),
        ("conditional claims", str(len(caps.variants)) if caps.variants else "-"),
    ]


def _variant_line(v: Variant) -> str:
    changes = [f"{k} = {_change(x)}" for k, x in v.changes.items()]
    changes += [f"add {k} {fmt_set(x)}" for k, x in v.add.items()]
    changes += [f"remove {k} {fmt_set(x)}" for k, x in v.remove.items()]
    note = f" — {v.note}" if v.note else ""
    return f"- when {v.when}: " + "; ".join(changes) + note


def _change(value: object) -> str:
    if isinstance(value, SpecLimits) or value is None:
        return _limits(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{getattr(k, 'value', k)}: {_change(x) if x is not None else 'removed'}"
                               for k, x in value.items()) + "}"
    if isinstance(value, (set, frozenset)):
        return fmt_set(value)
    return str(value)


def _plan_cell(caps: BackendCapabilities, platform: str, spec: SpecConfig) -> str:
    result = plan(spec, parse(platform), PhaseBackends.same(caps, spec), GraphPolicy())
    if not result.valid:
        codes = sorted({r.code.value for d in result.phases.values() if d.blocking for r in d.reasons})
        return "invalid (" + ", ".join(codes) + ")"
    return ", ".join(p.value for p in result.captured) or "none captured"


def shipped_registry() -> Registry:
    """The backends :data:`DISTRIBUTION` registers through its own entry points, and no other.

    Another installed package's backends would make the generated file differ from machine
    to machine (and ``attnhal docs --check`` report a current file as stale).
    """
    def discover() -> list[Any]:
        return [ep for ep in entry_points(group=GROUP)
                if ep.dist is not None and ep.dist.metadata["Name"] == DISTRIBUTION]
    return Registry(discover)


def capability_matrix(registry: Registry | None = None) -> str:
    """The Markdown of ``docs/capabilities.md`` for every backend of ``registry`` whose descriptor
    loads (default: :func:`shipped_registry`)."""
    entries = sorted((e for e in (registry or shipped_registry()).entries() if e.capabilities is not None),
                     key=lambda e: e.name)
    caps = [e.capabilities for e in entries if e.capabilities is not None]
    columns = [_descriptor_rows(c) for c in caps]
    rows = [(label, *(col[i][1] for col in columns)) for i, (label, _) in enumerate(columns[0])] if caps else []
    out = ["# Capability matrix", "",
           "Generated by `attnhal docs` from the descriptors of the backends attnhal ships "
           f"({', '.join(c.name for c in caps) or 'none'}); third-party backends installed next to it are "
           "not listed. A test fails when it is stale. Every claim here is checked by the conformance kit.", "",
           _md_table(["", *(c.name for c in caps)], rows),
           "", "## Captured phases by platform and spec config", "",
           "What `attnhal plan --backend NAME --platform P` decides with one backend in every role "
           "(default graph policy). CUDA and HIP rows agree wherever the descriptor allows both: "
           "the planner has one code path.", ""]
    for c in caps:
        out += [f"### {c.name}", ""]
        if c.variants:
            out += ["Conditional claims, applied in order:", "", *(_variant_line(v) for v in c.variants), ""]
        out += [
                _md_table(["platform", *(label for label, _ in SPECS)],
                          [(p, *(_plan_cell(c, p, spec) for _, spec in SPECS)) for p in PLATFORMS]), ""]
    return "\n".join(out)


def descriptor_fields() -> str:
    """``docs/descriptor_fields.md``: every key of a descriptor file with its type, the values
    it takes (the schema's bounds) and its default (:mod:`attnhal.capabilities.fields`)."""
    from attnhal.capabilities.fields import rows

    head = ["# Descriptor file keys: types and bounds", "",
            "Generated by `attnhal docs` from the schema (`attnhal/capabilities/fields.py`, with the bounds "
            "of `attnhal/capabilities/schema.py` and `claims.py`); do not edit by hand. What each key means: "
            "[descriptors.md](descriptors.md). A value outside these bounds is refused at load, naming the key.", ""]
    return "\n".join(head) + "\n" + _md_table(("key", "type", "values", "default", "schema"), rows())
