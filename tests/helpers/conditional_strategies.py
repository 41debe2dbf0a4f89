"""Hypothesis strategies for schema-v2 descriptors (variants, run limits, fills), contexts and policies."""

from dataclasses import replace

from hypothesis import strategies as st

from attnhal.capabilities import FillTerm, IntSet, SeqLenFill, Variant, When
from attnhal.phases import GRAPH_PHASES
from attnhal.planner import GraphPolicy
from attnhal.platform import Vendor
from attnhal.spec import KV_DTYPES, ModelKind, RequestContext, SpecAlgorithm, SpecConfig
from attnhal.testing.strategies import descriptors, spec_configs, spec_limits

ALGORITHMS = [a for a in SpecAlgorithm if a is not SpecAlgorithm.NONE]


def int_sets():
    return st.one_of(st.builds(IntSet, st.frozensets(st.integers(1, 6), min_size=1)),
                     st.tuples(st.none() | st.integers(1, 4), st.none() | st.integers(2, 8))
                     .filter(lambda ends: ends != (None, None) and (None in ends or ends[0] <= ends[1])).map(lambda ends: IntSet(min=ends[0], max=ends[1])))


def whens(vendor_facts: bool = True):
    options = {"model": st.frozensets(st.sampled_from(list(ModelKind)), min_size=1),
               "page_size": int_sets(), "topk": int_sets(), "num_steps": int_sets(),
               "kv_dtype": st.frozensets(st.sampled_from(KV_DTYPES), min_size=1),
               "algorithm": st.frozensets(st.sampled_from(list(SpecAlgorithm)), min_size=1)}
    if vendor_facts:
        options |= {"vendor": st.frozensets(st.sampled_from(list(Vendor)), min_size=1),
                    "arch": st.just({Vendor.CUDA: ("sm90..",), Vendor.HIP: ("gfx942",)})}
    return st.fixed_dictionaries({}, optional=options).filter(bool).map(lambda d: When(**d))


@st.composite
def conditional_descriptors(draw, vendors=tuple(Vendor), vendor_facts=True):
    """descriptors() plus run limits, models, page sizes, per-phase fills and up to 4 variants."""
    base = draw(descriptors(vendors=vendors, min_arch=vendor_facts))
    phases = sorted(base.phases)
    graphable = [p for p in phases if p in GRAPH_PHASES]
    limits_by_phase = lambda keys: st.dictionaries(st.sampled_from(keys), st.none() | spec_limits()) if keys \
        else st.just({})  # noqa: E731
    changes = st.fixed_dictionaries({}, optional={
        "graph": limits_by_phase(graphable), "run_limits": limits_by_phase(phases),
        "multi_step": st.none() | spec_limits(),
        "page_sizes": st.frozensets(st.sampled_from([1, 16, 64]), min_size=1),
        "models": st.frozensets(st.sampled_from(list(ModelKind)), min_size=1),
    })
    variants = draw(st.lists(st.builds(Variant, whens(vendor_facts), changes.filter(bool)), max_size=4))
    run_limits = draw(st.dictionaries(st.sampled_from(phases), spec_limits())) if phases else {}
    fills = draw(st.dictionaries(st.sampled_from(graphable), st.builds(
        SeqLenFill, st.integers(0, 2), at_least=st.integers(0, 2), at_least_plus=st.sampled_from(list(FillTerm))))) \
        if graphable else {}
    return replace(base, variants=tuple(variants), run_limits=run_limits, phase_fill=fills,
                   page_sizes=draw(st.frozensets(st.sampled_from([1, 16, 64]), min_size=1)))


contexts = st.builds(RequestContext, model=st.none() | st.sampled_from(list(ModelKind)),
                     page_size=st.none() | st.sampled_from([1, 16, 64]),
                     kv_dtype=st.none() | st.sampled_from(KV_DTYPES))


@st.composite
def algorithm_specs(draw):
    spec = draw(spec_configs())
    if not spec.speculative:
        return spec
    return SpecConfig(draw(st.sampled_from(ALGORITHMS)), spec.num_steps, spec.topk, spec.num_draft_tokens)


@st.composite
def policies_for(draw, spec):
    # Any step counts, also those a tree cannot take (it keeps its draft-token count): the
    # planner reports those as unfit, it never raises.
    return GraphPolicy(enabled=draw(st.booleans()), max_batch_size=draw(st.integers(1, 64)),
                       disabled_phases=draw(st.frozensets(st.sampled_from(GRAPH_PHASES))),
                       step_counts=draw(st.none() | st.lists(st.integers(1, 6), min_size=1, max_size=3)),
                       max_tokens=draw(st.none() | st.integers(1, 256)))
