"""A CPU emulator of CUDA/HIP graph capture, built on ``TorchDispatchMode``.

During :meth:`EmulatedGraph.capture` every op that reaches the dispatcher is
run and recorded with its tensors by identity and its Python scalars by value.
:meth:`EmulatedGraph.replay` re-runs the recorded ops, in order, on the same
tensor objects. That gives the semantics of a real graph that matter to an
attention backend:

* a host sync during capture is an error (:class:`CaptureError`):
  ``.item()``/``int(t)``/``bool(t)``/``if t.any()`` (``aten._local_scalar_dense``),
  ops returning a Python value computed from data (``torch.equal``,
  ``allclose``), ops whose output shape depends on data (``nonzero``,
  ``masked_select``, ``unique``, ``bincount``, ``repeat_interleave`` without
  ``output_size``, boolean-mask indexing), ``.tolist()``/``.numpy()``, and ops
  tagged ``torch.Tag.cudagraph_unsafe``;
* a Python value computed on the host at capture time stays frozen at replay
  (stale metadata), because scalars are recorded by value;
* tensors allocated during capture are the graph's pool: replay writes into
  them, so the tensors ``capture`` returned are static outputs;
* a ``torch.library.custom_op`` is recorded as one op; replay calls it again,
  so its kernel re-runs on the current contents of its inputs;
* random ops are redrawn at each replay (so does a real graph, whose RNG
  offset advances per replay; neither reproduces the eager draw).

What it does NOT model:

* memory addresses: replay reuses tensor objects, not addresses, so a kernel
  that caches a raw ``data_ptr()`` is not checked; nor are pool sharing
  between graphs or the memory a real graph would reserve;
* streams, events and ordering against other streams; timing and launch cost;
* kernels launched outside the dispatcher, e.g. a raw Triton launch not
  wrapped in a custom op: it runs at capture and is silently missing from
  replay. Work inside a custom op's implementation is likewise invisible:
  host syncs and allocations there are neither caught nor counted (except
  ``.tolist()``/``.numpy()``, which are patched globally during capture);
* device-to-host copies (``.cpu()``, ``.to("cpu")``): every tensor here is
  already on the host, so they are no-ops that never reach the recorder. For
  the same reason a bool-mask store of a one-element value is accepted (on a
  GPU it is graph-safe only when the value lives on the host);
* a composite op whose CPU path syncs where its GPU path does not is
  reported as a host sync: ``one_hot(t, num_classes=n)`` checks ``t.min()``
  with ``.item()`` on CPU only;
* CPU-side Python side effects of the captured function (counters, list
  appends, prints): they happen once, at capture, as with a real graph;
* tensors created without the dispatcher (``torch.from_numpy``) are captured
  by identity but their host-side source is not tracked;
* thread safety: ``Tensor.tolist``/``Tensor.numpy`` are patched on the class,
  process-wide, for the duration of a capture.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
from torch._ops import OpOverload
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .base import CaptureError, Graph

T = TypeVar("T")
Kwargs = dict[str, Any]
# (position among an op's flattened outputs, the tensor captured there)
Fresh = tuple[tuple[int, torch.Tensor], ...]

_aten = torch.ops.aten

_HOST_READ = (
    "reads tensor data into a Python value on the host (.item(), int(t), "
    "float(t), bool(t), `if t:`), a device-to-host sync that a graph cannot "
    "contain; at replay the Python value would not be recomputed. Keep the "
    "value on the device (torch.where, masked_fill_) or compute it before capture"
)
_HOST_RESULT = (
    "returns a Python value computed from tensor data, a device-to-host sync; "
    "compare on the device instead (torch.eq, torch.isclose) and keep the result a tensor"
)
_DYNAMIC_SHAPE = (
    "its output shape depends on tensor data, so the host must wait for the "
    "device to size the result, and a graph needs static shapes; use a "
    "static-size form (nonzero_static, torch.where, masked_fill_, "
    "repeat_interleave(output_size=...))"
)
_BOOL_MASK = (
    "indexing with a boolean mask calls nonzero() to size the result, a "
    "host sync; use integer index tensors, torch.where or masked_fill_"
)
_UNSAFE_TAG = "the op's author tagged it torch.Tag.cudagraph_unsafe"
_COPY_TO_HOST = (
    "copies tensor data to host memory (a device-to-host sync), and at replay "
    "the host copy would not be refreshed; keep the data in tensors"
)

_HOST_RESULT_OPS = frozenset({_aten.equal, _aten.allclose, _aten.is_nonzero})
_INDEX_PUT_OPS = frozenset({_aten.index_put_, _aten.index_put, _aten._index_put_impl_})
# Ops that only hand out memory: at replay a real graph runs no kernel for
# them, so the emulator re-runs nothing and the captured tensor stays as is.
_UNINITIALIZED = frozenset(
    {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty,
     _aten.new_empty_strided, _aten.empty_permuted}
)
_UNSAFE = getattr(torch.Tag, "cudagraph_unsafe", None)


class OpKind(enum.Enum):
    """How a recorded op is replayed."""

    MUTATING = "mutating"  # schema writes an argument (in-place, out=): re-run as is
    VIEW = "view"  # output shares storage with an input: the captured view stays valid
    ALLOC = "alloc"  # uninitialized memory (torch.empty): nothing to run
    FUNCTIONAL = "functional"  # fresh output: re-run and copy_ into the captured tensor


@dataclass(frozen=True)
class RecordedOp:
    """One op as captured: tensors by identity, scalars by value."""

    op: OpOverload
    args: tuple[Any, ...]
    kwargs: Kwargs
    kind: OpKind
    # outputs that were freshly allocated: replay copies the re-run result into them
    fresh: Fresh

    @property
    def name(self) -> str:
        """Qualified op name, e.g. ``aten::mm`` or ``mylib::my_kernel``."""
        return str(self.op._schema.name)

    def replay(self) -> int:
        """Re-run the op; returns how many tensors it had to allocate."""
        if self.kind in (OpKind.VIEW, OpKind.ALLOC):
            return 0
        result = self.op(*self.args, **self.kwargs)
        leaves = pytree.tree_leaves(result)
        for index, static in self.fresh:
            static.copy_(leaves[index])
        return len(self.fresh)


def graph_breaking_reason(op: OpOverload, args: Sequence[Any], kwargs: Kwargs) -> str | None:
    """Why ``op`` called with these arguments cannot be in a graph, or None."""
    tags = op.tags
    if torch.Tag.data_dependent_output in tags:
        return _HOST_READ
    if op.overloadpacket in _HOST_RESULT_OPS:
        return _HOST_RESULT
    if _UNSAFE is not None and _UNSAFE in tags:
        return _UNSAFE_TAG
    if op.overloadpacket in _INDEX_PUT_OPS:
        return None if _masked_fill_fast_path(args, kwargs) else _BOOL_MASK
    if torch.Tag.dynamic_output_shape in tags:
        return _dynamic_shape_reason(op, args, kwargs)
    return None


def _is_mask(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _masked_fill_fast_path(args: Sequence[Any], kwargs: Kwargs) -> bool:
    """True when ``index_put_`` needs no nonzero(): no mask index at all, or
    ATen's rewrite to ``masked_fill_`` (one mask index, a one-element value,
    no accumulate)."""
    indices = [i for i in args[1] if i is not None]
    if not any(_is_mask(i) for i in indices):
        return True
    value: torch.Tensor = args[2]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    return len(indices) == 1 and value.numel() == 1 and not accumulate


def _dynamic_shape_reason(op: OpOverload, args: Sequence[Any], kwargs: Kwargs) -> str | None:
    # These carry the tag for their worst case only; their static forms are fine.
    if op is _aten.index.Tensor:
        return _BOOL_MASK if any(_is_mask(i) for i in args[1]) else None
    if op is _aten.repeat_interleave.Tensor:
        return None if kwargs.get("output_size") is not None else _DYNAMIC_SHAPE
    return _DYNAMIC_SHAPE


def _storage_key(t: torch.Tensor) -> int | None:
    ptr = t.untyped_storage().data_ptr()
    return ptr or None  # empty storages all sit at 0: never call them shared


def _classify(
    op: OpOverload, inputs: Sequence[Any], outputs: Sequence[Any]
) -> tuple[OpKind, Fresh]:
    """Kind of the op and its freshly allocated outputs (see :class:`OpKind`)."""
    shared = {_storage_key(t) for t in inputs if isinstance(t, torch.Tensor)} - {None}
    fresh = tuple(
        (i, t) for i, t in enumerate(outputs)
        if isinstance(t, torch.Tensor) and _storage_key(t) not in shared
    )
    if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        return OpKind.MUTATING, fresh
    if op.overloadpacket in _UNINITIALIZED:
        return OpKind.ALLOC, ()
    if not fresh and any(isinstance(t, torch.Tensor) for t in outputs):
        return OpKind.VIEW, ()
    return OpKind.FUNCTIONAL, fresh


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[RecordedOp] = []

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        reason = graph_breaking_reason(func, args, kwargs)
        if reason is not None:
            raise CaptureError(str(func), reason)
        # The mode is off while we are inside it, so a custom op's
        # implementation runs unrecorded: one launch, one recorded op.
        out = func(*args, **kwargs)
        # tree_map rebuilds containers (size lists...) so scalars are frozen
        # by value while tensors stay the same objects.
        args, kwargs = pytree.tree_map(lambda x: x, (args, kwargs))
        kind, fresh = _classify(func, pytree.tree_leaves((args, kwargs)), pytree.tree_leaves(out))
        self.ops.append(RecordedOp(func, args, kwargs, kind, fresh))
        return out


_MISSING = object()


def _refuse(name: str) -> Callable[..., Any]:
    def refuse(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        raise CaptureError(f"Tensor.{name}", _COPY_TO_HOST)

    return refuse


@contextlib.contextmanager
def _forbid_host_copies() -> Iterator[None]:
    """Make ``Tensor.tolist``/``Tensor.numpy`` raise: on CPU they read memory
    directly, bypassing the dispatcher, so the recorder would never see them."""
    names = ("tolist", "numpy")
    saved = {name: torch.Tensor.__dict__.get(name, _MISSING) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, _refuse(name))
        yield
    finally:
        for name, original in saved.items():
            if original is _MISSING:
                delattr(torch.Tensor, name)  # falls back to TensorBase's method
            else:
                setattr(torch.Tensor, name, original)


class EmulatedGraph(Graph):
    """A graph emulated on CPU by recording dispatcher ops (see module docs)."""

    def __init__(self) -> None:
        self._ops: tuple[RecordedOp, ...] | None = None
        self._replay_allocations = 0

    def capture(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` once under ``torch.no_grad()``, recording its ops.

        Raises :class:`CaptureError` on a host sync or data-dependent shape;
        the graph then stays uncaptured.
        """
        if self._ops is not None:
            raise RuntimeError("this graph is already captured; make a new one")
        recorder = _Recorder()
        with torch.no_grad(), _forbid_host_copies(), recorder:
            out = fn()
        self._ops = tuple(recorder.ops)
        return out

    def replay(self) -> None:
        """Re-run the recorded ops in order on the captured tensors."""
        if self._ops is None:
            raise RuntimeError("replay() before capture()")
        with torch.no_grad():
            self._replay_allocations = sum(op.replay() for op in self._ops)

    @property
    def replay_allocations(self) -> int:
        """Op outputs freshly allocated during the last replay (functional ops)."""
        return self._replay_allocations

    @property
    def recorded_ops(self) -> tuple[RecordedOp, ...]:
        """The ops recorded at capture, in order (empty before capture)."""
        return self._ops or ()
