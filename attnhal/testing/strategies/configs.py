"""Strategies for configurations: platforms, speculative configs, limits, graph policies,
descriptors, and the values one descriptor claims.

The unbound ones draw what a third party might declare; :func:`dtypes`,
:func:`head_sizes`, :func:`page_sizes` and :func:`spec_configs_for` draw only what a
backend's :class:`~attnhal.capabilities.BackendCapabilities` claims.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.planner import GraphPolicy
from attnhal.platform import VENDORS, Platform, Vendor, detect, parse
from attnhal.spec import DTYPES, SpecConfig

__all__ = ["descriptors", "dtypes", "graph_limits", "graph_policies", "head_sizes", "page_sizes", "platform_specs",
           "platforms", "spec_configs", "spec_configs_for", "spec_limits"]

_CUDA_ARCHS = ("sm80", "sm86", "sm89", "sm90", "sm100")
_HIP_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100")


def platform_specs(vendors: tuple[Vendor, ...] = tuple(Vendor), graphs: bool | None = None) -> st.SearchStrategy[str]:
    """Spec strings for :func:`attnhal.platform.parse` (``"hip:gfx942"``, ``"cpu,nographs"``, ...)."""
    # Other vendors draw from their row's known archs (attnhal.platform.VENDORS).
    archs = {**{v: tuple(row.known) for v, row in VENDORS.items()},
             Vendor.CUDA: _CUDA_ARCHS, Vendor.HIP: _HIP_ARCHS, Vendor.CPU: ("",)}

    def spec(vendor: Vendor, arch: str, nographs: bool) -> str:
        base = f"{vendor.value}:{arch}" if arch else vendor.value
        return base + (",nographs" if nographs else "")

    nographs = st.just(not graphs) if graphs is not None else st.booleans()
    return st.sampled_from(vendors).flatmap(
        lambda v: st.builds(spec, st.just(v), st.sampled_from(archs[v]), nographs))


def platforms(vendors: tuple[Vendor, ...] = tuple(Vendor), graphs: bool | None = None,
              real: bool = False) -> st.SearchStrategy[Platform]:
    """Simulated platforms (see :func:`platform_specs`); with ``real=True`` the platform this
    process runs on (:func:`attnhal.platform.detect`) is drawn too."""
    simulated = platform_specs(vendors, graphs).map(parse)
    return st.one_of(st.builds(detect), simulated) if real else simulated


def spec_configs(max_steps: int = 5, max_topk: int = 4, speculative: bool | None = None) -> st.SearchStrategy[SpecConfig]:
    """Valid spec configs; with ``speculative=None`` both plain decoding and EAGLE."""
    @st.composite
    def eagle(draw: st.DrawFn) -> SpecConfig:
        steps = draw(st.integers(1, max_steps))
        topk = draw(st.integers(1, max_topk))
        if topk == 1:
            return SpecConfig.eagle(steps, 1)
        return SpecConfig.eagle(steps, topk, draw(st.integers(2, topk * steps + 1)))

    if speculative is None:
        return st.one_of(st.just(SpecConfig()), eagle())
    return eagle() if speculative else st.just(SpecConfig())


def spec_limits(max_value: int = 6) -> st.SearchStrategy[SpecLimits]:
    opt = st.none() | st.integers(1, max_value)
    return st.builds(SpecLimits, max_topk=opt, max_num_steps=opt, max_draft_tokens=opt)


def graph_policies() -> st.SearchStrategy[GraphPolicy]:
    return st.builds(GraphPolicy, enabled=st.booleans(), max_batch_size=st.integers(1, 64))


@st.composite
def descriptors(draw: st.DrawFn, vendors: tuple[Vendor, ...] = tuple(Vendor),
                min_arch: bool = True) -> BackendCapabilities:
    """Arbitrary well-formed descriptors (what a third party might declare).

    ``min_arch=False`` leaves out minimum archs, e.g. for vendor-symmetry checks.
    """
    archs = {Vendor.CUDA: st.sampled_from(_CUDA_ARCHS), Vendor.HIP: st.sampled_from(_HIP_ARCHS)}
    phases = draw(st.frozensets(st.sampled_from(list(Phase)), min_size=1))  # a file with no phase is refused
    capturable = [p for p in GRAPH_PHASES if p in phases]
    graph_phases = draw(st.frozensets(st.sampled_from(capturable))) if capturable else frozenset()
    return BackendCapabilities(
        name=draw(st.sampled_from(["alpha", "beta", "gamma"])),
        vendors=draw(st.frozensets(st.sampled_from(vendors), min_size=1)),
        phases=phases,
        graph={p: draw(spec_limits()) for p in sorted(graph_phases)},
        multi_step=draw(st.none() | spec_limits()),
        dtypes=draw(st.frozensets(st.sampled_from(DTYPES), min_size=1)),
        head_sizes=draw(st.frozensets(st.sampled_from([32, 64, 96, 128, 256]), min_size=1)),
        features=draw(st.frozensets(st.sampled_from(list(Feature)))),
        min_arch=draw(st.fixed_dictionaries({}, optional=archs)) if min_arch else {},
    )


# --- bound to a descriptor: what a backend claims ------------------------------------------

def _claimed(values: Sequence[object], what: str, caps: BackendCapabilities) -> list[object]:
    if not values:
        raise ValueError(f"backend {caps.name!r} claims no {what}")
    return list(values)


def dtypes(caps: BackendCapabilities) -> st.SearchStrategy[str]:
    """The compute dtypes ``caps`` claims, by name, in :data:`~attnhal.capabilities.DTYPES` order."""
    return st.sampled_from(_claimed([d for d in DTYPES if d in caps.dtypes], "dtypes", caps))


def head_sizes(caps: BackendCapabilities, max_size: int | None = None) -> st.SearchStrategy[int]:
    """The head sizes ``caps`` claims (at most ``max_size``), smallest first."""
    return st.sampled_from(_claimed(sorted(h for h in caps.head_sizes if max_size is None or h <= max_size),
                                    "head sizes", caps))


def page_sizes(caps: BackendCapabilities) -> st.SearchStrategy[int]:
    """The page sizes ``caps`` claims (``CaseRecipe.page_size`` builds requests owning whole pages)."""
    return st.sampled_from(_claimed(sorted(caps.page_sizes), "page sizes", caps))


def spec_configs_for(caps: BackendCapabilities, phase: Phase, limits: SpecLimits | None = None,
                     max_steps: int = 4, max_topk: int = 3) -> st.SearchStrategy[SpecConfig]:
    """EAGLE configs under which ``caps`` runs ``phase`` within ``limits`` (e.g. a graph claim's).

    ``target_verify`` draws trees (``topk > 1``) only if ``caps`` claims ``custom_mask``;
    ``draft_decode`` has ``num_steps >= 2`` (one step runs no draft decode).
    """
    limits = limits or SpecLimits()
    low = 2 if phase is Phase.DRAFT_DECODE else 1
    steps_top = min(max_steps, limits.max_num_steps or max_steps)
    topk_top = min(max_topk, limits.max_topk or max_topk)
    if phase is Phase.TARGET_VERIFY and Feature.CUSTOM_MASK not in caps.features:
        topk_top = 1
    if steps_top < low or topk_top < 1 or (limits.max_draft_tokens or 2) < 2:
        return st.nothing()

    @st.composite
    def draw(draw_: st.DrawFn) -> SpecConfig:
        steps, topk = draw_(st.integers(low, steps_top)), draw_(st.integers(1, topk_top))
        top_tokens = min(topk * steps + 1, limits.max_draft_tokens or topk * steps + 1)
        if topk == 1 and steps + 1 <= top_tokens:
            return SpecConfig.eagle(steps)
        if top_tokens < 2:
            return draw_(st.nothing())
        return SpecConfig.eagle(steps, topk, draw_(st.integers(2, top_tokens)))

    return draw()


def graph_limits(caps: BackendCapabilities, phase: Phase, multi_step: bool = False) -> SpecLimits:
    """The speculative limits one captured graph of ``phase`` is drawn within: the graph
    claim's, and with ``multi_step`` (every forward of a multi-step draft in one graph)
    also ``caps.multi_step``'s."""
    limits = caps.graph_limits(phase) or SpecLimits()
    if multi_step and caps.multi_step is not None:
        limits = _tighter(limits, caps.multi_step)
    return limits


def _tighter(a: SpecLimits, b: SpecLimits) -> SpecLimits:
    """Limits that hold where both ``a`` and ``b`` hold."""
    def low(x: int | None, y: int | None) -> int | None:
        return y if x is None else x if y is None else min(x, y)

    return SpecLimits(max_topk=low(a.max_topk, b.max_topk), max_num_steps=low(a.max_num_steps, b.max_num_steps),
                      max_draft_tokens=low(a.max_draft_tokens, b.max_draft_tokens))