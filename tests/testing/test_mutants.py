"""The kit's mutation self-test: every one-defect backend of tests/doubles/mutants.py is a real
defect (its trigger case shows it, by hand, while the torch backend is right on the same
case), and the kit at its default budget falsifies the claim the defect breaks.

The per-mutant kit runs check only the mutant's claim (CI time); set ``ATTNHAL_SLOW=1``
for the full run of every claim of every mutant.
"""

from __future__ import annotations

import os

import pytest
import torch
from mutants import MUTANTS, Mutant

from attnhal.backend import KVPool
from attnhal.testing.cases import Case, attention_config, build_case, make_pool
from attnhal.testing.checks.fp8 import late_scales
from attnhal.testing.oracle import real_tokens, reference_forward
from attnhal.testing.report import run_conformance
from attnhal_torch import TorchBackend

#: The defect categories of tests/doubles/mutants.py: each must have a mutant.
CATEGORIES = {"sizes", "inputs", "properties", "graphs", "features", "pages", "fp8"}
def _rescale(pool: KVPool) -> None:
    """The fp8 scales an engine sets late, the kit's (neither the recipe's nor 1)."""
    k, v = late_scales(pool.num_layers)
    pool.k_scale.copy_(torch.tensor(k))
    pool.v_scale.copy_(torch.tensor(v))


def _setup(cls: type[TorchBackend], mutant: Mutant) -> tuple[Case, TorchBackend]:
    """The trigger case and a backend with its metadata built the way the mutant's kind needs."""
    if mutant.kind == "late_scales":  # built first, then the engine loads scales and writes the cache
        pool = make_pool(mutant.trigger)
        backend = cls(attention_config(mutant.trigger), pool)
        _rescale(pool)
        case = build_case(mutant.trigger, pool=pool)
        backend.init_forward_metadata(case.batch)
        return case, backend
    case = build_case(mutant.trigger)
    backend = cls(case.config, case.pool)
    if mutant.kind in ("graph", "replay_scales"):  # what a replay runs: the static layout rewritten
        backend.init_graph_state(case.batch.batch_size, case.batch.num_tokens)
        backend.init_capture_metadata(case.batch)
        if mutant.kind == "replay_scales":
            _rescale(case.pool)
        backend.init_replay_metadata(case.batch)
    else:
        backend.init_forward_metadata(case.batch)
    return case, backend


def _run(cls: type[TorchBackend], mutant: Mutant, calls: int = 1) -> tuple[list[torch.Tensor], torch.Tensor, Case]:
    """The backend on the mutant's trigger case: ``calls`` forwards of one batch, the fp64
    reference (taken before them) and the case."""
    case, backend = _setup(cls, mutant)
    ref = reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale,
                            case.config)
    outs = [backend.forward(case.q, case.k, case.v, case.layer, case.batch).clone() for _ in range(calls)]
    return outs, ref, case


def _error(case: Case, ref: torch.Tensor, out: torch.Tensor) -> float:
    """Largest error of ``out`` on real tokens against the reference (inf if not finite)."""
    index = torch.tensor(real_tokens(case.batch))
    return float((out.double()[index] - ref[index]).abs().nan_to_num(float("inf")).max())


def test_the_table_covers_every_category_with_twenty_mutants() -> None:
    assert len(MUTANTS) >= 20
    assert {m.category.split(":")[0] for m in MUTANTS.values()} == CATEGORIES
    assert len({m.cls for m in MUTANTS.values()}) == len(MUTANTS)  # one defect each


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_trigger_shows_the_defect_by_hand(name: str) -> None:
    mutant = MUTANTS[name]
    tol = TorchBackend.capabilities.tolerance(mutant.trigger.dtype)
    bound = 10 * (tol.atol + tol.rtol) * mutant.trigger.v_magnitude
    # the torch backend is right on the trigger: the defect is the mutant's own
    (out,), ref, case = _run(TorchBackend, mutant)
    assert _error(case, ref, out) < bound
    if mutant.kind in ("output", "graph", "late_scales", "replay_scales"):
        (out,), ref, case = _run(mutant.cls, mutant)
        assert _error(case, ref, out) > bound
    elif mutant.kind == "nondeterministic":
        (first, second), ref, case = _run(mutant.cls, mutant, calls=2)
        assert not torch.equal(first, second)
        assert _error(case, ref, first) < bound and _error(case, ref, second) < bound  # both within tolerance
        assert torch.equal(*_run(TorchBackend, mutant, calls=2)[0])
    elif mutant.kind == "flaky":
        outs, ref, case = _run(mutant.cls, mutant, calls=10)
        errors = [_error(case, ref, out) for out in outs]
        assert any(e > bound for e in errors) and any(e < bound for e in errors)
    else:
        assert mutant.kind == "inputs"
        case = build_case(mutant.trigger)
        tensors = [case.q, case.k, case.v, case.batch.seq_lens, *case.pool.k[:case.layer], *case.pool.v[:case.layer],
                   *case.pool.k[case.layer + 1:], *case.pool.v[case.layer + 1:]]
        before = [t.clone() for t in tensors]
        backend = mutant.cls(case.config, case.pool)
        backend.init_forward_metadata(case.batch)
        backend.forward(case.q, case.k, case.v, case.layer, case.batch)
        assert any(not torch.equal(a, b) for a, b in zip(tensors, before))


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_kit_flags_each_mutant_for_its_claim_at_the_default_budget(name: str) -> None:
    mutant = MUTANTS[name]
    report = run_conformance(mutant.cls, platform="cpu", only=[mutant.claim])
    assert [r.claim.name for r in report.results] == [mutant.claim]
    assert [r.claim.name for r in report.falsified] == [mutant.claim], report.format()
    assert not report.ok


@pytest.mark.skipif(not os.environ.get("ATTNHAL_SLOW"), reason="full kit run per mutant: set ATTNHAL_SLOW=1")
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_full_default_run_flags_each_mutant(name: str) -> None:
    mutant = MUTANTS[name]
    report = run_conformance(mutant.cls, platform="cpu", allow_unchecked=True)
    assert mutant.claim in {r.claim.name for r in report.falsified}, report.format()
    assert not report.errors, report.format()


def test_a_defect_of_a_pair_falsifies_both_claims_and_no_third() -> None:
    """Sinks dropped on window layers: each feature alone works, the pair fails, so both claims
    are falsified; soft-cap's combinations fail too, but as well without the soft-cap: not its defect."""
    cls = MUTANTS["sinks_skipped_under_window"].cls
    report = run_conformance(cls, platform="cpu", max_examples=0,
                             only=["feature[sinks]", "feature[sliding_window]", "feature[logit_softcap]"])
    assert {r.claim.name for r in report.falsified} == {"feature[sinks]", "feature[sliding_window]"}, report.format()
    assert [r.claim.name for r in report.results if r.status.value == "verified"] == ["feature[logit_softcap]"]
