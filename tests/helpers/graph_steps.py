"""Graph-runner test pieces shared by the emulator tests and the device tests: toy steps,
the speculative phases' steps and batches, the torch backend's steps and its replay check."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from broken_backends import (
    batch_to,
    ToyDecode,
    make_pool,
    phase_batch,
    release,
)

from attnhal.backend import AttentionConfig, ForwardBatch, KVPool, MultiStepDraft, SpecInfo
from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.graphs import (
    GraphCaptureWarning,
    GraphRunner,
    PhaseStep,
)
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, Vendor, parse
from attnhal.spec import SpecConfig


SIZES = (1, 2, 4, 8)


CFG = AttentionConfig(num_q_heads=4, num_kv_heads=2, head_size=16)


CPU = parse("cpu")


def decode_plan(caps: BackendCapabilities, platform: Platform = CPU) -> GraphPlan:
    return plan(SpecConfig(), platform, PhaseBackends.same(caps), GraphPolicy(batch_sizes=SIZES))


def attention_step(backend: ToyDecode) -> PhaseStep:
    """Capture just the attention of layer 0 (writes the new K/V, then attends)."""
    h, kvh, d = CFG.num_q_heads, CFG.num_kv_heads, CFG.head_size

    def forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> torch.Tensor:
        return backend.forward(x["q"], x["k"], x["v"], 0, batch)

    f32 = torch.float32
    return PhaseStep(metadata=backend, forward=forward,
                     inputs={"q": ("token", (h, d), f32), "k": ("token", (kvh, d), f32),
                             "v": ("token", (kvh, d), f32)})


def qkv(n: int, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"q": (n, CFG.num_q_heads, CFG.head_size), "k": (n, CFG.num_kv_heads, CFG.head_size),
              "v": (n, CFG.num_kv_heads, CFG.head_size)}
    return {name: torch.randn(s, generator=g).to(device) for name, s in shapes.items()}


def eager(backend: ToyDecode, batch: ForwardBatch, x: dict[str, torch.Tensor]) -> torch.Tensor:
    backend.init_forward_metadata(batch)
    return backend.forward(x["q"], x["k"], x["v"], 0, batch)


class Meta:
    """A metadata owner with no state (the protocol, not a backend class)."""

    def __init__(self, fill: int) -> None:
        self.fill, self.states, self.seen = fill, [], {}  # type: ignore[var-annotated]

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.states.append((max_bs, max_num_tokens))

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        self.seen[batch.phase] = batch

    def graph_seq_len_fill_value(self, spec: SpecConfig | None = None) -> int:
        return self.fill


def mixing_forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per token: ``h`` mixed with every batch field (so wrong padding or copies show)."""
    t = batch.tokens_per_row or 1
    row = (batch.seq_lens * 1000 + batch.req_pool_indices * 10).float()  # [rows]
    spec = batch.spec or SpecInfo()
    if batch.extend_lens is not None:
        row = row + batch.extend_lens
    if spec.custom_mask is not None:
        row = row + spec.custom_mask.flatten(1).sum(1) * 7
    if spec.draft_path is not None:
        row = row + spec.draft_path.sum(1) * 3
    per_token = (row + x["r"])[:, None].expand(-1, t).reshape(-1)  # expand: no host sync on any device
    return x["h"] * (per_token + batch.out_cache_loc)[:, None]


def item_forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> torch.Tensor:
    return x["h"] * int(batch.seq_lens.max())  # host sync: cannot be captured


SPEC = SpecConfig.eagle(num_steps=3, topk=2, num_draft_tokens=5)


ALL_GRAPHS = BackendCapabilities(name="all", vendors=frozenset(Vendor), phases=frozenset(Phase),
                                 graph={p: SpecLimits() for p in GRAPH_PHASES}, multi_step=SpecLimits(),
                                 features=frozenset({Feature.CUSTOM_MASK}))


def spec_steps(meta: Meta, failing: Phase | None = None) -> dict[Phase, PhaseStep]:
    inputs: dict[str, Any] = {"h": ("token", (3,), torch.float32), "r": ("row", (), torch.float32)}
    return {p: PhaseStep(meta, item_forward if p is failing else mixing_forward, inputs,
                         rows_per_request=SPEC.topk if p is Phase.DRAFT_DECODE else 1)
            for p in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND, Phase.TARGET_VERIFY)}


