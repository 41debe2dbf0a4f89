"""The reference speculative worker: lossless against plain greedy, one code path on every vendor.

More cases: ATTNHAL_WORKER_EXAMPLES=200 pytest tests/example_engine/test_worker.py (default 25; a tenth of it for
the Triton interpreter, at least 3).
"""

import ast
import functools
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnhal.backend import PADDING_REQ
from attnhal.capabilities import FillTerm, SeqLenFill, Variant, When
from attnhal.phases import Phase
from attnhal.planner import GraphPolicy
from attnhal.platform import parse
from attnhal.example_engine.model import ModelConfig, TinyLlama, draft_of
from attnhal.example_engine.tree import first_level, grow, select
from attnhal.example_engine.worker import PlanInvalid, SpecWorker
from attnhal.registry import BackendUnavailable, Registry
from attnhal.spec import SpecConfig
from attnhal.testing.strategies import spec_configs
from attnhal_torch import TorchBackend

EXAMPLES = int(os.environ.get("ATTNHAL_WORKER_EXAMPLES", "25"))
SIZES = (1, 2, 4)
CONTEXT = 96
TARGET = TinyLlama(ModelConfig(num_layers=2, hidden_size=64, ffn_size=128, vocab_size=128, head_dim=16))
DRAFT = draft_of(TARGET)


@functools.lru_cache(maxsize=None)
def worker(spec: SpecConfig, graphs: bool, platform: str, backend: str = "torch", page_size: int = 1,
           kv_dtype: str = "float32") -> SpecWorker:
    """Workers are reusable across generate calls; caching keeps captures out of the example loop."""
    draft = DRAFT if spec.speculative else None
    return SpecWorker(TARGET, draft, spec, platform=platform, backend=backend,
                      policy=GraphPolicy(enabled=graphs, batch_sizes=SIZES), max_context_len=CONTEXT,
                      page_size=page_size, kv_dtype=kv_dtype)


def greedy(prompts, n, platform="cpu", page_size=1, kv_dtype="float32"):
    return worker(SpecConfig(), False, platform, page_size=page_size, kv_dtype=kv_dtype).generate(prompts, n).tokens


prompts_st = st.lists(st.lists(st.integers(0, 127), min_size=1, max_size=12), min_size=1, max_size=5)


@settings(max_examples=EXAMPLES)
@given(prompts_st, st.integers(1, 12), spec_configs(max_steps=4, max_topk=4, speculative=True), st.booleans(),
       st.sampled_from(["cuda:sm90", "hip:gfx942"]))
def test_speculative_output_is_plain_greedy(prompts, n, spec, graphs, platform):
    out = worker(spec, graphs, platform).generate(prompts, n)
    assert out.tokens == greedy(prompts, n)
    assert all(0 <= a <= spec.num_steps for a in out.accepted)


