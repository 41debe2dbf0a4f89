"""Hypothesis strategies for attnhal, in the spirit of ``hypothesis.extra``.

Platform, spec-config and descriptor strategies need no backend; batch strategies
bound to a backend's descriptor live in :mod:`attnhal.testing.batches`.
"""

from __future__ import annotations

from hypothesis import strategies as st

from attnhal.capabilities import (
    DTYPES,
    GRAPH_PHASES,
    BackendCapabilities,
    Feature,
    Phase,
    SpecLimits,
)
from attnhal.plan import GraphPolicy, SpecConfig
from attnhal.platform import Platform, Vendor, parse

__all__ = ["descriptors", "graph_policies", "platform_specs", "platforms", "spec_configs", "spec_limits"]

_CUDA_ARCHS = ("sm80", "sm86", "sm89", "sm90", "sm100")
_HIP_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100")


def platform_specs(vendors: tuple[Vendor, ...] = tuple(Vendor), graphs: bool | None = None) -> st.SearchStrategy[str]:
    """Spec strings for :func:`attnhal.platform.parse` (``"hip:gfx942"``, ``"cpu,nographs"``, ...)."""
    archs = {Vendor.CUDA: _CUDA_ARCHS, Vendor.HIP: _HIP_ARCHS, Vendor.CPU: ("",)}

    def spec(vendor: Vendor, arch: str, nographs: bool) -> str:
        base = f"{vendor.value}:{arch}" if arch else vendor.value
        return base + (",nographs" if nographs else "")

    nographs = st.just(not graphs) if graphs is not None else st.booleans()
    return st.sampled_from(vendors).flatmap(
        lambda v: st.builds(spec, st.just(v), st.sampled_from(archs[v]), nographs))


def platforms(vendors: tuple[Vendor, ...] = tuple(Vendor), graphs: bool | None = None) -> st.SearchStrategy[Platform]:
    """Simulated platforms (see :func:`platform_specs`)."""
    return platform_specs(vendors, graphs).map(parse)


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
    phases = draw(st.frozensets(st.sampled_from(list(Phase))))
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