def spec_batch(phase: Phase, requests: int, seed: int,
               device: str = "cpu") -> tuple[ForwardBatch, dict[str, torch.Tensor]]:
    """A batch of a spec phase with random fields (not a valid KV layout: for :func:`mixing_forward`)."""
    g = torch.Generator().manual_seed(seed)

    def ints(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=g)

    rows = requests * (SPEC.topk if phase is Phase.DRAFT_DECODE else 1)
    t = {Phase.TARGET_VERIFY: SPEC.num_draft_tokens, Phase.DRAFT_EXTEND: SPEC.draft_extend_len}.get(phase, 1)
    info = SpecInfo(topk=SPEC.topk, num_draft_tokens=SPEC.num_draft_tokens, draft_extend_len=SPEC.draft_extend_len,
                    custom_mask=ints(0, 2, rows, t, t).bool() if phase is Phase.TARGET_VERIFY else None,
                    draft_path=ints(1, 99, rows, SPEC.num_steps) if phase is Phase.DRAFT_DECODE else None)
    batch = ForwardBatch(phase, ints(1, 16, rows), ints(8, 30, rows).int(), ints(1, 99, rows * t), spec=info,
                         extend_lens=ints(1, t + 1, rows).int() if phase is Phase.DRAFT_EXTEND else None)
    x = {"h": torch.randn(rows * t, 3, generator=g), "r": torch.randn(rows, generator=g)}
    return batch_to(batch, device), {name: v.to(device) for name, v in x.items()}


TORCH_SPEC = SpecConfig.eagle(num_steps=3, topk=2, num_draft_tokens=4)


TORCH_SIZES = (1, 2, 4)


def torch_steps(pool: KVPool, spec: SpecConfig) -> tuple[BackendCapabilities, dict[Phase, PhaseStep]]:
    """Attention-only steps: decode / target_verify / draft_extend on TorchBackend,
    draft_decode as all forwards of a MultiStepDraft in one graph."""
    from attnhal_torch import TorchBackend as tb

    h, kvh, d, f32 = CFG.num_q_heads, CFG.num_kv_heads, CFG.head_size, torch.float32
    per_token = {"q": ("token", (h, d), f32), "k": ("token", (kvh, d), f32), "v": ("token", (kvh, d), f32)}
    target = tb(CFG, pool)  # one instance for all target phases: init_graph_state is called once

    def attend(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = target.forward(x["q"], x["k"], x["v"], 0, batch)
        return out

    steps = {p: PhaseStep(target, attend, per_token)
             for p in (Phase.DECODE, Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND)}
    if spec.speculative and spec.num_steps > 1:
        draft = MultiStepDraft(tb, CFG, pool, spec)

        def draft_forwards(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            return tuple(draft.backend(s).forward(x["q"][:, s], x["k"][:, s], x["v"][:, s], 0, b)
                         for s, b in enumerate(draft.step_batches(batch)))

        per_row = {name: ("row", (draft.num_forwards, *shape), dt) for name, (_, shape, dt) in per_token.items()}
        steps[Phase.DRAFT_DECODE] = PhaseStep(draft, draft_forwards, per_row, rows_per_request=spec.topk)
    return tb.capabilities, steps


def phase_inputs(step: PhaseStep, batch: ForwardBatch, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, s in step.input_specs.items():
        lead = batch.batch_size if s.per == "row" else batch.num_tokens
        out[name] = torch.randn((lead, *s.shape), generator=g, dtype=s.dtype).to(device)
    return out


def as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def check_torch_backend(platform: Platform, device: str, requests: tuple[int, ...]) -> None:
    """For each phase: replays (padded to a capture size) == eager, within the backend's
    fp32 tolerance, with no replay allocation and no capture failure."""
    pool = make_pool(CFG, max_reqs=16, max_context_len=40, device=device)
    for spec, phases in ((SpecConfig(), (Phase.DECODE,)),
                         (TORCH_SPEC, (Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE))):
        caps, all_steps = torch_steps(pool, spec)
        steps = {p: all_steps[p] for p in phases}
        p = plan(spec, platform, PhaseBackends.same(caps, spec), GraphPolicy(batch_sizes=TORCH_SIZES))
        with warnings.catch_warnings():
            warnings.simplefilter("error", GraphCaptureWarning)
            runner = GraphRunner(p, platform, steps)
        tol = caps.tolerance("float32")
        for phase in phases:
            assert runner.captured_sizes(phase) == TORCH_SIZES, runner.plan[phase]
            for n in requests:
                batch = phase_batch(pool, phase, spec, n, seed=n)
                x = phase_inputs(steps[phase], batch, seed=n, device=device)
                replayed = [t.clone() for t in as_tuple(runner.run(phase, batch, x))]
                steps[phase].metadata.init_forward_metadata(batch)
                for got, want in zip(replayed, as_tuple(steps[phase].forward(batch, x)), strict=True):
                    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)
                release(pool, batch)
            stats = runner.summary()[phase]
            assert (stats.replays, stats.eager_runs, stats.replay_allocations) == (len(requests), 0, 0), stats

