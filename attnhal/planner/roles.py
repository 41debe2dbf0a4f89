"""Roles: which backend runs each phase, and the one rule engines assign them by.

Engines pick backends per *role*, not per phase: a prefill and a decode backend
for the target model (one backend may serve both), a multi-step draft backend and
the draft model's extend backend. :func:`phase_roles` is the rule that turns those
choices into a backend per phase; :meth:`PhaseBackends.build` holds its result for
the planner, and engine front ends (``attnhal.engines``) apply it to their own names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from attnhal.capabilities.descriptor import BackendCapabilities
from attnhal.phases import Phase, draft_decode_runs
from attnhal.spec import SpecConfig, check_type

__all__ = ["AttentionMode", "PhaseBackends", "needs_draft_backend", "phase_roles"]

T = TypeVar("T")


class AttentionMode(str, Enum):
    """Which target backend target_verify (and, by default, draft_extend) runs on —
    SGLang's ``speculative_attention_mode``."""

    PREFILL = "prefill"
    DECODE = "decode"


#: The target phase whose backend target_verify follows in each mode.
_FOLLOWS = {AttentionMode.PREFILL: Phase.PREFILL, AttentionMode.DECODE: Phase.DECODE}
_ROLES = ("target", "draft_decode", "draft_extend", "prefill", "decode", "target_verify")


def _mode(value: object) -> AttentionMode:
    try:
        return AttentionMode(value)
    except ValueError:
        raise ValueError(f"speculative_attention_mode={value!r} (supported: prefill, decode)") from None


def _check_role(name: str, value: object) -> None:
    if value is not None and not isinstance(value, BackendCapabilities):
        raise TypeError(f"{name}={value!r} (supported: a BackendCapabilities or None; "
                        "a registered name resolves through default_registry().get(name).capabilities)")


def needs_draft_backend(spec: SpecConfig | None, step_counts: Iterable[int] = ()) -> bool:
    """Whether engines give the multi-step draft a backend: ``num_steps > 1`` under ``spec``
    (unknown ``spec``: assume so) or at one of the adaptive ``step_counts``.

    With one draft step the first draft token comes from draft_extend, and engines
    build no draft-decode backend at all.
    """
    return spec is None or any(draft_decode_runs(n) for n in (spec.num_steps, *step_counts))


def phase_roles(prefill: T, decode: T, spec: SpecConfig | None = None,
                mode: AttentionMode | str = AttentionMode.PREFILL, draft: T | None = None,
                draft_extend: T | None = None, step_counts: Iterable[int] = ()) -> dict[Phase, T | None]:
    """The role rule: the backend (descriptor, name, ...) of each phase, given an engine's choices.

    - prefill and decode run on ``prefill`` and ``decode``;
    - target_verify follows ``mode``: the prefill or the decode backend;
    - draft_extend runs on ``draft_extend``, else follows ``mode`` like target_verify;
    - draft_decode (the multi-step draft) runs on ``draft``, else on the decode backend;
      it has none when :func:`needs_draft_backend` says engines build none.

    Whether a phase runs at all is the spec config's business (:func:`attnhal.phases.phases_run`),
    not this rule's.
    """
    target = {Phase.PREFILL: prefill, Phase.DECODE: decode}
    follow = target[_FOLLOWS[_mode(mode)]]
    multi_step = (draft if draft is not None else decode) if needs_draft_backend(spec, step_counts) else None
    return {Phase.PREFILL: prefill, Phase.DECODE: decode, Phase.TARGET_VERIFY: follow,
            Phase.DRAFT_DECODE: multi_step,
            Phase.DRAFT_EXTEND: draft_extend if draft_extend is not None else follow}


