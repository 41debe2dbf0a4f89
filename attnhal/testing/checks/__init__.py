"""The claim checks of the conformance kit: each one proves a descriptor claim by running it.

A backend's :class:`~attnhal.capabilities.BackendCapabilities` is a list of claims.
:func:`claims` enumerates them as :class:`Claim` records; :func:`check` runs one claim
(hypothesis-driven: fixed examples plus ``max_examples`` random ones) and raises
:class:`ClaimFalsified` naming the claim, with the shrunk counterexample attached by
hypothesis as a note; :func:`verify` turns that into a :class:`ClaimResult`
(verified / falsified, possibly flaky / not checked here / kit error). The pytest mixin
(:mod:`attnhal.testing.conformance`) and :func:`attnhal.testing.report.run_conformance`
both drive these functions.

One module per claim family, so each claim's check is found in one short module:
:mod:`.phases` (``phase``, ``unclaimed``), :mod:`.features`, :mod:`.graphs` (``graph``,
``seq_len_fill``; capture in :mod:`.capture`), :mod:`.multi_step`, :mod:`.properties`
(``deterministic``, ``inputs_unchanged``), :mod:`.metamorphic` (``batch_invariant``,
``empty_batch``), :mod:`.edges` (``layer_pattern``, ``scale_edges``; the far pool in
:mod:`.far_pool`), :mod:`.coverage` (where examples reached); :mod:`.claims` and :mod:`.target` hold the
records, :mod:`.fixed` the fixed examples, :mod:`.limits` the speculative limits of graph
and multi-step claims, :mod:`.run` dispatches. Modules import their siblings by module
path (``attnhal.testing.checks.fixed``), never through this package.

=========================  ================================================================
claim                      what is run
=========================  ================================================================
``phase[P, dtype]``        every claimed head size of phase ``P`` in ``dtype``, eager, against
                           the fp64 reference within ``caps.tolerance(dtype)``; the K/V cache
                           changes only at ``out_cache_loc``
``unclaimed[P]``           a phase not in ``caps.phases`` raises ``UnsupportedPhase``
``feature[custom_mask]``   ``target_verify`` with draft-tree masks (``topk > 1``)
``graph[P]``               capture with :class:`~attnhal.graphs.GraphRunner` at several sizes;
                           padded replays equal eager and the reference; no host sync at
                           capture or in ``init_replay_metadata``; no allocation at replay;
                           K/V written only at real slots and the padding slot.
                           ``graph[draft_decode]`` captures every step of a
                           :class:`~attnhal.backend.MultiStepDraft` in one graph
``seq_len_fill[P]``        padded rows (seq len = the declared fill value) give finite
                           outputs and leave real rows as eager computes them
``multi_step``             :class:`~attnhal.backend.MultiStepDraft`: every forward matches the
                           reference while the draft tree re-parents between forwards
``deterministic``          every backend: one batch run twice, one graph replayed twice and
                           a second capture of it give bitwise-equal outputs
``inputs_unchanged``       every backend: q/k/v, the batch, the pool's table and the other
                           layers are untouched by a forward
``batch_invariant``        every backend: a request's output whatever rows surround it, in
                           what order, in which request row, at 1, 5 and 64 requests
``layer_pattern``          every backend: 4 layers with differing windows, sinks, fp8 scales
                           through one batch's metadata, each against its own reference
``scale_edges``            every backend: a context past 2^16, a pool past 2^31 elements,
                           (thorough) a prefill extend past 4096 tokens
``empty_batch``            every backend: a batch of 0 requests, eager and through graphs
=========================  ================================================================

The fixed examples (:mod:`.fixed`) reach KV block boundaries, a long context, edge rows at
every position, wide GQA and MQA layouts and input variations (explicit scale, logits of
hundreds, V near the dtype's range, fused and strided q/k/v).

A claim that cannot be run in this process (no device of a claimed vendor, no graph
API, a Triton backend on a CPU platform without the interpreter, ...) is reported
"not checked here" with the reason — never passed silently.
"""

from __future__ import annotations

from attnhal.testing.checks.claims import (
    DEFAULT_EXAMPLES,
    THOROUGH_EXAMPLES,
    Claim,
    ClaimFalsified,
    ClaimKind,
    ClaimResult,
    Status,
    claims,
    examples_from_env,
)
from attnhal.testing.checks.phases import canonical_cases
from attnhal.testing.checks.run import check, not_checked_reason, verify
from attnhal.testing.checks.target import Target, checkable_dtypes, process_reasons
from attnhal.testing.settings import EXAMPLES_ENV

__all__ = [
    "DEFAULT_EXAMPLES",
    "EXAMPLES_ENV",
    "THOROUGH_EXAMPLES",
    "Claim",
    "ClaimFalsified",
    "ClaimKind",
    "ClaimResult",
    "Status",
    "Target",
    "canonical_cases",
    "check",
    "checkable_dtypes",
    "claims",
    "examples_from_env",
    "not_checked_reason",
    "process_reasons",
    "verify",
]
