"""What the checks run (:class:`Target`: a backend class on a platform, and how hard to look)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis.database import ExampleDatabase

from attnhal.backend import AttentionBackend, AttentionConfig, KVPool, new_backend
from attnhal.capabilities import BackendCapabilities
from attnhal.platform import Platform
from attnhal.spec import DTYPES
from attnhal.testing.checks.claims import DEFAULT_EXAMPLES
from attnhal.testing.strategies import DEFAULT_MAX_COST, DEFAULT_MAX_SEQ_LEN

_PROFILE_DATABASE: Any = object()  # sentinel: use the loaded hypothesis profile's database


@dataclass
class Target:
    """What the checks run: a backend class on a platform, and how hard to look.

    Attributes
    ----------
    backend_cls: the :class:`~attnhal.backend.AttentionBackend` subclass under test.
    platform: where tensors live (``torch_device``) and how graphs are captured
        (``graph_kind``): the real device, or a simulated platform on the CPU.
    max_examples: random hypothesis examples per check, on top of the fixed ones
        (one per claimed head size, plus edge cases); ``0`` runs the fixed ones only.
        With ``seconds``: the most random examples.
    backend_kwargs: passed to every backend built (:meth:`new_backend`).
    capture_sizes: graph capture sizes (requests).
    max_requests, max_seq_len, max_cost: bounds of drawn batches and of the fixed
        examples (see :func:`attnhal.testing.strategies.batch_cost`; keep them small for
        interpreters).
    thorough: also the costlier fixed examples (more long contexts).
    seconds: time for each check's random examples: drawn in rounds until it is spent
        (at least one round); ``None``: exactly ``max_examples``.
    derandomize, database: hypothesis settings (``database`` defaults to the profile's).
    """

    backend_cls: type[AttentionBackend]
    platform: Platform
    max_examples: int = DEFAULT_EXAMPLES
    backend_kwargs: Mapping[str, Any] = field(default_factory=dict)
    capture_sizes: tuple[int, ...] = (1, 2, 4)
    max_requests: int = 3
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    max_cost: int = DEFAULT_MAX_COST
    thorough: bool = False
    seconds: float | None = None
    derandomize: bool = False
    database: ExampleDatabase | None = _PROFILE_DATABASE

    @property
    def caps(self) -> BackendCapabilities:
        return self.backend_cls.capabilities

    @property
    def device(self) -> str:
        return self.platform.torch_device

    @property
    def build_options(self) -> dict[str, Any]:
        """What every backend (or multi-step draft) is built with: :attr:`platform` and
        ``backend_kwargs`` (a ``platform`` there wins)."""
        return {"platform": self.platform, **self.backend_kwargs}

    def new_backend(self, config: AttentionConfig, pool: KVPool) -> AttentionBackend:
        """``backend_cls`` built for :attr:`platform` (:func:`attnhal.backend.new_backend`)."""
        return new_backend(self.backend_cls, config, pool, **self.build_options)

    def hypothesis_settings(self, explicit: bool = True) -> settings:
        """Settings of one hypothesis run; ``explicit=False`` leaves out the fixed examples."""
        kwargs: dict[str, Any] = {
            "max_examples": max(1, self.max_examples), "deadline": None, "derandomize": self.derandomize,
            "suppress_health_check": list(HealthCheck), "report_multiple_bugs": False, "print_blob": False}
        # No "explain" phase: its list of code lines run by failing cases is noise in a report.
        phases = (HypothesisPhase.explicit,) if self.max_examples == 0 else tuple(
            p for p in HypothesisPhase if p.name != "explain")
        kwargs["phases"] = tuple(p for p in phases if explicit or p is not HypothesisPhase.explicit)
        if self.database is not _PROFILE_DATABASE:
            kwargs["database"] = self.database
        return settings(**kwargs)



def process_reasons(target: Target) -> list[str]:
    """Why no claim of the backend can run in this process (empty: they can).

    Sources: the backend's required modules and the contract's
    :meth:`~attnhal.backend.AttentionBackend.runtime_reasons` (e.g. Triton on a host
    device without its interpreter).
    """
    caps = target.caps
    out = [f"module {m} is not installed" for m in caps.requires if importlib.util.find_spec(m) is None]
    if out:
        return out
    return [str(r) for r in target.backend_cls.runtime_reasons(target.platform)]


def checkable_dtypes(target: Target) -> list[str]:
    """Claimed dtypes, in the order checks use them."""
    return [d for d in DTYPES if d in target.caps.dtypes]


