"""SGLang server arguments -> the planner's inputs, as SGLang's own argument resolution decides them.

The spec config, the backend of every role (descriptors from the catalogue,
``sglang:NAME``), the graph policy with SGLang's capture sizes, and the request context.
The comments cite the SGLang 0.5.23 source lines each rule follows.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from attnhal.capabilities import BackendCapabilities
from attnhal.catalog import load
from attnhal.engines import flags as _flags
from attnhal.engines.base import EngineConfig, flag_error
from attnhal.engines.report import GraphRow
from attnhal.engines.flags import EngineArgError, cli_name, model_kind
from attnhal.errors import InvalidValue
from attnhal_sglang.flags import (ALGORITHMS, CHECKPOINT, DTYPES, FIELD_FLAGS, FLAGS, HARMLESS, KV_CACHE_DTYPES,
                                          SGLANG_VERSION)
from attnhal_sglang import multi_layer
from attnhal_sglang.defaults import base_backend, needs_default
from attnhal_sglang.model import facts_of
from attnhal.engines.model_config import HFConfig
from attnhal_sglang.env import BOOL_ENV, DRAFT_EXTEND_GRAPH_OFF, SINGLE_GRAPH_DRAFT, env_bool
from attnhal_sglang.pages import DEFAULT_PAGE_SIZE, PageSize, model_note, resolve_page_size
from attnhal.phases import DEFAULT_LAYOUT, Phase, StepLayout, phases_run
from attnhal.planner import AttentionMode, GraphPlan, GraphPolicy, PhaseBackends, phase_roles
from attnhal.platform import Platform, as_platform
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__all__ = ["BOOL_ENV", "DEFAULT_MAX_BS", "DEFAULT_PAGE_SIZE", "DRAFT_EXTEND_GRAPH_OFF", "SINGLE_GRAPH_DRAFT", "Choice", "SglangConfig",
           "capture_sizes", "env_bool", "from_server_args", "roles"]

#: Backends whose draft extend and default prefill SGLang builds on another backend: cute-dsl MLA
#: is decode-only; both run trtllm-gen (draft_utils.py:137-138; arg_groups/overrides.py:1233-1260).
_EXTEND_ON = {"cutedsl_mla": "trtllm_mla"}
#: attnhal's capture limit when SGLang's is not given (SGLang sizes it from GPU memory).
DEFAULT_MAX_BS = 32


@dataclass(frozen=True)
class Choice:
    """Which resolution made a config (``engine``: SGLang's own, ``builtin``: attnhal's) and why."""

    used: str
    why: str

    def __str__(self) -> str:
        who = "SGLang's own (ServerArgs.resolve_once)" if self.used == "engine" else "attnhal's built-in"
        return f"resolution: {who}: {self.why}"

    def to_dict(self) -> dict[str, str]:
        return {"used": self.used, "why": self.why}


@dataclass(frozen=True, kw_only=True)
class SglangConfig(EngineConfig):
    """SGLang arguments translated: what ``plan`` needs, and what was not used.

    ``context`` carries the page size SGLang sets whatever the platform; :meth:`plan` applies
    the platform's rules too (fa4 on SM100), see :meth:`page_size`.
    """

    engine: str = "sglang"
    version: str = SGLANG_VERSION
    checkpoint_flags: ClassVar[frozenset[str]] = CHECKPOINT
    values: Mapping[str, Any] = field(default_factory=dict)  # the converted server arguments
    resolved_by: str = "builtin"  # "engine": SGLang's own resolution made ``values``
    page: PageSize | None = None  # the page size SGLang's own resolution settled on (engine only)
    default_for: str | None = None  # the platform SGLang's default attention backend was picked for
    choice: Choice | None = None  # which resolution the command line used, and why

    def checkpoint_read_by(self) -> str | None:
        return "SGLang's own resolution, for the backend and page size," if self.resolved_by == "engine" else None

    def page_size(self, platform: Platform | str | None = None) -> PageSize:
        """The page size SGLang runs with on ``platform`` (``None``: the platform-independent rules)."""
        if self.page is not None:
            return self.page
        where = as_platform(platform) if platform is not None else None
        return resolve_page_size(self.values, self.context.model, where)

    def context_on(self, platform: Platform | str) -> RequestContext:
        """``context`` with the page size SGLang sets on ``platform``."""
        return replace(self.context, page_size=self.page_size(platform).value)

    def plan(self, platform: Platform | str) -> GraphPlan:
        where = as_platform(platform)
        if self.default_for is not None and where.name != self.default_for:
            # SGLang's default backend is per GPU: a config picked for one cannot plan another.
            raise EngineArgError("--platform", f"--platform={where.name!r}: the default attention backend was "
                                               f"picked for {self.default_for} (supported: {self.default_for}; "
                                               "translate the flags again for another platform)")
        return super().plan(where)

    def report(self, platform: Platform) -> dict[str, object]:
        """Besides the base entries: the resolution used, the page size and the engine's known differences."""
        from attnhal_sglang.audit import engine_differs

        from attnhal_sglang.late import late_failures

        return {**super().report(platform), "resolution": self.choice.to_dict() if self.choice else None,
                "page_size": self.page_size(platform).to_dict(),
                "engine_differs": [d.to_dict() for d in engine_differs(self, platform)], "seams": self.seams(),
                "late_failures": [f.to_dict() for f in late_failures(self, platform)]}

    def seams(self) -> dict[str, Any] | None:
        """SGLang's capability seams for the draft-extend backend (:func:`~attnhal_sglang.seams.plan_seams`)."""
        from attnhal_sglang.seams import plan_seams

        extend_off = {DRAFT_EXTEND_GRAPH_OFF: "1"} if Phase.DRAFT_EXTEND in self.policy.disabled_phases else {}
        model = self.context.model.value if self.context.model is not None else None
        return plan_seams(self.roles, model, self.spec.topk, self.policy.enabled, extend_off)

    def outcome(self, platform: Platform, result: GraphPlan) -> list[GraphRow]:
        """attnhal's plan with the phases SGLang's own rules leave eager (catalogued D-entries) and
        the phases on which a server SGLang starts fails later (the catalogue's late failures)."""
        from attnhal_sglang.audit import engine_differs
        from attnhal_sglang.late import AT_CAPTURE, late_failures
        from attnhal_sglang.report import plan_rows

        late = {failure.phase.value: failure for failure in late_failures(self, platform)}
        rows = plan_rows(result, engine_differs(self, platform))
        if self.layout is multi_layer.MULTI_LAYER:  # the multi-layer worker's own draft-extend graph rule
            rows = [multi_layer.draft_extend_row(row, self, platform, result) if row.phase == "draft_extend" else row
                    for row in rows]
        return [row if row.phase not in late else
                GraphRow(row.phase, "-", "fails at start" if late[row.phase].when == AT_CAPTURE else "fails later",
                         late[row.phase].backend, str(late[row.phase]), row.change, "late failure")
                for row in rows]

    def summary(self, platform: Platform) -> list[str]:
        return [f"engine: SGLang {self.version} flags -> roles: "
                + ", ".join(f"{role}={name}" for role, name in self.roles.items() if name is not None),
                *([str(self.choice)] if self.choice else [])]

    def context_notes(self, platform: Platform) -> dict[str, str | None]:
        return {"page_size": self.page_size(platform).note}

    def remarks(self, platform: Platform, result: GraphPlan) -> list[str]:
        """Why each captured phase is captured, the notes, SGLang's known differences and late failures,
        the seams, the start-up graph report the plugin would log, the ignored flags."""
        from attnhal_sglang.audit import engine_differs
        from attnhal_sglang.late import late_failures
        from attnhal.engines.report import format_report
        from attnhal_sglang.report import TITLE
        from attnhal_sglang.seams import plan_lines

        differs = engine_differs(self, platform)
        why = [f"why: {phase.value} is captured: {decision.backend} declares {phase.value} graphs and their "
               "limits hold, the platform has a graph API and the policy allows them"
               for phase, decision in result.phases.items() if decision.capture]
        report = format_report(f"{TITLE}: SGLang {self.version} on {as_platform(platform).name}",
                               self.outcome(platform, result))
        return [*why, *(f"note: {note}" for note in self.notes), *map(str, differs),
                *map(str, late_failures(self, platform)), *plan_lines(self.seams()), report, *self.ignored_lines()]


