"""The graph policy: whether, for which phases, at which batch sizes and step counts to capture.

An engine's graph settings as one validated record, with the bounds that keep a
typo from sizing static buffers (:data:`BATCH_SIZE`, :data:`MAX_CAPTURE_SIZES`,
:data:`MAX_STEP_COUNTS`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from attnhal.bounds import Bound
from attnhal.errors import InvalidValue
from attnhal.phases import Phase, tokens_per_request
from attnhal.spec import NUM_STEPS, SpecConfig, check_bound

__all__ = ["BATCH_SIZE", "CAPTURE_TOKENS", "MAX_CAPTURE_SIZES", "MAX_STEP_COUNTS", "GraphPolicy"]

#: Bounds of the graph policy: capture sizes size static buffers.
BATCH_SIZE = Bound("max_batch_size", 1, 4096)
CAPTURE_TOKENS = Bound("max_tokens", 1, 4096 * 1024)
MAX_CAPTURE_SIZES = 256
MAX_STEP_COUNTS = 16


@dataclass(frozen=True)
class GraphPolicy:
    """Whether, for which phases, at which batch sizes and step counts to capture graphs.

    Attributes
    ----------
    enabled: graphs at all.
    max_batch_size: largest capture batch size (1..4096).
    batch_sizes: explicit capture batch sizes (at most 256, each 1..4096), else derived from max.
    disabled_phases: phases never captured (an engine's per-phase switch), each with a reason.
    step_counts: adaptive speculation: the other ``num_steps`` values the engine may switch
        to; the plan is valid only if it is valid at each (at most 16, each 1..64).
    max_tokens: capture sizes from the spec width: a phase captures only batch sizes ``b``
        with ``b * tokens_per_request(phase) <= max_tokens`` (None: every size).
    """

    #: Field -> the bound of it (of each of its values, for the lists).
    BOUNDS: ClassVar[Mapping[str, Bound]] = MappingProxyType({
        "max_batch_size": BATCH_SIZE, "batch_sizes": BATCH_SIZE, "step_counts": NUM_STEPS,
        "max_tokens": CAPTURE_TOKENS})

    enabled: bool = True
    max_batch_size: int = 32
    batch_sizes: tuple[int, ...] | None = None
    disabled_phases: frozenset[Phase] = frozenset()
    step_counts: tuple[int, ...] | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"enabled={self.enabled!r} (supported: True or False)")
        check_bound(BATCH_SIZE, self.max_batch_size)
        if self.batch_sizes is not None:
            object.__setattr__(self, "batch_sizes", _int_tuple("batch_sizes", self.batch_sizes, BATCH_SIZE,
                                                               MAX_CAPTURE_SIZES))
        object.__setattr__(self, "disabled_phases", frozenset(_phase(p) for p in self.disabled_phases))
        if self.step_counts is not None:
            object.__setattr__(self, "step_counts", _int_tuple("step_counts", self.step_counts, NUM_STEPS,
                                                               MAX_STEP_COUNTS))
        if self.max_tokens is not None:
            check_bound(CAPTURE_TOKENS, self.max_tokens)

    def capture_sizes(self) -> tuple[int, ...]:
        """Sorted capture batch sizes: the given list, else 1, 2, 4, 8 then steps of 8 up to max."""
        return self._sizes

    @functools.cached_property
    def _sizes(self) -> tuple[int, ...]:
        if self.batch_sizes is not None:
            return tuple(sorted(set(self.batch_sizes)))
        sizes = {b for b in (1, 2, 4) if b <= self.max_batch_size}
        sizes |= set(range(8, self.max_batch_size + 1, 8)) | {self.max_batch_size}
        return tuple(sorted(sizes))

    def capture_sizes_for(self, phase: Phase, spec: SpecConfig) -> tuple[int, ...]:
        """The capture sizes of ``phase``: :meth:`capture_sizes`, cut by ``max_tokens`` if given."""
        sizes = self.capture_sizes()
        if self.max_tokens is None:
            return sizes
        width = max(tokens_per_request(phase, spec), 1)
        return tuple(b for b in sizes if b * width <= self.max_tokens)


def _int_tuple(name: str, values: Iterable[int], bound: Bound, max_len: int) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name}={values!r} (supported: a list of ints)")
    out = tuple(values)
    if not out or len(out) > max_len:
        raise InvalidValue(name, out, f"1..{max_len} values, got {len(out)}")
    for v in out:
        check_bound(bound, v, name)
    return out


def _phase(value: object) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        raise InvalidValue("phase", value, ", ".join(p.value for p in Phase)) from None
