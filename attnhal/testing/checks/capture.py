"""Capturing a claim's phase with :class:`~attnhal.graphs.GraphRunner`, its replay
metadata watched for host syncs and allocations."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch, KVPool, MultiStepDraft
from attnhal.graphs import CaptureError, EmulatedGraph, GraphCaptureWarning, GraphRunner, PhaseStep
from attnhal.graphs.emulator import OpKind
from attnhal.phases import Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhasePlan
from attnhal.spec import SpecConfig
from attnhal.testing.cases import CaseRecipe, PoolSize, attention_config, make_pool, pool_size
from attnhal.testing.checks.claims import Claim, ClaimFalsified
from attnhal.testing.checks.common import blame
from attnhal.testing.checks.limits import multi_step_graph
from attnhal.testing.checks.target import Target


class _Watched:
    """A graph step's metadata owner whose ``init_replay_metadata`` is checked: recorded by
    the capture emulator, any host sync or allocation there falsifies ``claim``."""

    def __init__(self, owner: Any, claim: Claim, check: bool) -> None:
        self.owner, self.claim, self.check = owner, claim, check

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.owner.init_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.owner.init_forward_metadata(batch)

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        self.owner.init_capture_metadata(batch)

    def graph_seq_len_fill_value(self, spec: SpecConfig | None = None) -> int:
        return int(self.owner.graph_seq_len_fill_value(spec))

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        if not self.check:  # a backend needing host seq lens reads a host tensor here, legitimately
            self.owner.init_replay_metadata(batch)
            return
        recorder = EmulatedGraph()
        try:
            recorder.capture(lambda: self.owner.init_replay_metadata(batch))
        except CaptureError as exc:
            raise ClaimFalsified(self.claim, f"init_replay_metadata syncs with the host: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            raise ClaimFalsified(self.claim, f"init_replay_metadata raised {type(exc).__name__}: {exc}") from exc
        fresh = sorted({op.name for op in recorder.recorded_ops
                        if op.kind is OpKind.ALLOC or (op.kind is OpKind.FUNCTIONAL and op.fresh)})
        if fresh:
            raise ClaimFalsified(self.claim, f"init_replay_metadata allocates ({', '.join(fresh[:4])}); it may only "
                                             "write into buffers made by init_graph_state")


@dataclass
class CapturedGraph:
    """One captured phase: the runner, its step's backends, and the last captured output."""

    runner: GraphRunner
    pool: KVPool
    layer: int
    fill: int
    outputs: dict[str, Any] = field(default_factory=dict)


def _pool_for(recipes: Sequence[CaseRecipe], device: str) -> KVPool:
    size = functools.reduce(PoolSize.union, (pool_size(r) for r in recipes))
    return make_pool(recipes[0], size, device)


def _inputs(config: AttentionConfig, steps: int, multi: bool) -> dict[str, tuple[str, tuple[int, ...], torch.dtype]]:
    h, kv, d, dt = config.num_q_heads, config.num_kv_heads, config.head_size, config.dtype
    dv = config.out_head_size
    out: dict[str, tuple[str, tuple[int, ...], torch.dtype]] = {}
    for s in range(steps):
        out |= {f"q{s}": ("token", (h, d), dt), f"k{s}": ("token", (kv, d), dt), f"v{s}": ("token", (kv, dv), dt)}
        if multi and s:
            out[f"parent{s}"] = ("row", (), torch.int64)
    return out


#: The named inputs of a captured step (``q0``, ``k0``, ``v0``, ``parent1``...): ``(kind, shape, dtype)``.
step_inputs = _inputs


def _owner(target: Target, claim: Claim, config: AttentionConfig, pool: KVPool, spec: SpecConfig,
           multi: bool) -> tuple[Any, list[AttentionBackend]]:
    """The metadata owner of a graph step (a backend, or a MultiStepDraft) and its step backends."""
    with blame(claim, "constructing the backend"):
        if multi:
            draft = MultiStepDraft(target.backend_cls, config, pool, spec, **target.build_options)
            return draft, [draft.backend(s) for s in range(draft.num_forwards)]
        backend = target.new_backend(config, pool)
        return backend, [backend]


def _step_forward(owner: Any, steps: list[AttentionBackend], layer: int, multi: bool, scratch: torch.Tensor,
                  outputs: dict[str, Any]) -> Callable[[ForwardBatch, dict[str, torch.Tensor]], Any]:
    """What the graph records: the attention of every step, re-parenting the draft tree in
    between with ``out=`` ops (no allocation), keeping each size's static outputs."""
    def forward(batch: ForwardBatch, x: dict[str, torch.Tensor]) -> Any:
        batches = owner.step_batches(batch) if multi else [batch]
        outs = []
        for s, (backend, step_batch) in enumerate(zip(steps, batches)):
            if s:
                path, rows = step_batch._spec().draft_path, batch.batch_size
                torch.index_select(path, 0, x[f"parent{s}"], out=scratch[:rows])
                path[:, :s].copy_(scratch[:rows, :s])
            outs.append(backend.forward(x[f"q{s}"], x[f"k{s}"], x[f"v{s}"], layer, step_batch))
        outputs[str(batch.batch_size)] = outs  # the last call of a size is its capture: static outputs
        return tuple(outs) if multi else outs[0]

    return forward


def capture(target: Target, claim: Claim, recipes: Sequence[CaseRecipe], sizes: tuple[int, ...]) -> CapturedGraph:
    """Capture ``claim``'s phase at ``sizes`` over a pool that holds every case of ``recipes``."""
    first, phase = recipes[0], recipes[0].phase
    pool = _pool_for(recipes, target.device)
    config, spec = attention_config(first), first.spec or SpecConfig()
    multi = multi_step_graph(target, claim)
    owner, steps = _owner(target, claim, config, pool, spec, multi)
    outputs: dict[str, Any] = {}
    scratch = torch.zeros((max(sizes) * spec.topk, spec.num_steps), dtype=torch.int64, device=target.device)
    step = PhaseStep(metadata=_Watched(owner, claim, check=not target.caps.needs_host_seq_lens),
                     forward=_step_forward(owner, steps, first.layer, multi, scratch, outputs),
                     inputs=_inputs(config, len(steps), multi),
                     rows_per_request=spec.topk if phase is Phase.DRAFT_DECODE else 1)
    plan = GraphPlan(platform=target.platform.name, spec=spec, policy=GraphPolicy(batch_sizes=sizes),
                     phases={phase: PhasePlan(runs=True, capture=True, backend=target.caps.name)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphCaptureWarning)  # the failure is read from the runner
        runner = GraphRunner(plan, target.platform, {phase: step})
    failure = runner.summary()[phase].failure
    if failure is not None:
        raise ClaimFalsified(claim, f"capture failed ({target.platform.graph_kind.value} graph): {failure}")
    return CapturedGraph(runner, pool, first.layer, step.metadata.graph_seq_len_fill_value(spec), outputs)