#: The flags that shape speculative decoding, read only with ``--speculative-algorithm``.
_SPEC_FLAGS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
               "speculative_ngram_max_bfs_breadth", "speculative_draft_attention_backend")


def _spec(values: Mapping[str, Any], notes: list[str]) -> SpecConfig:
    algorithm = values.get("speculative_algorithm")
    if algorithm is None:
        unused = [cli_name(name) for name in _SPEC_FLAGS if name in values]
        if unused:  # SGLang reads them only for an algorithm (arg_groups/speculative_hook.py): said, not dropped
            notes.append(f"{', '.join(unused)} without --speculative-algorithm: SGLang ignores "
                         f"{'them' if len(unused) > 1 else 'it'} (no speculative decoding)")
        return SpecConfig()
    if algorithm == "NGRAM":
        if "speculative_num_draft_tokens" not in values:
            raise EngineArgError("--speculative-num-draft-tokens", "NGRAM needs --speculative-num-draft-tokens")
        width: int = values["speculative_num_draft_tokens"]
        breadth: int = values.get("speculative_ngram_max_bfs_breadth", 1)
        return _spec_or_error(lambda: SpecConfig.ngram(width, breadth))
    steps = values.get("speculative_num_steps")
    if steps is None:
        raise EngineArgError("--speculative-num-steps", "--speculative-num-steps is required (SGLang picks it per "
                             "model when omitted; attnhal does not model that choice)")
    topk = values.get("speculative_eagle_topk", 1)
    tokens = values.get("speculative_num_draft_tokens", 0)
    if topk == 1 and tokens not in (0, steps + 1):
        # SGLang overrides it, with a warning (arg_groups/speculative_hook.py:1255-1266).
        notes.append(f"speculative_num_draft_tokens={tokens} -> {steps + 1}: SGLang sets num_steps + 1 for topk 1")
        tokens = steps + 1
    return _spec_or_error(lambda: SpecConfig(SpecAlgorithm(ALGORITHMS[algorithm]), steps, topk, tokens))


