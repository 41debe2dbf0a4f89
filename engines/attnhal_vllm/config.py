"""vLLM engine arguments -> :class:`VllmConfig`: the backend, the spec, the graph mode vLLM resolves (for the
release :func:`release_for` picks), and what the plan reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from attnhal.catalog import load
from attnhal.engines.base import EngineConfig
from attnhal.engines.flags import EngineArgError, check, model_kind
from attnhal.engines.plugin_gate import installed
from attnhal.engines.releases import modelled
from attnhal.engines.report import GraphRow, format_report
from attnhal_vllm.drafter import DrafterMode, drafter_mode
from attnhal_vllm.flags import (CHECKPOINT, FIELD_FLAGS, FLAGS, HARMLESS, METHODS, OPTIMIZATION_LEVELS,
                                 VLLM_SERIES_DIGITS, VLLM_VERSION, VLLM_VERSIONS)
from attnhal_vllm.levels import Level, support_on
from attnhal_vllm.modes import GraphMode, ModeResolution, resolve_mode
from attnhal_vllm.runner import RunnerChoice, select_runner
from attnhal_vllm.selection import ASSUMED, ModelShape, Selection, select
from attnhal_vllm.startup import report_rows
from attnhal.phases import Phase, phases_run
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends
from attnhal.platform import Platform, as_platform
from attnhal.spec import ModelKind, RequestContext, SpecAlgorithm, SpecConfig

__all__ = ["ADAPTER", "VllmAdapter", "VllmConfig", "from_engine_args", "release_for"]


@dataclass(frozen=True, kw_only=True)
class VllmConfig(EngineConfig):
    """vLLM arguments translated: the backend (in every role), the spec, the graph mode vLLM resolves.

    ``policy`` has graphs off when vLLM's mode has no full graphs (piecewise graphs leave
    attention eager), and the draft phases off where the release's drafter captures no
    attention (:mod:`~attnhal_vllm.drafter`); ``refusal`` is vLLM's own refusal of the
    requested mode; ``version`` the release modelled and ``chosen`` how it was picked.
    """

    engine: str = "vllm"
    version: str = VLLM_VERSION
    checkpoint_flags: ClassVar[frozenset[str]] = CHECKPOINT
    chosen: str = ""
    backend: str  # vllm:NAME
    requested: GraphMode
    resolution: ModeResolution
    level: Level | None = None  # the builder's level the resolution used (None: not resolved yet)
    drafter: DrafterMode | None = None  # None: no draft model (no speculation, or n-gram)
    runner: RunnerChoice | None = None  # the model runner vLLM selects (None: not selected yet)
    selection: Selection | None = None  # vLLM's default choice of backend (None: --attention-backend given)
    query_len: int = 1  # the uniform decode query length: 1 + speculative tokens

    def refusal(self) -> str | None:
        return self.resolution.error

    def _level(self, platform: Platform) -> Level:
        return self.level or support_on(self.backend, platform)

    def report(self, platform: Platform) -> dict[str, object]:
        """Besides the base entries: the backend, its support level and why, and the mode resolution."""
        level, r = self._level(platform), self.resolution
        return {**super().report(platform), "backend": self.backend, "cg_support": level.support.name,
                "cg_level": level.to_dict(), "cg_conditions": load(self.backend).meta.get("cg_conditions"),
                "cudagraph_mode": {"requested": r.requested.value, "resolved": r.mode.value if r.mode else None,
                                   "steps": list(r.steps), "error": r.error},
                "release": {"version": self.version, "chosen": self.chosen},
                "runner": self.runner.to_dict() if self.runner else None,
                "backend_choice": self.selection.to_dict() if self.selection else {"by": "--attention-backend"},
                "drafter": self.drafter.to_dict() if self.drafter else None}

    def summary(self, platform: Platform) -> list[str]:
        level, r = self._level(platform), self.resolution
        why = level.because or load(self.backend).meta.get("cg_conditions")
        resolved = r.mode.value if r.mode else f"error: {r.error}"
        chosen = f" ({self.chosen})" if self.chosen else ""
        return [f"engine: vLLM {self.version}{chosen} -> {self.backend}: AttentionCGSupport {level.support.name}"
                + (f" ({why})" if why else ""),
                *([f"backend: {self.selection.why()}"] if self.selection else []),
                *([f"assumes: {self.selection.shape.source.removeprefix('assumed: ')}"]
                  if self.selection and self.selection.shape.source.startswith("assumed: ") else []),
                *([f"assumes: {level.assumes}"] if level.assumes else []),
                *([f"runner: {self.runner.name} ({self.runner.why})"] if self.runner else []),
                *([f"assumes: {self.runner.assumes}"] if self.runner and self.runner.assumes else []),
                f"cudagraph_mode: {r.requested.value} -> {resolved}" + "".join(f"\n  {step}" for step in r.steps),
                *([f"drafter: draft decode {self.drafter.mode} ({self.drafter.why})"] if self.drafter else [])]

    def outcome(self, platform: Platform, result: GraphPlan) -> list[GraphRow]:
        """vLLM's graphs per routine from its mode resolution, and the drafter's (draft decode where it
        runs, draft extend) by its runner's rule: the rows the plugin logs at start;
        for a plan that cannot run (the backend refuses the platform), one row saying so and none
        claiming graphs."""
        blocked = [(phase, decision) for phase, decision in result.phases.items() if decision.blocking]
        if blocked:
            phase, decision = blocked[0]
            why = f"{phase.value}: {decision.reasons[0]}" if decision.reasons else phase.value
            return [GraphRow("all", "-", "cannot run", self.backend.removeprefix("vllm:"), why,
                             "--attention-backend (one that runs on this platform)", by="attnhal's plan")]
        level, r = self._level(platform), self.resolution
        return report_rows(self.backend.removeprefix("vllm:"), level.support, r.mode, self.query_len,
                           "vLLM's default", r.error, self.drafter, r.requested, result[Phase.DRAFT_DECODE].runs)

    def remarks(self, platform: Platform, result: GraphPlan) -> list[str]:
        """The notes, the start-up graph report the plugin would log, the ignored flags."""
        rows = self.outcome(platform, result)
        table = format_report(f"attnhal graph report (before launch): vLLM {self.version} on {platform.name}", rows)
        return [*(f"note: {note}" for note in self.notes), table, *self.ignored_lines()]


#: The ``--spec-*`` flags and the ``--speculative-config`` keys they stand for.
SPEC_FLAG_KEYS = {"spec_method": "method", "spec_model": "model", "spec_tokens": "num_speculative_tokens"}


def _refuse_contradictions(values: Mapping[str, Any], speculative: Mapping[str, Any]) -> None:
    """A ``--spec-*`` flag and the same key of ``--speculative-config`` are refused together, as vLLM
    refuses them (``engine/arg_utils.py:2108-2120``: mutually exclusive, even with the same value)."""
    for name, key in SPEC_FLAG_KEYS.items():
        flag = "--" + name.replace("_", "-")
        if values.get(name) is not None and key in speculative:
            raise EngineArgError(flag, f"{flag}={values[name]} with --speculative-config {key}={speculative[key]} "
                                       f"(supported: one of them; vLLM refuses both as mutually exclusive)")


def release_for(given: str | None) -> tuple[str, str]:
    """The vLLM release to model and how it was chosen: ``given`` (``--vllm-version``), else the
    installed release where attnhal supports it, else the newest supported one. A patch, pre- or
    post-release of a supported minor (``0.34.1``, ``0.34.0rc1``, ``v0.34.0``) is modelled as that
    minor's supported release, and ``chosen`` says so (:func:`attnhal.engines.releases.modelled`)."""
    if given is not None:
        same = modelled(given, VLLM_VERSIONS, VLLM_SERIES_DIGITS)
        if same is None:
            raise EngineArgError("--vllm-version", f"--vllm-version={given!r} (supported: {', '.join(VLLM_VERSIONS)}"
                                 f" and the patch, pre- and post-releases of their minors)")
        return same.release, "--vllm-version" + (f"; {same.line('vLLM')}" if not same.exact else "")
    here = installed("vllm")
    same = modelled(here, VLLM_VERSIONS, VLLM_SERIES_DIGITS)
    if same is not None:
        return same.release, "installed" + (f"; {same.line('vLLM')}" if not same.exact else "")
    where = "no vLLM installed" if here is None else f"vLLM {here} installed, not modelled"
    return VLLM_VERSIONS[-1], f"{where}: the newest supported; --vllm-version picks another"


