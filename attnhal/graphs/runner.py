"""GraphRunner: capture what a :class:`~attnhal.planner.GraphPlan` says, pad, replay, fall back.

For each phase the plan captures, the runner allocates static buffers sized for
that phase's largest capture batch size, captures one graph per size of the
phase's own ``PhasePlan.capture_sizes`` and, at
:meth:`GraphRunner.run`, copies a batch into the static buffers, pads it up to
the next captured size of that phase (padded rows get the phase's
``PhasePlan.seq_len_fill``) and replays. All graphs of a runner share one memory
pool: the phase with the largest footprint is captured first, each phase's
sizes largest first. Batches above the largest size, and phases that are not
captured, run eagerly. A capture that fails turns that phase, and only that
phase, eager — unless the driver failed it (:class:`CaptureAbort`): then the
phases not yet captured run eagerly too, with that reason.

The platform decides how graphs are made (:func:`~attnhal.graphs.new_graph`): its
``graph_kind`` (device graphs or the CPU emulator) and, for device graphs, the
implementation its vendor row names; nothing here looks at the vendor or at the
backend's class.
"""

from __future__ import annotations

import bisect
import functools
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnhal.backend.batch import ForwardBatch
from attnhal.phases import Phase
from attnhal.errors import InvalidValue
from attnhal.planner import GraphPlan
from attnhal.platform import GraphKind, Platform
from attnhal.platform.detection import torch_version

from .base import CaptureAbort, Graph
from .buffers import StaticBuffers, tokens_per_row, unpad
from .session import CAPTURE_ERROR_MODES, capture_session, new_graph
from .step import Inputs, MetadataOwner, PhaseStep, StepInput, StepOutputs

# The step records and the two helpers stay importable from here, where they used to live.
__all__ = ["GraphCaptureWarning", "GraphRunner", "MetadataOwner", "PhaseStats",
           "PhaseStep", "StepInput", "StepOutputs", "tokens_per_row", "torch_version"]

logger = logging.getLogger(__name__)


class GraphCaptureWarning(RuntimeWarning):
    """A phase's capture failed; the phase runs eagerly (see ``GraphRunner.plan``)."""


@dataclass
class PhaseStats:
    """Counters of one phase; ``failure`` is the capture error, if any."""

    captured_sizes: tuple[int, ...] = ()
    failure: str | None = None
    replays: int = 0
    eager_runs: int = 0
    replay_allocations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"captured_sizes": list(self.captured_sizes), "failure": self.failure,
                "replays": self.replays, "eager_runs": self.eager_runs,
                "replay_allocations": self.replay_allocations}


_TIE_ORDER = (Phase.TARGET_VERIFY, Phase.DECODE, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE, Phase.PREFILL)


@dataclass
class _Captured:
    graph: Graph
    batch: ForwardBatch
    inputs: dict[str, torch.Tensor]
    outputs: StepOutputs


def _checked(outputs: object) -> StepOutputs:
    if isinstance(outputs, torch.Tensor) or (
            isinstance(outputs, tuple) and all(isinstance(t, torch.Tensor) for t in outputs)):
        return outputs
    raise TypeError(f"step output={type(outputs).__name__} (supported: a tensor or a tuple of tensors)")