def _spec_or_error(build: Callable[[], SpecConfig]) -> SpecConfig:
    """The spec, or its refusal naming the flag that set the field (:data:`~.flags.FIELD_FLAGS`)."""
    try:
        return build()
    except InvalidValue as exc:
        raise flag_error(exc, FIELD_FLAGS) from None


def roles(values: Mapping[str, Any], spec: SpecConfig, layout: StepLayout = DEFAULT_LAYOUT) -> dict[str, str | None]:
    """The SGLang backend name running each role, as SGLang picks them.

    prefill/decode: the split flags over ``--attention-backend`` (draft_utils.py:55-61);
    target verify and draft extend follow ``--speculative-attention-mode`` (draft_utils.py:145-149);
    the draft model's backend is ``--speculative-draft-attention-backend`` when given (draft_utils.py:45,61);
    ``layout``: multi-layer EAGLE's draft steps are extends (no draft-decode role,
    :mod:`~attnhal_sglang.multi_layer`).
    """
    base = values.get("attention_backend")
    decode = values.get("decode_attention_backend", base)
    prefill = values.get("prefill_attention_backend") or _EXTEND_ON.get(decode) or base
    if prefill is None or decode is None:
        raise EngineArgError("--attention-backend", "--attention-backend is required (SGLang picks one per model "
                             "and GPU when omitted; attnhal does not model that choice)")
    mode = AttentionMode.DECODE if values.get("speculative_attention_mode") == "decode" else AttentionMode.PREFILL
    draft = values.get("speculative_draft_attention_backend") or None  # the draft model's decode and extend
    names = phase_roles(prefill, decode, spec, mode, draft=draft, draft_extend=draft)
    extend = names[Phase.DRAFT_EXTEND]
    if extend is not None:
        names[Phase.DRAFT_EXTEND] = _EXTEND_ON.get(extend, extend)
    # The speculative roles exist only where their phase runs (no draft backend for n-gram or one step).
    runs = phases_run(spec, layout) | {Phase.PREFILL, Phase.DECODE}
    return {phase.value: name if phase in runs else None for phase, name in names.items()}


def _descriptor(name: str | None) -> BackendCapabilities | None:
    return load(f"sglang:{name}").descriptor if name is not None else None


def _backends(names: Mapping[str, str | None], mode: str) -> PhaseBackends:
    return PhaseBackends(target=None, prefill=_descriptor(names["prefill"]), decode=_descriptor(names["decode"]),
                         draft_decode=_descriptor(names["draft_decode"]),
                         draft_extend=_descriptor(names["draft_extend"]),
                         speculative_attention_mode=AttentionMode(mode))


