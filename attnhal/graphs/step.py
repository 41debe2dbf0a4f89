"""What the graph runner captures for one phase: a :class:`PhaseStep` and its inputs.

A step pairs the owner of the phase's attention metadata (a backend or a
multi-step draft) with the forward a graph records and the shapes of the
tensors that forward reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, Union

import torch

from attnhal.backend.batch import ForwardBatch
from attnhal.spec import SpecConfig

__all__ = ["Inputs", "MetadataOwner", "PhaseStep", "StepInput", "StepOutputs"]

#: What a step's forward returns: a tensor or a tuple of tensors led by ``num_tokens`` or ``rows``.
StepOutputs = Union[torch.Tensor, tuple[torch.Tensor, ...]]
#: A step's inputs by name, as :meth:`GraphRunner.run` takes them.
Inputs = Mapping[str, torch.Tensor]


class MetadataOwner(Protocol):
    """What owns a phase's attention metadata: an ``AttentionBackend`` or a ``MultiStepDraft``."""

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None: ...

    def init_forward_metadata(self, batch: ForwardBatch) -> None: ...

    def init_capture_metadata(self, batch: ForwardBatch) -> None: ...

    def init_replay_metadata(self, batch: ForwardBatch) -> None: ...

    def graph_seq_len_fill_value(self, spec: SpecConfig | None = None) -> int: ...


class StepInput(NamedTuple):
    """One step input: ``[num_tokens or rows, *shape]`` of ``dtype``."""

    per: Literal["token", "row"]
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class PhaseStep:
    """What the runner captures for one phase.

    Attributes
    ----------
    metadata: owner of the phase's attention metadata (see :class:`MetadataOwner`).
    forward: ``forward(batch, inputs)`` -> a tensor or a tuple of tensors whose
        leading dim is ``num_tokens`` or ``rows``; this is what a graph records
        (a whole model forward of the phase, or just its attention).
    inputs: name -> ``(per, trailing shape, dtype)``; ``per`` is ``"token"``
        (``[num_tokens, *shape]``, e.g. ``q``) or ``"row"`` (``[rows, *shape]``).
    rows_per_request: ForwardBatch rows per request (``topk`` for ``draft_decode``,
        else 1); capture sizes count requests.
    """

    metadata: MetadataOwner
    forward: Callable[[ForwardBatch, dict[str, torch.Tensor]], StepOutputs]
    inputs: Mapping[str, StepInput | tuple[str, tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    rows_per_request: int = 1
    #: ``inputs`` as :class:`StepInput` s.
    input_specs: Mapping[str, StepInput] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        specs = {name: StepInput(*s) for name, s in self.inputs.items()}
        bad = [f"{n}.per={s.per!r}" for n, s in specs.items() if s.per not in ("token", "row")]
        if bad or self.rows_per_request < 1:
            raise ValueError(f"{', '.join(bad) or f'rows_per_request={self.rows_per_request}'} "
                             "(supported: per 'token' or 'row'; rows_per_request >= 1)")
        object.__setattr__(self, "input_specs", specs)