class GraphRunner:
    """Captures the phases a plan captures and runs batches through graphs or eagerly.

    Parameters
    ----------
    plan: the one source of what is captured: each phase with ``capture=True`` that has
        a step is captured at exactly ``plan[phase].capture_sizes`` (batch sizes in
        requests), its padded rows filled with ``plan[phase].seq_len_fill``.
    platform: where tensors live (``torch_device``), how graphs are captured
        (``graph_kind``, and ``graph_device``: the device calls) and the oldest torch whose
        device graphs report capture errors (``graph_min_torch``).
    steps: per phase, what to run (see :class:`PhaseStep`). Only these phases can be run.
    capture_error_mode: device graphs' capture error mode (see
        :data:`~attnhal.graphs.CAPTURE_ERROR_MODES`); "thread_local" where another
        thread (an NCCL/RCCL watchdog) runs during capture.

    Construction captures. It never raises for a failing capture: the phase
    falls back to eager, :attr:`plan` records ``capture_failed`` with the error,
    and a :class:`GraphCaptureWarning` is issued once for that phase.
    """

    def __init__(self, plan: GraphPlan, platform: Platform,
                 steps: Mapping[Phase, PhaseStep] | Mapping[str, PhaseStep],
                 capture_error_mode: str = "global") -> None:
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise ValueError(f"capture_error_mode={capture_error_mode!r} "
                             f"(supported: {', '.join(CAPTURE_ERROR_MODES)})")
        if plan.layout.graph_groups:  # never one graph per phase where the plan says one graph for several
            raise InvalidValue("layout.graph_groups", ", ".join(plan.graph_groups),
                               "none: GraphRunner captures one graph per phase; an engine capturing a group "
                               "as one graph runs it with its own runner")
        self._plan = plan
        self.platform = platform
        self._capture_error_mode = capture_error_mode
        self._steps = {Phase(p): s for p, s in steps.items()}
        self._stats = {p: PhaseStats() for p in self._steps}
        self._buffers: dict[Phase, StaticBuffers] = {}
        self._graphs: dict[Phase, dict[int, _Captured]] = {}
        self._pool: object | None = None
        self._capture_all()

    @property
    def plan(self) -> GraphPlan:
        """The plan as run: phases whose capture failed have ``capture=False`` and a reason."""
        return self._plan

    def captured_sizes(self, phase: Phase | str) -> tuple[int, ...]:
        """Capture sizes (requests) with a graph for ``phase``; empty when it runs eagerly."""
        return tuple(sorted(self._graphs.get(Phase(phase), {})))

    def summary(self) -> dict[Phase, PhaseStats]:
        """Per phase: captured sizes, capture failure, replays, eager runs, replay allocations."""
        return {p: replace(s) for p, s in self._stats.items()}

    # --- capture --------------------------------------------------------------------
    def _capture_all(self) -> None:
        # The plan is the one source of what to capture: each phase's own sizes, largest first.
        sizes = {p: self._sizes(p) for p in self._steps if self._plan[p].capture}
        sizes = {p: s for p, s in sizes.items() if s}
        if not sizes:
            return
        refusal = self._refusal()
        if refusal is not None:
            for phase in sizes:
                self._fail(phase, refusal, stacklevel=4)
            return
        phases = self._init_graph_states(sizes)
        phases.sort(key=lambda p: self._footprint(p, sizes[p][0]), reverse=True)
        bar = self._progress(sum(len(sizes[p]) for p in phases))
        try:
            with capture_session(self.platform) as pool:
                self._pool = pool
                self._capture_phases({p: sizes[p] for p in phases}, bar)
        except Exception as exc:  # noqa: BLE001 - the device cannot capture at all: every phase runs eagerly
            for phase in phases:
                if phase not in self._graphs and self._stats[phase].failure is None:
                    self._fail(phase, exc, stacklevel=4)
        finally:
            if bar is not None:
                bar.close()

    def _capture_phases(self, sizes: dict[Phase, tuple[int, ...]], bar: Any) -> None:
        """Capture each phase of ``sizes`` (in its order) at its sizes (largest first)."""
        phases = list(sizes)
        for i, phase in enumerate(phases):
            try:
                self._graphs[phase] = self._capture_phase(phase, sizes[phase], bar)
            except CaptureAbort as exc:  # the driver's capture state is gone: capture nothing more
                self._fail(phase, exc, stacklevel=5)
                for later in phases[i + 1:]:
                    self._fail(later, RuntimeError(f"not captured after phase={phase.value} failed in "
                                                   f"the driver: {exc}"), stacklevel=5)
                return
            except Exception as exc:  # noqa: BLE001 - any capture error means "run this phase eagerly"
                self._fail(phase, exc, stacklevel=5)
                continue
            self._stats[phase].captured_sizes = self.captured_sizes(phase)
            logger.info("captured phase=%s at batch sizes %s (%s graphs)", phase.value,
                        self._stats[phase].captured_sizes, self.platform.graph_kind.value)

    def _sizes(self, phase: Phase) -> tuple[int, ...]:
        """``phase``'s capture sizes, largest first: the plan's; a hand-built :class:`PhasePlan`
        that names none gets what the planner would give, the policy's sizes for the phase."""
        sizes = self._plan[phase].capture_sizes or self._plan.policy.capture_sizes_for(phase, self._plan.spec)
        return tuple(sorted(sizes, reverse=True))

    def _fill(self, phase: Phase) -> int:
        """The seq len of ``phase``'s padded rows: the plan's (the descriptor resolved for this
        plan, per phase); a hand-built :class:`PhasePlan` without one asks the metadata owner."""
        fill = self._plan[phase].seq_len_fill
        return fill if fill is not None else self._steps[phase].metadata.graph_seq_len_fill_value(self._plan.spec)

    def _refusal(self) -> RuntimeError | None:
        """Why device graphs must not be captured with this torch, or None."""
        minimum = self.platform.graph_min_torch
        if self.platform.graph_kind is not GraphKind.DEVICE or minimum is None:
            return None
        have = torch_version(torch.__version__)
        if have >= minimum:
            return None
        return RuntimeError(f"torch={torch.__version__} (supported: >= {minimum[0]}.{minimum[1]} for device "
                            f"graphs on {self.platform.vendor.value}: older torch lets a host sync during "
                            "capture pass silently and replay the capture-time value)")

    def _footprint(self, phase: Phase, max_size: int) -> tuple[int, int]:
        """Query tokens of ``phase`` at the largest size (what its graphs hold in the shared pool);
        on a tie the target model's phases first (a target forward outweighs a draft forward)."""
        tokens = max_size * self._steps[phase].rows_per_request * tokens_per_row(phase, self._plan.spec)
        return tokens, -_TIE_ORDER.index(phase)

    def _init_graph_states(self, sizes: Mapping[Phase, tuple[int, ...]]) -> list[Phase]:
        """Call ``init_graph_state`` once per metadata owner, sized for every phase it serves at
        that phase's largest capture size (a second call would re-allocate buffers an earlier
        phase's graphs already hold)."""
        groups: dict[int, list[Phase]] = {}
        for phase in sizes:
            groups.setdefault(id(self._steps[phase].metadata), []).append(phase)
        ok = []
        for group in groups.values():
            rows = [sizes[p][0] * self._steps[p].rows_per_request for p in group]
            try:
                tokens = [r * tokens_per_row(p, self._plan.spec) for r, p in zip(rows, group)]
                self._steps[group[0]].metadata.init_graph_state(max(rows), max(tokens))
            except Exception as exc:  # noqa: BLE001 - as a capture error: these phases run eagerly
                for phase in group:
                    self._fail(phase, exc, stacklevel=5)
                continue
            ok += group
        return ok

    def _capture_phase(self, phase: Phase, sizes: tuple[int, ...], bar: Any) -> dict[int, _Captured]:
        step = self._steps[phase]
        buffers = StaticBuffers(phase, self._plan.spec, step, sizes[0] * step.rows_per_request, self._fill(phase),
                                 torch.device(self.platform.torch_device))
        self._buffers[phase] = buffers
        graphs: dict[int, _Captured] = {}
        for size in sizes:  # largest first: later graphs fit in the memory the first one took
            batch, inputs = buffers.view(size)
            step.metadata.init_capture_metadata(batch)
            run = functools.partial(step.forward, batch, inputs)
            graph = new_graph(self.platform, pool=self._pool, device=self.platform.torch_device,
                              warmup_iters=0, capture_error_mode=self._capture_error_mode)
            graph.warm_up(run)  # once per size: kernels specialized on this size compile outside the graph
            graphs[size] = _Captured(graph, batch, inputs, _checked(graph.capture(run)))
            self._pool = self._pool if self._pool is not None else graph.pool
            if bar is not None:
                bar.update(1)
        return graphs

    def _fail(self, phase: Phase, exc: BaseException, stacklevel: int) -> None:
        why = f"{type(exc).__name__}: {exc}"
        self._plan = self._plan.with_capture_failure(phase, why)
        self._stats[phase].failure = why
        self._graphs.pop(phase, None)
        self._buffers.pop(phase, None)
        warnings.warn(f"graph capture of phase={phase.value} failed, it runs eagerly: {why}",
                      GraphCaptureWarning, stacklevel=stacklevel)

    def _progress(self, total: int) -> Any:
        # Only real captures take long enough to want a bar; tqdm is optional.
        if self.platform.graph_kind is not GraphKind.DEVICE:
            return None
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        return tqdm(total=total, desc="capturing graphs", unit="graph")

    # --- run ----------------------------------------------------------------------
    def run(self, phase: Phase | str, batch: ForwardBatch, inputs: Inputs) -> StepOutputs:
        """Run ``batch`` of ``phase``: replay the smallest captured size that fits, else eagerly.

        ``inputs`` follow the step's :class:`~attnhal.graphs.StepInput` s, e.g. ``q``: ``[num_tokens,
        num_q_heads, head_size]``. Replayed outputs are **views of the graph's static
        outputs**, cut to the real ``rows``/``num_tokens``; they stay valid until the next
        ``run`` of *any* phase, since all graphs share one memory pool (clone to keep
        them). Eager outputs are fresh tensors.
        Both run under ``torch.no_grad()``.
        """
        phase = Phase(phase)
        if phase not in self._steps:
            raise KeyError(f"phase={phase.value} (supported: {sorted(p.value for p in self._steps)})")
        if batch.phase is not phase:
            raise ValueError(f"batch.phase={batch.phase.value} (supported: {phase.value})")
        size = self._replay_size(phase, batch)
        if size is None:
            return self._eager(phase, batch, inputs)
        return self._replay(phase, size, batch, inputs)

    def _replay_size(self, phase: Phase, batch: ForwardBatch) -> int | None:
        graphs = self._graphs.get(phase)
        if not graphs or not self._buffers[phase].replayable(batch):
            return None
        sizes = sorted(graphs)
        i = bisect.bisect_left(sizes, batch.batch_size // self._buffers[phase].rows_per_request)
        return sizes[i] if i < len(sizes) else None

    def _eager(self, phase: Phase, batch: ForwardBatch, inputs: Inputs) -> StepOutputs:
        step = self._steps[phase]
        self._stats[phase].eager_runs += 1
        with torch.no_grad():
            step.metadata.init_forward_metadata(batch)
            return step.forward(batch, dict(inputs))

    def _replay(self, phase: Phase, size: int, batch: ForwardBatch, inputs: Inputs) -> StepOutputs:
        buffers, captured = self._buffers[phase], self._graphs[phase][size]
        buffers.load(batch, inputs, size)
        self._steps[phase].metadata.init_replay_metadata(captured.batch)
        captured.graph.replay()
        stats = self._stats[phase]
        stats.replays += 1
        stats.replay_allocations += captured.graph.replay_allocations
        rows, padded = batch.batch_size, size * buffers.rows_per_request
        # Row-major outputs: padded rows (or their tokens) are dropped by cutting the lead dim.
        return unpad(captured.outputs, {padded * buffers.tpr: rows * buffers.tpr, padded: rows})
