"""Reasons: why something is not supported, as a stable code and a factual message.

Every "no" attnhal gives is a :class:`Reason`: a :class:`ReasonCode` that tools may
act on and a message written as ``field=value (supported: ...)`` (:func:`reason`).
This module is the lowest layer after :mod:`attnhal.platform` and :mod:`attnhal.spec`:
phases, descriptors, the planner, the registry and the backend contract all speak it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

__all__ = ["Reason", "ReasonCode", "fmt_set", "reason"]


class ReasonCode(str, Enum):
    """Stable codes for every "no" attnhal gives; tools may act on them."""

    VENDOR = "vendor"
    ARCH = "arch"
    PHASE = "phase"
    MODEL = "model"
    DTYPE = "dtype"
    KV_DTYPE = "kv_dtype"
    HEAD_SIZE = "head_size"
    PAGE_SIZE = "page_size"
    HEAD_RATIO = "head_ratio"
    FEATURE = "feature"
    MODULE_MISSING = "module_missing"
    LOAD_ERROR = "load_error"
    RUNTIME = "runtime"
    NO_BACKEND = "no_backend"
    MULTI_STEP = "multi_step"
    SPEC_LIMIT = "spec_limit"  # a run limit: the phase cannot run with these spec settings
    STEP_COUNT = "step_count"  # an adaptive step count the spec config cannot take
    PHASE_NOT_RUN = "phase_not_run"
    GRAPH_UNSUPPORTED = "graph_unsupported"
    GRAPH_LIMIT = "graph_limit"
    GRAPHS_DISABLED = "graphs_disabled"
    NO_GRAPH_API = "no_graph_api"
    #: the device has a graph API, but the implementation its vendor row names cannot capture here
    GRAPH_DEVICE_UNAVAILABLE = "graph_device_unavailable"
    CAPTURE_FAILED = "capture_failed"
    #: the phase shares one graph with others (a ``GraphGroup``), and one of them is not captured
    GRAPH_GROUP = "graph_group"
    NOT_SELECTED = "not_selected"


@dataclass(frozen=True)
class Reason:
    """One reason something is not supported: a stable code and a factual message."""

    code: ReasonCode
    message: str

    def __str__(self) -> str:
        return f"[{self.code.value}] {self.message}"

    def to_dict(self) -> dict[str, str]:
        """``{"code": ..., "message": ...}``, as plans and the CLI's JSON output write it."""
        return {"code": self.code.value, "message": self.message}


def fmt_set(values: Iterable[object]) -> str:
    """``{a, b}`` with numbers in numeric order; ``none`` for an empty set."""
    items = sorted((getattr(v, "value", v) for v in values), key=lambda x: (isinstance(x, str), x))
    return "{" + ", ".join(str(i) for i in items) + "}" if items else "none"


def reason(code: ReasonCode, name: str, value: object, supported: str) -> Reason:
    """``name=value (supported: ...)`` — the one message format of attnhal."""
    shown = getattr(value, "value", value)
    return Reason(code, f"{name}={shown} (supported: {supported})")
