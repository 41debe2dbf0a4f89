"""Capability descriptors: what a backend can do, as one frozen record.

A backend's :class:`BackendCapabilities` (its *descriptor*) says which phases it
runs, which it can capture as a graph and under which speculative limits, which
speculative settings it can run at all, whether it can serve as a multi-step draft
backend, and which archs / model kinds / dtypes / head sizes / page sizes /
features it supports. :func:`not_supported_reasons` turns a request and a platform
into a list of :class:`Reason`; an empty list means "supported".

Claims that hold only under conditions are **variants**: ordered ``(when, changes)``
pairs. :meth:`BackendCapabilities.resolve` applies the variants whose :class:`When`
matches the :class:`Facts` of one plan and returns a plain descriptor; this is the
one place conditions are evaluated. The planner reads only resolved descriptors.

The package, in import order (each module imports only those before it):

- :mod:`~attnhal.capabilities.claims`: claim values (``SpecLimits``, ``SeqLenFill``, ``Tolerance``)
- :mod:`~attnhal.capabilities.conditions`: ``Facts``, ``IntSet``, ``When``, ``Variant``
- :mod:`~attnhal.capabilities.descriptor`: ``BackendCapabilities``
- :mod:`~attnhal.capabilities.support`: ``AttentionRequest``, ``not_supported_reasons``, ``supports``
- :mod:`~attnhal.capabilities.schema` and :mod:`~attnhal.capabilities.files`: descriptor files

The vocabulary it builds on lives below it: :mod:`attnhal.reasons` (``Reason``,
``ReasonCode``) and :mod:`attnhal.phases` (``Phase``, ``Feature``); both are
re-exported here, as are the spec and platform names this module always offered.
"""

from attnhal.capabilities.claims import DEFAULT_TOLERANCES, FillTerm, SeqLenFill, SpecLimits, Tolerance
from attnhal.capabilities.conditions import VARIANT_FIELDS, Facts, IntSet, Variant, When
from attnhal.capabilities.descriptor import BackendCapabilities
from attnhal.capabilities.support import AttentionRequest, not_supported_reasons, request_reasons, supports
from attnhal.phases import GRAPH_PHASES, Feature, Phase, tokens_per_request
# The platform and spec names below (and DEFAULT_TOLERANCES, VARIANT_FIELDS, fmt_set, reason) are
# re-exported outside ``__all__``: code imports them from here since this was one module.
from attnhal.platform import ArchSet, Fp8Flavor, Platform, PlatformSpecError, Vendor, arch_at_least, arch_sets
from attnhal.reasons import Reason, ReasonCode, fmt_set, reason
from attnhal.spec import DTYPES, KV_DTYPES, ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__all__ = [
    "DTYPES",
    "GRAPH_PHASES",
    "KV_DTYPES",
    "AttentionRequest",
    "BackendCapabilities",
    "Facts",
    "Feature",
    "FillTerm",
    "IntSet",
    "Phase",
    "Reason",
    "ReasonCode",
    "SeqLenFill",
    "SpecLimits",
    "Tolerance",
    "Variant",
    "When",
    "not_supported_reasons",
    "request_reasons",
    "supports",
    "tokens_per_request",
]

