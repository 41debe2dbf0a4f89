"""The inputs ``plan``, ``explain`` and ``demo`` share: platform, backends, spec, policy, context.

Each group is a pair: ``add_*_flags(parser)`` declares the flags, ``*_from(args)`` turns the
parsed values into the planner's input, raising :class:`~attnhal.cli.app.UsageError` that
names the flag for a value the API refuses.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Mapping

from attnhal.capabilities import BackendCapabilities
from attnhal.cli.app import UsageError
from attnhal.cli.args import IntList, choice, within
from attnhal.cli.output import one_line
from attnhal.errors import InvalidValue, shown
from attnhal.lookup import DescriptorFileError, RefShape, UnknownBackend, backend_class, describe, shape
from attnhal.phases import DraftSteps, GraphGroup, Phase, StepLayout
from attnhal.planner import AttentionMode, GraphPolicy, PhaseBackends, needs_draft_backend
from attnhal.platform import ENV_VAR, Platform, PlatformSpecError, detect, parse
from attnhal.registry import BackendUnavailable, Registry
from attnhal.kv_format import KV_FORMATS
from attnhal.spec import DTYPES, ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__all__ = ["BACKEND_FLAGS", "DRAFT_TOKENS", "FLAG_OF", "SPEC_STEPS", "add_plan_input_flags", "add_spec_flags",
           "context_from", "default_backend", "phase_backends", "policy_from", "read_backends", "refuse_unknown_name", "resolve_backend",
           "resolve_platform", "spec_from"]

#: Record field -> the flag of these commands that sets it: an API error's ``field``
#: (:class:`~attnhal.errors.InvalidValue`) names the flag through this table, never its message.
FLAG_OF = {
    "num_steps": "--spec-steps", "topk": "--topk", "num_draft_tokens": "--draft-tokens", "algorithm": "--spec-algorithm",
    "max_batch_size": "--max-bs", "step_counts": "--adaptive-steps", "max_tokens": "--capture-max-tokens",
    "phase": "--no-graph-phase", "disabled_phases": "--no-graph-phase",
    "model": "--model", "dtype": "--dtype", "kv_dtype": "--kv-dtype", "head_size": "--head-size",
    "page_size": "--page-size",
}
#: The flags' types, from the records' own bounds (one bound per value): ``--spec-steps`` adds
#: 0 below ``num_steps``'s range for "no speculative decoding".
SPEC_STEPS = within(SpecConfig.BOUNDS["num_steps"], off=0)
DRAFT_TOKENS = within(SpecConfig.BOUNDS["num_draft_tokens"])


#: The backend flags of ``plan`` and ``explain``, in the order :func:`read_backends` checks them.
BACKEND_FLAGS = ("--backend", "--target-backend", "--prefill-backend", "--decode-backend", "--draft-backend",
                 "--draft-extend-backend")


def resolve_platform(spec: str | None) -> Platform:
    """``--platform``, else ``ATTNHAL_PLATFORM``, else the detected device; errors name the source.

    Detecting the device imports torch (seconds): a command calls this after it has checked
    every other input, so bad input is refused before torch loads.
    """
    try:
        return parse(spec) if spec is not None else detect()
    except PlatformSpecError as exc:
        source = "--platform" if spec is not None else f"{ENV_VAR}={shown(os.environ.get(ENV_VAR, ''))} (environment)"
        raise UsageError(f"{source}: {exc}") from None


def resolve_backend(value: str, flag: str, registry: Registry,
                    platform: Platform | None = None) -> BackendCapabilities:
    """The descriptor ``value`` names (:mod:`attnhal.lookup`: a descriptor file, ``ENGINE:NAME``,
    ``module:attr`` or a registered name, the one for ``platform``'s vendor)."""
    try:
        return describe(value, platform, registry=registry)
    except DescriptorFileError as exc:
        raise UsageError(f"{flag}={value}: {exc.detail}") from None
    except UnknownBackend as exc:
        raise UsageError(f"{flag}: {exc.reasons[0].message}") from None
    except BackendUnavailable as exc:  # known, but failed to load
        raise UsageError(f"{flag}={value}: {exc.reasons[0].message}") from None


def read_backends(args: argparse.Namespace, registry: Registry) -> dict[str, BackendCapabilities]:
    """Every backend flag of :data:`BACKEND_FLAGS` given, checked before the platform is known
    (detecting it imports torch): a descriptor file, ``ENGINE:NAME`` or ``module:attr`` is read
    now (none depends on the platform); a registered name is checked to exist, and read later
    with the platform (it may have one descriptor per vendor). Returns value -> descriptor read."""
    read: dict[str, BackendCapabilities] = {}
    for flag in BACKEND_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if not value or value in read:
            continue
        if shape(value) is not RefShape.REGISTERED:
            read[value] = resolve_backend(value, flag, registry)
        elif value not in registry.names():
            resolve_backend(value, flag, registry)  # raises the unknown name's error, listing the known ones
    return read


def refuse_unknown_name(value: str, registry: Registry) -> None:
    """A registered-name reference that names nothing raises the lookup's own ``LookupError``
    (listing the names known) now, before an implementation (and torch) loads; other shapes
    and known names are read where they are used."""
    if shape(value) is RefShape.REGISTERED and value not in registry.names():
        backend_class(value, registry=registry)


def default_backend(platform: Platform, registry: Registry) -> BackendCapabilities:
    """The registry's choice for ``platform`` (no ``--backend`` given)."""
    try:
        caps = registry.select(platform).capabilities
    except LookupError as exc:
        raise UsageError(f"--backend: {one_line(str(exc))}") from None
    assert caps is not None
    return caps


def add_spec_flags(p: argparse.ArgumentParser, *, max_bs: bool = True) -> None:
    """``--platform``, the EAGLE spec (``--spec-steps``, ``--topk``, ``--draft-tokens``), ``--no-graphs``, ``--max-bs``."""
    p.add_argument("--platform", help="simulate a platform: cuda:sm90, hip:gfx942, cpu, ... (append ,nographs "
                                      f"for a device without graphs); default: ${ENV_VAR}, else the detected device")
    p.add_argument("--spec-steps", type=SPEC_STEPS, default=0,
                   help="EAGLE draft steps, %(type)s (0 = no speculative decoding)")
    p.add_argument("--topk", type=within(SpecConfig.BOUNDS["topk"]), default=1,
                   help="draft branches per step, %(type)s (a tree when > 1)")
    p.add_argument("--draft-tokens", type=DRAFT_TOKENS, default=None,
                   help="tokens verified per request, %(type)s (default: spec steps + 1; required when --topk > 1)")
    p.add_argument("--no-graphs", action="store_true", help="graph capture disabled by policy")
    if max_bs:
        p.add_argument("--max-bs", type=within(GraphPolicy.BOUNDS["max_batch_size"]), default=32,
                       help="largest capture batch size, %(type)s")


def spec_from(args: argparse.Namespace) -> SpecConfig:
    """The spec config of :func:`add_spec_flags` (and ``--spec-algorithm`` where declared)."""
    if args.spec_steps == 0:
        if args.topk != 1 or args.draft_tokens or getattr(args, "adaptive_steps", None):
            raise UsageError("--topk/--draft-tokens/--adaptive-steps need --spec-steps >= 1 (speculative decoding)")
        return SpecConfig()
    if args.topk > 1 and args.draft_tokens is None:
        raise UsageError(f"--draft-tokens is required with --topk={args.topk} (supported: "
                         f"{DRAFT_TOKENS}, the tree nodes verified per request)")
    try:
        return SpecConfig(SpecAlgorithm(getattr(args, "spec_algorithm", None) or "eagle"), args.spec_steps, args.topk,
                          args.draft_tokens or 0)
    except InvalidValue as exc:
        raise UsageError(f"{FLAG_OF[exc.field]}: {exc}") from None


def policy_from(args: argparse.Namespace) -> GraphPolicy:
    """The graph policy: ``--no-graphs``, ``--max-bs`` and, where declared, the flags of :func:`add_plan_input_flags`."""
    try:
        return GraphPolicy(enabled=not args.no_graphs, max_batch_size=args.max_bs,
                           disabled_phases=frozenset(getattr(args, "no_graph_phase", None) or ()),
                           step_counts=getattr(args, "adaptive_steps", None),
                           max_tokens=getattr(args, "capture_max_tokens", None))
    except InvalidValue as exc:
        raise UsageError(f"{FLAG_OF[exc.field]}: {exc}") from None


def add_plan_input_flags(p: argparse.ArgumentParser, *, context: bool, roles: bool) -> None:
    """Flags of plan/explain beyond add_spec_flags: algorithm, model/KV context, roles, graph policy."""
    p.add_argument("--spec-algorithm", type=choice([a.value for a in SpecAlgorithm][1:]),
                   help="speculative algorithm with --spec-steps (default eagle; ngram runs target_verify only)")
    p.add_argument("--model", type=choice([m.value for m in ModelKind]),
                   help="model attention layout: mha, gqa, mla (default: not checked)")
    if context:
        p.add_argument("--dtype", type=choice(DTYPES), help="compute dtype (default: not checked)")
        p.add_argument("--kv-dtype", type=choice(tuple(KV_FORMATS)), help="KV-cache dtype")
        p.add_argument("--head-size", type=within(RequestContext.BOUNDS["head_size"]), help="head dimension, %(type)s")
        p.add_argument("--page-size", type=within(RequestContext.BOUNDS["page_size"]),
                       help="KV page size in tokens, %(type)s")
    if roles:
        p.add_argument("--prefill-backend", help="backend of prefill (over --target-backend)")
        p.add_argument("--decode-backend", help="backend of decode and of the multi-step draft (over --target-backend)")
        p.add_argument("--speculative-attention-mode", type=choice([m.value for m in AttentionMode]),
                       default="prefill", help="target_verify and draft_extend follow the prefill or decode backend")
    p.add_argument("--no-graph-phase", action="append", type=choice([ph.value for ph in Phase]),
                   help="never capture this phase (repeatable)")
    p.add_argument("--adaptive-steps", type=IntList(within(GraphPolicy.BOUNDS["step_counts"])),
                   help="adaptive speculation: other step counts the plan must be valid for, %(type)s, e.g. 1,3,5 "
                        "(needs --spec-steps)")
    p.add_argument("--capture-max-tokens", type=within(GraphPolicy.BOUNDS["max_tokens"]),
                   help="capture sizes from the spec width: batch sizes with bs x tokens per request <= N, %(type)s")
    p.add_argument("--draft-as", type=choice([d.value for d in DraftSteps]), default=DraftSteps.DECODE.value,
                   help="the engine's draft steps: decode (EAGLE) or extend (one extend per step, no draft_decode: "
                        "SGLang's multi-layer EAGLE)")
    p.add_argument("--one-graph", action="append", metavar="PHASE,PHASE[,...]",
                   help="phases the engine captures as one graph (repeatable), e.g. "
                        "draft_extend,draft_decode,target_verify: one answer for all of them")


def layout_from(args: argparse.Namespace) -> StepLayout:
    """The engine's step layout: ``--draft-as`` and each ``--one-graph`` (a group named by its phases)."""
    try:
        groups = tuple(GraphGroup("+".join(names), frozenset(names))
                       for names in ([n.strip() for n in text.split(",")] for text in getattr(args, "one_graph", None) or ()))
        return StepLayout(DraftSteps(getattr(args, "draft_as", DraftSteps.DECODE.value)), groups)
    except InvalidValue as exc:
        raise UsageError(f"--one-graph: {exc}") from None


def context_from(args: argparse.Namespace) -> RequestContext:
    """The request context every running phase checks its backend against (``--model``, ``--dtype``, ...)."""
    try:
        return RequestContext(model=args.model, dtype=args.dtype, kv_dtype=args.kv_dtype,
                              head_size=args.head_size, page_size=args.page_size)
    except InvalidValue as exc:
        raise UsageError(f"{FLAG_OF[exc.field]}: {exc}") from None


def phase_backends(args: argparse.Namespace, spec: SpecConfig, platform: Platform,
                   registry: Registry, read: Mapping[str, BackendCapabilities] | None = None) -> PhaseBackends:
    """--backend for every role, overridden per role by the role rule (:meth:`PhaseBackends.build`);
    without --backend, the registry's choice for the platform. ``read``: descriptors
    :func:`read_backends` already read, by value."""
    def named(value: str | None, flag: str) -> BackendCapabilities | None:
        if not value:
            return None
        return (read or {}).get(value) or resolve_backend(value, flag, registry, platform)

    @functools.cache
    def every_role() -> BackendCapabilities:
        return named(args.backend, "--backend") or default_backend(platform, registry)

    target = named(args.target_backend, "--target-backend") or every_role()
    steps = tuple(getattr(args, "adaptive_steps", None) or ())
    draft = None
    if needs_draft_backend(spec, steps):  # a --draft-backend for a draft that never runs is not read
        draft = named(args.draft_backend, "--draft-backend") or (None if args.decode_backend else every_role())
    split = args.prefill_backend or args.decode_backend
    extend = named(args.draft_extend_backend, "--draft-extend-backend") or (None if split else every_role())
    return PhaseBackends.build(named(args.prefill_backend, "--prefill-backend") or target,
                               named(args.decode_backend, "--decode-backend") or target, spec,
                               args.speculative_attention_mode, draft=draft, draft_extend=extend, target=target,
                               step_counts=steps)