@settings(max_examples=max(3, EXAMPLES // 3))
@given(prompts_st, st.integers(1, 12), spec_configs(max_steps=4, max_topk=4, speculative=True), st.booleans(),
       st.sampled_from([("cuda:sm90", 16, "float32"), ("hip:gfx942", 16, "float32"), ("cuda:sm90", 1, "fp8_e4m3"),
                        ("hip:gfx942", 1, "fp8_e4m3"), ("hip:gfx942", 16, "fp8_e5m2")]))
def test_paged_and_fp8_caches_are_lossless(prompts, n, spec, graphs, case):
    """Speculative equals greedy under the same page size and cache dtype (fp8 tokens may
    differ from fp32 tokens; spec vs greedy may not); the e4m3 flavour is the platform's."""
    platform, page, kv = case
    w = worker(spec, graphs, platform, page_size=page, kv_dtype=kv)
    assert w.generate(prompts, n).tokens == greedy(prompts, n, platform, page, kv)


@pytest.mark.parametrize("platform, dtype", [("cuda:sm90", torch.float8_e4m3fn), ("hip:gfx942", torch.float8_e4m3fnuz)])
def test_fp8_cache_is_stored_in_the_platform_flavour(platform, dtype):
    w = worker(SpecConfig.eagle(2, 2, 4), True, platform, page_size=16, kv_dtype="fp8_e4m3")
    assert w.target_pool.dtype == dtype and w.draft_pool.dtype == dtype and w.target_pool.page_size == 16
    assert set(w.plan.captured) == {Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE}


def test_fp8_e4m3_on_a_platform_without_fp8_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match=r"fp8_flavor='none' \(supported: e4m3fn, e4m3fnuz for kv_dtype=fp8_e4m3"):
        SpecWorker(TARGET, DRAFT, SpecConfig.eagle(2), platform="cpu", kv_dtype="fp8_e4m3", max_context_len=CONTEXT)


@settings(max_examples=max(3, EXAMPLES // 3))
@given(prompts_st, st.integers(1, 10), spec_configs(max_steps=3, max_topk=3, speculative=True))
def test_cuda_and_hip_give_identical_plans_and_tokens(prompts, n, spec):
    cuda, hip = worker(spec, True, "cuda:sm90"), worker(spec, True, "hip:gfx942")
    assert cuda.plan.to_dict()["phases"] == hip.plan.to_dict()["phases"]
    assert cuda.generate(prompts, n).tokens == hip.generate(prompts, n).tokens


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
def test_one_step_captures_draft_extend_end_to_end(platform):
    w = worker(SpecConfig.eagle(1), True, platform)
    assert not w.plan[Phase.DRAFT_DECODE].runs
    assert w.plan[Phase.DRAFT_EXTEND].capture and w.plan[Phase.TARGET_VERIFY].capture
    prompts = [[5, 6, 7], [1], [9, 9, 9, 9, 9]]
    before = w.runner.summary()[Phase.DRAFT_EXTEND].replays
    assert w.generate(prompts, 8).tokens == greedy(prompts, 8)
    assert w.runner.summary()[Phase.DRAFT_EXTEND].replays > before


def test_acceptance_is_neither_zero_nor_total():
    out = worker(SpecConfig.eagle(3), False, "cpu").generate([[1, 2, 3], [4, 5], [6]], 24)
    assert 1.2 < out.mean_accept_length < 4.0


def test_batches_above_the_largest_capture_size_run_eagerly():
    w = worker(SpecConfig.eagle(2), True, "cpu")
    prompts = [[i, i + 1] for i in range(6)]  # 6 requests, capture sizes up to 4: chunks of 4 and 2
    assert w.generate(prompts, 6).tokens == greedy(prompts, 6)


def test_backend_that_does_not_fit_is_an_error_with_reasons():
    with pytest.raises(BackendUnavailable, match="vendor=cpu"):
        SpecWorker(TARGET, DRAFT, SpecConfig.eagle(2), platform="cpu", backend="triton", max_context_len=CONTEXT)


def test_invalid_plan_is_an_error_with_reasons():
    class NoMultiStep(TorchBackend):
        capabilities = replace(TorchBackend.capabilities, name="no-multi-step", multi_step=None)

    registry = Registry(discover=lambda: [])
    registry.register(NoMultiStep)
    with pytest.raises(PlanInvalid, match="draft_decode: .multi_step."):
        SpecWorker(TARGET, DRAFT, SpecConfig.eagle(2), platform="cpu", backend="no-multi-step",
                   registry=registry, max_context_len=CONTEXT)


PADDED_FILLS: dict[Phase, set[int]] = {}


class PerPhaseFill(TorchBackend):
    """The torch backend with a fill rule per phase (one only through a HIP variant); records the
    seq lens of the padded rows (request row 0) of every replay."""

    capabilities = replace(
        TorchBackend.capabilities, name="per-phase-fill",
        phase_fill={Phase.DRAFT_EXTEND: SeqLenFill(2), Phase.TARGET_VERIFY: SeqLenFill(1, plus=FillTerm.WIDTH)},
        variants=(Variant(When(vendor={"hip"}), {"phase_fill": {Phase.DRAFT_DECODE: SeqLenFill(3)}}, note="hip"),))

    def init_replay_metadata(self, batch):
        padded = batch.seq_lens[batch.req_pool_indices == PADDING_REQ]
        PADDED_FILLS.setdefault(batch.phase, set()).update(padded.tolist())
        super().init_replay_metadata(batch)


def test_worker_runs_the_plans_per_phase_sizes_and_fills_end_to_end():
    registry = Registry(discover=lambda: [])
    registry.register(PerPhaseFill)
    spec = SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
    w = SpecWorker(TARGET, DRAFT, spec, platform="hip:gfx942", backend="per-phase-fill", registry=registry,
                   policy=GraphPolicy(batch_sizes=(2, 4), max_tokens=8), max_context_len=CONTEXT)
    want = {Phase.DRAFT_DECODE: ((2, 4), 3), Phase.DRAFT_EXTEND: ((2,), 2), Phase.TARGET_VERIFY: ((2,), 5)}
    for phase, (sizes, fill) in want.items():  # 4 tokens per request in extend and verify: 2 x 4 <= 8
        assert (w.plan[phase].capture_sizes, w.plan[phase].seq_len_fill) == (sizes, fill)
        assert w.runner.captured_sizes(phase) == sizes
    PADDED_FILLS.clear()
    for prompts in ([[5, 6, 7]], [[1], [2, 3], [4, 4, 4]]):  # one request pads every phase; three: 4 or eager
        assert w.generate(prompts, 6).tokens == greedy(prompts, 6)
    assert PADDED_FILLS == {phase: {fill} for phase, (_, fill) in want.items()}
    stats = w.runner.summary()
    assert stats[Phase.TARGET_VERIFY].eager_runs > 0 and stats[Phase.DRAFT_DECODE].eager_runs == 0


class NoMlaExtendGraph(TorchBackend):
    """The torch backend whose draft-extend graph is claimed for every layout but MLA, and for
    page size 1 only: claims a plan made without the request's context cannot see."""

    capabilities = replace(TorchBackend.capabilities, name="no-mla-extend-graph", variants=(
        Variant(When(model={"mla"}), {"graph": {Phase.DRAFT_EXTEND: None}}, note="no MLA draft-extend graph"),
        Variant(When(page_size=range(2, 4097)), {"graph": {Phase.DRAFT_EXTEND: None}}, note="pages of 1 only")))


@pytest.mark.parametrize("mla,page_size,captured", [(False, 1, True), (True, 1, False), (False, 16, False)])
def test_the_worker_plans_for_its_model_and_cache(mla: bool, page_size: int, captured: bool) -> None:
    """The worker's plan is made for its model's layout and its cache's page size and dtype, so a
    descriptor's conditional claims decide as they do for a server's request, and the run stays lossless."""
    registry = Registry(discover=lambda: [])
    registry.register(NoMlaExtendGraph)
    target = TinyLlama(ModelConfig(num_layers=1, hidden_size=64, ffn_size=128, vocab_size=128, num_q_heads=16,
                                   mla=True)) if mla else TARGET
    w = SpecWorker(target, draft_of(target) if mla else DRAFT, SpecConfig.eagle(1), platform="cpu",
                   backend="no-mla-extend-graph", registry=registry, policy=GraphPolicy(batch_sizes=(1,)),
                   max_context_len=CONTEXT, page_size=page_size)
    assert w.plan.context is not None and w.plan.context.model.value == ("mla" if mla else "gqa")
    assert w.plan[Phase.DRAFT_EXTEND].capture is captured and w.plan[Phase.TARGET_VERIFY].capture
    assert w.runner.captured_sizes(Phase.DRAFT_EXTEND) == ((1,) if captured else ())
    reference = SpecWorker(target, None, SpecConfig(), platform="cpu", backend="torch", max_context_len=CONTEXT,
                           page_size=page_size)
    assert w.generate([[5, 6, 7]], 4).tokens == reference.generate([[5, 6, 7]], 4).tokens


def test_no_vendor_checks_and_no_isinstance_on_backends():
    for path in Path("attnhal/example_engine").glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id in ("isinstance", "issubclass", "hasattr", "type")]
        assert not calls, f"{path}: {[ast.unparse(c) for c in calls]}"
        text = path.read_text()
        assert "Vendor" not in text and ".vendor" not in text and "torch.version" not in text, path


def test_tree_selection_is_ancestor_closed():
    torch.manual_seed(0)
    bs, k, steps, vocab = 3, 3, 4, 20
    tree = first_level(torch.randn(bs, vocab), k)
    for _ in range(steps - 1):
        tree = tree.add_level(*grow(tree.branch_scores, torch.randn(bs * k, vocab)))
    verify = select(tree, torch.zeros(bs, dtype=torch.long), 8, steps)
    for b in range(bs):
        for node in range(1, 8):
            parent = int(verify.parent[b, node])
            assert parent < node and verify.depth[b, node] == verify.depth[b, parent] + 1
            assert bool(verify.mask[b, node, parent]) and bool(verify.mask[b, node, 0])


def _triton_ready() -> bool:
    try:
        from attnhal_triton import TritonBackend
    except ImportError:
        return False
    return not TritonBackend.runtime_reasons(parse("hip:gfx942"))


@pytest.mark.skipif(not _triton_ready(), reason="triton not installed, or no GPU and no TRITON_INTERPRET=1")
@settings(max_examples=max(3, EXAMPLES // 10))
@given(st.lists(st.lists(st.integers(0, 127), min_size=1, max_size=6), min_size=1, max_size=2), st.integers(1, 5),
       st.sampled_from([SpecConfig.eagle(1), SpecConfig.eagle(2, 2, 4), SpecConfig.eagle(3)]), st.booleans(),
       st.sampled_from(["cuda:sm90", "hip:gfx942"]))
def test_triton_backend_is_lossless_too(prompts, n, spec, graphs, platform):
    """The Triton kernels (interpreter on CPU) in every role; fewer cases: ~1-5 s each."""
    assert worker(spec, graphs, platform, "triton").generate(prompts, n).tokens == greedy(prompts, n)


def test_bad_prompts_are_refused_with_what_is_allowed():
    w = worker(SpecConfig.eagle(2), False, "cpu")
    with pytest.raises(ValueError, match=r"prompts: 0 \(supported: 1..8"):
        w.generate([], 4)
    with pytest.raises(ValueError, match=r"prompts: 9 \(supported: 1..8"):
        w.generate([[1]] * 9, 4)
