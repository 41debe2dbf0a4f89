"""Hypothesis strategies for attnhal, in the spirit of ``hypothesis.extra``.

Import it under a short name that shadows nothing: ``import attnhal.testing.strategies as hst``.

Two families:

* **unbound** — need no backend: :func:`platforms` (simulated), :func:`platform_specs`,
  :func:`spec_configs`, :func:`spec_limits`, :func:`graph_policies`, :func:`descriptors`,
  :func:`head_configs`, :func:`head_layouts`, :func:`context_lengths`,
  :func:`input_variations`, :func:`tree_parents`, :func:`tree_masks`, :func:`windows`,
  :func:`window_fields`;
* **bound to a descriptor** — draw only what a backend's
  :class:`~attnhal.capabilities.BackendCapabilities` claims: :func:`dtypes`,
  :func:`head_sizes`, :func:`page_sizes`, :func:`feature_fields` (claimed features, page
  sizes and KV dtypes combined), :func:`kv_fields`, :func:`spec_configs_for` (within a claim's
  :class:`~attnhal.capabilities.SpecLimits`; :func:`graph_limits` gives a graph's), and the
  batches of each phase: :func:`case_specs` (a :class:`~attnhal.testing.cases.CaseRecipe`,
  readable when shrunk), :func:`cases` (built: config, pool with random K/V, ForwardBatch,
  q, k, v), :func:`multi_step_specs` and :func:`graph_case_specs`.

Sizes reach what real kernels hit (block boundaries, contexts past 4096, prefill extends
past 128 tokens, GQA groups up to 16, MQA) under a cost model (:func:`batch_cost`) that
bounds each batch, so long contexts come with few requests. An interpreter run passes a
smaller ``max_seq_len`` and ``max_cost``. :func:`input_variations` draws explicit scales,
large magnitudes and non-contiguous q/k/v (``inputs=True``).

:mod:`.configs` holds the configuration strategies, :mod:`.features` the feature
combinations, :mod:`.forwards` the forward ones.
"""

from __future__ import annotations

from attnhal.testing.strategies.configs import (
    descriptors,
    dtypes,
    graph_limits,
    graph_policies,
    head_sizes,
    page_sizes,
    platform_specs,
    platforms,
    spec_configs,
    spec_configs_for,
    spec_limits,
)
from attnhal.testing.strategies.features import (
    FP8_KV_SCALE,
    MLA_FIELDS,
    WINDOW_EDGES,
    feature_fields,
    kv_fields,
    window_fields,
    windows,
)
from attnhal.testing.strategies.forwards import (
    DEFAULT_MAX_COST,
    DEFAULT_MAX_SEQ_LEN,
    batch_cost,
    case_specs,
    cases,
    context_lengths,
    graph_case_specs,
    head_configs,
    head_layouts,
    input_variations,
    multi_step_specs,
    tree_masks,
    tree_parents,
)

__all__ = [
    "DEFAULT_MAX_COST",
    "DEFAULT_MAX_SEQ_LEN",
    "FP8_KV_SCALE",
    "MLA_FIELDS",
    "WINDOW_EDGES",
    "batch_cost",
    "case_specs",
    "cases",
    "context_lengths",
    "descriptors",
    "dtypes",
    "feature_fields",
    "graph_case_specs",
    "graph_limits",
    "graph_policies",
    "head_configs",
    "head_layouts",
    "head_sizes",
    "input_variations",
    "kv_fields",
    "multi_step_specs",
    "page_sizes",
    "platform_specs",
    "platforms",
    "spec_configs",
    "spec_configs_for",
    "spec_limits",
    "tree_masks",
    "tree_parents",
    "window_fields",
    "windows",
]