def from_engine_args(args: Mapping[str, Any], platform: Platform | str | None = None,
                     trtllm_cubins: bool = True, model: ModelKind | str | None = None,
                     version: str | None = None, env: Mapping[str, str] | None = None,
                     shape: ModelShape | None = None) -> VllmConfig:
    """Translate vLLM engine arguments (``--attention-backend``, ``--spec-method``, ``--spec-tokens``,
    ``--speculative-config``, ``--compilation-config`` ``cudagraph_mode``, ``--enforce-eager``).

    The requested mode defaults to vLLM's ``FULL_AND_PIECEWISE`` (``config/vllm.py:311, 332``);
    ``--enforce-eager`` makes it ``NONE``. The builder's level is the one it reports on
    ``platform`` (:func:`~attnhal_vllm.levels.support_on`; without a platform, the
    catalogue's); ``trtllm_cubins`` is the assumption FlashInfer's level rests on; ``model``
    the model's attention kind (vLLM reads it from the checkpoint); ``version`` the release
    (:func:`release_for`: default the installed one, else the newest supported); ``env`` vLLM's
    environment as far as it picks the model runner (:func:`~attnhal_vllm.runner.select_runner`:
    ``VLLM_USE_V2_MODEL_RUNNER``; default unset). Raises :class:`EngineArgError` naming the flag.
    """
    release, chosen = release_for(version)
    runner = select_runner(release, env or {})
    values, ignored = check(args, FLAGS, HARMLESS, "attnhal_vllm.HARMLESS")
    where = as_platform(platform) if platform is not None else None
    selection = None
    if "attention_backend" not in values:
        selection = _default_backend(args, where, model_kind(model), shape)
        values["attention_backend"] = selection.backend
    speculative = values.get("speculative_config", {})
    _refuse_contradictions({**args, **values}, speculative)  # --spec-model is read as harmless: args has it
    method = values.get("spec_method", speculative.get("method"))
    tokens = values.get("spec_tokens", speculative.get("num_speculative_tokens"))
    if (method is None) != (tokens is None):
        raise EngineArgError("--spec-tokens", "speculative decoding needs both a method and --spec-tokens")
    if method is None:
        spec = SpecConfig()
    elif METHODS[method] == "ngram":
        spec = SpecConfig.ngram(tokens + 1)
    else:
        spec = SpecConfig(SpecAlgorithm(METHODS[method]), tokens)
    level_default = OPTIMIZATION_LEVELS[values.get("optimization_level", "2")]  # vLLM's default level: 2
    requested = GraphMode(values.get("compilation_config", {}).get("cudagraph_mode", level_default))
    if values.get("enforce_eager"):
        requested = GraphMode.NONE
    query_len = 1 + tokens if tokens else 1
    level = support_on(values["attention_backend"], where, tokens or 0, trtllm_cubins)
    resolution = resolve_mode(requested, level.support, query_len)
    backend = values["attention_backend"]
    full = resolution.mode is not None and "FULL" in (resolution.mode.decode, resolution.mode.mixed)
    runs = phases_run(spec) | {Phase.PREFILL, Phase.DECODE}
    drafter = (drafter_mode(release, resolution.mode, runner.name, spec.algorithm.value)
               if Phase.DRAFT_EXTEND in runs else None)  # a draft model: its prefill runs with one token too
    notes, off = _drafter_notes(drafter, full)
    return VllmConfig(spec=spec, backends=PhaseBackends.same(load(backend).descriptor, spec),
                      policy=GraphPolicy(enabled=full, disabled_phases=off, disabled_by=_why_no_full(resolution)),
                      context=RequestContext(model=model_kind(model)),
                      roles={p.value: backend.removeprefix("vllm:") if p in runs else None for p in Phase},
                      ignored=ignored, notes=notes, version=release, chosen=chosen, backend=backend,
                      requested=requested, resolution=resolution, level=level, drafter=drafter,
                      query_len=query_len, runner=runner, selection=selection)


