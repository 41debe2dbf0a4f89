"""Strategies for the optional features one descriptor claims, drawn together.

Real kernel bugs live where features meet (a window with a tree mask, sinks with a
window or a split context, a page table with a quantized cache), so
:func:`feature_fields` draws any combination of what a descriptor claims, each feature
on or off: a sliding window (one size for every layer, or per layer), a soft-cap, sinks,
the MLA geometry, a page size and a KV dtype. The fields are those of a
:class:`~attnhal.testing.cases.CaseRecipe`; ``head_size`` and ``page_size`` belong to
:func:`~attnhal.testing.strategies.case_specs` (its cost model and lengths depend on them).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from attnhal.capabilities import BackendCapabilities
from attnhal.kv_format import kv_format
from attnhal.phases import Feature

__all__ = ["FP8_KV_SCALE", "MLA_FIELDS", "WINDOW_EDGES", "feature_fields", "kv_fields", "window_fields", "windows"]

#: Window sizes past the KV blocks and splits of real kernels (a window start that falls
#: in another block than the query, a window longer than a split).
WINDOW_EDGES = (31, 63, 64, 65, 127, 255, 1000)
#: MLA (absorbed, DeepSeek): q/k head = latent 512 + rope 64, V = the latent part, one KV head.
MLA_FIELDS: dict[str, Any] = {"head_size": 576, "v_head_size": 512, "num_kv_heads": 1}
#: ``k_scale`` of drawn fp8 caches (``v_scale`` is twice it): neither is 1.
FP8_KV_SCALE = 0.25


def windows() -> st.SearchStrategy[int]:
    """Left window sizes: small ones (shrink targets, 0 = the query alone), then :data:`WINDOW_EDGES`."""
    return st.one_of(st.integers(0, 12), st.sampled_from(WINDOW_EDGES))


def window_fields() -> st.SearchStrategy[dict[str, Any]]:
    """``sliding_window``: one size for every layer, or a window layer beside a full one."""
    return windows().flatmap(lambda w: st.sampled_from(({"sliding_window": w}, {"sliding_window": (None, w)},
                                                        {"sliding_window": (w, None)})))


def kv_fields(caps: BackendCapabilities, fp8_flavors: tuple[str, ...] = ("e4m3fn",)) -> list[dict[str, Any]]:
    """The claimed KV dtypes that differ from the compute dtypes, as recipe fields (fp8
    e4m3 once per flavour in ``fp8_flavors``; fp8 caches with :data:`FP8_KV_SCALE`)."""
    out: list[dict[str, Any]] = []
    for kv in sorted(set(caps.kv_dtypes or ()) - set(caps.dtypes)):
        fmt = kv_format(kv)
        flavours = fp8_flavors if fmt.needs_flavor else ("e4m3fn",)
        scale = FP8_KV_SCALE if fmt.scaled else 1.0
        out += [{"kv_dtype": kv, "fp8_flavor": f, "kv_scale": scale} for f in flavours]
    return out


def feature_fields(caps: BackendCapabilities,
                   fp8_flavors: tuple[str, ...] = ("e4m3fn",)) -> st.SearchStrategy[dict[str, Any]]:
    """Recipe fields of any combination of the features, page sizes and KV dtypes ``caps``
    claims (each one on or off; shrinks towards none of them). ``custom_mask`` is not a
    field: the trees of ``target_verify`` are drawn with the batch."""
    parts: list[st.SearchStrategy[dict[str, Any]]] = []
    off: st.SearchStrategy[dict[str, Any]] = st.just({})
    if Feature.SLIDING_WINDOW in caps.features:
        parts.append(off | window_fields())
    if Feature.LOGIT_SOFTCAP in caps.features:
        parts.append(off | st.floats(0.25, 30.0).map(lambda c: {"logit_softcap": c}))
    if Feature.SINKS in caps.features:
        parts.append(off | st.just({"sinks": True}))
    if Feature.MLA in caps.features and MLA_FIELDS["head_size"] in caps.head_sizes:
        parts.append(off | st.just(MLA_FIELDS))
    pages = sorted(p for p in caps.page_sizes if p > 1)
    if pages:
        parts.append(off | st.sampled_from(pages).map(lambda p: {"page_size": p}))
    kvs = kv_fields(caps, fp8_flavors)
    if kvs:
        parts.append(off | st.sampled_from(kvs))

    def merge(dicts: tuple[dict[str, Any], ...]) -> dict[str, Any]:
        return {k: v for d in dicts for k, v in d.items()}

    return st.tuples(*parts).map(merge) if parts else off