@dataclass(frozen=True)
class PhaseBackends:
    """The descriptor of the backend running each role.

    ``target`` serves prefill, decode and target_verify unless ``prefill`` /
    ``decode`` / ``target_verify`` name their own. Without an explicit
    ``target_verify``, verification runs on the prefill or the decode backend as
    ``speculative_attention_mode`` says (engines split prefill and decode
    backends). ``draft_decode`` is the multi-step draft backend; engines have
    none when ``num_steps == 1``. ``draft_extend`` is the draft model's extend
    backend. A role left ``None`` is never skipped: a phase that runs without a
    backend makes the plan invalid. :meth:`build` fills the roles by the engines'
    rule (:func:`phase_roles`).
    """

    target: BackendCapabilities | None
    draft_decode: BackendCapabilities | None = None
    draft_extend: BackendCapabilities | None = None
    prefill: BackendCapabilities | None = None
    decode: BackendCapabilities | None = None
    target_verify: BackendCapabilities | None = None
    speculative_attention_mode: AttentionMode = AttentionMode.PREFILL

    def __post_init__(self) -> None:
        for name in _ROLES:
            _check_role(name, getattr(self, name))
        object.__setattr__(self, "speculative_attention_mode", _mode(self.speculative_attention_mode))

    @classmethod
    def build(cls, prefill: BackendCapabilities | None, decode: BackendCapabilities | None,
              spec: SpecConfig | None = None, mode: AttentionMode | str = AttentionMode.PREFILL,
              draft: BackendCapabilities | None = None, draft_extend: BackendCapabilities | None = None, *,
              target: BackendCapabilities | None = None, step_counts: Iterable[int] = ()) -> PhaseBackends:
        """The roles by the engines' rule (:func:`phase_roles`).

        Parameters
        ----------
        prefill, decode: the target model's prefill and decode backends; ``None``: ``target``'s.
        spec: the speculative config; ``None`` keeps a draft backend (unknown step count).
        mode: ``speculative_attention_mode``: what target_verify and, by default, draft_extend follow.
        draft: the multi-step draft backend (default: the decode backend); dropped when the
            draft never runs more than one step (``spec.num_steps`` and ``step_counts`` all 1).
        draft_extend: the draft model's extend backend (default: the one ``mode`` follows).
        target: the backend of the target roles left ``None``.
        step_counts: adaptive speculation's other ``num_steps`` values
            (:attr:`~attnhal.planner.GraphPolicy.step_counts`).
        """
        for name, value in (("prefill", prefill), ("decode", decode), ("draft", draft),
                            ("draft_extend", draft_extend), ("target", target)):
            _check_role(name, value)  # by the argument's name: each may end up in several roles
        if spec is not None:
            check_type("spec", spec, SpecConfig)
        mode = _mode(mode)
        steps = tuple(step_counts)
        by_phase = phase_roles(prefill if prefill is not None else target, decode if decode is not None else target,
                               spec, mode, draft, draft_extend, steps)
        return cls(target=target, prefill=prefill, decode=decode, draft_decode=by_phase[Phase.DRAFT_DECODE],
                   draft_extend=by_phase[Phase.DRAFT_EXTEND], speculative_attention_mode=mode)

    @classmethod
    def same(cls, caps: BackendCapabilities, spec: SpecConfig | None = None) -> PhaseBackends:
        """One backend for every role (no draft-decode backend when ``num_steps == 1``)."""
        check_type("caps", caps, BackendCapabilities)
        return cls.build(None, None, spec, target=caps)

    @classmethod
    def split(cls, prefill: BackendCapabilities, decode: BackendCapabilities, spec: SpecConfig | None = None,
              mode: AttentionMode | str = AttentionMode.PREFILL) -> PhaseBackends:
        """Separate prefill and decode backends, the draft model on the same ones: target_verify
        and draft_extend follow ``mode``; the multi-step draft runs on the decode backend."""
        return cls.build(prefill, decode, spec, mode)

    def role(self, phase: Phase) -> tuple[str, BackendCapabilities | None]:
        """The role that runs ``phase`` and its backend."""
        if phase is Phase.PREFILL:
            return "prefill", self.prefill or self.target
        if phase is Phase.DECODE:
            return "decode", self.decode or self.target
        if phase is Phase.TARGET_VERIFY:
            if self.target_verify is not None:
                return "target_verify", self.target_verify
            return self.role(_FOLLOWS[self.speculative_attention_mode])
        return phase.value, getattr(self, phase.value)

    def for_phase(self, phase: Phase) -> BackendCapabilities | None:
        """The backend that runs ``phase`` (``None``: no role has one)."""
        return self.role(phase)[1]