#: ``--dtype`` values under which vLLM's selection sees the dtype attnhal assumes (the model's own).
_MODEL_DTYPES = {"auto": None, "bfloat16": "bfloat16", "float16": "float16", "half": "float16"}


def _default_backend(values: Mapping[str, Any], platform: Platform | None, kind: ModelKind | None,
                     shape: ModelShape | None) -> Selection:
    """vLLM's own choice (:func:`~attnhal_vllm.selection.select`) for the model's shape, or the shape
    assumed for its kind; ``--dtype`` as vLLM would read it."""
    if shape is not None and kind is not None and (kind is ModelKind.MLA) != shape.mla:
        raise EngineArgError("--model", f"--model={kind.value} contradicts --model-config ({shape.source}: "
                                        f"{'MLA' if shape.mla else 'not MLA'}) (supported: one of them)")
    chosen = shape or ASSUMED[kind is ModelKind.MLA]
    dtype = str(values.get("dtype") or "auto").lower()
    if dtype not in _MODEL_DTYPES:
        raise EngineArgError("--dtype", f"--dtype={dtype!r} without --attention-backend (supported: "
                                        f"{', '.join(_MODEL_DTYPES)}; vLLM's default choice under another dtype "
                                        "is not modelled: give --attention-backend)")
    named = _MODEL_DTYPES[dtype]
    if named is not None:
        chosen = replace(chosen, dtype=named)
    return select(platform, chosen)


def _drafter_notes(drafter: DrafterMode | None, target_full: bool) -> tuple[tuple[str, ...], frozenset[Phase]]:
    """The draft phases the release's drafter leaves eager while the target captures (``target_full``:
    the target's mode has full graphs), and why."""
    if drafter is None or drafter.captures_attention or not target_full:
        return (), frozenset()
    graphs = "no graphs" if drafter.mode == "NONE" else f"{drafter.mode} graphs"
    note = (f"vLLM {drafter.release}'s drafter on the {drafter.runner} runner runs {graphs}: its attention (draft "
            "decode, draft extend) is not captured, so attnhal plans both draft phases eager")
    return (note,), frozenset({Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND})


def _cubins(value: str | None) -> bool:
    return (value or "yes") == "yes"


def _why_no_full(resolution: ModeResolution) -> str:
    """Who leaves attention outside the graphs when the resolved mode has no full graphs: the mode
    asked for, or vLLM's downgrade of it (a refusal of the mode: vLLM does not start)."""
    if resolution.mode is None:
        return f"vLLM, which refuses cudagraph_mode {resolution.requested.value}"
    if resolution.mode == resolution.requested:
        return (f"cudagraph_mode {resolution.mode.value} as asked (piecewise graphs leave attention "
                "outside the graph)")
    return (f"vLLM's downgrade of cudagraph_mode {resolution.requested.value} to {resolution.mode.value} "
            "(piecewise graphs leave attention outside the graph)")