def capture_sizes(max_bs: int, speculative: bool, padding: bool = True) -> tuple[int, ...]:
    """SGLang's default decode capture batch sizes up to ``max_bs``
    (arg_groups/cuda_graph_hook.py:499-532): denser at small sizes under speculation."""
    if not padding:
        sizes = list(range(1, max_bs + 1))
    elif speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return tuple(sorted({b for b in sizes if b <= max_bs} | {max_bs}))


def _policy(values: Mapping[str, Any], env: Mapping[str, str], spec: SpecConfig) -> GraphPolicy:
    disabled = (values.get("disable_cuda_graph", False) or values.get("disable_decode_cuda_graph", False)
                or values.get("cuda_graph_backend_decode") == "disabled")
    max_bs = values.get("cuda_graph_max_bs_decode", values.get("cuda_graph_max_bs"))
    sizes = values.get("cuda_graph_bs_decode", values.get("cuda_graph_bs"))
    if max_bs is None and sizes is not None:
        max_bs = max(sizes)
    max_bs = max_bs or DEFAULT_MAX_BS
    if sizes is None:
        sizes = capture_sizes(max_bs, spec.speculative, not values.get("disable_cuda_graph_padding", False))
    off = env_bool(env, DRAFT_EXTEND_GRAPH_OFF)
    return GraphPolicy(enabled=not disabled, max_batch_size=max_bs, batch_sizes=sizes,
                       disabled_phases=frozenset((Phase.DRAFT_EXTEND,)) if off else frozenset())


def from_server_args(args: Mapping[str, Any] | argparse.Namespace, env: Mapping[str, str] | None = None,
                     model: ModelKind | str | None = None, platform: Platform | str | None = None,
                     model_config: HFConfig | None = None) -> SglangConfig:
    """Translate SGLang server arguments (names as in ``ServerArgs``) into planner inputs.

    ``env`` may carry ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH`` (eagle_worker_v2.py:627);
    ``model`` is the model's attention kind, which SGLang reads from the checkpoint;
    ``platform`` the GPU, which SGLang's default attention backend depends on (needed only
    when no backend flag is given: the config then plans for that platform only); ``model_config``
    the model's ``config.json`` (``--model-config``), read as SGLang reads it (:mod:`attnhal_sglang.model`:
    the kind when ``model`` is not given, and the DeepSeek override of the default backend).
    Raises :class:`EngineArgError` naming the flag for anything attnhal cannot take.
    """
    raw = vars(args) if isinstance(args, argparse.Namespace) else args  # a Parsed keeps the flags as typed
    values, ignored = _flags.check(raw, FLAGS, HARMLESS, "attnhal_sglang.HARMLESS")
    notes: list[str] = []
    kind = model_kind(model)
    facts = facts_of(model_config) if model_config is not None else None
    if facts is not None and kind is not None and (kind is ModelKind.MLA) != (facts.kind is ModelKind.MLA):
        raise EngineArgError("--model", f"--model={kind.value} contradicts --model-config ({facts.source}: SGLang "
                                        f"reads it as {facts.kind.value}) (supported: one of them)")
    kind = kind or (facts.kind if facts else None)
    where = as_platform(platform) if platform is not None else None
    default_for = where.name if where is not None and needs_default(values) else None
    if (base := base_backend(values, kind, where, facts.deepseek_override if facts else None)) is not None:
        values = {**values, "attention_backend": base.name}
        notes.append(str(base))
    spec = _spec(values, notes)
    layout = multi_layer.layout(values, spec, notes)
    names = roles(values, spec, layout)
    if not {"cuda_graph_max_bs", "cuda_graph_max_bs_decode", "cuda_graph_bs", "cuda_graph_bs_decode"} & set(values):
        notes.append(f"capture batch sizes up to {DEFAULT_MAX_BS}: SGLang sizes them from GPU memory; "
                     "give --cuda-graph-max-bs-decode to match a server")
    if (open_page := model_note(values, kind)) is not None:
        notes.append(open_page)
    context = RequestContext(model=kind, dtype=DTYPES.get(values.get("dtype", "auto")),
                             kv_dtype=KV_CACHE_DTYPES.get(values.get("kv_cache_dtype", "auto")),
                             page_size=resolve_page_size(values, kind).value)
    return SglangConfig(spec=spec, backends=_backends(names, values.get("speculative_attention_mode", "prefill")),
                        policy=_policy(values, env or {}, spec), context=context, roles=names, ignored=ignored,
                        notes=tuple(notes), values=values, default_for=default_for, layout=layout)
