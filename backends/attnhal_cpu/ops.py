"""The native op ``torch.ops.attnhal_cpu_<isa>.attend`` and its fake (meta) implementation.

One op per launch, declared with ``Tensor(a!)`` outputs: graph capture (real or the
CPU emulator), ``torch.compile`` and the dispatcher see one op that writes into the
tensors it was given and returns nothing, so a captured graph re-runs the kernel on
the same buffers and everything that changes between replays is read from tensors.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from attnhal.errors import AttnhalError
from attnhal_cpu.build import native_build
from attnhal_cpu.params import HostParams, width_of

__all__ = ["Kernel", "NativeUnavailable", "attend_op", "host_kernel"]


class NativeUnavailable(AttnhalError, RuntimeError):
    """The C++ kernel could not be built or loaded here (the message says why)."""


_LOCK = threading.Lock()
_FAKES: set[str] = set()


def attend_op(namespace: str | None = None) -> Any:
    """``torch.ops.<namespace>.attend`` of a loaded build (default: this host's, built on first use).

    Schema: ``attend(out!, mid_o!, mid_lse!, q, k_cache, v_cache, req_to_page,
    req_pool_indices, seq_lens, ext_lens?, mask?, extra_slots?, num_extra,
    tokens_per_row, page_size, sm_scale, num_splits, prefetch=16, max_vectors=64,
    prefetch_burst=False, tile_vectors=1)``; see ``csrc/attention.cpp`` and
    :class:`~attnhal_cpu.params.KernelParams` (``op_args``) for the last four.
    """
    build = native_build()
    if not build.ok:
        raise NativeUnavailable(f"attnhal_cpu kernel unavailable: {build.error}")
    namespace = namespace or build.name
    with _LOCK:
        if namespace not in _FAKES:
            torch.library.register_fake(f"{namespace}::attend")(_attend_fake)
            _FAKES.add(namespace)
    return getattr(torch.ops, namespace).attend


@dataclass(frozen=True)
class Kernel:
    """One build's ``attend`` op and the parameters to launch it with, per cache width (``origin``:
    measured or defaulted, and when or why; :class:`~attnhal_cpu.tuning.Tuning`)."""

    op: Any
    params: HostParams
    name: str
    origin: str = ""


def host_kernel(itemsize: int = 4) -> Kernel:
    """The build that runs caches of ``itemsize``-byte elements on this host (the host's own, or a
    narrower one that raced faster here: :func:`~attnhal_cpu.build.native_build`), with its parameters."""
    build = native_build()
    namespace, tuning = build.runs(width_of(itemsize))  # attend_op raises when the build failed
    origin = f"{tuning.source}: {tuning.detail}" if tuning else ""
    return Kernel(attend_op(namespace), tuning.params if tuning else build.params, namespace, origin)


def _attend_fake(out: torch.Tensor, mid_o: torch.Tensor, mid_lse: torch.Tensor, *args: Any) -> None:
    # Writes only into its given tensors: nothing to allocate, nothing to return.
    return None
